"""One training run per work dir (issue 27, item 3):
:mod:`mmsoft_tools.work_dir_lock`. The whole tool is tested in
``tests/test_tools/test_chain.py`` (a second ``tools/train.py``, and
``dist_train.sh`` killed then resumed)."""
import json
import os
import os.path as osp
import socket

import pytest
from conftest import dead_pid, work_dir_holder

from mmsoft_tools.work_dir_lock import (LOCK_NAME, WorkDirLock,
                                        WorkDirLockedError)


def _write(work, **info):
    os.makedirs(work, exist_ok=True)
    with open(osp.join(work, LOCK_NAME), 'w') as f:
        json.dump(info, f)


def test_acquire_release(tmp_path):
    work = str(tmp_path / 'w')
    with WorkDirLock(work) as lock:
        with open(lock.path) as f:
            info = json.load(f)
        assert info['pid'] == os.getpid()
        assert info['host'] == socket.gethostname()
    assert os.listdir(work) == []  # released: the file is gone


def test_live_holder_is_named(tmp_path):
    work = str(tmp_path / 'w')
    with work_dir_holder(work, seconds=60) as holder:
        with pytest.raises(WorkDirLockedError) as e:
            WorkDirLock(work).acquire()
        msg = str(e.value)
        assert msg.startswith(
            f'work dir {work} is in use by another training run (pid '
            f'{holder.pid} on host {socket.gethostname()}, started ')
        assert msg.endswith(
            f'Wait for it to finish, or pass another --work-dir; if that '
            f'run is gone, remove {osp.join(work, LOCK_NAME)}')
    # SIGKILLed: the kernel released its flock; the file is taken over
    logged = []
    WorkDirLock(work, log=logged.append).acquire().release()
    assert logged and logged[0].startswith(
        'mmsoft: taking over the work dir lock of a run that is gone (pid '
        f'{holder.pid} on host {socket.gethostname()}')


def test_stale_lock_of_dead_pid_is_taken_over(tmp_path):
    work = str(tmp_path / 'w')
    pid = int(dead_pid())
    _write(work, pid=pid, host=socket.gethostname(), started=0)
    logged = []
    lock = WorkDirLock(work, log=logged.append).acquire()
    assert f'pid {pid} on host' in logged[0]
    lock.release()


def test_holder_on_another_host_is_not_guessed(tmp_path):
    """Another machine's pid cannot be checked from here: refuse, and say
    to remove the file if that run is gone."""
    work = str(tmp_path / 'w')
    _write(work, pid=1234, host='other-node-7', started=0)
    with pytest.raises(WorkDirLockedError) as e:
        WorkDirLock(work).acquire()
    msg = str(e.value)
    assert '(pid 1234 on host other-node-7, started ' in msg
    assert 'on another machine, which cannot be checked from here' in msg
    assert msg.endswith(f'remove {osp.join(work, LOCK_NAME)}')
