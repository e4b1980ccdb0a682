"""A run's checkpoint directory: the file to resume, the run owning it."""
import contextlib
import logging
import os
import os.path as osp
import re
from collections.abc import Mapping
from typing import Iterable, List, Optional, Tuple

from mmengine.logging import print_log

from mmsoft.utils.atomic import atomic_write
from mmsoft.utils.checkpoint_io import (CheckpointError, describe_damage,
                                        load_verified)

_CKPT_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')
#: the owning work dir, in a checkpoint directory outside it
OWNER_FILE = '.mmsoft-work-dir'


class CheckpointDirInUse(CheckpointError):
    """The checkpoint directory belongs to another work dir's run."""


def training(runner) -> bool:
    """Whether the train loop is built."""
    from mmengine.runner import BaseLoop
    return isinstance(getattr(runner, '_train_loop', None), BaseLoop)


def read_line(path: str) -> Optional[str]:
    """The stripped text of a file, or None (missing, empty)."""
    try:
        with open(path) as f:
            return f.read().strip() or None
    except OSError:
        return None


def checkpoint_candidates(dirs: Iterable[str],
                          extra: Iterable[str] = ()) -> List[str]:
    """``epoch_N.pth`` / ``iter_N.pth`` of ``dirs`` and ``extra``, newest
    (by N, then mtime) first."""
    found = {
        osp.abspath(osp.join(d, e))
        for d in dirs
        for e in (os.listdir(d) if osp.isdir(d) else ()) if _CKPT_RE.match(e)
    } | {osp.abspath(p)
         for p in extra if p and osp.isfile(p)}

    def key(p):
        m = _CKPT_RE.match(osp.basename(p))
        return int(m.group(1)) if m else -1, \
            osp.getmtime(p) if osp.exists(p) else 0.

    return sorted(found, key=key, reverse=True)


def check_complete(path: str) -> Optional[str]:
    """None if ``path`` is a training checkpoint that loads, else why."""
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


def check_undamaged(path: str) -> Optional[str]:
    """:func:`check_complete` without unpickling."""
    damage = describe_damage(path)
    return damage and f'checkpoint {path} {damage}'


def find_newest_complete(work_dir: str,
                         out_dir: Optional[str] = None,
                         check=check_complete,
                         quiet: bool = False
                         ) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete checkpoint of ``work_dir`` and ``out_dir`` (or
    None), the ``(path, reason)`` of newer damaged ones; a
    ``last_checkpoint`` naming a file elsewhere is ignored."""

    def warn(msg):
        if not quiet:
            print_log(
                f'mmsoft: {msg}', logger='current', level=logging.WARNING)

    dirs = list(dict.fromkeys([work_dir] + ([out_dir] if out_dir else [])))
    last = read_line(osp.join(work_dir, 'last_checkpoint'))
    own = {osp.realpath(d) for d in dirs}
    if last and osp.realpath(osp.dirname(osp.abspath(last))) not in own:
        warn(f'{osp.join(work_dir, "last_checkpoint")} names {last}, outside '
             f'this run\'s checkpoint directory (a copied or moved work '
             f'dir?): ignored; resuming from the newest checkpoint of '
             f'{" / ".join(dirs)}')
        last = None
    skipped = []
    for p in checkpoint_candidates(dirs, [last]):
        reason = check(p)
        if reason is None:
            return p, skipped
        skipped.append((p, reason))
        warn(f'skipping {reason}' if reason.startswith('checkpoint ') else
             f'skipping checkpoint {p}: it {reason}')
    if last and not osp.isfile(last):
        warn(f'last_checkpoint names {last}, which does not exist')
    return None, skipped


def no_complete_checkpoint(work_dir: str, damaged: List[str]) -> str:
    return (f'resume: no complete checkpoint in {work_dir}; damaged: '
            f'{damaged}. Remove them to train from scratch.')


def missing_resume_file(path: str) -> str:
    return (f'--resume {path}: no such file (omit the path to resume from '
            f'the newest checkpoint of the work dir)')


def checkpoint_dir_of(work_dir: str, out_dir: Optional[str] = None) -> str:
    """The work dir, or mmengine's ``<out_dir>/<work dir name>``."""
    if out_dir is None or out_dir == work_dir:
        return work_dir
    return osp.join(out_dir, osp.basename(str(work_dir).rstrip(osp.sep)))


def checkpoint_dir_refusal(ckpt_dir: str, work_dir: str) -> Optional[str]:
    """Why ``work_dir``'s run may not write ``ckpt_dir``, or None."""
    me = osp.realpath(work_dir)
    if osp.realpath(ckpt_dir) == me:
        return None
    marker = osp.join(ckpt_dir, OWNER_FILE)
    owner = read_line(marker)
    if not owner or owner == me:
        return None
    return (f'checkpoint directory {ckpt_dir} (default_hooks.checkpoint.'
            f'out_dir / the work dir\'s name) belongs to the run in work '
            f'dir {owner} ({marker}), not to this one ({me}): its '
            f'max_keep_ckpts would delete the other run\'s checkpoints and '
            f'--resume would continue it. Give this run another out_dir or '
            f'a work dir of another name (if you moved that work dir here, '
            f'delete {marker})')


def claim_checkpoint_dir(ckpt_dir: str, work_dir: str) -> None:
    """Make ``work_dir`` the owner of ``ckpt_dir`` or raise
    :class:`CheckpointDirInUse`."""
    me = osp.realpath(work_dir)
    if osp.realpath(ckpt_dir) == me:
        return
    marker = osp.join(ckpt_dir, OWNER_FILE)
    os.makedirs(ckpt_dir, exist_ok=True)
    with contextlib.suppress(FileExistsError), open(marker, 'x') as f:
        f.write(me + '\n')  # exclusive: the first run wins
        return
    refusal = checkpoint_dir_refusal(ckpt_dir, work_dir)
    if refusal:
        raise CheckpointDirInUse(refusal)
    if not read_line(marker):
        atomic_write(marker, me + '\n')
