""":mod:`mmsoft.utils.safe_load` in detail: the one-line refusals of the
restricted stand-ins, :func:`unsafe_globals` (zip, legacy, plain pickles),
the restricted unpickler of torch < 2.6 and HistoryBuffer's restoring."""
import codecs
import os
import pickle
import shutil
import warnings

import numpy as np
import pytest
import torch
from conftest import needs_torch
from mmengine.logging import HistoryBuffer

from mmsoft import compat
from mmsoft.utils import safe_load

_CPU_TAG = b'X\x03\x00\x00\x00cpu'  # a CPU storage's tag in a pickle


def retag(path, tag=b'mmsoft_absent_device'):
    """The legacy file ``path`` as if saved on a device this machine lacks."""
    with open(path, 'rb') as f:
        data = f.read()
    assert _CPU_TAG in data
    with open(path, 'wb') as f:
        f.write(
            data.replace(_CPU_TAG,
                         b'X' + len(tag).to_bytes(4, 'little') + tag))


class _Call:
    """Pickles to ``fn(*args)``."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


class _Allowed:
    """A class a caller allows through ``extra``."""


def _refusal(what, allowed):
    return (f'mmsoft: refusing {what} while loading a checkpoint with '
            f'weights_only=True; only {allowed} is allowed.')


def _runner_load(path):
    """torch.load in the Runner's context (SafeCheckpointHook enters it)."""
    with compat.mmengine_checkpoints_allowed():
        return torch.load(path)


@pytest.mark.parametrize('load', [
    safe_load.safe_torch_load,
    pytest.param(
        _runner_load,
        marks=needs_torch('2.6', 'torch.load weights-only by default'))
])
@pytest.mark.parametrize(
    'owner,name',
    [
        (np.ndarray, 'mean'),  # not an allow-listed owner
        (np.ndarray, 'tofile'),
        (torch.Tensor, 'new_empty'),
        (HistoryBuffer, '_set_default_statistics'),  # private
        (HistoryBuffer, '__init__'),
        (HistoryBuffer, '_statistics_methods'),  # not a function
    ])
def test_getattr_is_only_a_public_method_of_history_buffer(
        tmp_path, load, owner, name):
    """Refused in one line naming the call (another owner's); the allowed
    form loads."""
    path = tmp_path / 'gadget.pth'
    torch.save({'x': _Call(getattr, owner, name)}, path)
    want = _refusal(f'getattr({owner!r}, {name!r})',
                    'a public method of HistoryBuffer')
    with pytest.raises(pickle.UnpicklingError) as info:
        load(path)
    assert owner is HistoryBuffer or want in str(info.value)
    torch.save({'x': _Call(getattr, HistoryBuffer, 'mean')}, path)
    assert load(path)['x'] is HistoryBuffer.mean


@pytest.mark.parametrize('fn,args', [(getattr, (np.ndarray, 'tofile')),
                                     (bytes, (10**6, )),
                                     (codecs.encode, (b'x', 'base64'))])
def test_stand_ins_build_only_what_mmengine_needs(tmp_path, fn, args):
    """The getattr / bytes / _codecs.encode stand-ins refuse other uses."""
    if fn is codecs.encode and safe_load.native_allow_list():
        pytest.skip('torch >= 2.6 allows every codec')
    path = str(tmp_path / 'gadget.pth')
    torch.save({'x': _Call(fn, *args)}, path)
    with pytest.raises(pickle.UnpicklingError):
        safe_load.safe_torch_load(path)


def test_bytes_refusal_is_one_line():
    with pytest.raises(pickle.UnpicklingError) as info:
        safe_load.mmengine_safe_globals()[2][0](10)
    assert str(info.value) == _refusal('bytes(10,)', 'bytes()')


@needs_torch('2.5', 'torch.serialization.safe_globals (a user allow-list)')
def test_stand_ins_defer_to_the_users_allow_list():
    """What the user allow-listed in torch the stand-ins allow too."""
    getattr_, bytes_ = (
        safe_load.mmengine_safe_globals()[i][0] for i in (1, 2))
    with pytest.raises(pickle.UnpicklingError):
        getattr_(np.ndarray, 'tofile')
    with pytest.raises(pickle.UnpicklingError):
        bytes_(3)
    with torch.serialization.safe_globals([getattr, bytes]):
        assert getattr_(np.ndarray, 'tofile') is np.ndarray.tofile
        assert bytes_(3) == b'\0\0\0'
    assert bytes_() == b''  # an empty array's data: always


