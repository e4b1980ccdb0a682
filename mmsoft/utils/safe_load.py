"""``torch.load`` that never runs code from a checkpoint
(docs/en/advanced_guides/compatibility.md)."""
import codecs
import contextlib
import importlib
import io
import pickle
import sys
import types
import warnings
import zipfile

import torch
from mmengine.logging.history_buffer import HistoryBuffer


class _LoadedHistoryBuffer(HistoryBuffer):
    """Restores the instance only (not the pickled class method table)."""

    __qualname__ = 'HistoryBuffer(loading)'

    def __setstate__(self, state):
        state = dict(state)
        methods = dict(state.pop('statistics_methods', {}))
        self._set_default_statistics()  # setdefault: replaces nothing
        odd = sorted(
            str(k) for k, v in methods.items()
            if HistoryBuffer._statistics_methods.get(k) is not v)
        if odd:
            warnings.warn(
                f'mmsoft.compat: ignoring the statistics methods {odd} '
                'pickled with a HistoryBuffer: they differ from the ones '
                'registered in this process (loading a checkpoint does not '
                'change HistoryBuffer)',
                stacklevel=2)
        self.__dict__.update(state)
        self.__class__ = HistoryBuffer


def _limited(real, ok, what, allowed):
    """``real`` for the calls ``ok`` accepts (or allow-listed in torch)."""

    def call(*args):
        if ok(*args) or real in getattr(torch.serialization,
                                        'get_safe_globals', list)():
            return real(*args)
        raise pickle.UnpicklingError(
            f'mmsoft: refusing {what(*args)} while loading a checkpoint with '
            f'weights_only=True; only {allowed} is allowed.')

    return call


#: ``getattr`` limited to public functions of HistoryBuffer
_checkpoint_getattr = _limited(
    getattr, lambda obj, name: any(
        obj is c for c in (HistoryBuffer, _LoadedHistoryBuffer)
    ) and isinstance(name, str) and not name.startswith('_') and isinstance(
        vars(HistoryBuffer).get(name), types.FunctionType),
    lambda obj, name: f'getattr({obj!r}, {name!r})',
    'a public method of HistoryBuffer')
#: ``bytes`` limited to ``bytes()`` (an empty array's data)
_checkpoint_bytes = _limited(bytes, lambda *args: not args,
                             lambda *args: f'bytes{args!r}', 'bytes()')

#: ``_codecs.encode`` limited to protocol 2's ``bytes`` (latin1)
_checkpoint_codecs_encode = _limited(
    codecs.encode,
    lambda obj, enc='utf-8', *_: isinstance(obj, str) and enc in
    ('latin1', 'latin-1'),
    lambda obj, enc='utf-8', *_:
    f'_codecs.encode of a {type(obj).__name__} with {enc!r}',
    "encode(str, 'latin1')")


def mmengine_safe_globals():
    """The allow-list of mmengine's training checkpoints (numpy 1.x, 2.x)."""
    import numpy as np
    try:
        from numpy._core import multiarray as ma
        ma._reconstruct, ma.scalar
    except (ImportError, AttributeError):  # numpy < 1.26
        from numpy.core import multiarray as ma
    dtypes = dict.fromkeys(type(np.dtype(c)) for c in '?bhilqBHILQefdgFDG')
    return [(_LoadedHistoryBuffer,
             'mmengine.logging.history_buffer.HistoryBuffer'),
            (_checkpoint_getattr, 'builtins.getattr'),
            (_checkpoint_bytes, 'builtins.bytes'), np.ndarray, np.dtype] + [
                (fn, f'{mod}.{fn.__name__}')
                for fn in (ma._reconstruct, ma.scalar)
                for mod in ('numpy.core.multiarray', 'numpy._core.multiarray')
            ] + [c for c in dtypes if c is not np.dtype]  # numpy >= 1.25


def torch_version(version=None):
    """(major, minor) of torch's version (or of ``version``)."""
    return tuple(
        int(''.join(c for c in part if c.isdigit()) or 0) for part in str(
            version or torch.__version__).split('+')[0].split('.')[:2])


def native_allow_list():
    """Whether torch's weights-only unpickler takes the allow-list."""
    return torch_version() >= (2, 6)


#: what torch 2.14's weights-only unpickler allows beyond torch 2.1's
_NEWER_TORCH_ALLOWED = ('builtins.set', 'builtins.complex',
                        'collections.Counter', 'torch.device') + tuple(
                            f'torch._utils._rebuild_{n}'
                            for n in ('tensor_v3', 'parameter_with_state',
                                      'qtensor', 'device_tensor_from_numpy',
                                      'device_tensor_from_cpu_tensor',
                                      'nested_tensor', 'wrapper_subclass'))


def _allow_list(extra=()):
    """``'module.name'`` -> object that :func:`safe_torch_load` allows."""
    from torch._weights_only_unpickler import _get_allowed_globals
    out = {  # every dtype and quantisation scheme
        f'torch.{n}': o
        for n, o in vars(torch).items()
        if isinstance(o, (torch.dtype, torch.qscheme))
    }
    for full in _NEWER_TORCH_ALLOWED:
        mod, _, name = full.rpartition('.')
        obj = getattr(importlib.import_module(mod), name, None)
        if obj is not None:
            out[full] = obj
    out.update(_get_allowed_globals())
    if not native_allow_list():  # torch >= 2.6 allows every codec itself
        out['_codecs.encode'] = _checkpoint_codecs_encode
    for e in mmengine_safe_globals() + list(extra):
        obj, name = e if isinstance(
            e, tuple) else (e, f'{e.__module__}.{e.__qualname__}')
        out[name] = obj
    return out


