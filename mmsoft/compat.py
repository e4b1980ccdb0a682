"""Compatibility fixes for torch >= 2.6 (verified: 2.14.1) + mmengine 0.10.7.

:func:`apply` is idempotent and returns the names of the fixes in effect.
``import mmsoft`` does not call it: :func:`mmsoft.setup` does (once), which
runs when a SOFT backbone or an mmsoft hook is built and in the tools (see
:mod:`mmsoft.runtime`). Each fix below names the failure it addresses.

One part of the first fix, the allow-list of
:func:`register_safe_globals`, is registered by ``import mmsoft`` itself:
mmengine's inferencers unpickle the checkpoint before anything builds a
SOFT model, so a detection / segmentation checkpoint written by
``tools/train.py`` could not be loaded by ``DetInferencer`` /
``MMSegInferencer`` (``demo/image_demo.py``) otherwise. It is the only
change ``import mmsoft`` makes to torch (none to mmengine).

Fix ``torch_load_mmengine_safe_globals``
----------------------------------------
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

Fix ``mmengine_verified_local_loader``
--------------------------------------
mmengine's loader of local checkpoint files is replaced by
:func:`mmsoft.utils.checkpoint_io.load_from_local`: a damaged (empty,
truncated, CRC-failing) file raises a ``CheckpointError`` saying so, and the
SHA-256 that mmsoft stores in its checkpoints is verified on every load
(resume, ``load_from``, ``tools/test.py``, ``init_cfg`` ``Pretrained``).

Undeclared dependencies of mmseg
--------------------------------
mmsegmentation 1.2.2 imports ``ftfy`` and ``regex`` (``mmseg.utils``'s
tokenizer, pulled in by ``mmseg.models`` / ``mmseg.utils``) without declaring
them. Nothing here hides that; :func:`check_optional_deps` reports them with
the fix (``pip install ftfy regex``).
"""
import importlib.util
import pickle
import types
import warnings

__all__ = [
    'apply', 'applied', 'check_optional_deps', 'register_safe_globals',
    'MMENGINE_SAFE_GLOBALS', 'OPTIONAL_DEPS'
]

#: packages mmseg imports without declaring them -> why they are needed
OPTIONAL_DEPS = {
    'ftfy': 'imported by mmseg.utils (tokenizer) in mmsegmentation 1.2.2',
    'regex': 'imported by mmseg.utils (tokenizer) in mmsegmentation 1.2.2',
}

#: names of the fixes applied so far (in order)
_APPLIED = []

#: (alias, class) pairs: :func:`_checkpoint_getattr` may return the public
#: functions of ``class`` when asked for those of ``alias`` or ``class``
_GETATTR_OWNERS = ()

#: filled by :func:`_mmengine_safe_globals` when the fix is applied
MMENGINE_SAFE_GLOBALS = []


def _checkpoint_getattr(obj, name):
    """``getattr`` as seen by torch's weights-only unpickler.

    Returns ``obj.<name>`` only when ``obj`` is an allow-listed class (e.g.
    mmengine's ``HistoryBuffer``) and ``name`` is a public plain function
    defined on that class; e.g. ``getattr(HistoryBuffer, 'mean')``.
    """
    # the unpickler hands us the class a GLOBAL resolved to: for
    # HistoryBuffer that is _LoadedHistoryBuffer, an alias of it here
    owner = next(
        (real
         for alias, real in _GETATTR_OWNERS if obj is alias or obj is real),
        None)
    if owner is not None and isinstance(name, str) and \
            not name.startswith('_') and isinstance(
                vars(owner).get(name), types.FunctionType):
        return getattr(owner, name)
    import torch
    if getattr in torch.serialization.get_safe_globals():
        # the user explicitly trusts the real getattr
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'mmsoft.compat: refusing getattr({obj!r}, {name!r}) while loading a '
        'checkpoint with weights_only=True; only public methods of '
        f'{[real.__qualname__ for _, real in _GETATTR_OWNERS]} are '
        'allowed.')


def _checkpoint_bytes(*args):
    """``bytes`` as seen by torch's weights-only unpickler: pickle protocol
    2 stores an empty ``bytes`` (e.g. the data of an empty numpy array) as
    ``bytes()``; only that is built (``bytes(n)`` would allocate n bytes)."""
    if not args:
        return b''
    import torch
    if bytes in torch.serialization.get_safe_globals():
        return bytes(*args)  # the user explicitly trusts the real bytes
    raise pickle.UnpicklingError(
        f'mmsoft.compat: refusing bytes{args!r} while loading a checkpoint '
        'with weights_only=True; only bytes() is allowed.')


