"""Stop training at the first non-finite loss (issue 13).

Without this hook a run whose loss became ``nan`` / ``inf`` (an exploding
learning rate, a bad sample, an fp16 overflow) trains on to the end, exits
0 and its CheckpointHook saves NaN weights over the last good checkpoint.

:class:`NonFiniteLossHook` checks the loss of every training iteration
*before* the backward pass and the optimizer step (it wraps the optim
wrapper's ``update_params``), so the weights are never updated with a
non-finite gradient, and stops the run with :class:`NonFiniteLossError`
(the process exits non-zero) naming the epoch and iteration. Nothing is
saved: the exception leaves ``runner.train()`` before any
``after_train_iter`` / ``after_train_epoch`` hook (CheckpointHook) runs, so
the last checkpoint on disk is the last good one.

A finite loss can still come with overflowing gradients (e.g. an exploding
learning rate: loss 5e9, gradients inf) whose optimizer step writes
non-finite weights; the next loss is then NaN, but the CheckpointHook of
*this* iteration would already have saved the NaN weights over the last good
checkpoint. So the parameters are checked after every optimizer step (one
max-abs reduction per device) and the run stops there too, before any
checkpoint of that iteration; and no checkpoint with non-finite parameters
is ever saved (``before_save_checkpoint``, for models whose ``train_step``
bypasses ``update_params``).

With ``max_skipped_steps=N`` (> 0) up to N consecutive non-finite steps
are skipped instead (no backward, no optimizer step, gradients zeroed) and
the run stops at the (N + 1)-th in a row. Non-finite parameters always stop
the run (the step cannot be undone).

In distributed runs the decision is all-reduced, so every rank skips or
stops together (one rank stopping alone would leave the others waiting in
the next collective).

mmsoft's configs and ``tools/train.py`` turn it on::

    custom_hooks = [dict(type='NonFiniteLossHook')]
"""
import functools
import math
from typing import Optional

import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

__all__ = ['NonFiniteLossHook', 'NonFiniteLossError', 'add_nonfinite_hook']


class NonFiniteLossError(RuntimeError):
    """The training loss became nan / inf; the run was stopped."""


def _is_finite(value) -> bool:
    if isinstance(value, torch.Tensor):
        return bool(torch.isfinite(value.detach()).all())
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return True


@torch.no_grad()
def _nonfinite_params(params) -> list:
    """The tensors of ``params`` holding a nan / inf (one max-abs reduction
    per device and dtype; a finite but huge value is not flagged)."""
    groups = {}
    for p in params:
        if p is not None and (p.is_floating_point() or p.is_complex()) \
                and p.numel():
            groups.setdefault((p.device, p.dtype), []).append(p)
    bad = []
    for tensors in groups.values():
        try:
            norms = torch._foreach_norm(tensors, ord=float('inf'))
        except (AttributeError, RuntimeError, TypeError):  # pragma: no cover
            norms = [t.abs().max() for t in tensors]
        finite = torch.isfinite(torch.stack([n.float() for n in norms]))
        if not bool(finite.all()):
            bad += [t for t, ok in zip(tensors, finite.tolist()) if not ok]
    return bad


