"""One training run per work dir (issue 27, item 3): the lock itself."""
import datetime
import json
import os
import os.path as osp
import socket
import sys
import time

import pytest
from conftest import dead_pid

from mmsoft_tools.work_dir_lock import (LOCK_NAME, WorkDirLock,
                                        WorkDirLockedError)

HOST = socket.gethostname()
TAKE_OVER = 'mmsoft: taking over the work dir lock of a run that is gone ('


def _write(work, record):
    os.makedirs(work, exist_ok=True)
    with open(osp.join(work, LOCK_NAME), 'w') as f:
        f.write(record if isinstance(record, str) else json.dumps(record))


def _refusal(work):
    with pytest.raises(WorkDirLockedError) as e:
        WorkDirLock(work).acquire()
    return str(e.value)


def test_record_and_flock_are_the_documented_files(tmp_path, monkeypatch):
    """Held: the record (pid, host, start, command) and a flock; released:
    both gone."""
    fcntl = pytest.importorskip('fcntl')  # flock: Unix
    work = str(tmp_path / 'w')
    argv = ['tools/train.py', 'configs/soft_tiny.py', '--work-dir', work]
    monkeypatch.setattr(sys, 'argv', argv)
    before = time.time()
    with WorkDirLock(work):
        after = time.time()
        assert sorted(os.listdir(work)) == [LOCK_NAME, LOCK_NAME + '.flock']
        with open(osp.join(work, LOCK_NAME)) as f:
            info = json.load(f)
        assert info == dict(
            pid=os.getpid(),
            host=HOST,
            started=info['started'],
            command=' '.join(argv))
        assert before <= info['started'] <= after
        fd = os.open(osp.join(work, LOCK_NAME + '.flock'), os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    assert os.listdir(work) == []


@pytest.mark.parametrize(
    'record,started', [(dict(started=0), 0), ({}, None),
                       (dict(command='tools/train.py cfg.py'), None)],
    ids=['epoch', 'unset', 'no-pid'])
def test_stale_lock_is_taken_over_on_stderr(tmp_path, capsys, record, started):
    """Without ``log``: one line on stderr; start time 0 is a time; each
    unknown field '?' (no 'None', no start time of now)."""
    work, pid = str(tmp_path / 'w'), int(dead_pid())
    who = dict(pid=pid, host=HOST) if 'command' not in record else {}
    _write(work, dict(record, **who))
    WorkDirLock(work).acquire().release()
    when = '?' if started is None else time.strftime('%Y-%m-%d %H:%M:%S',
                                                     time.localtime(0))
    holder = f'pid {pid} on host {HOST}' if who else 'pid ? on host ?'
    assert capsys.readouterr() == ('',
                                   f'{TAKE_OVER}{holder}, started {when}): '
                                   f'{osp.join(work, LOCK_NAME)}\n')


STARTED = 1500000000.7  # 2017, far from now
WHEN = datetime.datetime.fromtimestamp(int(STARTED)).strftime(
    '%Y-%m-%d %H:%M:%S')  # to the second, local time


@pytest.mark.parametrize(
    'record,live,holder',
    [(dict(pid=4321, host=HOST,
           started=STARTED), True, f'pid 4321 on host {HOST}, started {WHEN}'),
     (dict(pid=4321, host='node-7', started=STARTED), False,
      f'pid 4321 on host node-7, started {WHEN}; on another machine, which '
      'cannot be checked from here'),
     ('{"pid": 12', True, 'an unknown process'),
     ('[20438, "vm"]', True, 'an unknown process')],
    ids=['this-host', 'another-host', 'cut-short', 'not-an-object'])
def test_refusal_names_the_holder(tmp_path, record, live, holder):
    """A live flock: refused at once; another host's pid: not guessed (it
    cannot be checked from here); a record cut short or no JSON object."""
    work = str(tmp_path / 'w')
    path = osp.join(work, LOCK_NAME)
    lock = WorkDirLock(work).acquire() if live else None
    try:
        _write(work, record)
        start = time.monotonic()
        msg = _refusal(work)
        assert time.monotonic() - start < 0.9
    finally:
        if lock:
            lock.release()
    assert msg == (
        f'work dir {work} is in use by another training run ({holder}; lock '
        f'file {path}): two runs in one work dir overwrite and delete each '
        f"other's checkpoints. Wait for it to finish, or pass another "
        f'--work-dir; if that run is gone, remove {path}')
