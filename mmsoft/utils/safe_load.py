"""``torch.load`` that never runs code from a checkpoint, on every torch.

:func:`safe_torch_load` unpickles tensors, plain containers and an
allow-list: mmengine's training checkpoint objects (``HistoryBuffer`` with
its numpy arrays, restricted ``getattr`` / ``bytes``; why each entry is
needed and why it is safe: :mod:`mmsoft.compat`) and what the caller adds.
Any other pickled global (``os.system``, a class whose ``__reduce__`` runs
code ...) is refused:

* torch >= 2.6: torch's weights-only unpickler with the allow-list
  (``torch.serialization.safe_globals``);
* torch < 2.6: ``torch.load`` defaults to ``weights_only=False`` (it
  unpickles anything), torch < 2.5 has no ``safe_globals`` and torch < 2.4
  no ``add_safe_globals``, and before 2.6 the weights-only unpickler cannot
  ``BUILD`` allow-listed classes: :class:`RestrictedUnpickler` (the
  "Restricting Globals" recipe of the :mod:`pickle` docs) resolves only the
  names of torch's own weights-only allow-list plus mmsoft's, and is given
  to ``torch.load`` as its pickle module.

Every mmsoft loading path goes through it: mmengine's local loader after
:func:`mmsoft.setup` (``resume``, ``load_from``, ``tools/test.py``,
``init_cfg`` ``Pretrained``, the inferencers of ``demo/image_demo.py``, ONNX
export), :func:`mmsoft.utils.checkpoint_io.find_newest_complete` and the
converters.
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

#: built once by :func:`mmengine_safe_globals`
_MMENGINE_SAFE = []

#: (alias, class) pairs: :func:`_checkpoint_getattr` may return the public
#: functions of ``class`` when asked for those of ``alias`` or ``class``
_GETATTR_OWNERS = ()


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
        f'mmsoft: refusing getattr({obj!r}, {name!r}) while loading a '
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
        f'mmsoft: refusing bytes{args!r} while loading a checkpoint '
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


def mmengine_safe_globals():
    """The allow-list of mmengine's training checkpoints (see
    :mod:`mmsoft.compat`): ``(object, 'module.name')`` pairs and objects;
    built once."""
    global _GETATTR_OWNERS
    if _MMENGINE_SAFE:
        return list(_MMENGINE_SAFE)
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


#: what torch 2.14's weights-only unpickler allows beyond torch 2.1's
#: (mmengine checkpoints hold e.g. a ``collections.Counter``)
_NEWER_TORCH_ALLOWED = ('builtins.set', 'builtins.complex',
                        'collections.Counter', 'torch.device',
                        'torch._utils._rebuild_tensor_v3',
                        'torch._utils._rebuild_parameter_with_state',
                        'torch._utils._rebuild_qtensor',
                        'torch._utils._rebuild_device_tensor_from_numpy',
                        'torch._utils._rebuild_device_tensor_from_cpu_tensor',
                        'torch._utils._rebuild_nested_tensor',
                        'torch._utils._rebuild_wrapper_subclass')


def _torch_allowed_globals():
    """What torch's weights-only unpickler allows (tensors, storages,
    dtypes, ``OrderedDict``, ``torch.Size`` ...), at least what torch
    2.14's allows: ``'module.name'`` -> object."""
    import builtins
    import collections

    import torch
    from torch._weights_only_unpickler import _get_allowed_globals
    out = dict(_get_allowed_globals())
    modules = {
        'builtins': builtins,
        'collections': collections,
        'torch': torch,
        'torch._utils': torch._utils
    }
    for full in _NEWER_TORCH_ALLOWED:
        mod, _, name = full.rpartition('.')
        obj = getattr(modules[mod], name, None)
        if obj is not None:
            out.setdefault(full, obj)
    for name in dir(torch):  # every dtype and quantisation scheme
        obj = getattr(torch, name, None)
        if isinstance(obj, (torch.dtype, torch.qscheme)):
            out.setdefault(f'torch.{name}', obj)
    return out


def _checkpoint_codecs_encode(obj, encoding='utf-8', errors='strict'):
    """``_codecs.encode`` as :class:`RestrictedUnpickler` sees it: pickle
    protocol 2 (``torch.save``'s) stores ``bytes`` (e.g. a numpy array's
    data) as ``_codecs.encode(<str>, 'latin1')``; only str -> bytes."""
    import codecs
    if not isinstance(obj, str) or encoding not in ('latin1', 'latin-1'):
        raise pickle.UnpicklingError(
            f'mmsoft: refusing _codecs.encode of a '
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
        entries = mmengine_safe_globals() + entries
    for entry in entries:
        obj, name = entry if isinstance(
            entry, tuple) else (entry,
                                f'{entry.__module__}.{entry.__qualname__}')
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
        safe = list(extra)
        if importlib.util.find_spec('mmengine') is not None:
            safe = mmengine_safe_globals() + safe
        # only what is not allow-listed yet: leaving the context removes
        # its entries (also those the process had allow-listed before)
        have = torch.serialization.get_safe_globals()
        safe = [e for e in safe if e not in have]
        with torch.serialization.safe_globals(safe):
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
            found = torch.serialization.get_unsafe_globals_in_checkpoint(path)
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