@needs_torch('2.5', 'torch.serialization.get_unsafe_globals_in_checkpoint')
def test_unsafe_globals_names_every_refused_global(tmp_path):
    """A zip file: every global but mmengine's and ``extra``."""
    path = str(tmp_path / 'two.pth')
    torch.save(
        dict(
            state_dict={'w': torch.ones(2)},
            hub=HistoryBuffer([1.0], [1]),
            arrays=[np.arange(3)],
            a=os.getcwd,
            b=_Allowed,
            c=shutil.rmtree), path)
    name = f'{__name__}._Allowed'
    assert sorted(safe_load.unsafe_globals(path)) == sorted(
        [f'{os.getcwd.__module__}.getcwd', name, 'shutil.rmtree'])
    assert sorted(safe_load.unsafe_globals(path, extra=[_Allowed])) == sorted(
        [f'{os.getcwd.__module__}.getcwd', 'shutil.rmtree'])


def _training_checkpoint(path, **more):
    """A legacy-format file as mmengine's Runner saves one."""
    buf = HistoryBuffer()
    for v in (1.0, 0.5):
        buf.update(v)
    torch.save(
        dict(
            state_dict={'w': torch.arange(4.)},
            message_hub=dict(log_scalars={'loss': buf}),
            arrays=[np.arange(3), np.zeros(0)],
            **more),
        str(path),
        _use_new_zipfile_serialization=False)
    return str(path)


def test_unsafe_globals_of_legacy_files(tmp_path):
    """A legacy file's first refused global, also from an absent device."""
    ok = _training_checkpoint(tmp_path / 'iter_2.pth', allowed=_Allowed)
    assert safe_load.unsafe_globals(ok, extra=[_Allowed]) == []
    assert safe_load.unsafe_globals(ok) == [f'{__name__}._Allowed']
    bad = _training_checkpoint(tmp_path / 'bad.pth', x=os.getcwd)
    assert safe_load.unsafe_globals(bad) == [f'{os.getcwd.__module__}.getcwd']
    retag(bad)
    assert safe_load.unsafe_globals(bad) == [f'{os.getcwd.__module__}.getcwd']


@needs_torch('2.6', "torch's unpickler loads checkpoints (any _codecs.encode)")
def test_unsafe_globals_of_a_legacy_file_follow_this_torch(tmp_path):
    """The scan allows what safe_torch_load allows on this torch."""
    for zipped in (True, False):
        path = str(tmp_path / f'rot13_{zipped}.pth')
        kw = dict(_use_new_zipfile_serialization=zipped)
        torch.save(dict(a=_Call(codecs.encode, 'abc', 'rot13')), path, **kw)
        assert safe_load.safe_torch_load(path) == {'a': 'nop'}
        torch.save(
            dict(a=_Call(codecs.encode, 'abc', 'rot13'), b=os.getcwd), path,
            **kw)
        with pytest.raises(pickle.UnpicklingError, match='getcwd'):
            safe_load.safe_torch_load(path)
        assert safe_load.unsafe_globals(path) == [
            f'{os.getcwd.__module__}.getcwd'
        ], zipped


def _history_buffer(**state):
    """A HistoryBuffer pickling its fields, no method table, and ``state``."""
    hb = HistoryBuffer([5.0, 7.0], [1, 1])
    fields = dict(hb.__dict__)
    fields.pop('statistics_methods', None)
    hb.__getstate__ = lambda: dict(fields, **state)
    return hb


def test_history_buffer_without_method_table_is_restored(tmp_path):
    """Pickled without its method table: a working HistoryBuffer."""
    path = tmp_path / 'hb.pth'
    torch.save({'x': _history_buffer()}, path)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        got = safe_load.safe_torch_load(path)['x']
    assert type(got) is HistoryBuffer
    assert got.mean() == 6.0 and got.statistics('max') == 7.0
    assert 'statistics_methods' not in got.__dict__


