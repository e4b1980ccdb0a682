"""Checkpoint files that survive a kill and are never silently damaged
(docs/en/advanced_guides/fault_tolerance.md)."""
import logging
import os
import os.path as osp
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping
from typing import Iterable, List, Optional, Tuple

import torch
from mmengine.logging import print_log

from .atomic import TMP_SUFFIX, atomic_path, atomic_write, remove_stale_temps
from .safe_load import safe_torch_load, unsafe_globals

__all__ = [
    'CheckpointError', 'CheckpointWriteError', 'CheckpointRefused',
    'save_atomic', 'describe_damage', 'load_verified', 'find_newest_complete',
    'check_complete', 'checkpoint_candidates', 'remove_stale_temps',
    'refusal_message', 'TMP_SUFFIX', 'CheckpointDirInUse',
    'claim_checkpoint_dir', 'OWNER_FILE'
]

_CKPT_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')
#: in a checkpoint directory outside the work dir: the work dir writing it
OWNER_FILE = '.mmsoft-work-dir'


class CheckpointError(RuntimeError):
    """A checkpoint file is damaged."""


class CheckpointDirInUse(CheckpointError):
    """A checkpoint directory belongs to the run of another work dir."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, ...)."""

    def __str__(self):
        return self.strerror or super().__str__()


class CheckpointRefused(pickle.UnpicklingError):
    """Weights-only loading refused a checkpoint."""


def _warn(msg):
    print_log(f'mmsoft: {msg}', logger='current', level=logging.WARNING)


def _head(path: str, n: int) -> bytes:
    with open(path, 'rb') as f:
        return f.read(n)


def describe_damage(path: str) -> Optional[str]:
    """Why ``path`` cannot be a complete torch checkpoint, or None: empty,
    not a checkpoint, truncated, a record failing its CRC-32 (which
    ``torch.load`` does not check)."""
    try:
        size, head = os.path.getsize(path), _head(path, 4)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if head[:2] != b'PK':  # b'\x80': a pickle (legacy torch.save format)
        return None if head[:1] == b'\x80' else 'is empty (0 bytes)' \
            if not size else f'is not a torch checkpoint (starts with ' \
            f'{head!r})'
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - BadZipFile, zlib errors ...
        return f'is truncated or corrupt ({size} bytes; {e})'
    return bad and f'is corrupt (CRC error in record {bad!r})'


def refusal_message(path: str, refused: List[str], converter=False) -> str:
    """One line for a refused checkpoint: the file, what it holds and the
    safe fix (never ``weights_only=False``)."""
    what = 'pickled objects other than tensors and plain containers' + (
        f' ({", ".join(refused)})' if refused else '')
    if osp.isfile(path) and _head(path, 1) == b'\x80':
        what = f"a plain / legacy pickle (not torch's zip format) with {what}"
    fix = 'if you trust the file, run again with --trust-checkpoint' \
        if converter else ('convert it with tools/model_converters/'
                           'soft2mmsoft.py SRC DST (add --trust-checkpoint '
                           'there only if you trust the file)')
    return (f'checkpoint {path} was refused: it holds {what}, which could '
            f'run code when unpickled; {fix}')


def load_verified(path: str, map_location='cpu', weights_only=None):
    """Load ``path`` without running code from it (``weights_only=False``:
    anything, for a trusted file). A damaged file raises
    :class:`CheckpointError`, one that pickles code
    :class:`CheckpointRefused`: one line naming the file and the fix."""
    damage = describe_damage(path)
    if damage is not None:
        raise CheckpointError(f'checkpoint {path} {damage}; it was not '
                              f'loaded (use an earlier or a fresh copy)')
    if weights_only is False:
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        return safe_torch_load(path, map_location=map_location)
    except pickle.UnpicklingError:
        raise CheckpointRefused(refusal_message(
            path, unsafe_globals(path))) from None


def save_atomic(obj, path: str, writer=None) -> None:
    """``writer(obj, file)`` (default ``torch.save``) into ``path``
    atomically and durably."""
    with atomic_path(path, durable=True) as tmp:
        with open(tmp, 'xb') as f:
            (writer or torch.save)(obj, f)


