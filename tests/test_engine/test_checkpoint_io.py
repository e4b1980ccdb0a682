""":mod:`mmsoft.utils.checkpoint_io` and :mod:`mmsoft.utils.atomic`."""
import errno
import os
import os.path as osp
import pickle
import re
import signal

import numpy as np
import pytest
import torch
from conftest import dead_pid, deadline
from mmengine.logging import HistoryBuffer

from mmsoft.engine.hooks import checkpoint_hook as resume
from mmsoft.utils import atomic
from mmsoft.utils import checkpoint_io as cio
from mmsoft.utils.atomic import (TMP_SUFFIX, atomic_path, atomic_write,
                                 remove_stale_temps)


def test_describe_damage_names_each_kind(tmp_path):
    good = tmp_path / 'good.pth'
    torch.save(dict(w=torch.zeros(256)), good)
    legacy = tmp_path / 'legacy.pth'
    torch.save(dict(w=1), legacy, _use_new_zipfile_serialization=False)
    data = bytearray(good.read_bytes())
    (tmp_path / 'empty.pth').write_bytes(b'')
    (tmp_path / 'image.pth').write_bytes(b'GIF89a' + bytes(100))
    (tmp_path / 'code.pth').write_bytes(b'\x80\x02cos\nsystem\n')  # cut
    (tmp_path / 'cut.pth').write_bytes(bytes(data[:len(data) // 2]))
    data[data.index(bytes(1024))] ^= 0xFF  # inside the tensor's record
    (tmp_path / 'flipped.pth').write_bytes(bytes(data))
    got = {
        f[:-4]: cio.describe_damage(str(tmp_path / f))
        for f in ('good.pth', 'legacy.pth', 'empty.pth', 'image.pth',
                  'code.pth', 'cut.pth', 'flipped.pth', 'gone.pth')
    }
    assert got.pop('good') is None and got.pop('legacy') is None
    assert got.pop('cut').startswith(
        f'is truncated or corrupt ({len(data) // 2} bytes; ')
    flipped = got.pop('flipped')
    assert flipped.startswith("is corrupt (CRC error in record '") and \
        flipped.endswith("/data/0')")
    assert got == dict(
        empty='is empty (0 bytes)',
        image="is not a torch checkpoint (starts with b'GIF8')",
        code="is truncated or corrupt (13 bytes; torch's legacy (non-zip) "
        'format, cut short in its pickles)',
        gone='cannot be read (No such file or directory)')


def test_training_checkpoint_loads_verified(tmp_path):
    """``map_location`` applied; torch's process-wide allow-list left as it
    was (what it allows: tests/test_compat.py); the refusal lines."""
    get = getattr(torch.serialization, 'get_safe_globals', lambda: [])
    before = sorted(map(str, get()))  # a set: its order may change
    path = str(tmp_path / 'iter_2.pth')
    torch.save(dict(state_dict=dict(w=torch.ones(2)), a=[np.arange(3)]), path)
    seen = []
    got = cio.load_verified(path, lambda s, loc: seen.append(loc) or s)
    assert seen == ['cpu'] and torch.equal(got['state_dict']['w'],
                                           torch.ones(2))
    np.testing.assert_array_equal(got['a'][0], [0, 1, 2])
    assert cio.load_verified(path)['state_dict']['w'].device.type == 'cpu'
    assert sorted(map(str, get())) == before
    # the refusal templates beyond tests/test_checkpoint_safety.py's FAULTS:
    # no name found, a caller's fix (code: none offered), a missing file
    plain = tmp_path / 'plain.pkl'
    plain.write_bytes(pickle.dumps(dict(w=1)))
    assert cio.refusal_message(
        str(plain), [], fix='use the .pth'
    ) == (f"checkpoint {plain} was refused: it holds a plain / legacy pickle "
          f"(not torch's zip format) with pickled objects other than tensors "
          f'and plain containers, which could run code when unpickled; use '
          f'the .pth')
    code = cio.refusal_message(
        str(plain), ['x.Opaque', 'os.system', 'builtins.eval'], fix='FIX')
    assert 'pickled code (os.system, builtins.eval) that' in code
    assert 'FIX' not in code
    gone = tmp_path / 'gone.pth'
    assert cio.refusal_message(str(gone), ['x.A', 'y.B']) == (
        f'checkpoint {gone} was refused: it holds pickled objects other than '
        'tensors and plain containers (x.A, y.B), which could run code when '
        'unpickled; convert it with tools/model_converters/soft2mmsoft.py SRC '
        'DST (add --trust-checkpoint there only if you trust the file)')


@pytest.fixture(scope='module')
def legacy(tmp_path_factory):
    """An mmengine training checkpoint in torch's legacy format: bytes."""
    model, path = torch.nn.Linear(64, 32), tmp_path_factory.mktemp('l') / 'w'
    torch.save(
        dict(
            state_dict=dict(model.state_dict(), idx=torch.arange(5)),
            optimizer=torch.optim.SGD(model.parameters(), 0.1).state_dict(),
            meta=dict(epoch=1, seed=np.int64(3), arr=np.zeros(3)),
            message_hub=dict(loss=HistoryBuffer([1.0, 2.0], [1, 1]))),
        path,
        _use_new_zipfile_serialization=False)
    return path.read_bytes()


def test_legacy_untyped_storage_is_checked_in_bytes(tmp_path):
    """Its size header counts bytes (also resume's quick check); a header
    of another size; storage keys that are no list: no verdict."""
    path = tmp_path / 'raw.pth'
    torch.save(
        dict(s=torch.UntypedStorage(64)),
        path,
        _use_new_zipfile_serialization=False)
    data = path.read_bytes()
    assert cio.describe_damage(str(path)) is None
    assert resume.check_undamaged(str(path)) is None
    path.write_bytes(data[:-10])
    damage = (f"is truncated or corrupt ({len(data) - 10} bytes; torch's "
              'legacy (non-zip) format, cut short in its tensor data)')
    assert cio.describe_damage(str(path)) == damage
    assert resume.check_undamaged(str(path)) == f'checkpoint {path} {damage}'
    path.write_bytes(data[:-72] + (65).to_bytes(8, 'little') + data[-64:])
    assert re.fullmatch(
        rf"is corrupt \({len(data)} bytes; torch's legacy \(non-zip\) format: "
        r'storage \d+ records another size than its tensor\)',
        cio.describe_damage(str(path)))
    keys = data.rindex(b'\x80\x02]q\x00')  # ] (a list), APPEND a: a tuple
    end = data.index(b'a.', keys)
    path.write_bytes(data[:keys + 2] + data[keys + 5:end] + b'\x85.' +
                     data[end + 2:-10])
    assert cio.describe_damage(str(path)) is None
    # an invalid opcode (not a cut) in the protocol pickle: torch.load's to
    # judge, no verdict
    protocol = data.index(b'\x80\x02M')
    path.write_bytes(data[:protocol + 2] + b'\xfe' + data[protocol + 3:])
    assert cio.describe_damage(str(path)) is None


def test_load_verified_names_a_damaged_legacy_file(tmp_path, monkeypatch,
                                                   legacy):
    """An mmengine file cut short; torch.load's error: a CheckpointError."""
    cut = tmp_path / 'cut.pth'
    for n, where in ((40, 'pickles'), (300, 'pickles'), (len(legacy) - 100,
                                                         'tensor data')):
        cut.write_bytes(legacy[:n])  # in the system info, the object, data
        with pytest.raises(cio.CheckpointError) as e:
            cio.load_verified(str(cut))
        assert str(e.value) == (
            f"checkpoint {cut} is truncated or corrupt ({n} bytes; torch's "
            f'legacy (non-zip) format, cut short in its {where}); it was not '
            'loaded (use an earlier or a fresh copy)')
    monkeypatch.setattr(cio, 'describe_damage', lambda path: None)
    with pytest.raises(cio.CheckpointError) as e:
        cio.load_verified(str(cut))
    assert str(e.value).startswith(
        f"checkpoint {cut} is truncated or corrupt (torch's legacy (non-zip) "
        'format: RuntimeError: unexpected EOF')

    def load(*args, **kwargs):  # an error without a message
        raise EOFError()

    monkeypatch.setattr(cio, 'safe_torch_load', load)
    with pytest.raises(cio.CheckpointError) as e:
        cio.load_verified(str(cut))
    assert str(e.value) == (
        f"checkpoint {cut} is truncated or corrupt (torch's legacy (non-zip) "
        'format: EOFError: end of file); it was not loaded (use an earlier or '
        'a fresh copy)')


# ------------------------------------------------------------ atomic
@pytest.mark.parametrize(
    'how', ['cause', 'context', 'other', 'cycle', 'ctrl-c', 'sigterm'])
def test_atomic_path_keeps_the_old_file(tmp_path, how):
    """ENOSPC as the cause / context: an OSError; others (Ctrl-C, SIGTERM as
    SystemExit(143)) pass unchanged, a chain that loops searched once."""
    target = tmp_path / 'w.pth'
    target.write_bytes(b'previous')
    disk = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'w.pth')
    error = RuntimeError('PytorchStreamWriter failed writing file')
    if how in ('other', 'cycle'):
        error, disk = ValueError('not a state dict'), KeyError('state_dict')
        if how == 'cycle':
            disk.__context__ = error
    elif how == 'ctrl-c':  # not an Exception: never converted
        error = KeyboardInterrupt()
    want = dict(cause=OSError, context=OSError, sigterm=SystemExit)
    handler, caught = lambda *a: caught.append(a), []
    old = signal.signal(signal.SIGTERM, handler)
    try:
        with pytest.raises(want.get(how, type(error))) as e, deadline(5):
            with atomic_path(str(target)) as tmp:
                with open(tmp, 'wb') as f:
                    f.write(b'half')
                if how == 'sigterm':
                    os.kill(os.getpid(), signal.SIGTERM)
                if how == 'context':
                    try:
                        raise disk
                    except OSError:
                        raise error
                raise error from disk
    finally:
        assert signal.signal(signal.SIGTERM, old) is handler and not caught
    if e.type is OSError:
        assert (e.value.errno, e.value.strerror) == (errno.ENOSPC,
                                                     os.strerror(errno.ENOSPC))
        assert e.value.__cause__ is error  # the writer's report is kept
    else:
        assert e.value.code == 143 if how == 'sigterm' else e.value is error
    assert target.read_bytes() == b'previous'
    assert os.listdir(tmp_path) == ['w.pth']  # no temporary


def test_stale_temporaries_of_killed_writers_only(tmp_path, monkeypatch):
    """A running writer's or another user's kept (no signal sent)."""
    received = []
    stops = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda s, f: received.append(s)) for s in stops}
    try:
        mine = tmp_path / f'.epoch_3.pth.{os.getpid()}.0123abcd{TMP_SUFFIX}'
        mine.write_bytes(b'half')
        assert remove_stale_temps(str(tmp_path)) == []
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    assert mine.read_bytes() == b'half' and received == []
    mine.unlink()
    assert remove_stale_temps(str(tmp_path / 'not yet')) == []
    tmp = atomic.temp_path_for(str(tmp_path / 'iter_4.pth'))
    assert osp.dirname(tmp) == str(tmp_path)
    stale = tmp.replace(f'.{os.getpid()}.', f'.{dead_pid()}.')
    open(stale, 'wb').close()
    (tmp_path / '.iter_4.pth.tmp').write_bytes(b'x')  # not ours
    for name, error in (('kill', PermissionError(1, 'not permitted')),
                        ('unlink', PermissionError(13, 'denied'))):
        with monkeypatch.context() as m:  # another user's; cannot remove
            m.setattr(
                atomic.os, name, lambda *a, e=error: (_ for _ in ()).throw(e))
            assert remove_stale_temps(str(tmp_path)) == []
    assert remove_stale_temps(str(tmp_path), name='other.pth') == []
    assert remove_stale_temps(str(tmp_path), name='iter_4.pth') == [stale]
    assert os.listdir(tmp_path) == ['.iter_4.pth.tmp']
    # atomic_write: directories only on request; durable=True alone fsyncs
    os.unlink(tmp_path / '.iter_4.pth.tmp')
    synced, real = [], os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: synced.append(fd) or real(fd))
    for name, data in (('a', 'iter_4.pth'), ('b', b'\x00\x01')):
        atomic_write(str(tmp_path / name), data)
        assert (tmp_path / name).read_bytes() == (
            data.encode() if isinstance(data, str) else data)
    assert synced == []
    target = tmp_path / 'new' / 'last_checkpoint'
    with pytest.raises(FileNotFoundError):
        atomic_write(str(target), 'x')
    assert sorted(os.listdir(tmp_path)) == ['a', 'b']
    atomic_write(str(target), 'x', makedirs=True, durable=True)
    assert target.read_text() == 'x' and len(synced) == 2