def test_foreign_method_table_warning_is_one_line(tmp_path):
    """A pickled method table unlike this process's: one warning."""
    table = dict(HistoryBuffer._statistics_methods)
    path = tmp_path / 'hb.pth'
    torch.save(
        {'x': _history_buffer(statistics_methods={'mean': HistoryBuffer.max})},
        path)
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter('always')
            got = safe_load.safe_torch_load(path)['x']
    finally:
        HistoryBuffer._statistics_methods.clear()
        HistoryBuffer._statistics_methods.update(table)
    assert [str(w.message) for w in seen] == [
        "mmsoft.compat: ignoring the statistics methods ['mean'] pickled "
        'with a HistoryBuffer: they differ from the ones registered in '
        'this process (loading a checkpoint does not change HistoryBuffer)'
    ]
    assert got.mean() == 6.0


def test_refusal_message_names_the_global():
    """The refusal is one line: the global and what is unpickled."""
    e = safe_load.RefusedGlobal('posix.getcwd')
    assert isinstance(e, pickle.UnpicklingError) and e.name == 'posix.getcwd'
    assert str(e) == (
        'mmsoft: refusing the pickled global posix.getcwd: only tensors, '
        'plain containers and allow-listed objects are unpickled')


def test_python2_names_of_protocol_2_are_mapped(tmp_path):
    """Protocol 2's ``__builtin__`` names load as ``builtins``' ones."""
    path = tmp_path / 'p2.pth'
    kw = dict(pickle_protocol=2, _use_new_zipfile_serialization=False)
    torch.save(dict(s={1, 2}, w=torch.ones(1)), str(path), **kw)
    with open(path, 'rb') as f:
        assert b'__builtin__' in f.read()
    got = safe_load.safe_torch_load(str(path))
    assert got['s'] == {1, 2} and got['w'].tolist() == [1.]
    torch.save(dict(s={1, 2}, f=os.getcwd), str(path), **kw)
    assert safe_load.unsafe_globals(str(path)) == \
        [f'{os.getcwd.__module__}.getcwd']


@pytest.mark.parametrize('version, want', [
    ('2.6.0', (2, 6)),
    ('2.5.1+cu124', (2, 5)),
    ('2.6+cu124', (2, 6)),
    ('2.10.0a0+git1234', (2, 10)),
    ('3.0.0.dev20270101', (3, 0)),
    ('2.x', (2, 0)),
])
def test_torch_version_is_major_minor(version, want):
    """(major, minor); local tags, pre-release suffixes dropped."""
    assert safe_load.torch_version(version) == want


@pytest.mark.parametrize('version, native', [('2.5.1', False), ('2.6.0', True),
                                             ('2.7.0+cpu', True)])
def test_native_allow_list_from_torch_2_6(monkeypatch, version, native):
    monkeypatch.setattr(torch, '__version__', version)
    assert safe_load.torch_version() == safe_load.torch_version(version)
    assert safe_load.native_allow_list() is native


@pytest.fixture
def restricted(monkeypatch):
    """What torch < 2.6 runs (the restricted unpickler)."""
    monkeypatch.setattr(safe_load, 'native_allow_list', lambda: False)


def test_restricted_loader_loads_what_torch_loads(tmp_path, restricted):
    """Tensors, a protocol-2 array, ``extra``; ``map_location`` applied."""
    path = str(tmp_path / 'p2.pth')
    obj = dict(
        w=torch.arange(3.), a=np.arange(4, dtype=np.int16), x=_Allowed())
    torch.save(obj, path, pickle_protocol=2)
    seen = []

    def where(storage, location):
        seen.append(location)
        return storage

    got = safe_load.safe_torch_load(path, map_location=where, extra=[_Allowed])
    assert seen == ['cpu']
    assert got['w'].tolist() == [0., 1., 2.]
    assert got['a'].dtype == np.int16 and got['a'].tolist() == [0, 1, 2, 3]
    assert isinstance(got['x'], _Allowed)
    with pytest.raises(safe_load.RefusedGlobal, match='_Allowed'):
        safe_load.safe_torch_load(path)


