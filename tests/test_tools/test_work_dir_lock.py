"""One training run per work dir (issue 27, item 3): the lock itself."""
import datetime
import json
import os
import os.path as osp
import re
import socket
import sys
import time

import pytest
from conftest import dead_pid, work_dir_holder

from mmsoft_tools.work_dir_lock import (LOCK_NAME, WorkDirLock,
                                        WorkDirLockedError)

HOST = socket.gethostname()
TAKE_OVER = 'mmsoft: taking over the work dir lock of a run that is gone ('


def _write(work, **info):
    os.makedirs(work, exist_ok=True)
    with open(osp.join(work, LOCK_NAME), 'w') as f:
        json.dump(info, f)


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


def test_live_holder_is_named(tmp_path):
    work = str(tmp_path / 'w')
    with work_dir_holder(work, seconds=60) as holder:
        msg = _refusal(work)
        assert msg.startswith(
            f'work dir {work} is in use by another training run (pid '
            f'{holder.pid} on host {HOST}, started ')
        assert msg.endswith(
            f'Wait for it to finish, or pass another --work-dir; if that '
            f'run is gone, remove {osp.join(work, LOCK_NAME)}')
    # SIGKILLed: the kernel released its flock; the file is taken over
    logged = []
    WorkDirLock(work, log=logged.append).acquire().release()
    assert logged and logged[0].startswith(
        f'{TAKE_OVER}pid {holder.pid} on host {HOST}')


@pytest.mark.parametrize('started', [0, None], ids=['epoch', 'unset'])
def test_stale_lock_of_dead_pid_is_taken_over_on_stderr(
        tmp_path, capsys, started):
    """Without ``log``: one line on stderr; start time 0 is a time."""
    work = str(tmp_path / 'w')
    pid = int(dead_pid())
    _write(
        work,
        pid=pid,
        host=HOST,
        **({} if started is None else dict(started=started)))
    WorkDirLock(work).acquire().release()
    when = '?' if started is None else time.strftime('%Y-%m-%d %H:%M:%S',
                                                     time.localtime(0))
    assert capsys.readouterr() == (
        '', f'{TAKE_OVER}pid {pid} on host {HOST}, started {when}): '
        f'{osp.join(work, LOCK_NAME)}\n')


def _holder(msg: str) -> str:
    """The holder named in a refusal: '(<holder>; lock file ...)'."""
    m = re.search(r'in use by another training run \((.*); lock file ', msg)
    assert m, msg
    return m.group(1)


@pytest.mark.parametrize('where', ['this host', 'another host'])
def test_refusal_names_the_holders_start_time(tmp_path, where):
    """To the second, local time; a live flock: refused at once; another
    host's pid: not guessed (cannot be checked from here)."""
    work = str(tmp_path / 'w')
    started = 1500000000.7  # 2017, far from now
    host = HOST if where == 'this host' else 'node-7'
    live = WorkDirLock(work).acquire() if where == 'this host' else None
    try:
        _write(work, pid=4321, host=host, started=started)
        start = time.monotonic()
        msg = _refusal(work)
        assert time.monotonic() - start < 0.9
    finally:
        if live:
            live.release()
    if where != 'this host':
        assert 'on another machine, which cannot be checked from here' in msg
        assert msg.endswith(f'remove {osp.join(work, LOCK_NAME)}')
    holder = _holder(msg).split('; on another machine')[0]
    prefix = f'pid 4321 on host {host}, started '
    assert holder.startswith(prefix), holder
    when = datetime.datetime.strptime(holder[len(prefix):],
                                      '%Y-%m-%d %H:%M:%S')
    assert when == datetime.datetime.fromtimestamp(int(started))


@pytest.mark.parametrize('record', ['{"pid": 12', '[20438, "vm"]'])
def test_unreadable_record_names_an_unknown_holder(tmp_path, record):
    """A live holder's record cut short or not a JSON object."""
    work = str(tmp_path / 'w')
    with WorkDirLock(work) as live:
        with open(live.path, 'w') as f:
            f.write(record)
        assert _holder(_refusal(work)) == 'an unknown process'


def test_fields_missing_from_the_record_are_question_marks(tmp_path):
    """Each unknown field '?' (no 'None', no start time of now)."""
    work = str(tmp_path / 'w')
    _write(work, command='python tools/train.py cfg.py')
    logged = []
    WorkDirLock(work, log=logged.append).acquire().release()
    assert logged == [
        f'{TAKE_OVER}pid ? on host ?, started ?): {osp.join(work, LOCK_NAME)}'
    ]
