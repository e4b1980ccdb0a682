""":mod:`mmsoft.compat` / :mod:`mmsoft.utils.safe_load`: mmengine's training
checkpoints load weights-only, nothing else runs from a pickle."""
import codecs
import os
import pickle
import shutil
import uuid
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import Reduce, needs_torch
from mmengine.logging import HistoryBuffer, MessageHub

from mmsoft import compat
from mmsoft.utils import safe_load

needs_weights_only = needs_torch(
    '2.6', 'torch.load weights-only by default, allow-list with names')
CWD = f'{os.getcwd.__module__}.getcwd'
LOADED = repr(safe_load._LoadedHistoryBuffer)  # HistoryBuffer at load time


class _Allowed:  # a class a caller allows through ``extra``
    pass


def _refusal(what, allowed):
    return (f'mmsoft: refusing {what} while loading a checkpoint with '
            f'weights_only=True; only {allowed} is allowed.')


def _save(path, obj, **kw):
    torch.save(obj, str(path), **kw)
    return str(path)


@pytest.fixture
def table():
    """HistoryBuffer's method table (filled by a first one), put back."""
    HistoryBuffer()
    table = dict(HistoryBuffer._statistics_methods)
    yield table
    HistoryBuffer._statistics_methods.clear()
    HistoryBuffer._statistics_methods.update(table)


@pytest.fixture(params=[True, False], ids=['native', 'restricted'])
def allow_list(request, monkeypatch):  # torch's (>= 2.6) or the restricted
    if request.param and not safe_load.native_allow_list():
        pytest.skip('torch < 2.6: no allow-list in the weights-only loader')
    monkeypatch.setattr(safe_load, 'native_allow_list', lambda: request.param)
    return request.param


@needs_weights_only
def test_allow_list_is_scoped():
    """The context adds and removes exactly mmengine's entries."""

    def get():
        return set(torch.serialization.get_safe_globals())

    before = get()
    entries = safe_load.mmengine_safe_globals()
    with compat.mmengine_checkpoints_allowed():
        inside = get()
        assert inside == before | set(entries)
        with compat.mmengine_checkpoints_allowed():
            assert get() == inside
        assert get() == inside
    assert get() == before
    torch.serialization.add_safe_globals([entries[0]])  # the user's own
    try:
        with compat.mmengine_checkpoints_allowed():
            pass
        assert get() == before | {entries[0]}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(list(before))
    assert get() == before


@needs_weights_only
def test_mmengine_checkpoint_loads_weights_only_inside_the_context(
        tmp_path, table):
    """Refused outside; inside, no warning, the method table empty or not."""
    from mmengine.runner.checkpoint import CheckpointLoader
    model = nn.Linear(4, 3)
    hub = MessageHub.get_instance(f'mmsoft_test_compat_{uuid.uuid4().hex}')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
    hub.update_scalar('val/acc', 0.5)
    hub.update_info('best_score', np.float64(0.75))  # a numpy scalar
    arrays = [
        np.array([0, 1, 2]).astype(dt)
        for dt in ('int32', 'int64', 'float32', 'float64', 'bool')
    ]
    ckpt = dict(
        meta=dict(epoch=0, iter=3, cfg='', seed=0),
        state_dict=model.state_dict(),
        message_hub=hub.state_dict(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1).state_dict(),
        extra=dict(arrays=arrays))
    path = _save(tmp_path / 'iter_3.pth', ckpt)
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
        torch.load(path)
    HistoryBuffer._statistics_methods.clear()
    with compat.mmengine_checkpoints_allowed(), warnings.catch_warnings():
        warnings.simplefilter('error')
        loaded = (torch.load(path), torch.load(path, weights_only=True),
                  CheckpointLoader.load_checkpoint(path, map_location='cpu'))
    for got in loaded:
        assert got['meta'] == ckpt['meta']
        for k, v in ckpt['state_dict'].items():
            torch.testing.assert_close(got['state_dict'][k], v)
        for a, b in zip(got['extra']['arrays'], arrays):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        best = got['message_hub']['runtime_info']['best_score']
        assert type(best) is np.float64 and best == 0.75
        buf = got['message_hub']['log_scalars']['train/loss']
        assert isinstance(buf, HistoryBuffer)
        np.testing.assert_allclose(buf.data[0], [1.0, 0.5, 1.0 / 3])
        # statistics methods came back through the restricted getattr
        assert buf.statistics('mean') == pytest.approx((1 + .5 + 1 / 3) / 3)
        assert buf.current() == pytest.approx(1 / 3)
        hub = MessageHub.get_instance(f'mmsoft_loaded_{uuid.uuid4().hex}')
        hub.load_state_dict(got['message_hub'])
        assert hub.get_scalar('val/acc').current() == 0.5