def test_restricted_codecs_encode_is_latin1_of_a_str_only(
        tmp_path, restricted):
    """Before torch 2.6: only ``_codecs.encode(str, 'latin1')``."""
    path = str(tmp_path / 'enc.pth')
    for args, want in [(('\xff', 'latin1'), b'\xff'),
                       (('\xff', 'latin-1'), b'\xff'),
                       (('a', 'latin1', 'strict'), b'a')]:
        torch.save({'b': _Call(codecs.encode, *args)}, path)
        assert safe_load.safe_torch_load(path) == {'b': want}
    for args, what in [(('a', ), "a str with 'utf-8'"),
                       (('a', 'utf-8'), "a str with 'utf-8'"),
                       ((b'a', 'latin1'), "a bytes with 'latin1'")]:
        torch.save({'b': _Call(codecs.encode, *args)}, path)
        with pytest.raises(pickle.UnpicklingError) as info:
            safe_load.safe_torch_load(path)
        assert str(info.value) == _refusal(f'_codecs.encode of {what}',
                                           "encode(str, 'latin1')")
    torch.save({'b': _Call(codecs.encode, '\u0100', 'latin1')}, path)
    with pytest.raises(UnicodeEncodeError):  # strict, as protocol 2 asks
        safe_load.safe_torch_load(path)


@needs_torch('2.6', "torch's weights-only unpickler with (obj, name) "
             'entries')
def test_native_loader_takes_every_codec(tmp_path):
    path = str(tmp_path / 'enc.pth')
    torch.save({'b': _Call(codecs.encode, 'a', 'utf-8')}, path)
    assert safe_load.safe_torch_load(path) == {'b': b'a'}


@pytest.mark.parametrize(
    'dtype', ['u1', 'u2', 'u4', 'u8', 'i2', 'f2', 'c8', 'c16', '?'])
def test_numpy_scalars_and_arrays_of_every_numeric_dtype_load(tmp_path, dtype):
    """Numpy scalars and arrays of every numeric dtype load."""
    path = str(tmp_path / 'np.pth')
    a = np.arange(3).astype(dtype)
    torch.save({'a': a, 's': a[1]}, path)
    listed = getattr(torch.serialization, 'get_safe_globals', list)()
    if listed:
        torch.serialization.clear_safe_globals()
    try:
        got = safe_load.safe_torch_load(path)
    finally:
        if listed:
            torch.serialization.add_safe_globals(listed)
    assert got['a'].dtype == np.dtype(dtype) and got['a'].tolist() == \
        a.tolist()
    assert got['s'].dtype == np.dtype(dtype) and got['s'] == a[1]


@pytest.mark.parametrize('protocol', [0, 1, 2, 4, 5])
def test_pickled_globals_reads_every_global_without_running(
        tmp_path, protocol):
    """Every global of a plain pickle once, in its Python 3 name."""
    from mmsoft.utils.safe_load import _pickled_globals, unsafe_globals
    path = tmp_path / 'p.pkl'
    runs = _Call(os.system, 'true')
    obj = {'a': _Allowed(), 'b': [_Allowed(), runs], 'c': runs}
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    names = _pickled_globals(str(path))
    assert f'{__name__}._Allowed' in names
    assert f'{os.system.__module__}.system' in names
    assert names == list(dict.fromkeys(names))  # each once
    assert all(not n.startswith(('copy_reg.', '__builtin__.')) for n in names)
    assert f'{os.system.__module__}.system' in unsafe_globals(str(path))


def test_code_globals_are_functions_and_system_modules():
    from mmsoft.utils.safe_load import code_globals
    data = [
        'argparse.Namespace', 'collections.OrderedDict', 'builtins.set',
        'builtins.object', 'copyreg._reconstructor', f'{__name__}._Allowed',
        'not_imported.SomeClass', 'numpy.ndarray'
    ]
    code = [
        'posix.system', 'os.system', 'builtins.eval', 'builtins.getattr',
        'subprocess.Popen', 'io.open', 'torch.load',
        'torch.storage._load_from_bytes', 'numpy.testing.run_module_suite',
        'not_imported.helper', 'nodots', f'{__name__}._Allowed.__reduce__'
    ]
    assert code_globals(data) == []
    assert code_globals(code + data) == code
