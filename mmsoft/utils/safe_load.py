"""``torch.load`` that never runs code from a checkpoint, on every torch.

:func:`safe_torch_load` unpickles tensors, plain containers and an
allow-list: what mmengine's training checkpoints hold (``HistoryBuffer``
and its numpy arrays, a restricted ``getattr`` / ``bytes``; why each entry
is needed and safe: :mod:`mmsoft.compat`) and what the caller adds.

* torch >= 2.6: torch's own weights-only unpickler with the allow-list
  (``torch.serialization.safe_globals``);
* torch < 2.6 (``weights_only`` defaults to False; no ``safe_globals``
  before 2.5, and the weights-only unpickler cannot ``BUILD`` allow-listed
  classes): :class:`RestrictedUnpickler` ("Restricting Globals" of the
  :mod:`pickle` docs), which resolves torch's weights-only allow-list plus
  mmsoft's, given to ``torch.load`` as its pickle module.
"""
import importlib.util
import pickle
import types
import warnings

__all__ = [
    'safe_torch_load', 'unsafe_globals', 'RefusedGlobal',
    'RestrictedUnpickler', 'native_allow_list', 'torch_version',
    'mmengine_safe_globals'
]

_MMENGINE_SAFE = []  # built once by mmengine_safe_globals()
#: (alias, class): _checkpoint_getattr returns public functions of class
_GETATTR_OWNERS = ()


def _user_safe_globals():
    """What the user allow-listed with ``torch.serialization`` (>= 2.4)."""
    import torch
    get = getattr(torch.serialization, 'get_safe_globals', None)
    return get() if get is not None else []


def _checkpoint_getattr(obj, name):
    """``getattr`` for the unpickler: only a public plain function defined
    on an allow-listed class (``getattr(HistoryBuffer, 'mean')``)."""
    owner = next(
        (real
         for alias, real in _GETATTR_OWNERS if obj is alias or obj is real),
        None)
    if owner is not None and isinstance(name, str) and \
            not name.startswith('_') and isinstance(
                vars(owner).get(name), types.FunctionType):
        return getattr(owner, name)
    if getattr in _user_safe_globals():  # the user trusts the real getattr
        return getattr(obj, name)
    raise pickle.UnpicklingError(
        f'mmsoft: refusing getattr({obj!r}, {name!r}) while loading a '
        'checkpoint with weights_only=True; only public methods of '
        f'{[real.__qualname__ for _, real in _GETATTR_OWNERS]} are allowed.')


def _checkpoint_bytes(*args):
    """``bytes`` for the unpickler: protocol 2 stores an empty ``bytes``
    (an empty array's data) as ``bytes()``; only that is built."""
    if not args:
        return b''
    if bytes in _user_safe_globals():
        return bytes(*args)
    raise pickle.UnpicklingError(
        f'mmsoft: refusing bytes{args!r} while loading a checkpoint '
        'with weights_only=True; only bytes() is allowed.')


def _make_loaded_history_buffer():
    from mmengine.logging.history_buffer import HistoryBuffer

    class _LoadedHistoryBuffer(HistoryBuffer):
        """A pickled ``HistoryBuffer`` is rebuilt as this; it becomes a
        plain ``HistoryBuffer`` without touching the class's
        ``_statistics_methods`` (:mod:`mmsoft.compat`)."""

        def __setstate__(self, state):
            state = dict(state)
            methods = state.pop('statistics_methods', {})
            self._set_default_statistics()  # setdefault: replaces nothing
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
    """numpy globals that numeric arrays / scalars / dtypes pickle to, under
    both module spellings (numpy.core: 1.x, numpy._core: 2.x)."""
    import numpy as np
    out = [np.ndarray, np.dtype]
    try:
        from numpy._core import multiarray
        multiarray._reconstruct, multiarray.scalar
    except (ImportError, AttributeError):  # numpy < 1.26
        from numpy.core import multiarray
    for fn in (multiarray._reconstruct, multiarray.scalar):
        for mod in ('numpy.core.multiarray', 'numpy._core.multiarray'):
            out.append((fn, f'{mod}.{fn.__name__}'))
    for code in '?bhilqBHILQefdgFDG':  # numpy >= 1.25: dtype classes
        cls = type(np.dtype(code))
        if cls is not np.dtype and cls not in out:
            out.append(cls)
    return out


def mmengine_safe_globals():
    """The allow-list of mmengine's training checkpoints (objects and
    ``(object, 'module.name')`` pairs); built once."""
    global _GETATTR_OWNERS
    if not _MMENGINE_SAFE:
        from mmengine.logging.history_buffer import HistoryBuffer
        loaded = _make_loaded_history_buffer()
        _GETATTR_OWNERS = ((loaded, HistoryBuffer), )
        _MMENGINE_SAFE[:] = [
            (loaded, 'mmengine.logging.history_buffer.HistoryBuffer'),
            (_checkpoint_getattr, 'builtins.getattr'),
            (_checkpoint_bytes, 'builtins.bytes')
        ] + _numpy_safe_globals()
    return list(_MMENGINE_SAFE)


def torch_version(version=None):
    """(major, minor) of torch's version (or of ``version``)."""
    if version is None:
        import torch
        version = torch.__version__
    return tuple(
        int(''.join(c for c in part if c.isdigit()) or 0)
        for part in str(version).split('+')[0].split('.')[:2])


