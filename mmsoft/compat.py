"""Compatibility with the supported stacks (torch 2.1 to 2.14, mmengine 0.10).

``import mmsoft`` calls :func:`register_safe_globals`, and nothing else
here changes the process. The two torch shims below answer one
version-dependent question each for the model code (the tools' own shims:
``tools/mmsoft_tools/torch_compat.py``).

The allow-list of mmengine training checkpoints
-----------------------------------------------
Since torch 2.6 ``torch.load`` defaults to ``weights_only=True``; mmengine
0.10.7 calls it without ``weights_only`` and every Runner checkpoint holds
the ``MessageHub`` state (``HistoryBuffer`` objects with numpy arrays), so
``Runner(resume / load_from)``, ``load_checkpoint``, the inferencers and
``torch.load`` of any ``epoch_N.pth`` fail with ``Unsupported global:
GLOBAL mmengine.logging.history_buffer.HistoryBuffer``. The allow-list
holds exactly what such checkpoints contain, instead of
``weights_only=False`` (which runs code from the file):

* ``HistoryBuffer``, as :class:`_LoadedHistoryBuffer`, whose
  ``__setstate__`` restores the instance only: mmengine's copies the
  pickled method table into the *class* (a crafted file could make every
  ``'mean'`` a max); a differing table is ignored with a warning;
* what numeric numpy arrays, scalars and dtypes pickle to, under
  ``numpy.core`` and ``numpy._core`` (object arrays stay refused);
* ``builtins.getattr`` as :func:`_checkpoint_getattr`: protocol 2 pickles
  ``HistoryBuffer.min`` as ``getattr(HistoryBuffer, 'min')``; only public
  plain functions of ``HistoryBuffer`` are returned;
* ``builtins.bytes`` as :func:`_checkpoint_bytes`: only ``bytes()`` (an
  empty array's data).

If the user allow-listed the real ``getattr`` / ``bytes``, they are used.
A statistics method registered as a module-level function still needs the
user's own ``add_safe_globals``.
"""
from mmsoft.utils.safe_load import (RefusedGlobal, RestrictedUnpickler,
                                    mmengine_safe_globals, native_allow_list,
                                    safe_torch_load, torch_version,
                                    unsafe_globals)

__all__ = [
    'register_safe_globals', 'MMENGINE_SAFE_GLOBALS', 'safe_torch_load',
    'unsafe_globals', 'RefusedGlobal', 'RestrictedUnpickler',
    'native_allow_list', 'torch_version', 'unravel_index', 'autocast_dtype'
]

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
