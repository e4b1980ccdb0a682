"""``SafeCheckpointHook``: mmengine's ``CheckpointHook`` whose checkpoints
survive a kill and a full disk, resume bit-exactly and are read safely.

mmengine 0.10.7's ``CheckpointHook`` (with ``max_keep_ckpts``) deletes the
oldest checkpoint *before* writing the new one in place, ``Runner(resume=
True)`` trusts ``work_dir/last_checkpoint``, no RNG state is saved, and
before torch 2.6 its ``torch.load`` unpickles anything. This hook (the
arguments of ``CheckpointHook``, plus ``save_rng``; opt-in by name in a
config, ``tools/train.py`` swaps it in):

* writes every checkpoint (periodic and best) to a temporary file in the
  same directory, ``fsync`` s it and renames it into place
  (:mod:`mmsoft.utils.atomic`); outdated checkpoints are removed, and
  ``last_checkpoint`` (itself replaced atomically) updated, only after the
  new file is complete; a failed write (full disk) raises
  :class:`~mmsoft.utils.checkpoint_io.CheckpointWriteError` naming what was
  kept; temporaries of a killed run are removed by the next one;
* stores each rank's RNG states and the train sampler's seed under
  ``meta['mmsoft_rng']`` / ``meta['mmsoft_sampler_seed']`` and restores
  them on resume (after mmengine replays an iteration-based loop's
  batches); validation leaves the training RNG streams untouched;
* in ``before_run`` (which mmengine 0.10 calls before ``load_or_resume``):
  with ``resume=True`` and no path, picks the newest *complete* checkpoint
  (damaged newer ones are skipped with a warning); a ``load_from`` /
  ``--resume PATH`` file is read first with mmsoft's safe reader
  (:func:`~mmsoft.utils.checkpoint_io.check_runner_checkpoint`): a damaged
  or code-running file stops the run with one line, on every torch, and
  so does a training checkpoint whose stored config sets the other
  ``attn_norm`` (:func:`check_recorded_attn_norm`);
* keeps to the run's own checkpoint directory: resume ignores a
  ``last_checkpoint`` naming another directory (a copied work dir), the
  checkpoint names restored on resume from another directory are dropped
  and nothing outside the directory is removed (``max_keep_ckpts``, best
  checkpoints); a directory ``out_dir/<work dir name>`` that the run of
  another work dir of the same name writes to stops training with one line
  (:func:`~mmsoft.utils.checkpoint_io.claim_checkpoint_dir`).

Only local directories get the atomic treatment. Bit-exact resume holds
with ``num_workers=0`` or non-persistent workers (mmengine's
``worker_init_fn`` reseeds workers from (seed, rank, worker id)).
"""
import contextlib
import os
import os.path as osp

from mmengine.dist import (broadcast_object_list, get_rank, get_world_size,
                           is_distributed, is_main_process)
from mmengine.hooks import CheckpointHook
from mmengine.registry import HOOKS

from mmsoft.utils.atomic import atomic_path, atomic_write
from mmsoft.utils.checkpoint_io import (CheckpointDirInUse, CheckpointError,
                                        CheckpointWriteError,
                                        check_runner_checkpoint,
                                        claim_checkpoint_dir,
                                        find_newest_complete,
                                        recorded_attn_norms,
                                        remove_stale_temps)
from mmsoft.utils.rng_state import get_rng_state, set_rng_state

__all__ = [
    'SafeCheckpointHook', 'use_safe_checkpoint_hook',
    'check_recorded_attn_norm'
]

#: checkpoint hook types that :func:`use_safe_checkpoint_hook` replaces
PLAIN_TYPES = ('CheckpointHook', 'mmengine.CheckpointHook')


def _train_sampler(runner):
    from mmengine.runner import BaseLoop
    loop = getattr(runner, '_train_loop', None)
    if not isinstance(loop, BaseLoop):  # not built: not training
        return None
    loader = loop.dataloader
    for sampler in (getattr(loader, 'sampler', None),
                    getattr(
                        getattr(loader, 'batch_sampler', None), 'sampler',
                        None)):
        if sampler is not None and hasattr(sampler, 'seed'):
            return sampler
    return None


class _DeferredRemoval:
    """A file backend whose ``remove`` / ``rmtree`` are queued."""

    def __init__(self, backend, queue):
        self._backend, self._queue = backend, queue

    def remove(self, path):
        self._queue.append(('remove', path))

    def rmtree(self, path):
        self._queue.append(('rmtree', path))

    def __getattr__(self, name):
        return getattr(self._backend, name)