def native_allow_list():
    """True when torch's weights-only unpickler takes mmsoft's allow-list
    (``(obj, name)`` entries, ``BUILD`` of allow-listed classes): >= 2.6."""
    return torch_version() >= (2, 6)


class RefusedGlobal(pickle.UnpicklingError):
    """A checkpoint names a global outside the allow-list (``name``)."""

    def __init__(self, name):
        self.name = name
        super().__init__(
            f'mmsoft: refusing the pickled global {name}: only tensors, '
            'plain containers and allow-listed objects are unpickled')


#: what torch 2.14's weights-only unpickler allows beyond torch 2.1's
_NEWER_TORCH_ALLOWED = ('builtins.set', 'builtins.complex',
                        'collections.Counter', 'torch.device',
                        'torch._utils._rebuild_tensor_v3',
                        'torch._utils._rebuild_parameter_with_state',
                        'torch._utils._rebuild_qtensor',
                        'torch._utils._rebuild_device_tensor_from_numpy',
                        'torch._utils._rebuild_device_tensor_from_cpu_tensor',
                        'torch._utils._rebuild_nested_tensor',
                        'torch._utils._rebuild_wrapper_subclass')


def _checkpoint_codecs_encode(obj, encoding='utf-8', errors='strict'):
    """``_codecs.encode`` for :class:`RestrictedUnpickler`: protocol 2
    stores ``bytes`` as ``_codecs.encode(<str>, 'latin1')``; only that."""
    import codecs
    if not isinstance(obj, str) or encoding not in ('latin1', 'latin-1'):
        raise pickle.UnpicklingError(
            f'mmsoft: refusing _codecs.encode of a {type(obj).__name__} '
            f'with {encoding!r} while loading a checkpoint')
    return codecs.encode(obj, encoding, errors)


def _allow_list(extra=()):
    """``'module.name'`` -> object: torch's weights-only list (at least
    torch 2.14's), mmengine's checkpoint objects and ``extra``."""
    import builtins
    import collections

    import torch
    from torch._weights_only_unpickler import _get_allowed_globals
    out = dict(_get_allowed_globals())
    modules = dict(
        builtins=builtins,
        collections=collections,
        torch=torch,
        **{'torch._utils': torch._utils})
    for full in _NEWER_TORCH_ALLOWED:
        mod, _, name = full.rpartition('.')
        if hasattr(modules[mod], name):
            out.setdefault(full, getattr(modules[mod], name))
    for name in dir(torch):  # every dtype and quantisation scheme
        obj = getattr(torch, name, None)
        if isinstance(obj, (torch.dtype, torch.qscheme)):
            out.setdefault(f'torch.{name}', obj)
    out['_codecs.encode'] = _checkpoint_codecs_encode
    entries = list(extra)
    if importlib.util.find_spec('mmengine') is not None:
        entries = mmengine_safe_globals() + entries
    for entry in entries:
        obj, name = entry if isinstance(
            entry, tuple) else (entry,
                                f'{entry.__module__}.{entry.__qualname__}')
        out[name] = obj
    return out


class RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the globals of :attr:`allowed` (anything else raises
    :class:`RefusedGlobal`); used on torch < 2.6."""

    allowed = {}

    def find_class(self, module, name):
        import _compat_pickle  # protocol < 3: Python 2 names, as fix_imports
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        obj = self.allowed.get(f'{module}.{name}')
        if obj is None:
            raise RefusedGlobal(f'{module}.{name}')
        return obj


def _restricted_pickle_module(extra=()):
    """A module for ``torch.load(pickle_module=...)``: the restricted
    ``Unpickler``, ``load`` and ``UnpicklingError``."""
    Unpickler = type('Unpickler', (RestrictedUnpickler, ),
                     dict(allowed=_allow_list(extra)))
    mod = types.ModuleType('mmsoft_restricted_pickle')
    mod.Unpickler = Unpickler
    mod.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    mod.UnpicklingError = pickle.UnpicklingError
    return mod


def safe_torch_load(f, map_location=None, extra=()):
    """``torch.load`` that never runs code from the file, on every torch.

    Unpickles tensors, plain containers, mmengine's training checkpoint
    objects and ``extra`` (objects or ``(object, 'module.name')`` pairs);
    any other pickled global raises ``pickle.UnpicklingError``. The
    process-wide allow-list is left as it was.
    """
    import torch
    if not native_allow_list():
        return torch.load(
            f,
            map_location=map_location,
            weights_only=False,
            pickle_module=_restricted_pickle_module(extra))
    safe = list(extra)
    if importlib.util.find_spec('mmengine') is not None:
        safe = mmengine_safe_globals() + safe
    # only new entries: leaving the context removes what it added
    have = torch.serialization.get_safe_globals()
    with torch.serialization.safe_globals([e for e in safe if e not in have]):
        return torch.load(f, map_location=map_location, weights_only=True)


def unsafe_globals(path, extra=()):
    """Globals of the checkpoint ``path`` that :func:`safe_torch_load`
    refuses (``module.name``; only the first one on torch < 2.5)."""
    import torch
    allowed = _allow_list(extra)
    if hasattr(torch.serialization, 'get_unsafe_globals_in_checkpoint'):
        try:
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
            return [g for g in found if g not in allowed]
        except Exception:  # noqa: BLE001 - e.g. a legacy (non-zip) file
            pass
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
