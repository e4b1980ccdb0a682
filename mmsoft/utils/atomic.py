"""Atomic file writes: the target is either the complete new file or
untouched.

The one home of "write a temporary file next to the target, then
``os.replace``", used by the checkpoints (:mod:`mmsoft.utils.checkpoint_io`,
:class:`~mmsoft.engine.hooks.SafeCheckpointHook`, the converters), copied
configs (``python -m mmsoft.configs copy``), ONNX exports and the tools'
tables, figures and JSON files:

* :func:`atomic_path` - a context manager that yields a temporary path in
  the target's directory for any writer that takes a file name
  (``fig.savefig``, ``np.savez``, ``torch.onnx.export``, ``shutil.copyfile``
  ...), renames it onto the target when the block succeeds and removes it
  on any exception, SIGINT or SIGTERM (SIGTERM raises ``SystemExit(143)``
  inside the block, in the main thread).
* :func:`atomic_write` - text or bytes through :func:`atomic_path`.
* :func:`remove_stale_temps` - deletes what a SIGKILL left behind: the
  temporaries are named ``.<name>.<pid>.<random>.mmsoft-tmp[<suffix>]``.

``durable=True`` (the checkpoints) also ``fsync``\\ s the file before and its
directory after the rename, so that the new file survives a power loss.
This module uses the standard library only.
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
    'signals_raise', 'os_error_in_chain', 'TMP_SUFFIX'
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

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except (ValueError, OSError):  # pragma: no cover - unusual embeddings
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def temp_path_for(path: str, suffix: str = '') -> str:
    """A fresh temporary name next to ``path`` (see :data:`TMP_SUFFIX`);
    ``suffix`` (e.g. ``'.png'``) is appended for writers that infer the
    format from the name."""
    d, name = osp.split(osp.abspath(path))
    return osp.join(
        d, f'.{name}.{os.getpid()}.{os.urandom(4).hex()}'
        f'{TMP_SUFFIX}{suffix}')


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _chmod_default(path: str) -> None:
    """The permissions of a file made by ``open()`` (not mkstemp's 0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def os_error_in_chain(exc: BaseException) -> Optional[OSError]:
    """The first ``OSError`` in ``exc`` and its causes / contexts.

    ``torch.save`` into a file reports a full disk as ``RuntimeError:
    [enforce fail at inline_container.cc] . unexpected pos ...`` raised
    while handling the file's ``OSError: [Errno 28] No space left on
    device``; this finds the latter.
    """
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
                durable: bool = False) -> Iterator[str]:
    """Yield a temporary path next to ``path``; rename it onto ``path`` when
    the block succeeds.

    Args:
        path: the target file.
        suffix: appended to the temporary name (``'.png'`` for
            ``savefig``, ``'.npz'`` for ``np.savez`` ...).
        makedirs: create the target's directory first.
        durable: ``fsync`` the file before and the directory after the
            rename (checkpoints).

    On any exception - an unwritable directory, a full disk, SIGINT /
    SIGTERM - the temporary file is removed, ``path`` is untouched and the
    exception propagates; an ``OSError`` that the writer wrapped in another
    exception (``torch.save`` on a full disk) is raised as that ``OSError``
    (:func:`os_error_in_chain`).
    """
    path = osp.abspath(path)
    if makedirs:
        os.makedirs(osp.dirname(path), exist_ok=True)
    tmp = temp_path_for(path, suffix)
    with signals_raise():
        try:
            yield tmp
            if durable:
                with open(tmp, 'rb+') as f:
                    os.fsync(f.fileno())
            _chmod_default(tmp)
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
        _fsync_dir(osp.dirname(path))


def atomic_write(path: str,
                 data: Union[str, bytes],
                 makedirs: bool = False,
                 durable: bool = False) -> None:
    """Replace ``path`` by ``data`` (text is written as UTF-8) atomically;
    see :func:`atomic_path`."""
    if isinstance(data, str):
        data = data.encode()
    with atomic_path(path, makedirs=makedirs, durable=durable) as tmp:
        with open(tmp, 'xb') as f:
            f.write(data)


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stale_temps(directory: str,
                       name: Optional[str] = None) -> List[str]:
    """Delete temporary files of :func:`atomic_path` (without ``suffix``)
    in ``directory`` whose writer process no longer runs (left by a
    SIGKILL); returns their paths. With ``name``, only the temporaries of
    that target file."""
    removed = []
    try:
        entries = os.listdir(directory)
    except OSError:
        return removed
    for entry in entries:
        m = _TMP_RE.match(entry)
        if not m or (name is not None and m.group('name') != name):
            continue
        if _pid_alive(int(m.group('pid'))):
            continue
        p = osp.join(directory, entry)
        try:
            os.unlink(p)
            removed.append(p)
        except OSError:
            pass
    return removed