class _Stub:
    """Any global of a pickle that :class:`RestrictedUnpickler` walks."""
    __init__ = __setitem__ = __setstate__ = append = extend = \
        lambda *args, **kwargs: None
    __call__ = lambda *args, **kwargs: _Stub()  # noqa: E731


class RestrictedUnpickler(pickle.Unpickler):
    """Only the globals of :attr:`allowed`; or walks (``names``) a pickle."""

    allowed = {}

    def __init__(self, f, names=None, **kwargs):
        super().__init__(f, **kwargs)
        self.names, self.storages = names, {}
        if names is not None:
            self.persistent_load = self._storage

    def find_class(self, module, name):
        import _compat_pickle  # protocol < 3: Python 3's names
        module, name = _compat_pickle.NAME_MAPPING.get((module, name),
                                                       (module, name))
        full = f'{_compat_pickle.IMPORT_MAPPING.get(module, module)}.{name}'
        if self.names is not None:
            self.names.append(full)
            return type('Stub', (_Stub, ), dict(global_name=name))
        if self.allowed.get(full) is None:
            raise pickle.UnpicklingError(
                f'mmsoft: refusing the pickled global {full}: only tensors, '
                'plain containers and allow-listed objects are unpickled')
        return self.allowed[full]

    def _storage(self, pid):
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == 'storage':
            self.storages[str(pid[2])] = (getattr(pid[1], 'global_name',
                                                  None), pid[4])
        return _Stub()


def safe_torch_load(f, map_location=None, extra=()):
    """``torch.load`` that never runs code from the file."""
    if native_allow_list():
        with mmengine_checkpoints_allowed(extra):
            return torch.load(f, map_location=map_location, weights_only=True)
    Unpickler = type('Unpickler', (RestrictedUnpickler, ),
                     dict(allowed=_allow_list(extra)))
    mod = types.ModuleType('mmsoft_restricted_pickle')
    mod.Unpickler, mod.UnpicklingError = Unpickler, pickle.UnpicklingError
    mod.load = lambda file, **kwargs: Unpickler(file, **kwargs).load()
    return torch.load(
        f, map_location=map_location, weights_only=False, pickle_module=mod)


def mmengine_checkpoints_allowed(extra=()):
    """Inside: mmengine's training checkpoints load weights-only."""
    if not native_allow_list():
        return contextlib.nullcontext()
    have = torch.serialization.get_safe_globals()
    new = [e for e in mmengine_safe_globals() + list(extra) if e not in have]
    return torch.serialization.safe_globals(new)  # removes them afterwards


def unsafe_globals(path, extra=()):
    """Globals of ``path`` that :func:`safe_torch_load` refuses."""
    allowed = _allow_list(extra)
    find = getattr(torch.serialization, 'get_unsafe_globals_in_checkpoint',
                   None)
    for scan in (find, _pickled_globals):  # torch < 2.5, a legacy file
        with contextlib.suppress(Exception):
            return [g for g in scan(path) if g not in allowed]
    return []  # damaged files: not our question


def _pickled_globals(path):
    """The globals named by the first (at most 5) pickles of ``path``."""
    names = []
    with open(path, 'rb') as f:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(f) as z:
                pkl = next(n for n in z.namelist() if n.endswith('/data.pkl'))
                f = io.BufferedReader(io.BytesIO(z.read(pkl)))
        for _ in range(5):
            if not f.peek(1):
                break
            RestrictedUnpickler(f, names).load()
    return list(dict.fromkeys(names))


#: modules whose globals run code or reach the system when unpickled
_CODE_MODULES = frozenset(
    'os posix nt subprocess sys shutil socket builtins __builtin__ '
    'importlib runpy pty code codeop webbrowser ctypes pickle _pickle '
    'marshal types operator functools io _io tempfile pathlib glob '
    'multiprocessing threading signal asyncio platform commands posixpath '
    'ntpath pdb bdb timeit cProfile profile trace sqlite3 urllib http '
    'ftplib smtplib telnetlib zipimport pkgutil inspect gc'.split())
#: the plain data types of builtins; how protocols 0-2 rebuild an object
_DATA = frozenset([
    f'builtins.{n}' for n in
    ('set frozenset complex slice bytearray range dict list tuple bytes str '
     'int float bool object').split()
] + ['copyreg._reconstructor', 'copyreg.__newobj__', 'copyreg.__newobj_ex__'])


def code_globals(names):
    """The ``names`` that would run code when unpickled."""
    out = []
    for full in names:
        mod, _, name = str(full).rpartition('.')
        obj = sys.modules.get(mod)
        if full.replace('__builtin__.', 'builtins.', 1) in _DATA:
            continue
        for part in name.split('.') if obj is not None else ():
            obj = getattr(obj, part, None)
        if mod.split('.')[0] in _CODE_MODULES or not mod or (
                not name[:1].isupper() if obj is None
                or obj is sys.modules.get(mod) else not isinstance(obj, type)):
            out.append(full)
    return out
