"""Compatibility with the supported stacks (torch 2.1 to 2.14, mmengine 0.10).

``import mmsoft`` calls :func:`register_safe_globals` (below) and nothing
else here changes the process. The torch shims (:func:`autocast_dtype`,
:func:`sdpa_math` ...) answer one version-dependent question each.

The allow-list of mmengine training checkpoints
-----------------------------------------------
Failure: since torch 2.6, ``torch.load`` defaults to ``weights_only=True``.
mmengine 0.10.7 calls ``torch.load(filename, map_location=...)`` without
``weights_only`` (``mmengine.runner.checkpoint.load_from_local`` and the
http / pavi / hub loaders), and every checkpoint written by its ``Runner``
stores the ``MessageHub`` state, whose ``log_scalars`` are
``mmengine.logging.HistoryBuffer`` objects holding numpy arrays. So
``Runner(resume=True)``, ``Runner(load_from=...)`` (even just for
``runner.test()``), ``mmengine.runner.load_checkpoint``,
``CheckpointLoader.load_checkpoint`` and ``torch.load`` of any
``iter_*.pth`` / ``epoch_*.pth`` raise::

    _pickle.UnpicklingError: Weights only load failed. ...
    WeightsUnpickler error: Unsupported global: GLOBAL
    mmengine.logging.history_buffer.HistoryBuffer was not an allowed global
    by default. ...

(Plain ``state_dict`` files, e.g. the official SOFT weights, load fine.)

Fix: allow-list exactly what such checkpoints contain with
``torch.serialization.add_safe_globals`` instead of loading with
``weights_only=False`` (which would run arbitrary code from a checkpoint):

* ``mmengine.logging.history_buffer.HistoryBuffer``;
* what its numpy arrays and numpy scalars (e.g. an ``np.float64`` best score)
  pickle to: ``numpy.core.multiarray._reconstruct``, ``numpy.ndarray``,
  ``numpy.dtype``, ``numpy.core.multiarray.scalar`` and the numeric / bool
  dtype classes (``numpy.dtypes.Float64DType`` ...; with numpy >= 1.25 a
  dtype is rebuilt as an instance of these). Both spellings of the module,
  ``numpy.core`` (numpy 1.x) and ``numpy._core`` (numpy 2.x), are listed so
  that checkpoints written under either numpy load. Object arrays stay
  refused.
* ``builtins.getattr``, **restricted**: ``HistoryBuffer.__getstate__`` saves
  its ``statistics_methods`` dict ``{'min': HistoryBuffer.min, ...}``, and
  pickle protocol 2 (``torch.save``'s default) stores a method as
  ``getattr(HistoryBuffer, 'min')``. Allow-listing the real ``getattr``
  would let a checkpoint fetch arbitrary attributes (and
  ``HistoryBuffer.__setstate__`` copies that dict into a class attribute
  whose values are later called). :func:`_checkpoint_getattr` is
  registered under the name ``builtins.getattr`` instead: it only returns
  public plain functions defined on ``HistoryBuffer`` itself and raises
  ``UnpicklingError`` for anything else. If the user allow-listed the real
  ``getattr`` themselves, it defers to it.

Loading never changes class-level state: ``HistoryBuffer.__setstate__``
copies the pickled ``statistics_methods`` into the *class* attribute
``HistoryBuffer._statistics_methods``, so a crafted checkpoint could replace
e.g. ``'mean'`` by ``HistoryBuffer.max`` for the whole process. The name
``mmengine.logging.history_buffer.HistoryBuffer`` is therefore allow-listed
as :class:`_LoadedHistoryBuffer`, whose ``__setstate__`` restores only the
instance state (a pickled method table that differs from the process's
registered methods is ignored with a warning) and then turns the object into
a plain ``HistoryBuffer``.

A never-updated ``HistoryBuffer`` (or any empty numpy array) pickles its
empty data buffer as ``bytes()``; ``builtins.bytes`` is allow-listed as
:func:`_checkpoint_bytes`, which only builds the empty ``bytes`` object.

Limitation: a statistics method registered with
``HistoryBuffer.register_statistics`` as a module-level function is pickled
as that function's global; such checkpoints still need
``torch.serialization.add_safe_globals([that_function])``, and the method is
only used if the loading process registered the same function itself.

Undeclared dependencies of mmseg
--------------------------------
mmsegmentation 1.2.2 imports ``ftfy`` and ``regex`` (``mmseg.utils``'s
tokenizer, pulled in by ``mmseg.models`` / ``mmseg.utils``) without declaring
them. Nothing here hides that; :func:`check_optional_deps` reports them with
the fix (``pip install ftfy regex``).
"""
import importlib.util
import warnings

from mmsoft.utils.safe_load import (RefusedGlobal, RestrictedUnpickler,
                                    mmengine_safe_globals, native_allow_list,
                                    safe_torch_load, torch_version,
                                    unsafe_globals)

__all__ = [
    'check_optional_deps', 'register_safe_globals',
    'MMENGINE_SAFE_GLOBALS', 'OPTIONAL_DEPS', 'safe_torch_load',
    'unsafe_globals', 'RefusedGlobal', 'RestrictedUnpickler',
    'native_allow_list', 'torch_version', 'unravel_index',
    'is_autocast_enabled', 'autocast_dtype', 'tree_leaves', 'sdpa_math',
    'onnx_export_takes_dynamo', 'grad_scaler'
]