@pytest.mark.parametrize('methods', ['absent', 'same', 'other'])
def test_history_buffer_loads_and_changes_no_class(tmp_path, table, methods,
                                                   allow_list):
    """A pickled method table unlike ours: one warning, not applied."""
    hb = HistoryBuffer([5.0, 7.0], [1, 1])
    if methods != 'absent':  # a pickled method table (crafted)
        fn = HistoryBuffer.mean if methods == 'same' else HistoryBuffer.max
        fields = dict(vars(hb), statistics_methods={'mean': fn})
        hb.__getstate__ = lambda: fields
    mean = Reduce(getattr, HistoryBuffer, 'mean')  # the allowed getattr
    empty = HistoryBuffer()  # its arrays: bytes() (before: refused)
    path = _save(tmp_path / 'hb.pth', {'x': hb, 'm': mean, 'e': empty})
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter('always')
        got = safe_load.safe_torch_load(path)
    assert [str(w.message) for w in seen] == [
        "mmsoft.compat: ignoring the statistics methods ['mean'] pickled "
        'with a HistoryBuffer: they differ from the ones registered in '
        'this process (loading a checkpoint does not change HistoryBuffer)'
    ][:methods == 'other']
    assert got['m'] is HistoryBuffer.mean and got['e'].data[0].size == 0
    got = got['x']
    assert HistoryBuffer._statistics_methods == table
    assert HistoryBuffer([1, 2, 3], [1, 1, 1]).statistics('mean') == 2
    assert type(got) is HistoryBuffer and got.mean() == 6.0
    assert got.current() == 7.0 and got.statistics('max') == 7.0
    assert 'statistics_methods' not in got.__dict__


def _getattr(owner, name, shown=LOADED):
    return (lambda: Reduce(getattr, owner, name),
            _refusal(f"getattr({shown}, '{name}')",
                     'a public method of HistoryBuffer'))


@pytest.mark.parametrize(
    'make,want',
    [
        _getattr(np.ndarray, 'mean', "<class 'numpy.ndarray'>"),
        _getattr(HistoryBuffer, '_set_default_statistics'),
        _getattr(HistoryBuffer, 'register_statistics'),  # a classmethod
        (lambda: Reduce(bytes, 10), _refusal('bytes(10,)', 'bytes()')),
        (lambda: os.getcwd, 'getcwd'),  # any other global
        (lambda: np.array([1, 2], dtype=object), '')
    ],
    ids=['other-owner', 'private', 'classmethod', 'bytes', 'global', 'object'])
def test_crafted_pickles_are_refused(tmp_path, make, want, allow_list):
    """The fix is an allow-list, not ``weights_only=False``."""
    path = _save(tmp_path / 'gadget.pth', {'x': make()})
    if not (want or allow_list):  # allowed objects only: no code runs
        assert safe_load.safe_torch_load(path)['x'].tolist() == [1, 2]
        return
    with pytest.raises(pickle.UnpicklingError) as info:
        safe_load.safe_torch_load(path)
    assert want in str(info.value)


@needs_torch('2.5', 'torch.serialization.safe_globals (a user allow-list)')
def test_stand_ins_defer_to_the_users_allow_list():
    """What the user allow-listed in torch the stand-ins allow too."""
    getattr_, bytes_ = (
        safe_load.mmengine_safe_globals()[i][0] for i in (1, 2))
    with pytest.raises(pickle.UnpicklingError):
        getattr_(np.ndarray, 'tofile')
    with pytest.raises(pickle.UnpicklingError) as info:
        bytes_(3)
    assert str(info.value) == _refusal('bytes(3,)', 'bytes()')
    with torch.serialization.safe_globals([getattr, bytes]):
        assert getattr_(np.ndarray, 'tofile') is np.ndarray.tofile
        assert bytes_(3) == b'\0\0\0'
    assert bytes_() == b''  # an empty array's data: always


