"""Atomic file writes: the target is either the complete new file or
untouched.

:func:`atomic_path` yields a temporary path in the target's directory for
any writer that takes a file name (``torch.save``, ``fig.savefig``,
``torch.onnx.export`` ...), renames it onto the target when the block
succeeds and removes it on any exception, SIGINT or SIGTERM (which raises
``SystemExit(143)`` inside the block, in the main thread); ``durable=True``
(checkpoints) also ``fsync`` s the file and its directory.
:func:`atomic_write` writes text or bytes through it;
:func:`remove_stale_temps` deletes what a SIGKILL left behind (temporaries
are named ``.<name>.<pid>.<random>.mmsoft-tmp[<suffix>]``).
"""
import contextlib
import os
import os.path as osp
import re
import signal
import threading
from typing import Iterator, List, Optional, Union

__all__ = [
    'atomic_path', 'atomic_write', 'temp_path_for', 'remove_stale_temps',
    'signals_raise', 'os_error_in_chain', 'pid_alive', 'TMP_SUFFIX',
    'unwritable_reason'
]

#: what every temporary name ends with (before an optional ``suffix``)
TMP_SUFFIX = '.mmsoft-tmp'

_TMP_RE = re.compile(r'^\.(?P<name>.+)\.(?P<pid>\d+)\.[0-9a-f]{8}' +
                     re.escape(TMP_SUFFIX) + '$')


@contextlib.contextmanager
def signals_raise() -> Iterator[None]:
    """SIGTERM raises SystemExit inside (SIGINT already raises
    KeyboardInterrupt), so that ``finally`` clauses run; main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def temp_path_for(path: str, suffix: str = '') -> str:
    """A fresh temporary name next to ``path`` (``suffix``, e.g. ``'.png'``,
    for writers that infer the format from the name)."""
    d, name = osp.split(osp.abspath(path))
    return osp.join(
        d, f'.{name}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}{suffix}')


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def os_error_in_chain(exc: BaseException) -> Optional[OSError]:
    """The first ``OSError`` in ``exc`` and its causes / contexts
    (``torch.save`` reports a full disk as a ``RuntimeError`` raised while
    handling ``OSError: [Errno 28] No space left on device``)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


@contextlib.contextmanager
def atomic_path(path: str,
                suffix: str = '',
                makedirs: bool = False,
                durable: bool = False,
                missing_ok: bool = False) -> Iterator[str]:
    """Yield a temporary path next to ``path``; rename it onto ``path``
    when the block succeeds (see the module doc). On any exception the
    temporary file is removed, ``path`` is untouched and the exception
    propagates; an ``OSError`` that the writer wrapped in another exception
    is raised as that ``OSError``. ``missing_ok``: a block that wrote
    nothing (e.g. a rank other than 0) leaves ``path`` untouched."""
    path = osp.abspath(path)
    if makedirs:
        os.makedirs(osp.dirname(path), exist_ok=True)
    tmp = temp_path_for(path, suffix)
    with signals_raise():
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
            os_error = os_error_in_chain(e) if isinstance(e, Exception) \
                else None
            if os_error is not None and os_error is not e:
                raise OSError(os_error.errno, os_error.strerror,
                              os_error.filename) from e
            raise
    if durable:
        with contextlib.suppress(OSError):
            _fsync(osp.dirname(path))


def atomic_write(path: str,
                 data: Union[str, bytes],
                 makedirs: bool = False,
                 durable: bool = False) -> None:
    """Replace ``path`` by ``data`` (text as UTF-8) atomically."""
    if isinstance(data, str):
        data = data.encode()
    with atomic_path(path, makedirs=makedirs, durable=durable) as tmp:
        with open(tmp, 'xb') as f:
            f.write(data)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a process we may not signal does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, someone else's
        return True
    return True


def remove_stale_temps(directory: str,
                       name: Optional[str] = None) -> List[str]:
    """Delete the temporaries of :func:`atomic_path` (without ``suffix``)
    in ``directory`` whose writer no longer runs; with ``name``, only those
    of that target. Returns their paths."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        m = _TMP_RE.match(entry)
        if m and (name is None or m.group('name') == name) and \
                not pid_alive(int(m.group('pid'))):
            with contextlib.suppress(OSError):
                os.unlink(osp.join(directory, entry))
                removed.append(osp.join(directory, entry))
    return removed


def unwritable_reason(path: str, directory: bool = False) -> Optional[str]:
    """Why a file (``directory``: a directory) cannot be written at
    ``path``, or None: checked before heavy work. Missing parents are fine
    (writers create them) unless the nearest existing one is a file or not
    writable."""
    path = osp.abspath(path)
    if not directory and osp.isdir(path):
        return 'is a directory; give a file name'
    if directory and osp.exists(path) and not osp.isdir(path):
        return 'exists and is not a directory'
    parent = osp.dirname(path)
    while not osp.exists(parent) and osp.dirname(parent) != parent:
        parent = osp.dirname(parent)
    if not osp.isdir(parent):
        return f'{parent} is a file, not a directory'
    if not os.access(parent, os.W_OK | os.X_OK):
        return f'directory {parent} is not writable'
    return None
