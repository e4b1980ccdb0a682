"""Checkpoint files that survive a kill and are never silently damaged.

* :func:`save_atomic` - ``torch.save`` through
  :func:`mmsoft.utils.atomic.atomic_path`: the target is either the
  complete new file or untouched (temporaries are removed on errors and
  SIGTERM, :func:`remove_stale_temps` removes what a SIGKILL left).
* :func:`load_verified` - :func:`mmsoft.utils.safe_load.safe_torch_load`
  after :func:`describe_damage`, with one-line errors. torch's zip reader
  does not check the CRC-32 of tensor records (a flipped bit in a tensor
  loads as a different value); :func:`describe_damage` checks every
  record's CRC-32 with :mod:`zipfile`, which detects it.
* :func:`check_runner_checkpoint` - what ``Runner.load_or_resume`` is about
  to read, checked by :class:`~mmsoft.engine.hooks.SafeCheckpointHook`'s
  ``before_run`` (mmengine's own ``torch.load`` unpickles anything before
  torch 2.6).
* :func:`find_newest_complete` - the newest ``epoch_N.pth`` /
  ``iter_N.pth`` of a work dir that loads; damaged newer ones are skipped,
  and a ``last_checkpoint`` naming a file of another directory (a copied
  work dir) is ignored.
* :func:`claim_checkpoint_dir` - one run per checkpoint directory: a
  shared ``out_dir`` of two work dirs of the same name is refused.
* :func:`recorded_attn_norms` - the ``attn_norm`` settings that the
  config stored in a training checkpoint (``meta['cfg']``) records.
"""
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

from .atomic import TMP_SUFFIX, atomic_path, atomic_write, remove_stale_temps
from .safe_load import safe_torch_load, unsafe_globals

__all__ = [
    'CheckpointError', 'CheckpointWriteError', 'CheckpointRefused',
    'save_atomic', 'describe_damage', 'load_verified',
    'check_runner_checkpoint', 'find_newest_complete', 'check_complete',
    'checkpoint_candidates', 'remove_stale_temps', 'refused_globals',
    'refusal_message', 'is_legacy_pickle', 'TMP_SUFFIX', 'CheckpointDirInUse',
    'claim_checkpoint_dir', 'OWNER_FILE', 'recorded_attn_norms'
]

_CKPT_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')


class CheckpointError(RuntimeError):
    """A checkpoint file is damaged."""


class CheckpointDirInUse(CheckpointError):
    """A checkpoint directory belongs to the run of another work dir
    (:func:`claim_checkpoint_dir`)."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, ...): the message
    names the file and what was kept (``SafeCheckpointHook``)."""

    def __str__(self):
        return self.strerror or super().__str__()


class CheckpointRefused(pickle.UnpicklingError):
    """Weights-only loading refused a checkpoint (:func:`refusal_message`).
    """


def describe_damage(path: str) -> Optional[str]:
    """Why ``path`` cannot be a complete torch checkpoint, or None: empty,
    not a checkpoint, a truncated zip, a record failing its CRC-32 (reads
    the whole file)."""
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if size == 0:
        return 'is empty (0 bytes)'
    if head[:2] != b'PK':
        if head[:1] == b'\x80':  # a pickle (legacy torch.save format)
            return None
        return f'is not a torch checkpoint (starts with {head!r})'
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - BadZipFile, zlib errors ...
        return f'is truncated or corrupt ({size} bytes; {e})'
    return None if bad is None else f'is corrupt (CRC error in record ' \
        f'{bad!r})'


def is_legacy_pickle(path: str) -> bool:
    """True for a pickle file, not torch's zip format."""
    try:
        with open(path, 'rb') as f:
            return f.read(1) == b'\x80'
    except OSError:
        return False


def refused_globals(path: str) -> List[str]:
    """Globals in ``path`` that weights-only loading refuses."""
    return unsafe_globals(path)