@pytest.mark.parametrize('scan', ['torch', 'walk'])
def test_unsafe_globals_names_every_refused_global(tmp_path, monkeypatch,
                                                   scan):
    """Every global but mmengine's and ``extra`` (torch's scan or ours)."""
    if scan == 'walk':
        monkeypatch.delattr(torch.serialization,
                            'get_unsafe_globals_in_checkpoint', False)
    elif not hasattr(torch.serialization, 'get_unsafe_globals_in_checkpoint'):
        pytest.skip('torch < 2.5: no get_unsafe_globals_in_checkpoint')
    path = _save(
        tmp_path / 'two.pth',
        dict(
            state_dict={'w': torch.ones(2)},
            hub=HistoryBuffer([1.0], [1]),
            arrays=[np.arange(3)],
            a=os.getcwd,
            b=_Allowed,
            c=shutil.rmtree))
    assert sorted(safe_load.unsafe_globals(path)) == sorted(
        [CWD, f'{__name__}._Allowed', 'shutil.rmtree'])
    assert sorted(safe_load.unsafe_globals(path, extra=[_Allowed])) == sorted(
        [CWD, 'shutil.rmtree'])


def test_legacy_files_load_and_are_scanned(tmp_path, allow_list):
    """A legacy training checkpoint loads (``extra``, ``map_location``
    applied); its refused globals; protocol 2's ``__builtin__`` names load
    and are scanned as ``builtins``' ones; a damaged file: none."""
    buf = HistoryBuffer()
    for v in (1.0, 0.5):
        buf.update(v)
    kw = dict(_use_new_zipfile_serialization=False)
    ok = _save(tmp_path / 'iter_2.pth', dict(
        state_dict={'w': torch.arange(4.)},
        message_hub=dict(log_scalars={'loss': buf}),
        arrays=[np.arange(3, dtype=np.int16), np.zeros(0)], allowed=_Allowed),
        **kw)  # yapf: disable
    seen = []
    got = safe_load.safe_torch_load(
        ok, map_location=lambda s, loc: seen.append(loc) or s,
        extra=[_Allowed])  # yapf: disable
    assert seen == ['cpu'] and got['state_dict']['w'].tolist() == [0, 1, 2, 3]
    assert got['arrays'][0].dtype == np.int16 and got['allowed'] is _Allowed
    assert got['message_hub']['log_scalars']['loss'].mean() == 0.75
    with pytest.raises(pickle.UnpicklingError) as info:
        safe_load.safe_torch_load(ok)
    assert allow_list or str(info.value) == (
        f'mmsoft: refusing the pickled global {__name__}._Allowed: only '
        'tensors, plain containers and allow-listed objects are unpickled')
    assert '_Allowed' in str(info.value)
    assert safe_load.unsafe_globals(ok, extra=[_Allowed]) == []
    assert safe_load.unsafe_globals(ok) == [f'{__name__}._Allowed']
    kw['pickle_protocol'] = 2
    path = _save(tmp_path / 'p2.pth', dict(s={1, 2}, w=torch.ones(1)), **kw)
    with open(path, 'rb') as f:
        assert b'__builtin__' in f.read()
    got = safe_load.safe_torch_load(path)
    assert got['s'] == {1, 2} and got['w'].tolist() == [1.]
    _save(path, dict(s={1, 2}, f=os.getcwd), **kw)
    assert safe_load.unsafe_globals(path) == [CWD]
    (tmp_path / 'cut.pth').write_bytes(b'\x80\x02}q\x00(X')
    assert safe_load.unsafe_globals(str(tmp_path / 'cut.pth')) == []


@needs_torch('2.6', "torch's unpickler loads checkpoints (any _codecs.encode)")
@pytest.mark.parametrize('zipped', [True, False])
def test_unsafe_globals_of_a_file_follow_this_torch(tmp_path, zipped):
    """The scan allows what safe_torch_load allows on this torch."""
    kw = dict(_use_new_zipfile_serialization=zipped)
    rot13 = Reduce(codecs.encode, 'abc', 'rot13')
    path = _save(tmp_path / 'rot13.pth', dict(a=rot13), **kw)
    assert safe_load.safe_torch_load(path) == {'a': 'nop'}
    _save(path, dict(a=rot13, b=os.getcwd), **kw)
    with pytest.raises(pickle.UnpicklingError, match='getcwd'):
        safe_load.safe_torch_load(path)
    assert safe_load.unsafe_globals(path) == [CWD]