def checkpoint_candidates(dirs: Iterable[str],
                          extra: Iterable[str] = ()) -> List[str]:
    """``epoch_N.pth`` / ``iter_N.pth`` of ``dirs`` plus the ``extra``
    files, newest first (by N, then by modification time)."""
    found = {}
    for d in dirs:
        for entry in os.listdir(d) if osp.isdir(d) else ():
            m = _CKPT_RE.match(entry)
            if m:
                found[osp.abspath(osp.join(d, entry))] = int(m.group(1))
    for p in extra:
        if p and osp.isfile(p):
            m = _CKPT_RE.match(osp.basename(p))
            found.setdefault(osp.abspath(p), int(m.group(1)) if m else -1)

    def key(p):
        return found[p], osp.getmtime(p) if osp.exists(p) else 0.

    return sorted(found, key=key, reverse=True)


def check_complete(path: str) -> Optional[str]:
    """None if ``path`` is an undamaged training checkpoint that loads
    safely, else the reason."""
    try:
        ckpt = load_verified(path)
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001
        return f'cannot be loaded ({type(e).__name__}: ' \
               f'{(str(e).splitlines() or [""])[0]})'
    if not isinstance(ckpt, Mapping) or 'meta' not in ckpt:
        return 'is not a training checkpoint (no meta)'
    return None


def find_newest_complete(work_dir: str,
                         out_dir: Optional[str] = None
                         ) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete training checkpoint of ``work_dir`` and
    ``out_dir``, or None, and the ``(path, reason)`` of the damaged newer
    ones (logged). A ``last_checkpoint`` naming a file elsewhere (a copied
    work dir) is ignored."""
    dirs = list(dict.fromkeys([work_dir] + ([out_dir] if out_dir else [])))
    last = None
    if osp.isfile(osp.join(work_dir, 'last_checkpoint')):
        with open(osp.join(work_dir, 'last_checkpoint')) as f:
            last = f.read().strip() or None
    own = {osp.realpath(d) for d in dirs}
    if last and osp.realpath(osp.dirname(osp.abspath(last))) not in own:
        _warn(f'{osp.join(work_dir, "last_checkpoint")} names {last}, '
              f'outside this run\'s checkpoint directory (a copied or moved '
              f'work dir?): ignored; resuming from the newest checkpoint of '
              f'{" / ".join(dirs)}')
        last = None
    skipped = []
    for p in checkpoint_candidates(dirs, [last] if last else []):
        reason = check_complete(p)
        if reason is None:
            return p, skipped
        skipped.append((p, reason))
        _warn(f'skipping {reason}' if reason.startswith('checkpoint ') else
              f'skipping checkpoint {p}: it {reason}')
    if last and not osp.isfile(last):
        _warn(f'last_checkpoint names {last}, which does not exist')
    return None, skipped


def claim_checkpoint_dir(ckpt_dir: str, work_dir: str) -> None:
    """Record ``work_dir`` as the run writing ``ckpt_dir`` (``out_dir`` /
    ``<work dir name>``), or raise :class:`CheckpointDirInUse` when the run
    of another work dir holds it."""
    me = osp.realpath(work_dir)
    if osp.realpath(ckpt_dir) == me:
        return
    marker = osp.join(ckpt_dir, OWNER_FILE)
    os.makedirs(ckpt_dir, exist_ok=True)
    try:
        fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        try:
            with open(marker) as f:
                owner = f.read().strip()
        except OSError:
            owner = ''
        if owner and owner != me:
            raise CheckpointDirInUse(
                f'checkpoint directory {ckpt_dir} (default_hooks.checkpoint.'
                f'out_dir / the work dir\'s name) belongs to the run in work '
                f'dir {owner} ({marker}), not to this one ({me}): its '
                f'max_keep_ckpts would delete the other run\'s checkpoints '
                f'and --resume would continue it. Give this run another '
                f'out_dir or a work dir of another name (if you moved that '
                f'work dir here, delete {marker})') from None
        if not owner:
            atomic_write(marker, me + '\n')
        return
    with os.fdopen(fd, 'w') as f:
        f.write(me + '\n')


#: 0.3.0's names, deprecated in 0.4, removed in 0.5: (object, why)
_DEPRECATED = dict(
    add_checksum=(lambda checkpoint: checkpoint, 'does nothing: damage is '
                  'detected by the zip CRC-32s (describe_damage)'),
    verify_checksum=(lambda checkpoint, filename='': False, 'does nothing: '
                     'use describe_damage(path) / load_verified(path)'),
    refused_globals=(unsafe_globals,
                     'use mmsoft.utils.safe_load.unsafe_globals'))


def __getattr__(name):
    if name not in _DEPRECATED:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    warnings.warn(
        f'mmsoft.utils.checkpoint_io.{name} is deprecated: '
        f'{_DEPRECATED[name][1]}',
        DeprecationWarning,
        stacklevel=2)
    return _DEPRECATED[name][0]