def refusal_message(path: str,
                    refused: List[str],
                    converter: bool = False) -> str:
    """One line for a refused checkpoint: the file, what it holds and the
    safe fix (never torch's advice to load with ``weights_only=False``)."""
    what = 'pickled objects other than tensors and plain containers'
    if refused:
        what += f' ({", ".join(refused)})'
    if is_legacy_pickle(path):
        what = f"a plain / legacy pickle (not torch's zip format) with {what}"
    fix = ('if you trust the file, run again with --trust-checkpoint'
           if converter else
           'convert it with tools/model_converters/soft2mmsoft.py SRC DST '
           '(add --trust-checkpoint there only if you trust the file)')
    return (f'checkpoint {path} was refused: it holds {what}, which could '
            f'run code when unpickled; {fix}')


def load_verified(path: str, map_location='cpu', weights_only=None):
    """Load ``path`` without running code from it (``weights_only=False``:
    anything, for a file the caller explicitly trusts). A damaged file
    raises :class:`CheckpointError`, a refused one
    :class:`CheckpointRefused`; both one line naming the file and the fix.
    """
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
            path, refused_globals(path))) from None


def check_runner_checkpoint(runner):
    """Check the local file that ``runner.load_or_resume`` will read
    (``load_from``, or ``resume=True`` with a path) with
    :func:`load_verified`: raises before mmengine's ``torch.load`` could
    unpickle a code-running or damaged file (``before_run`` hooks run
    before ``load_or_resume`` in mmengine 0.10's ``train`` / ``val`` /
    ``test``). Returns the checkpoint read (None: nothing to check)."""
    path = getattr(runner, '_load_from', None)
    if path and not getattr(runner, '_has_loaded', False) and \
            osp.isfile(str(path)):
        return load_verified(str(path))
    return None


def recorded_attn_norms(checkpoint) -> set:
    """The ``attn_norm`` values that the config of a training checkpoint
    (mmengine stores the run's config text as ``meta['cfg']``) sets inside
    ``model`` (empty: none recorded). The text is parsed with :mod:`ast`,
    never executed."""
    import ast
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) \
        else None
    text = meta.get('cfg') if isinstance(meta, Mapping) else None
    if not isinstance(text, str):
        return set()
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return set()
    found = set()
    for stmt in tree.body:
        if not (isinstance(stmt, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == 'model'
                for t in stmt.targets)):
            continue
        for node in ast.walk(stmt.value):
            values = []
            if isinstance(node, ast.Call):
                values = [
                    k.value for k in node.keywords if k.arg == 'attn_norm'
                ]
            elif isinstance(node, ast.Dict):
                values = [
                    v for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and k.value == 'attn_norm'
                ]
            found.update(
                v.value for v in values
                if isinstance(v, ast.Constant) and isinstance(v.value, bool))
    return found


def save_atomic(obj, path: str, writer=None) -> None:
    """``writer(obj, file)`` (default ``torch.save``) into ``path``
    atomically and durably (:func:`mmsoft.utils.atomic.atomic_path`)."""
    with atomic_path(path, durable=True) as tmp:
        with open(tmp, 'xb') as f:
            (writer or torch.save)(obj, f)


def checkpoint_candidates(dirs: Iterable[str],
                          extra: Iterable[str] = ()) -> List[str]:
    """``epoch_N.pth`` / ``iter_N.pth`` files of ``dirs`` plus ``extra``
    paths, newest first (by N, then by modification time)."""
    found = {}
    for d in dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for entry in entries:
            m = _CKPT_RE.match(entry)
            if m:
                found[osp.abspath(osp.join(d, entry))] = int(m.group(1))
    for p in extra:
        if p and osp.isfile(p):
            m = _CKPT_RE.match(osp.basename(p))
            found.setdefault(osp.abspath(p), int(m.group(1)) if m else -1)

    def key(p):
        try:
            return found[p], os.path.getmtime(p)
        except OSError:
            return found[p], 0.

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
               f'{str(e).splitlines()[0] if str(e) else ""})'
    if not isinstance(ckpt, Mapping) or 'meta' not in ckpt:
        return 'is not a training checkpoint (no meta)'
    return None