def _make_loaded_history_buffer():
    from mmengine.logging.history_buffer import HistoryBuffer

    class _LoadedHistoryBuffer(HistoryBuffer):
        """What a pickled ``HistoryBuffer`` is rebuilt as; becomes a plain
        ``HistoryBuffer`` in ``__setstate__`` without touching the class's
        ``_statistics_methods`` (see the module doc)."""

        def __setstate__(self, state):
            state = dict(state)
            methods = state.pop('statistics_methods', {})
            # the built-in min / max / current / mean, as every
            # HistoryBuffer() does (setdefault: never replaces an entry)
            self._set_default_statistics()
            registered = HistoryBuffer._statistics_methods
            odd = sorted(
                str(k) for k, v in dict(methods).items()
                if registered.get(k) is not v)
            if odd:
                warnings.warn(
                    'mmsoft.compat: ignoring the statistics methods '
                    f'{odd} pickled with a HistoryBuffer: they differ from '
                    'the ones registered in this process (loading a '
                    'checkpoint does not change HistoryBuffer)',
                    stacklevel=2)
            self.__dict__.update(state)
            self.__class__ = HistoryBuffer

    _LoadedHistoryBuffer.__qualname__ = 'HistoryBuffer(loading)'
    return _LoadedHistoryBuffer


def _numpy_safe_globals():
    """numpy globals that numeric arrays / scalars / dtypes pickle to."""
    import numpy as np

    out = [np.ndarray, np.dtype]
    try:  # numpy 2 (numpy.core is a deprecated alias there); 1.26 has it too
        from numpy._core import multiarray
        multiarray._reconstruct, multiarray.scalar
    except (ImportError, AttributeError):  # numpy < 1.26
        from numpy.core import multiarray
    for fn in (multiarray._reconstruct, multiarray.scalar):
        for mod in ('numpy.core.multiarray', 'numpy._core.multiarray'):
            out.append((fn, f'{mod}.{fn.__name__}'))
    # with numpy >= 1.25 a dtype unpickles as an instance of its dtype class
    # (numpy.dtypes.Float64DType ...), which the unpickler must BUILD.
    codes = '?' + 'bhilqBHILQ' + 'efdg' + 'FDG'
    for code in codes:
        cls = type(np.dtype(code))
        if cls is not np.dtype and cls not in out:
            out.append(cls)
    return out


def _mmengine_safe_globals():
    global _GETATTR_OWNERS
    from mmengine.logging.history_buffer import HistoryBuffer

    loaded = _make_loaded_history_buffer()
    _GETATTR_OWNERS = ((loaded, HistoryBuffer), )
    return [(loaded, 'mmengine.logging.history_buffer.HistoryBuffer'),
            (_checkpoint_getattr, 'builtins.getattr'),
            (_checkpoint_bytes, 'builtins.bytes')] + _numpy_safe_globals()


def register_safe_globals():
    """Add the allow-list of what mmengine training checkpoints pickle
    (module doc) to torch's weights-only unpickler; idempotent.

    ``import mmsoft`` calls this (and only this): mmengine's inferencers
    (``DetInferencer``, ``MMSegInferencer``: ``BaseInferencer._init_model``)
    and any ``torch.load`` of a Runner checkpoint unpickle the file *before*
    a model is built, and the config's ``custom_imports=['mmsoft']`` is the
    only mmsoft code that has run by then. torch's allow-list is
    process-global by design (``torch.serialization.add_safe_globals``; the
    loaders of mmengine pass no per-call list), and the alternative,
    ``weights_only=False``, would let a checkpoint run arbitrary code. The
    entries only widen what ``torch.load`` accepts, to objects that cannot
    run code or change state (see the module doc). Returns False (nothing
    registered) with torch < 2.6.
    """
    return _fix_torch_load_mmengine_safe_globals()


def _fix_torch_load_mmengine_safe_globals():
    """Allow-list what mmengine training checkpoints need (see module doc).

    Returns False (nothing to fix) with torch < 2.6, whose ``torch.load``
    defaults to ``weights_only=False`` (and whose ``add_safe_globals``, where
    it exists, does not take the ``(obj, name)`` entries used here).
    """
    import torch
    from mmengine.utils import digit_version
    if digit_version(torch.__version__) < digit_version('2.6.0'):
        return False
    from torch.serialization import add_safe_globals
    if MMENGINE_SAFE_GLOBALS:  # applied before: add the same objects again
        add_safe_globals(MMENGINE_SAFE_GLOBALS)
        return True
    safe = _mmengine_safe_globals()
    add_safe_globals(safe)  # a set union: repeating it changes nothing
    MMENGINE_SAFE_GLOBALS[:] = safe
    return True


def _fix_mmengine_verified_local_loader():
    """Damage and checksum checks on mmengine's local loads (module doc)."""
    from mmsoft.utils.checkpoint_io import install_loader
    return install_loader()


_FIXES = (
    ('torch_load_mmengine_safe_globals',
     _fix_torch_load_mmengine_safe_globals),
    ('mmengine_verified_local_loader', _fix_mmengine_verified_local_loader),
)


def apply():
    """Apply the fixes; idempotent.

    Returns:
        list[str]: names of the fixes in effect (those applied by this call
        or an earlier one), in order.
    """
    for name, fix in _FIXES:
        if name not in _APPLIED and fix():
            _APPLIED.append(name)
    return list(_APPLIED)


def applied():
    """Names of the fixes applied so far."""
    return list(_APPLIED)


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