@pytest.mark.parametrize('protocol', [0, 2, 5])
def test_pickled_globals_reads_every_global_without_running(
        tmp_path, protocol):
    """Every global of a plain pickle once, in its Python 3 name."""
    path = tmp_path / 'p.pkl'
    runs = Reduce(os.system, 'true')
    obj = {'a': _Allowed(), 'b': [_Allowed(), runs], 'c': runs}
    path.write_bytes(pickle.dumps(obj, protocol=protocol))
    names = safe_load._pickled_globals(str(path))
    assert f'{__name__}._Allowed' in names
    assert f'{os.system.__module__}.system' in names
    assert names == list(dict.fromkeys(names))  # each once
    assert all(not n.startswith(('copy_reg.', '__builtin__.')) for n in names)
    assert f'{os.system.__module__}.system' in safe_load.unsafe_globals(
        str(path))


def test_code_globals_are_functions_and_system_modules():
    data = (
        'argparse.Namespace collections.OrderedDict builtins.set '
        '__builtin__.set builtins.object copyreg._reconstructor '
        f'{__name__}._Allowed not_imported.SomeClass numpy.ndarray').split()
    code = (
        'posix.system os.system builtins.eval builtins.getattr '
        'subprocess.Popen io.open torch.load torch.storage._load_from_bytes '
        'numpy.testing.run_module_suite not_imported.helper nodots '
        f'{__name__}._Allowed.__reduce__').split()
    assert safe_load.code_globals(data) == []
    assert safe_load.code_globals(code + data) == code


@pytest.mark.parametrize('version, want, native', [
    ('2.5.1+cu124', (2, 5), False),
    ('2.6.0', (2, 6), True),
    ('2.10.0a0+git1234', (2, 10), True),
    ('3.0.0.dev20270101', (3, 0), True),
    ('2.x', (2, 0), False),
])
def test_torch_version_and_the_native_allow_list(monkeypatch, version, want,
                                                 native):
    """(major, minor); torch's own allow-list from 2.6 on."""
    assert safe_load.torch_version(version) == want
    monkeypatch.setattr(torch, '__version__', version)
    assert safe_load.torch_version() == want
    assert safe_load.native_allow_list() is native


def test_restricted_codecs_encode_is_latin1_of_a_str_only(
        tmp_path, monkeypatch):
    """Before torch 2.6 (the context: a no-op)."""
    get = getattr(torch.serialization, 'get_safe_globals', list)
    before = list(map(str, get()))
    monkeypatch.setattr(safe_load, 'native_allow_list', lambda: False)
    with compat.mmengine_checkpoints_allowed():
        assert list(map(str, get())) == before
    path = _save(tmp_path / 'enc.pth',
                 {'b': Reduce(codecs.encode, '\xff', 'latin-1')})
    assert safe_load.safe_torch_load(path) == {'b': b'\xff'}
    _save(path, {'b': Reduce(codecs.encode, 'a')})
    with pytest.raises(pickle.UnpicklingError) as info:
        safe_load.safe_torch_load(path)
    assert str(info.value) == _refusal("_codecs.encode of a str with 'utf-8'",
                                       "encode(str, 'latin1')")
    encode = safe_load._checkpoint_codecs_encode
    assert encode('a', 'latin1', 'strict') == b'a'
    with pytest.raises(pickle.UnpicklingError) as info:
        encode(b'a', 'latin1')
    assert str(info.value) == _refusal(
        "_codecs.encode of a bytes with 'latin1'", "encode(str, 'latin1')")
    with pytest.raises(UnicodeEncodeError):  # strict, as protocol 2 asks
        encode('\u0100', 'latin1')


def test_numpy_scalars_and_arrays_of_every_numeric_dtype_load(
        tmp_path, allow_list):
    path, dtypes = str(tmp_path / 'np.pth'), 'u1 u2 u4 u8 i2 f2 c8 c16 ?'
    arrays = {dt: np.arange(3).astype(dt) for dt in dtypes.split()}
    torch.save({dt: (a, a[1]) for dt, a in arrays.items()}, path)
    listed = getattr(torch.serialization, 'get_safe_globals', list)()
    if listed:
        torch.serialization.clear_safe_globals()
    try:
        got = safe_load.safe_torch_load(path)
    finally:
        if listed:
            torch.serialization.add_safe_globals(listed)
    for dt, a in arrays.items():
        assert got[dt][0].dtype == a.dtype and got[dt][0].tolist() == \
            a.tolist(), dt
        assert got[dt][1].dtype == a.dtype and got[dt][1] == a[1], dt
