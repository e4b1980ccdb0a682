"""Compatibility fixes for torch >= 2.6 (verified: 2.14.1) + mmengine 0.10.7.

:func:`apply` is idempotent and returns the names of the fixes in effect.
``import mmsoft`` does not call it: :func:`mmsoft.setup` does (once), which
runs when a SOFT backbone or an mmsoft hook is built and in the tools (see
:mod:`mmsoft.runtime`). Each fix below names the failure it addresses.

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
    'apply', 'applied', 'check_optional_deps', 'MMENGINE_SAFE_GLOBALS',
    'OPTIONAL_DEPS', 'safe_torch_load', 'unsafe_globals', 'RefusedGlobal',
    'RestrictedUnpickler', 'native_allow_list', 'torch_version'
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


def _user_safe_globals():
    """What the user allow-listed with ``torch.serialization`` (torch >=
    2.4; nothing before)."""
    import torch
    get = getattr(torch.serialization, 'get_safe_globals', None)
    return get() if get is not None else []


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
    if getattr in _user_safe_globals():
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
    if bytes in _user_safe_globals():
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


# ------------------------------------------------ weights-only loading
def torch_version(version=None):
    """(major, minor) of torch's version (or of ``version``)."""
    if version is None:
        import torch
        version = torch.__version__
    parts = []
    for part in str(version).split('+')[0].split('.')[:2]:
        digits = ''.join(c for c in part if c.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def native_allow_list():
    """True when torch's own weights-only unpickler can take mmsoft's
    allow-list (``torch.serialization.safe_globals`` with ``(obj, name)``
    entries and ``BUILD`` of allow-listed classes: torch >= 2.6). Before,
    :func:`safe_torch_load` unpickles with :class:`RestrictedUnpickler`."""
    return torch_version() >= (2, 6)


class RefusedGlobal(pickle.UnpicklingError):
    """A checkpoint names a global outside the allow-list; ``name`` is it
    (``module.qualname``)."""

    def __init__(self, name):
        self.name = name
        super().__init__(
            f'mmsoft: refusing the pickled global {name}: only tensors, '
            'plain containers and allow-listed objects are unpickled')


def _torch_allowed_globals():
    """What torch's weights-only unpickler allows (tensors, storages,
    dtypes, ``OrderedDict``, ``torch.Size`` ...): ``'module.name'`` ->
    object."""
    try:
        from torch._weights_only_unpickler import _get_allowed_globals
        return dict(_get_allowed_globals())
    except ImportError:  # pragma: no cover - torch without the module
        import collections

        import torch
        import torch._utils as tu
        out = {'collections.OrderedDict': collections.OrderedDict,
               'torch.Size': torch.Size}
        for name in dir(tu):
            if name.startswith('_rebuild_'):
                out[f'torch._utils.{name}'] = getattr(tu, name)
        return out


def _checkpoint_codecs_encode(obj, encoding='utf-8', errors='strict'):
    """``_codecs.encode`` as :class:`RestrictedUnpickler` sees it: pickle
    protocol 2 (``torch.save``'s) stores ``bytes`` (e.g. a numpy array's
    data) as ``_codecs.encode(<str>, 'latin1')``; only str -> bytes."""
    import codecs
    if not isinstance(obj, str) or encoding not in ('latin1', 'latin-1'):
        raise pickle.UnpicklingError(
            f'mmsoft.compat: refusing _codecs.encode of a '
            f'{type(obj).__name__} with {encoding!r} while loading a '
            'checkpoint')
    return codecs.encode(obj, encoding, errors)


def _allow_list(extra=()):
    """``'module.name'`` -> object for :class:`RestrictedUnpickler`:
    torch's own list, mmengine's training checkpoints (as
    :func:`_mmengine_safe_globals`, when mmengine is installed) and
    ``extra`` (objects or ``(object, 'module.name')`` pairs)."""
    out = _torch_allowed_globals()
    out['_codecs.encode'] = _checkpoint_codecs_encode
    entries = list(extra)
    if importlib.util.find_spec('mmengine') is not None:
        entries = _mmengine_safe_globals() + entries
    for entry in entries:
        obj, name = entry if isinstance(entry, tuple) else (
            entry, f'{entry.__module__}.{entry.__qualname__}')
        out[name] = obj
    return out


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that resolves only allow-listed globals (the
    "Restricting Globals" recipe of the :mod:`pickle` docs): a checkpoint
    cannot name ``os.system``, ``builtins.eval``, a class with a harmful
    ``__reduce__`` ...; anything else raises :class:`RefusedGlobal`.
    :func:`safe_torch_load` hands it to ``torch.load`` as the pickle module
    on torch < 2.6, whose weights-only unpickler has no allow-list API."""

    allowed = {}

    def find_class(self, module, name):
        # protocol < 3 names Python 2 modules (``__builtin__.getattr``):
        # the same mapping as pickle's ``fix_imports``
        import _compat_pickle
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        full = f'{module}.{name}'
        obj = self.allowed.get(full)
        if obj is None:
            raise RefusedGlobal(full)
        return obj


def _restricted_pickle_module(extra=()):
    """A module object that ``torch.load(pickle_module=...)`` accepts:
    ``Unpickler`` (restricted), ``load`` and ``Unpickler``'s errors."""
    allowed = _allow_list(extra)

    class Unpickler(RestrictedUnpickler):
        pass

    Unpickler.allowed = allowed

    def load(file, **kwargs):
        return Unpickler(file, **kwargs).load()

    mod = types.ModuleType('mmsoft_restricted_pickle')
    mod.Unpickler = Unpickler
    mod.load = load
    mod.UnpicklingError = pickle.UnpicklingError
    mod.__name__ = 'mmsoft_restricted_pickle'
    return mod


def safe_torch_load(f, map_location=None, extra=()):
    """``torch.load`` that never runs code from the file, on every torch.

    Unpickles tensors, plain containers, mmengine's training checkpoint
    objects (see the module doc) and ``extra`` (objects or ``(object,
    'module.name')`` pairs); any other pickled global raises
    ``pickle.UnpicklingError`` (:class:`RefusedGlobal` on torch < 2.6).
    torch >= 2.6: its weights-only unpickler with the allow-list;
    before (``weights_only`` defaults to False there, and torch < 2.5 has
    no ``safe_globals``): :class:`RestrictedUnpickler`.
    """
    import torch
    if native_allow_list():
        apply()  # mmengine's globals are allow-listed process-wide
        if extra:
            with torch.serialization.safe_globals(list(extra)):
                return torch.load(
                    f, map_location=map_location, weights_only=True)
        return torch.load(f, map_location=map_location, weights_only=True)
    return torch.load(
        f,
        map_location=map_location,
        weights_only=False,
        pickle_module=_restricted_pickle_module(extra))


def unsafe_globals(path, extra=()):
    """Globals of the checkpoint ``path`` that :func:`safe_torch_load`
    refuses (``module.name``; the first one on torch < 2.5)."""
    import torch
    allowed = _allow_list(extra)
    if hasattr(torch.serialization, 'get_unsafe_globals_in_checkpoint'):
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(
                path)
        except Exception:  # noqa: BLE001 - e.g. a legacy (non-zip) file
            found = None
        if found is not None:
            return [g for g in found if g not in allowed]
    try:
        torch.load(
            path,
            map_location='cpu',
            weights_only=False,
            pickle_module=_restricted_pickle_module(extra))
    except RefusedGlobal as e:
        return [e.name]
    except Exception:  # noqa: BLE001 - damaged files: not our question
        pass
    return []


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