#: packages mmseg imports without declaring them -> why they are needed
OPTIONAL_DEPS = {
    'ftfy': 'imported by mmseg.utils (tokenizer) in mmsegmentation 1.2.2',
    'regex': 'imported by mmseg.utils (tokenizer) in mmsegmentation 1.2.2',
}

#: filled by :func:`register_safe_globals`
MMENGINE_SAFE_GLOBALS = []


def register_safe_globals():
    """Add the allow-list of what mmengine training checkpoints pickle
    (module doc) to torch's weights-only unpickler; idempotent.

    ``import mmsoft`` calls this, the one process-wide change it makes:
    mmengine 0.10 calls ``torch.load`` without ``weights_only``, which is
    True by default since torch 2.6, so ``Runner(resume / load_from)``, the
    inferencers (which load before any model is built) and ``torch.load``
    of any ``epoch_N.pth`` fail on mmengine's own ``HistoryBuffer``.
    torch's allow-list is process-global by design and mmengine passes no
    per-call list; the alternative, ``weights_only=False``, runs code from
    the file. The entries only widen what ``torch.load`` accepts, to
    objects that cannot run code or change state. Returns False (nothing
    registered) before torch 2.6, where ``torch.load`` unpickles anything
    by default and mmsoft's own loaders use
    :class:`mmsoft.utils.safe_load.RestrictedUnpickler`.
    """
    if not native_allow_list():
        return False
    from torch.serialization import add_safe_globals
    MMENGINE_SAFE_GLOBALS[:] = mmengine_safe_globals()
    add_safe_globals(MMENGINE_SAFE_GLOBALS)  # a set union: idempotent
    return True


# ------------------------------------------------------- torch shims
def autocast_dtype(device_type):
    """The autocast dtype of ``device_type`` ('cpu', 'cuda') if autocast is
    on there, else None, on every torch: torch >= 2.4 asks by device type
    (``torch.is_autocast_enabled(device)``, ``torch.get_autocast_dtype``);
    before, the CPU has its own functions and the plain ones are CUDA's.
    Chosen by the torch version, not by catching a ``TypeError`` (under
    Dynamo on torch 2.1 that is an internal compiler error). The one home
    of this question (the safe conv and the AMP code ask it here)."""
    import torch
    if hasattr(torch, 'get_autocast_dtype'):  # torch >= 2.4
        if not torch.is_autocast_enabled(device_type):
            return None
        return torch.get_autocast_dtype(device_type)
    if device_type == 'cpu':
        if not torch.is_autocast_cpu_enabled():
            return None
        return torch.get_autocast_cpu_dtype()
    if not torch.is_autocast_enabled():
        return None
    return torch.get_autocast_gpu_dtype()


def is_autocast_enabled(device_type):
    """``torch.is_autocast_enabled(device_type)`` (torch >= 2.4) on every
    torch (see :func:`autocast_dtype`)."""
    return autocast_dtype(device_type) is not None


def onnx_export_takes_dynamo():
    """True when ``torch.onnx.export`` has the ``dynamo`` argument (the
    torch.export-based exporter; torch >= 2.5)."""
    import inspect

    import torch
    return 'dynamo' in inspect.signature(torch.onnx.export).parameters


def sdpa_math():
    """A context in which ``F.scaled_dot_product_attention`` runs its math
    kernel (it materialises the n x n matrix): ``torch.nn.attention
    .sdpa_kernel(SDPBackend.MATH)`` (torch >= 2.3), before: the
    ``torch.backends.cuda.sdp_kernel`` flags (the CPU had no other kernel)."""
    import torch
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return torch.backends.cuda.sdp_kernel(
            enable_flash=False, enable_math=True, enable_mem_efficient=False)
    return sdpa_kernel(SDPBackend.MATH)


def grad_scaler(device_type, **kwargs):
    """``torch.amp.GradScaler(device_type, ...)`` (torch >= 2.3); before:
    ``torch.cuda.amp.GradScaler`` (CUDA's, the only one)."""
    import torch
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler(device_type, **kwargs)
    return torch.cuda.amp.GradScaler(**kwargs)


def tree_leaves(tree):
    """``torch.utils._pytree.tree_leaves`` (torch >= 2.2) on every torch."""
    from torch.utils import _pytree
    if hasattr(_pytree, 'tree_leaves'):
        return _pytree.tree_leaves(tree)
    return _pytree.tree_flatten(tree)[0]


def unravel_index(indices, shape):
    """``torch.unravel_index`` (torch >= 2.2) on every torch: the tuple of
    coordinate tensors of the flat ``indices`` into ``shape``."""
    import torch
    if hasattr(torch, 'unravel_index'):
        return tuple(torch.unravel_index(indices, tuple(shape)))
    out = []
    for size in reversed(tuple(shape)):
        out.append(torch.remainder(indices, size))
        indices = torch.div(indices, size, rounding_mode='floor')
    return tuple(reversed(out))


def check_optional_deps(warn=True):
    """Report packages mmseg needs but does not declare (ftfy, regex).

    Nothing is installed or stubbed: a missing one still fails where mmseg
    imports it; this only says which and how to fix it.

    Returns:
        list[str]: the missing packages (empty when all are importable).
    """
    missing = [
        name for name in OPTIONAL_DEPS
        if importlib.util.find_spec(name) is None
    ]
    if missing and warn:
        warnings.warn(
            'mmsoft: missing packages needed by mmsegmentation: ' +
            ', '.join(f'{m} ({OPTIONAL_DEPS[m]})' for m in missing) +
            f'; fix: pip install {" ".join(missing)}',
            stacklevel=2)
    return missing
