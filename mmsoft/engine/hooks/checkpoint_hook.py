"""Kill-safe, bit-exact ``CheckpointHook`` (docs/en/advanced_guides/
fault_tolerance.md)."""
import contextlib
import copy
import errno
import json
import logging
import os
import os.path as osp
import random
import re
from collections.abc import Mapping
from typing import Iterable, List, Optional, Tuple

import numpy as np
import torch
from mmengine.dist import (all_gather_object, broadcast_object_list, get_rank,
                           get_world_size, is_main_process)
from mmengine.fileio import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from mmsoft.utils.atomic import atomic_path, atomic_write, remove_stale_temps
from mmsoft.utils.checkpoint_io import (CheckpointError, CheckpointWriteError,
                                        describe_damage, load_verified)
from mmsoft.utils.safe_load import mmengine_checkpoints_allowed

_CKPT_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')
#: the owning work dir, in a checkpoint directory outside it
OWNER_FILE = '.mmsoft-work-dir'
#: ``{"checkpoint", "epoch", "iter"}`` while a checkpoint's validation runs
VAL_MARKER = '.mmsoft-val-pending'


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
    """The ``epoch_N.pth`` / ``iter_N.pth`` files, newest first."""
    found = {
        osp.abspath(osp.join(d, e))
        for d in dirs
        for e in (os.listdir(d) if osp.isdir(d) else ()) if _CKPT_RE.match(e)
    } | {osp.abspath(p)
         for p in extra if p and osp.isfile(p)}
    m = _CKPT_RE.match
    return sorted(
        found,
        key=lambda p: (int(m(osp.basename(p))[1])
                       if m(osp.basename(p)) else -1, osp.getmtime(p)),
        reverse=True)


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
    """The newest complete checkpoint, the ``(path, reason)`` of newer ones."""

    def warn(msg):
        quiet or print_log(f'mmsoft: {msg}', 'current', logging.WARNING)

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


def missing_load_from(path: str, trains: bool = True) -> str:
    fix = ', or leave load_from out' if trains else ''
    return (f'load_from {path}: no such file; pass an existing checkpoint '
            f'(e.g. <work_dir>/epoch_N.pth){fix}')


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
    """Make ``work_dir`` the owner of ``ckpt_dir`` (the first run wins)."""
    me, marker = osp.realpath(work_dir), osp.join(ckpt_dir, OWNER_FILE)
    if osp.realpath(ckpt_dir) == me:
        return
    os.makedirs(ckpt_dir, exist_ok=True)
    with contextlib.suppress(FileExistsError), open(marker, 'x') as f:
        return f.write(me + '\n')  # exclusive: the first run wins
    refusal = checkpoint_dir_refusal(ckpt_dir, work_dir)
    if refusal:
        raise CheckpointDirInUse(refusal)
    if not read_line(marker):
        atomic_write(marker, me + '\n')


def get_rng_state() -> dict:
    """This process's RNG states, loadable with ``weights_only=True``."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = dict(
        python=random.getstate(),
        numpy=(name, torch.from_numpy(keys.astype(np.int64)), int(pos),
               int(has_gauss), float(cached)),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, np.asarray(keys).astype(np.uint32), int(pos),
                         int(has_gauss), float(cached)))
    torch.set_rng_state(state['torch'].cpu())
    cuda = state.get('cuda')
    if cuda is not None and torch.cuda.is_available() and \
            len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])


def _train_sampler(runner):
    loader = runner.train_loop.dataloader if training(runner) else None
    batch = getattr(loader, 'batch_sampler', None)
    found = (getattr(loader, 'sampler', None), getattr(batch, 'sampler', None))
    return next((s for s in found if hasattr(s, 'seed')), None)


def _restore_after(loop, inner, n, callback):
    """``inner``; ``callback()`` after mmengine's replay of ``n`` batches."""
    for _ in range(n - 1):
        yield next(inner)
    data = next(inner)
    loop.dataloader_iterator = inner
    callback()
    yield data


