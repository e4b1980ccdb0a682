"""One training run per work dir (``tools/train.py``, ``dist_train.sh``).

Two runs in one work dir lose data silently: both write ``epoch_N.pth``,
``max_keep_ckpts`` deletes the other run's checkpoints, and
``last_checkpoint`` and the dumped config end up belonging to the other
run, so a later ``--resume`` continues the wrong one. :class:`WorkDirLock`
is taken (by rank 0) before the Runner touches the work dir:

* the lock file ``<work_dir>/.mmsoft-train.lock`` records the holder (pid,
  host, start time, command) and is held with ``fcntl.flock`` for the life
  of the process, so the kernel releases it when the process dies, also
  on ``kill -9``;
* a second run finds it held and stops with :class:`WorkDirLockedError`:
  one line naming the holder and the fix (wait, or another ``--work-dir``);
* a lock left by a process that is gone (the file is there, nobody holds
  it) is taken over with a warning; where ``flock`` is not enforced (some
  network file systems) a recorded holder on this host whose pid no longer
  runs is stale too. A holder recorded on *another* host cannot be checked
  from here: the message says to remove the file if that run is gone.

The lock is released (and its file removed) when the run ends.
"""
import json
import os
import os.path as osp
import socket
import sys
import time
from typing import Optional

__all__ = ['WorkDirLock', 'WorkDirLockedError', 'LOCK_NAME']

#: the lock file's name inside the work dir
LOCK_NAME = '.mmsoft-train.lock'


class WorkDirLockedError(RuntimeError):
    """Another live run holds the work dir."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, owned by someone else
        return True
    return True


def _describe(info: dict) -> str:
    started = info.get('started')
    when = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started)) \
        if isinstance(started, (int, float)) else '?'
    return (f'pid {info.get("pid", "?")} on host {info.get("host", "?")}, '
            f'started {when}')


class WorkDirLock:
    """Exclusive use of ``work_dir`` by one training run (module doc).

    Args:
        work_dir (str): the run's work dir (created if needed).
        log (callable): where the take-over of a stale lock is reported.
    """

    def __init__(self, work_dir: str, log=None):
        self.work_dir = work_dir
        self.path = osp.join(work_dir, LOCK_NAME)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self._fd: Optional[int] = None

    def _read(self, fd) -> dict:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            data = os.read(fd, 65536)
            info = json.loads(data.decode() or '{}')
            return info if isinstance(info, dict) else {}
        except (OSError, ValueError):
            return {}

    def _refuse(self, info: dict, why: str = ''):
        holder = _describe(info) if info else 'an unknown process'
        raise WorkDirLockedError(
            f'work dir {self.work_dir} is in use by another training run '
            f'({holder}{why}; lock file {self.path}): two runs in one work '
            f'dir overwrite and delete each other\'s checkpoints. Wait for '
            f'it to finish, or pass another --work-dir; if that run is '
            f'gone, remove {self.path}')

    def acquire(self) -> 'WorkDirLock':
        import fcntl
        os.makedirs(self.work_dir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except (BlockingIOError, PermissionError):
                self._refuse(self._read(fd))
            except OSError:  # flock not supported: the recorded pid decides
                pass
            info = self._read(fd)
            host = socket.gethostname()
            if info.get('pid') not in (None, os.getpid()):
                if info.get('host') == host:
                    if _pid_alive(int(info['pid'])) and \
                            not self._flock_works(fd):
                        self._refuse(info)
                else:  # another machine: nothing to check from here
                    self._refuse(
                        info, '; on another machine, which cannot be '
                        'checked from here')
                self.log(f'mmsoft: taking over the work dir lock of a run '
                         f'that is gone ({_describe(info)}): {self.path}')
            record = dict(
                pid=os.getpid(),
                host=host,
                started=time.time(),
                command=' '.join(sys.argv))
            os.ftruncate(fd, 0)
            os.lseek(fd, 0, os.SEEK_SET)
            os.write(fd, json.dumps(record).encode())
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return self

    @staticmethod
    def _flock_works(fd) -> bool:
        """True when we hold an enforced flock on ``fd`` (then a live pid in
        the file is a recycled one, not a holder)."""
        import fcntl
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            return False

    def release(self) -> None:
        """Remove the lock file (if it is still ours) and unlock."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if self._read(fd).get('pid') == os.getpid():
                os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(fd)  # releases the flock

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
