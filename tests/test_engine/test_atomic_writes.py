""":mod:`mmsoft.utils.atomic`: the target is either the complete new file
or untouched, and a full disk that a writer reports as another exception
is still an ``OSError`` with its errno (what ``SafeCheckpointHook``'s
full-disk message reads; docs/en/advanced_guides/fault_tolerance.md)."""
import contextlib
import errno
import os
import signal

import pytest

from mmsoft.utils.atomic import (TMP_SUFFIX, atomic_path, os_error_in_chain,
                                 remove_stale_temps)


@contextlib.contextmanager
def _deadline(seconds=5):
    """Fail instead of hanging (SIGALRM; the loops tested are Python)."""

    def timeout(signum, frame):
        raise TimeoutError(f'still running after {seconds} s')

    old = signal.signal(signal.SIGALRM, timeout)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _full_disk(how):
    """What torch.save raises on a full disk: a RuntimeError caused by (or
    raised while handling) the OSError."""
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
    """A chain whose causes / contexts form a loop (set by hand) is
    searched once: no OSError found, no endless loop."""
    a, b = RuntimeError('a'), ValueError('b')
    a.__cause__, b.__context__ = b, a
    with _deadline():
        assert os_error_in_chain(a) is None
    disk = OSError(errno.ENOSPC, 'No space left on device')
    b.__cause__ = disk
    with _deadline():
        assert os_error_in_chain(a) is disk


def test_a_live_writers_temporary_is_kept_and_the_writer_undisturbed(tmp_path):
    """The stale-temporary sweep only looks whether the writer runs (here
    this process: a save in progress): its file stays, and no signal that
    would end a run is sent to it (CPython runs the handler of a signal
    sent to its own process before ``os.kill`` returns)."""
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