def _val_record(checkpoint: str, epoch, iter) -> dict:
    """:data:`VAL_MARKER`'s content for ``checkpoint``."""
    return dict(checkpoint=osp.basename(checkpoint), epoch=epoch, iter=iter)


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook``: atomic writes, safe reads, RNG states, resume."""

    def __init__(self, *args, save_rng: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.save_rng = save_rng
        # every rank's states for this save; the training states during a
        # validation; (epoch, iter); (path, epoch, iter) of the last save
        self._pending_rng = self._val_rng = self._saving = self._saved = None
        self._loaded_meta = self._val_marker = None

    def _checkpoint_dir(self, runner):
        return checkpoint_dir_of(runner.work_dir, self.out_dir)

    def before_run(self, runner) -> None:
        """Claim the checkpoint dir; check or find the file to load."""
        load = getattr(type(runner), 'load_checkpoint', None)
        if load is not None and 'load_checkpoint' not in vars(runner):

            def load_checkpoint(*args, **kwargs):
                with mmengine_checkpoints_allowed():
                    return load(runner, *args, **kwargs)

            runner.load_checkpoint = load_checkpoint
        trains, resume = training(runner), getattr(runner, '_resume', False)
        auto = resume and getattr(runner, '_load_from', None) is None
        ckpt_dir = self._checkpoint_dir(runner) if trains or auto else ''
        result = [None, None, None]  # path, skipped, refusal
        if is_main_process() and ckpt_dir:
            try:
                if trains and '://' not in str(ckpt_dir):
                    claim_checkpoint_dir(ckpt_dir, runner.work_dir)
                if auto:
                    path, skipped = find_newest_complete(
                        runner.work_dir, ckpt_dir)
                    result = [path, [p for p, _ in skipped], None]
            except CheckpointDirInUse as e:
                result = [None, None, str(e)]
        broadcast_object_list(result)  # rank 0 decides
        path, skipped, refusal = result
        if refusal:
            raise CheckpointDirInUse(refusal)
        if not auto:  # read before mmengine's (unrestricted < torch 2.6)
            load_from = str(getattr(runner, '_load_from', None) or '')
            if load_from and '://' not in load_from and \
                    not osp.isfile(load_from):
                raise FileNotFoundError(
                    f'--resume {load_from}: no such file (omit the path to '
                    f'resume from the newest checkpoint of the work dir)'
                    if resume else missing_load_from(load_from, trains))
            if osp.isfile(load_from) and not getattr(runner, '_has_loaded',
                                                     False):
                load_verified(load_from)  # the model: StrictLoadHook's check
        elif path is not None:
            runner.logger.info('mmsoft: resuming from the newest complete '
                               f'checkpoint {path}')
            runner._load_from = path
            from .strict_load_hook import skip_pretrained_init
            skip_pretrained_init(runner, path)
        elif skipped:
            raise CheckpointError(
                f'resume: no complete checkpoint in {runner.work_dir}; '
                f'damaged: {skipped}. Remove them to train from scratch.')
        else:
            runner.logger.info('mmsoft: no checkpoint to resume from in '
                               f'{runner.work_dir}; training from scratch')
            runner._resume = False  # a stale last_checkpoint is not trusted

    def after_run(self, runner) -> None:
        vars(runner).pop('load_checkpoint', None)

    def after_load_checkpoint(self, runner, checkpoint) -> None:
        meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else {}
        self._loaded_meta = meta if isinstance(meta, dict) else {}

    def before_train(self, runner) -> None:
        resumed = getattr(runner, '_resume', False) and getattr(
            runner, '_has_loaded', False)
        if resumed and '://' not in str(self._checkpoint_dir(runner)):
            self._forget_other_dirs(runner)
        super().before_train(runner)
        if not self._is_local():
            runner.logger.warning(
                'mmsoft: checkpoints go to a non-local storage backend; they '
                'are written by mmengine (not atomically)')
        elif is_main_process():
            for p in remove_stale_temps(self.out_dir):
                runner.logger.warning(f'mmsoft: removed {p}, a partial '
                                      'checkpoint left by a killed run')
        meta, self._loaded_meta = self._loaded_meta, None
        if getattr(runner, '_resume', False) and meta:
            self._restore_sampler_seed(runner, meta)
            self._schedule_rng_restore(runner, meta)
            self._validate_unfinished(runner, meta)

    def _forget_other_dirs(self, runner) -> None:
        """Forget another directory's restored checkpoint names."""
        ckpt_dir = osp.realpath(self._checkpoint_dir(runner))
        hub, loaded = runner.message_hub, getattr(runner, '_load_from', None)
        if 'keep_ckpt_ids' in hub.runtime_info and loaded and \
                osp.realpath(osp.dirname(str(loaded))) != ckpt_dir:
            hub.update_info('keep_ckpt_ids', [])
        for key, value in list(hub.runtime_info.items()):
            if key.startswith('best_ckpt') and isinstance(value, str) and \
                    osp.realpath(osp.dirname(value)) != ckpt_dir:
                own = osp.join(ckpt_dir, osp.basename(value))
                hub.update_info(key, own if osp.isfile(own) else None)

    def _validate_unfinished(self, runner, meta):
        """Validate the resumed checkpoint if its validation did not end."""
        box, loaded = [None], str(getattr(runner, '_load_from', None) or '')
        marker = osp.join(osp.dirname(osp.abspath(loaded)), VAL_MARKER)
        if is_main_process() and self._is_local() and '://' not in loaded:
            with contextlib.suppress(OSError, ValueError), open(marker) as f:
                if json.load(f) == _val_record(loaded, meta.get('epoch'),
                                               meta.get('iter')):
                    box = [marker]
        broadcast_object_list(box)
        if box[0] is None or getattr(runner, 'val_loop', None) is None:
            return
        from mmengine.runner import EpochBasedTrainLoop
        what = f'epoch {meta.get("epoch")}' if isinstance(
            runner.train_loop, EpochBasedTrainLoop) else \
            f'iteration {meta.get("iter")}'
        runner.logger.info(
            f'mmsoft: the validation of {what} ({runner._load_from}) did not '
            f'finish (the run was stopped during it): validating it now, '
            f'before training goes on')
        own = osp.realpath(osp.dirname(box[0])) == osp.realpath(
            self._checkpoint_dir(runner))
        self._val_marker = box[0] if own else None
        runner.val_loop.run()

    def _restore_sampler_seed(self, runner, meta):
        seed = meta.get('mmsoft_sampler_seed')
        sampler = _train_sampler(runner)
        if seed is None or sampler is None or sampler.seed == seed:
            return
        runner.logger.info(f'mmsoft: train sampler seed {sampler.seed} -> '
                           f'{seed} (from the checkpoint)')
        sampler.seed = seed
        if hasattr(sampler, '_indices_of_rank'):  # InfiniteSampler
            sampler.indices = sampler._indices_of_rank()
        loop = runner.train_loop
        if hasattr(loop, 'dataloader_iterator'):  # iterator built already
            loop.dataloader_iterator = type(loop.dataloader_iterator)(
                loop.dataloader)

    def _schedule_rng_restore(self, runner, meta):
        info = meta.get('mmsoft_rng')
        if not self.save_rng or not info:
            return
        states, world = info.get('states', []), get_world_size()
        if info.get('world_size') != world or len(states) != world:
            return runner.logger.warning(
                f'mmsoft: the checkpoint holds RNG states of '
                f'{info.get("world_size")} process(es), this run has '
                f'{world}: RNG states not restored')
        state = states[get_rank()]

        def restore():
            set_rng_state(state)
            runner.logger.info('mmsoft: RNG states restored')

        loop = runner.train_loop
        it = getattr(loop, 'dataloader_iterator', None)
        if getattr(loop, 'iter', 0) > 0 and it is not None:
            # after IterBasedTrainLoop's replay of `iter` batches
            loop.dataloader_iterator = _restore_after(loop, it, loop.iter,
                                                      restore)
        else:
            restore()

    def before_val(self, runner) -> None:
        if self.save_rng:  # validation draws leave training's alone
            self._val_rng = get_rng_state()
        saved = self._saved
        if saved and training(runner) and is_main_process() and \
                self._is_local() and saved[1:] == (runner.epoch, runner.iter):
            # a resume before its end validates this checkpoint first
            self._val_marker = osp.join(osp.dirname(saved[0]), VAL_MARKER)
            atomic_write(self._val_marker, json.dumps(_val_record(*saved)))

    def after_val(self, runner) -> None:
        if self._val_rng is not None:
            set_rng_state(self._val_rng)
        if self._val_marker is not None:
            with contextlib.suppress(OSError):
                os.remove(self._val_marker)
        self._val_rng = self._val_marker = None

    def _is_local(self):
        return isinstance(getattr(self, 'file_backend', None), LocalBackend)

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        from mmsoft.models.loading import attn_norms
        meta = checkpoint.setdefault('meta', {})
        norms = attn_norms(runner.model)  # loading.check_attn_norm reads it
        if norms:
            meta['mmsoft_attn_norm'] = sorted(norms)
        if self.save_rng:
            states = self._pending_rng or [self._val_rng or get_rng_state()]
            meta['mmsoft_rng'] = dict(world_size=len(states), states=states)
        sampler = _train_sampler(runner)
        if sampler is not None:
            meta['mmsoft_sampler_seed'] = sampler.seed
        self._saving = (meta.get('epoch'), meta.get('iter'))

    def _save_checkpoint_with_step(self, runner, step, meta):
        # every rank's states (a collective call on all ranks)
        self._pending_rng = self.save_rng and all_gather_object(
            self._val_rng or get_rng_state())
        self._saving = None
        try:
            with self._atomic(runner):
                super()._save_checkpoint_with_step(runner, step, meta)
                if is_main_process() and self._is_local():
                    last = osp.join(runner.work_dir, 'last_checkpoint')
                    atomic_write(last, self.last_ckpt, durable=True)
                    if self._saving:
                        self._saved = (osp.abspath(self.last_ckpt),
                                       *self._saving)
        finally:
            self._pending_rng = None

    def _save_best_checkpoint(self, runner, metrics) -> None:
        with self._atomic(runner):
            super()._save_best_checkpoint(runner, metrics)

    @contextlib.contextmanager
    def _atomic(self, runner):
        """Atomic ``runner.save_checkpoint``; removals deferred to the end."""
        if not self._is_local():
            yield
            return
        backend, removals, written = self.file_backend, [], set()
        cls_save = type(runner).save_checkpoint

        def save_checkpoint(out_dir, filename, *args, **kwargs):
            if not is_main_process():  # Runner.save_checkpoint: master only
                return cls_save(runner, out_dir, filename, *args, **kwargs)
            final = osp.abspath(backend.join_path(out_dir, filename))
            os.makedirs(osp.dirname(final), exist_ok=True)
            try:
                with atomic_path(final, durable=True) as tmp:
                    cls_save(runner, osp.dirname(tmp), osp.basename(tmp),
                             *args, **kwargs)
            except OSError as e:
                msg = _write_failure(runner, final, e)
                raise CheckpointWriteError(e.errno, msg) from e
            written.add(final)

        self.file_backend = copy.copy(backend)  # removals queued
        self.file_backend.remove = self.file_backend.rmtree = removals.append
        runner.save_checkpoint = save_checkpoint
        try:
            yield
        finally:
            self.file_backend = backend
            runner.__dict__.pop('save_checkpoint', None)
        # the new files are complete: drop outdated ones (own dir only)
        own = osp.realpath(self.out_dir)
        for path in removals:
            if osp.abspath(path) in written:
                continue
            if osp.realpath(osp.dirname(path)) != own:
                runner.logger.warning(
                    f'mmsoft: not removing {path}: outside this run\'s '
                    f'checkpoint directory {self.out_dir}')
                continue
            try:
                if backend.isfile(path):
                    backend.remove(path)
                elif backend.isdir(path):  # deepspeed's checkpoints
                    backend.rmtree(path)
            except OSError as e:
                runner.logger.warning(f'mmsoft: could not remove {path}: {e}')


def _write_failure(runner, path: str, error: OSError) -> str:
    """One line: the failure, its fix, and what to resume."""
    code = f' (errno {error.errno})' if error.errno else ''
    prev = read_line(osp.join(runner.work_dir, 'last_checkpoint'))
    kept = (f'the previous checkpoint {prev} was kept (last_checkpoint '
            f'still names it)' if prev else 'no earlier checkpoint of this '
            'run exists')
    where, e = osp.dirname(path), errno
    fix = {
        e.EFBIG: 'Raise the file size limit (ulimit -f) or write to another '
        'file system',
        e.EROFS: f'{where} is read-only: choose another work dir',
        e.EACCES: f'Check the permissions of {where} (ls -ld)'
    }.get(e.EACCES if error.errno == e.EPERM else error.errno,
          f'Free space in {where}')
    then = ('continue with tools/train.py ... --resume' if prev else
            'start the training again (there is nothing to resume)')
    return (f'cannot write checkpoint {path}: {error.strerror or error}'
            f'{code}; nothing was written, {kept}. {fix} and {then}')
