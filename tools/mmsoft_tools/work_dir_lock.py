"""One training run per work dir (docs/en/advanced_guides/fault_tolerance.md):
rank 0 holds a ``filelock``; ``.mmsoft-train.lock`` names the holder."""
import json
import os
import os.path as osp
import socket
import sys
import time

from filelock import FileLock, Timeout

LOCK_NAME = '.mmsoft-train.lock'


class WorkDirLockedError(RuntimeError):
    """Another live run holds the work dir."""


def _describe(info: dict) -> str:
    started = info.get('started')
    when = time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started)) \
        if isinstance(started, (int, float)) else '?'
    return (f'pid {info.get("pid", "?")} on host {info.get("host", "?")}, '
            f'started {when}')


class WorkDirLock:
    """Exclusive use of ``work_dir`` by one training run."""

    def __init__(self, work_dir: str, log=None):
        self.work_dir = work_dir
        self.path = osp.join(work_dir, LOCK_NAME)
        self.log = log or (lambda msg: print(msg, file=sys.stderr))
        self._lock = FileLock(self.path + '.flock')

    def _read(self) -> dict:
        try:
            with open(self.path) as f:
                info = json.load(f)
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
        os.makedirs(self.work_dir, exist_ok=True)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            self._refuse(self._read())
        try:
            info = self._read()
            host = socket.gethostname()
            if info.get('host') not in (None, host):
                self._refuse(
                    info, '; on another machine, which cannot be '
                    'checked from here')
            if info:
                self.log(f'mmsoft: taking over the work dir lock of a run '
                         f'that is gone ({_describe(info)}): {self.path}')
            record = dict(
                pid=os.getpid(),
                host=host,
                started=time.time(),
                command=' '.join(sys.argv))
            with open(self.path, 'w') as f:
                json.dump(record, f)
        except BaseException:
            self._lock.release()
            raise
        return self

    def release(self) -> None:
        """Remove the lock files and unlock."""
        if not self._lock.is_locked:
            return
        for path in (self.path, self._lock.lock_file):
            try:
                os.unlink(path)
            except OSError:
                pass
        self._lock.release()

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