def find_newest_complete(work_dir: str,
                         out_dir: Optional[str] = None
                         ) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """``(path or None, skipped)``: the newest complete training checkpoint
    among the ``epoch_N.pth`` / ``iter_N.pth`` of ``work_dir`` and
    ``out_dir`` (the run's checkpoint directory) and the file that
    ``<work_dir>/last_checkpoint`` names if it lies in one of them (a name
    elsewhere, as in a copied work dir, is ignored with a warning: resume
    continues the run of this work dir, never another one); ``skipped``
    lists ``(path, reason)`` of newer, damaged ones (each also logged as a
    warning)."""
    from mmengine.logging import print_log
    dirs = [work_dir] + ([out_dir] if out_dir else [])
    last = None
    try:
        with open(osp.join(work_dir, 'last_checkpoint')) as f:
            last = f.read().strip() or None
    except OSError:
        pass
    own = {osp.realpath(d) for d in dirs}
    if last and osp.realpath(osp.dirname(osp.abspath(last))) not in own:
        # a copied or moved work dir: its last_checkpoint names the file
        # of the other run; resuming (or max_keep_ckpts) must not touch it
        print_log(
            f'mmsoft: {osp.join(work_dir, "last_checkpoint")} names {last}, '
            f'outside this run\'s checkpoint directory (a copied or moved '
            f'work dir?): ignored; resuming from the newest checkpoint of '
            f'{" / ".join(dict.fromkeys(dirs))}',
            logger='current',
            level=logging.WARNING)
        last = None
    skipped = []
    for p in checkpoint_candidates(
            dict.fromkeys(dirs), [last] if last else []):
        reason = check_complete(p)
        if reason is None:
            return p, skipped
        skipped.append((p, reason))
        print_log(
            f'mmsoft: skipping {reason}' if reason.startswith('checkpoint ')
            else f'mmsoft: skipping checkpoint {p}: it {reason}',
            logger='current',
            level=logging.WARNING)
    if last and not osp.isfile(last):
        print_log(
            f'mmsoft: last_checkpoint names {last}, which does not exist',
            logger='current',
            level=logging.WARNING)
    return None, skipped


#: the file in a checkpoint directory outside the work dir that names the
#: work dir of the run writing there (:func:`claim_checkpoint_dir`)
OWNER_FILE = '.mmsoft-work-dir'


def claim_checkpoint_dir(ckpt_dir: str, work_dir: str) -> None:
    """Record ``work_dir`` as the run of ``ckpt_dir`` (``out_dir`` /
    ``<work dir name>``), or raise :class:`CheckpointDirInUse` (one line)
    when another work dir holds it: two runs whose work dirs have the same
    name share mmengine's checkpoint directory, where one's
    ``max_keep_ckpts`` deletes the other's checkpoints and ``--resume``
    continues the other run. Nothing to do when ``ckpt_dir`` is the work
    dir itself."""
    if osp.realpath(ckpt_dir) == osp.realpath(work_dir):
        return
    me = osp.realpath(work_dir)
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


def add_checksum(checkpoint):
    """Deprecated in 0.4 (removed in 0.5): checkpoints are no longer given an
    mmsoft checksum; :func:`describe_damage` checks torch's zip CRC-32s."""
    warnings.warn(
        'mmsoft.utils.checkpoint_io.add_checksum is deprecated and does '
        'nothing: damage is detected by the zip CRC-32s (describe_damage)',
        DeprecationWarning,
        stacklevel=2)
    return checkpoint


def verify_checksum(checkpoint, filename: str = '<checkpoint>') -> bool:
    """Deprecated in 0.4 (removed in 0.5): see :func:`add_checksum`; returns
    False (no mmsoft checksum checked)."""
    warnings.warn(
        'mmsoft.utils.checkpoint_io.verify_checksum is deprecated and does '
        'nothing: use describe_damage(path) / load_verified(path)',
        DeprecationWarning,
        stacklevel=2)
    return False
