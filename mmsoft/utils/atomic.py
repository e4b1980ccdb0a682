"""Atomic file writes: the complete new file or the old one untouched."""
import contextlib
import os
import os.path as osp
import re
import signal
import threading
from typing import Iterator, List, Optional, Union

TMP_SUFFIX = '.mmsoft-tmp'
_TMP_RE = re.compile(r'^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}' +
                     re.escape(TMP_SUFFIX) + '$')


def temp_path_for(path: str, suffix: str = '') -> str:
    """``.<name>.<pid>.<random>.mmsoft-tmp<suffix>`` next to ``path``."""
    d, name = osp.split(osp.abspath(path))
    return osp.join(
        d, f'.{name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}{suffix}')


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _sigterm(signum, frame):
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def atomic_path(path: str,
                suffix: str = '',
                makedirs: bool = False,
                durable: bool = False,
                missing_ok: bool = False) -> Iterator[str]:
    """A temporary path renamed onto ``path`` after the block."""
    path = osp.abspath(path)
    if makedirs:
        os.makedirs(osp.dirname(path), exist_ok=True)
    tmp = temp_path_for(path, suffix)
    main = threading.current_thread() is threading.main_thread()
    old = main and signal.signal(signal.SIGTERM, _sigterm)  # SystemExit(143)
    try:
        yield tmp
        if missing_ok and not osp.lexists(tmp):
            return
        if durable:
            _fsync(tmp)
        umask = os.umask(0)  # open()'s permissions, not mkstemp's 0600
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        # torch.save reports a full disk as a RuntimeError from OSError
        err, seen = e, set()
        while isinstance(e, Exception) and err is not None and \
                id(err) not in seen and not isinstance(err, OSError):
            seen.add(id(err))
            err = err.__cause__ or err.__context__
        if isinstance(err, OSError) and err is not e:
            raise OSError(err.errno, err.strerror, err.filename) from e
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, old)
    if durable:
        with contextlib.suppress(OSError):
            _fsync(osp.dirname(path))


def atomic_write(path: str,
                 data: Union[str, bytes],
                 makedirs: bool = False,
                 durable: bool = False) -> None:
    """Replace ``path`` by ``data`` (text as UTF-8) atomically."""
    with atomic_path(path, makedirs=makedirs, durable=durable) as tmp:
        with open(tmp, 'xb') as f:
            f.write(data.encode() if isinstance(data, str) else data)


def remove_stale_temps(directory: str,
                       name: Optional[str] = None) -> List[str]:
    """Delete (and return) the temporaries whose writer is gone."""
    try:
        entries, removed = os.listdir(directory), []
    except OSError:  # none yet, unreadable
        return []
    for entry in entries:
        m = _TMP_RE.match(entry)
        if not m or name not in (None, m.group('name')):
            continue
        try:
            os.kill(int(m.group('pid')), 0)
        except ProcessLookupError:  # gone (PermissionError: it runs)
            with contextlib.suppress(OSError):
                os.unlink(osp.join(directory, entry))
                removed.append(osp.join(directory, entry))
        except OSError:
            pass
    return removed
