""":mod:`mmsoft.utils.atomic`: the target is the complete new file or
untouched; a full disk behind another exception is an ``OSError``."""
import errno
import os
import os.path as osp
import signal

import pytest
from conftest import dead_pid, deadline

from mmsoft.utils import atomic
from mmsoft.utils.atomic import (TMP_SUFFIX, atomic_path, atomic_write,
                                 os_error_in_chain, remove_stale_temps,
                                 temp_path_for)


def _full_disk(how):
    """torch.save's error on a full disk (the OSError its cause / context)."""
    disk = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), 'w.pth')
    if how == 'cause':
        return RuntimeError('PytorchStreamWriter failed writing file'), disk
    try:
        raise disk
    except OSError:
        try:
            raise RuntimeError('PytorchStreamWriter failed writing file')
        except RuntimeError as e:
            return e, None


@pytest.mark.parametrize('how', ['cause', 'context'])
def test_full_disk_behind_another_exception_is_an_os_error(tmp_path, how):
    target = tmp_path / 'w.pth'
    target.write_bytes(b'previous')
    error, cause = _full_disk(how)
    with pytest.raises(OSError) as e:
        with atomic_path(str(target)) as tmp:
            with open(tmp, 'wb') as f:
                f.write(b'half')
            raise error from cause
    assert (e.value.errno, e.value.strerror) == (errno.ENOSPC,
                                                 os.strerror(errno.ENOSPC))
    assert e.value.__cause__ is error  # the writer's report is kept
    assert target.read_bytes() == b'previous'
    assert sorted(os.listdir(tmp_path)) == ['w.pth']  # no temporary


def test_other_errors_pass_through_unchanged(tmp_path):
    target = tmp_path / 'w.pth'
    error = ValueError('not a state dict')
    with pytest.raises(ValueError) as e:
        with atomic_path(str(target)):
            raise error from KeyError('state_dict')
    assert e.value is error
    assert os.listdir(tmp_path) == []  # no temporary, no target


def test_chain_search_ends_on_a_cycle():
    """A chain whose causes / contexts loop is searched once."""
    a, b = RuntimeError('a'), ValueError('b')
    a.__cause__, b.__context__ = b, a
    with deadline(5):
        assert os_error_in_chain(a) is None
    disk = OSError(errno.ENOSPC, 'No space left on device')
    b.__cause__ = disk
    with deadline(5):
        assert os_error_in_chain(a) is disk


def test_a_live_writers_temporary_is_kept_and_the_writer_undisturbed(
        tmp_path, monkeypatch):
    """A running writer's temporary is kept; no signal is sent."""
    received = []
    stops = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda s, f: received.append(s)) for s in stops}
    try:
        tmp = tmp_path / f'.epoch_3.pth.{os.getpid()}.0123abcd{TMP_SUFFIX}'
        tmp.write_bytes(b'half')
        assert remove_stale_temps(str(tmp_path)) == []
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    assert tmp.read_bytes() == b'half'
    assert received == []

    def kill(pid, sig):  # a process of another user
        raise PermissionError(1, 'Operation not permitted')

    monkeypatch.setattr(atomic.os, 'kill', kill)
    pid = dead_pid()
    theirs = tmp_path / f'.epoch_3.pth.{pid}.0123abcd{TMP_SUFFIX}'
    theirs.write_bytes(b'x')
    assert atomic.pid_alive(pid) and remove_stale_temps(str(tmp_path)) == []
    assert theirs.is_file()


def test_a_killed_writers_temporary_is_found_next_to_the_target(tmp_path):
    """A killed writer's temporary next to the target is removed."""
    target = tmp_path / 'iter_4.pth'
    tmp = temp_path_for(str(target))
    assert osp.dirname(tmp) == str(tmp_path)
    stale = tmp.replace(f'.{os.getpid()}.', f'.{dead_pid()}.')
    open(stale, 'wb').close()
    (tmp_path / '.iter_4.pth.tmp').write_bytes(b'x')  # not ours
    assert remove_stale_temps(str(tmp_path)) == [stale]
    assert os.listdir(tmp_path) == ['.iter_4.pth.tmp']


def test_sweep_of_a_missing_or_stubborn_directory_reports_nothing(
        tmp_path, monkeypatch):
    """No directory, or a temporary that cannot be removed: no error."""
    assert remove_stale_temps(str(tmp_path / 'not yet')) == []
    stale = tmp_path / f'.iter_4.pth.{dead_pid()}.0123abcd{TMP_SUFFIX}'
    stale.write_bytes(b'half')

    def unlink(path, *args, **kwargs):
        raise PermissionError(13, 'Permission denied', path)

    monkeypatch.setattr(atomic.os, 'unlink', unlink)
    assert remove_stale_temps(str(tmp_path)) == []


@pytest.mark.parametrize('data', ['iter_4.pth', b'\x00\x01'])
def test_atomic_write_text_or_bytes(tmp_path, data):
    target = tmp_path / 'last_checkpoint'
    atomic_write(str(target), data)
    expected = data.encode() if isinstance(data, str) else data
    assert target.read_bytes() == expected


def test_atomic_write_directories_only_on_request(tmp_path):
    target = tmp_path / 'new' / 'last_checkpoint'
    with pytest.raises(FileNotFoundError):
        atomic_write(str(target), 'x')
    assert os.listdir(tmp_path) == []
    atomic_write(str(target), 'x', makedirs=True)
    assert target.read_text() == 'x'


def test_atomic_write_is_durable_on_request(tmp_path, monkeypatch):
    """``durable=True`` fsyncs file and directory; the default does not."""
    synced = []
    real = os.fsync
    monkeypatch.setattr(os, 'fsync', lambda fd: synced.append(fd) or real(fd))
    atomic_write(str(tmp_path / 'a'), 'x')
    assert synced == []
    atomic_write(str(tmp_path / 'b'), 'x', durable=True)
    assert len(synced) == 2