class _RestoreAfter:
    """Iterator proxy: after ``n`` ``next()`` calls (mmengine's replay of
    the batches a resumed iteration-based loop has already trained on) run
    ``callback`` and put the wrapped iterator back on ``loop``."""

    def __init__(self, loop, n, callback):
        self.loop, self.inner = loop, loop.dataloader_iterator
        self.n, self.callback = n, callback

    def __iter__(self):
        return self

    def __next__(self):
        data = next(self.inner)
        self.n -= 1
        if self.n <= 0:
            self.loop.dataloader_iterator = self.inner
            self.callback()
        return data


@HOOKS.register_module()
class SafeCheckpointHook(CheckpointHook):
    """``CheckpointHook`` with atomic writes, RNG states, safe reads and
    resume from the newest complete checkpoint (see the module doc).

    Args:
        save_rng (bool): save the RNG states of every rank and restore them
            on resume. Defaults to True.
        **kwargs: the arguments of mmengine's ``CheckpointHook``.
    """

    def __init__(self, *args, save_rng: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.save_rng = save_rng
        self._atomic_depth = 0
        self._pending_rng = None  # gathered states for the current save
        self._val_rng = None  # states at the start of a validation run
        self._loaded_meta = None  # meta of the checkpoint last loaded
        self._warned_backend = False

    # ------------------------------------------------------------- resume
    def _checkpoint_dir(self, runner):
        if self.out_dir is None or self.out_dir == runner.work_dir:
            return runner.work_dir
        return osp.join(self.out_dir,
                        osp.basename(runner.work_dir.rstrip(osp.sep)))

    def before_run(self, runner) -> None:
        """Check the ``load_from`` / resume file; ``resume=True`` without a
        path: pick the newest complete checkpoint of this run's directories
        (mmengine would take ``last_checkpoint`` on trust); training: claim
        the checkpoint directory (``checkpoint_io.claim_checkpoint_dir``)."""
        from mmengine.runner import BaseLoop
        training = isinstance(getattr(runner, '_train_loop', None), BaseLoop)
        auto = getattr(runner, '_resume', False) and \
            getattr(runner, '_load_from', None) is None
        ckpt_dir = self._checkpoint_dir(runner) if training or auto else ''
        result = [None, None, None]  # path, skipped, refusal
        if is_main_process() and ckpt_dir:
            try:
                if training and '://' not in str(ckpt_dir):
                    claim_checkpoint_dir(ckpt_dir, runner.work_dir)
                if auto:
                    path, skipped = find_newest_complete(
                        runner.work_dir, ckpt_dir)
                    result = [path, [p for p, _ in skipped], None]
            except CheckpointDirInUse as e:
                result = [None, None, str(e)]
        if is_distributed():
            broadcast_object_list(result)
        path, skipped, refusal = result
        if refusal:
            raise CheckpointDirInUse(refusal)
        if not auto:
            checkpoint = check_runner_checkpoint(runner)
            if checkpoint is not None:
                check_recorded_attn_norm(runner.model, checkpoint,
                                         runner._load_from)
            return
        if path is not None:
            runner.logger.info(f'mmsoft: resuming from the newest complete '
                               f'checkpoint {path}')
            runner._load_from = path
        elif skipped:
            raise CheckpointError(
                f'resume: no complete checkpoint in {runner.work_dir}; '
                f'damaged: {skipped}. Remove them to train from scratch.')
        else:
            runner.logger.info('mmsoft: no checkpoint to resume from in '
                               f'{runner.work_dir}; training from scratch')
            runner._resume = False  # a stale last_checkpoint is not trusted

    def _forget_other_dirs(self, runner) -> None:
        """After resuming: the checkpoint names restored from the message
        hub refer to the directory of the run that wrote them. Those of
        another directory (``--resume`` of another run's file, a copied
        work dir) are dropped, so that ``max_keep_ckpts`` and a new best
        checkpoint never delete files this run did not write."""
        if not (getattr(runner, '_resume', False)
                and getattr(runner, '_has_loaded', False)):
            return
        ckpt_dir = osp.realpath(self._checkpoint_dir(runner))
        hub = runner.message_hub
        loaded = getattr(runner, '_load_from', None)
        if 'keep_ckpt_ids' in hub.runtime_info and loaded and \
                osp.realpath(osp.dirname(str(loaded))) != ckpt_dir:
            hub.update_info('keep_ckpt_ids', [])
        for key, value in list(hub.runtime_info.items()):
            if not key.startswith('best_ckpt') or not isinstance(value, str) \
                    or osp.realpath(osp.dirname(value)) == ckpt_dir:
                continue
            own = osp.join(ckpt_dir, osp.basename(value))
            hub.update_info(key, own if osp.isfile(own) else None)

    def after_load_checkpoint(self, runner, checkpoint) -> None:
        meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else {}
        self._loaded_meta = meta if isinstance(meta, dict) else {}

    def before_train(self, runner) -> None:
        if '://' not in str(self._checkpoint_dir(runner)):
            self._forget_other_dirs(runner)
        super().before_train(runner)
        if is_main_process() and self._is_local():
            for p in remove_stale_temps(self.out_dir):
                runner.logger.warning(
                    f'mmsoft: removed {p}, a partial checkpoint left by a '
                    f'killed run')
        if getattr(runner, '_resume', False) and self._loaded_meta:
            self._restore_sampler_seed(runner)
            self._schedule_rng_restore(runner)
        self._loaded_meta = None

    def _restore_sampler_seed(self, runner):
        seed = self._loaded_meta.get('mmsoft_sampler_seed')
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

    def _schedule_rng_restore(self, runner):
        info = self._loaded_meta.get('mmsoft_rng')
        if not self.save_rng or not info:
            return
        states, world = info.get('states', []), get_world_size()
        if info.get('world_size') != world or len(states) != world:
            runner.logger.warning(
                f'mmsoft: the checkpoint holds RNG states of '
                f'{info.get("world_size")} process(es), this run has '
                f'{world}: RNG states not restored')
            return
        state = states[get_rank()]

        def restore():
            set_rng_state(state)
            runner.logger.info('mmsoft: RNG states restored from the '
                               'checkpoint')

        loop = runner.train_loop
        if getattr(loop, 'iter', 0) > 0 and hasattr(loop,
                                                    'dataloader_iterator'):
            # IterBasedTrainLoop replays `iter` batches after before_train:
            # restore once that replay is over
            loop.dataloader_iterator = _RestoreAfter(loop, loop.iter, restore)
        else:
            restore()

    # ------------------------------------------- validation is RNG-neutral
    def before_val(self, runner) -> None:
        if self.save_rng:
            self._val_rng = get_rng_state()

    def after_val(self, runner) -> None:
        if self._val_rng is not None:
            set_rng_state(self._val_rng)
        self._val_rng = None

    # --------------------------------------------------------------- save
    def _is_local(self):
        from mmengine.fileio import LocalBackend
        backend = getattr(self, 'file_backend', None)
        if isinstance(backend, _DeferredRemoval):
            backend = backend._backend
        return isinstance(backend, LocalBackend)

    def _gather_rng(self):
        """Every rank's RNG states (a collective call on all ranks)."""
        state = self._val_rng if self._val_rng is not None \
            else get_rng_state()
        if not is_distributed():
            return [state]
        from mmengine.dist import all_gather_object
        return all_gather_object(state)

    def before_save_checkpoint(self, runner, checkpoint) -> None:
        meta = checkpoint.setdefault('meta', {})
        if self.save_rng:
            states = self._pending_rng
            if states is None:  # a save outside _save_checkpoint_with_step
                states = [
                    self._val_rng
                    if self._val_rng is not None else get_rng_state()
                ]
            meta['mmsoft_rng'] = dict(world_size=len(states), states=states)
        sampler = _train_sampler(runner)
        if sampler is not None:
            meta['mmsoft_sampler_seed'] = sampler.seed

    def _save_checkpoint_with_step(self, runner, step, meta):
        self._pending_rng = self._gather_rng() if self.save_rng else None
        try:
            with self._atomic(runner):
                super()._save_checkpoint_with_step(runner, step, meta)
                if is_main_process() and self._is_local():
                    atomic_write(
                        osp.join(runner.work_dir, 'last_checkpoint'),
                        self.last_ckpt,
                        durable=True)
        finally:
            self._pending_rng = None

    def _save_best_checkpoint(self, runner, metrics) -> None:
        with self._atomic(runner):
            super()._save_best_checkpoint(runner, metrics)

    @contextlib.contextmanager
    def _atomic(self, runner):
        """Inside: ``runner.save_checkpoint`` writes atomically and removals
        of old checkpoints wait until the block has finished."""
        if self._atomic_depth or not self._is_local():
            if not self._atomic_depth and not self._warned_backend:
                self._warned_backend = True
                runner.logger.warning(
                    'mmsoft: checkpoints go to a non-local storage backend; '
                    'they are written by mmengine (not atomically)')
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
                raise CheckpointWriteError(e.errno,
                                           _write_failure(runner, final,
                                                          e)) from e
            written.add(final)

        self._atomic_depth += 1
        self.file_backend = _DeferredRemoval(backend, removals)
        runner.save_checkpoint = save_checkpoint
        try:
            yield
        finally:
            self._atomic_depth -= 1
            self.file_backend = backend
            runner.__dict__.pop('save_checkpoint', None)
        # the new files are complete: now drop the outdated ones (of this
        # run's checkpoint directory only)
        own = osp.realpath(self.out_dir)
        for kind, path in removals:
            if osp.abspath(path) in written:
                continue
            if osp.realpath(osp.dirname(path)) != own:
                runner.logger.warning(
                    f'mmsoft: not removing {path}: outside this run\'s '
                    f'checkpoint directory {self.out_dir}')
                continue
            try:
                if kind == 'remove' and backend.isfile(path):
                    backend.remove(path)
                elif kind == 'rmtree' and backend.isdir(path):
                    backend.rmtree(path)
            except OSError as e:
                runner.logger.warning(f'mmsoft: could not remove {path}: {e}')


def check_recorded_attn_norm(model, checkpoint, path) -> None:
    """Refuse a training checkpoint whose stored config (``meta['cfg']``,
    :func:`~mmsoft.utils.checkpoint_io.recorded_attn_norms`) sets another
    ``attn_norm`` than ``model``'s SOFT attentions use: the tensors are the
    same, so the weights would load and give wrong results (a checkpoint
    of another model is left to the strict key check). Raises
    :class:`~mmsoft.utils.strict_load.CheckpointMismatchError` naming both
    settings and the fix."""
    from mmsoft.models.layers import SOFTAttention
    from mmsoft.utils.strict_load import CheckpointMismatchError
    want = recorded_attn_norms(checkpoint)
    state = checkpoint.get('state_dict') if isinstance(checkpoint,
                                                       dict) else None
    if isinstance(state, dict) and set(state) != set(model.state_dict()):
        return  # another model: the strict key check names the mismatch
    have = {
        m.attn_norm
        for m in model.modules() if isinstance(m, SOFTAttention)
    }
    if not want or not have or want == have:
        return

    def text(values):
        return ' / '.join(f'attn_norm={v}' for v in sorted(values))

    fix = (
        f'--cfg-options model.backbone.attn_cfg.attn_norm={next(iter(want))}'
        if len(want) == 1 else 'its attn_cfg settings')
    raise CheckpointMismatchError(
        f'checkpoint {path} was trained with {text(want)} (the config stored '
        f'in it), but this model\'s SOFT attention has {text(have)}: the '
        f'weights would load and give wrong results. Use the config it was '
        f'trained with or {fix}')


def _write_failure(runner, path: str, error: OSError) -> str:
    """The one-line report of a checkpoint that could not be written."""
    reason = error.strerror or str(error)
    code = f' (errno {error.errno})' if error.errno else ''
    prev = None
    try:
        with open(osp.join(runner.work_dir, 'last_checkpoint')) as f:
            prev = f.read().strip() or None
    except OSError:
        pass
    kept = (f'the previous checkpoint {prev} was kept (last_checkpoint '
            f'still names it)' if prev else 'no earlier checkpoint of this '
            'run exists')
    return (f'cannot write checkpoint {path}: {reason}{code}; nothing was '
            f'written, {kept}. Free space in {osp.dirname(path)} and '
            f'continue with tools/train.py ... --resume')


def use_safe_checkpoint_hook(cfg) -> bool:
    """Make a config's plain ``CheckpointHook`` a :class:`SafeCheckpointHook`
    (in place; what ``tools/train.py`` does). Returns True if changed."""
    hooks = cfg.get('default_hooks', None)
    hook = hooks.get('checkpoint', None) if hooks is not None else None
    if hook is None or not hasattr(hook, 'get') or \
            hook.get('type') not in PLAIN_TYPES + (CheckpointHook, ):
        return False
    hook['type'] = 'SafeCheckpointHook'
    return True