def _any_rank(flag: bool) -> bool:
    """True if ``flag`` is True on any rank (no-op outside distributed)."""
    from mmengine.dist import all_reduce, get_world_size
    if get_world_size() == 1:
        return flag
    t = torch.tensor([1.0 if flag else 0.0])
    try:
        from mmengine.dist import get_comm_device
        t = t.to(get_comm_device())
    except Exception:  # pragma: no cover
        pass
    all_reduce(t, op='max')
    return bool(t.item() > 0)


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop (or skip) training steps whose loss is not finite.

    Args:
        max_skipped_steps (int): consecutive non-finite steps to skip before
            stopping; 0 (default) stops at the first one.

    Its priority (``'VERY_HIGH'``) puts its ``after_train_iter`` check
    before the CheckpointHook's (``'VERY_LOW'``), as a second line of
    defence for models whose ``train_step`` does not go through the optim
    wrapper's ``update_params``.
    """

    priority = 'VERY_HIGH'

    def __init__(self, max_skipped_steps: int = 0):
        if isinstance(max_skipped_steps, bool) or \
                not isinstance(max_skipped_steps, int) or \
                max_skipped_steps < 0:
            raise ValueError(f'NonFiniteLossHook: max_skipped_steps must be '
                             f'an int >= 0, got {max_skipped_steps!r}')
        self.max_skipped_steps = max_skipped_steps
        self.skipped = 0  # consecutive skipped steps
        self.total_skipped = 0
        self._step_skipped = False
        self._runner = None

    # ------------------------------------------------------------ helpers
    def _where(self, runner) -> str:
        """'epoch E, iteration I/N' (1-based; I counts from the start)."""
        from mmengine.runner import EpochBasedTrainLoop
        loop = runner.train_loop
        max_iters = getattr(loop, 'max_iters', None)
        it = f'iteration {runner.iter + 1}' + \
            (f'/{max_iters}' if max_iters else '')
        if isinstance(loop, EpochBasedTrainLoop):
            return f'epoch {runner.epoch + 1}, {it}'
        return it

    @staticmethod
    def _checkpoint_note(runner) -> str:
        work_dir = getattr(runner, 'work_dir', None)
        if not work_dir:
            return ''
        return (f'; no checkpoint was written at this point (checkpoints '
                f'in {work_dir} are from before the fault)')

    def _stop(self, runner, loss) -> None:
        ckpt = self._checkpoint_note(runner)
        skipped = (f' after {self.skipped} skipped step(s)'
                   if self.max_skipped_steps else '')
        msg = (f'NonFiniteLossHook: non-finite training loss ({loss}) at '
               f'{self._where(runner)}{skipped}; training stopped before '
               f'the optimizer step{ckpt}. Lower the learning rate, enable '
               f'gradient clipping (optim_wrapper.clip_grad), or allow '
               f'skipped steps with custom_hooks=[dict('
               f"type='NonFiniteLossHook', max_skipped_steps=N)].")
        runner.logger.error(msg)
        raise NonFiniteLossError(msg)

    def _param_names(self, runner, bad) -> str:
        from mmengine.model import is_model_wrapper
        model = runner.model
        if is_model_wrapper(model):
            model = model.module
        ids = {id(t) for t in bad}
        names = [n for n, p in model.named_parameters() if id(p) in ids]
        shown = ', '.join(names[:3]) + (', ...' if len(names) > 3 else '')
        return f'{len(bad)} parameter tensor(s)' + (f' ({shown})'
                                                    if shown else '')

    def _check_params(self, runner, params, loss) -> None:
        """Stop if the optimizer step just wrote non-finite parameters."""
        bad = _nonfinite_params(params)
        if not _any_rank(bool(bad)):
            return
        what = self._param_names(runner, bad) if bad else \
            'parameters on another rank'
        ckpt = self._checkpoint_note(runner)
        msg = (f'NonFiniteLossHook: the optimizer step at '
               f'{self._where(runner)} made {what} nan / inf although the '
               f'loss was finite ({loss}): the gradients or the update '
               f'overflowed; training stopped{ckpt}. Lower the learning '
               f'rate or enable gradient clipping (optim_wrapper.clip_grad).')
        runner.logger.error(msg)
        raise NonFiniteLossError(msg)

    def _check(self, loss) -> bool:
        """True if this step must be skipped; raises if training stops."""
        bad = _any_rank(not _is_finite(loss))
        if not bad:
            self.skipped = 0
            return False
        runner = self._runner
        if self.skipped >= self.max_skipped_steps:
            self._stop(runner, self._fmt(loss))
        self.skipped += 1
        self.total_skipped += 1
        runner.logger.warning(
            f'NonFiniteLossHook: non-finite loss ({self._fmt(loss)}) at '
            f'{self._where(runner)}: step skipped ({self.skipped}/'
            f'{self.max_skipped_steps} in a row)')
        return True

    @staticmethod
    def _fmt(loss) -> str:
        if isinstance(loss, torch.Tensor):
            loss = loss.detach().float().mean().item()
        return str(loss)

    def _guard(self, optim_wrapper) -> None:
        """Wrap ``optim_wrapper.update_params`` (instance attribute) with
        the check. Idempotent."""
        if getattr(optim_wrapper, '_nonfinite_guarded', False):
            return
        original = optim_wrapper.update_params
        hook = self

        @functools.wraps(original)
        def update_params(loss, *args, **kwargs):
            hook._step_skipped = hook._check(loss)
            if hook._step_skipped:
                optim_wrapper.zero_grad()
                return None
            result = original(loss, *args, **kwargs)
            hook._check_params(hook._runner, [
                p for g in optim_wrapper.optimizer.param_groups
                for p in g['params']
            ], hook._fmt(loss))
            return result

        # with the config's ``compile`` switch (MMEngine compiles
        # ``train_step``) the checks (``.item()``) and the optimizer step
        # run eagerly: Dynamo cannot trace this wrapper's optimizer step
        # (an internal error on ``param_groups``); the model's forward and
        # backward stay compiled
        optim_wrapper.update_params = _dynamo_disable(update_params)
        optim_wrapper._nonfinite_guarded = True

    # ------------------------------------------------------------ hooks
    def before_train(self, runner) -> None:
        self._runner = runner
        wrappers = runner.optim_wrapper
        if hasattr(wrappers, 'update_params') and \
                not hasattr(wrappers, 'optim_wrappers'):
            self._guard(wrappers)
        else:  # OptimWrapperDict
            for w in getattr(wrappers, 'optim_wrappers', {}).values():
                self._guard(w)

    def before_train_iter(self,
                          runner,
                          batch_idx: int,
                          data_batch=None) -> None:
        self._step_skipped = False

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs: Optional[dict] = None) -> None:
        if self._step_skipped or not isinstance(outputs, dict):
            return
        loss = outputs.get('loss')
        if loss is not None and _any_rank(not _is_finite(loss)):
            self._stop(runner, self._fmt(loss))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Never save non-finite parameters (the last good checkpoint stays;
        with mmsoft's SafeCheckpointHook nothing has been removed yet)."""
        from mmengine.model import is_model_wrapper
        model = runner.model
        if is_model_wrapper(model):
            model = model.module
        bad = _nonfinite_params(list(model.parameters()))
        if not bad:  # parameters are the same on every rank
            return
        msg = (f'NonFiniteLossHook: refusing to save a checkpoint at '
               f'{self._where(runner)}: {self._param_names(runner, bad)} '
               f'hold nan / inf; training stopped, the checkpoints on disk '
               f'are from before the fault. Lower the learning rate or '
               f'enable gradient clipping (optim_wrapper.clip_grad).')
        runner.logger.error(msg)
        raise NonFiniteLossError(msg)


def _dynamo_disable(fn):
    """``fn`` run eagerly inside ``torch.compile`` d code (unchanged
    outside it)."""
    disable = getattr(getattr(torch, '_dynamo', None), 'disable', None)
    return fn if disable is None else functools.wraps(fn)(disable(fn))


def add_nonfinite_hook(cfg) -> bool:
    """Add ``NonFiniteLossHook`` to ``cfg.custom_hooks`` unless the config
    has one already (then its settings are kept). Returns True if added."""
    hooks = list(cfg.get('custom_hooks', None) or [])
    for h in hooks:
        t = h.get('type') if isinstance(h, dict) else h
        if t is NonFiniteLossHook or (isinstance(t, str) and t.split('.')[-1]
                                      == 'NonFiniteLossHook'):
            return False
    hooks.append(dict(type='NonFiniteLossHook'))
    cfg.custom_hooks = hooks
    return True
