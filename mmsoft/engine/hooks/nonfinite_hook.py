"""Stop at the first non-finite loss, step or output
(docs/en/advanced_guides/fault_tolerance.md)."""
import math

import numpy as np
import torch
from mmengine.dist import all_reduce, get_comm_device, get_world_size
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.structures import BaseDataElement

_FIX = ('Lower the learning rate or enable gradient clipping '
        '(optim_wrapper.clip_grad)')


class NonFiniteLossError(RuntimeError):
    """Stopped at a non-finite loss, step or output."""


def _value(loss) -> float:
    """A loss (a tensor's mean) as a float; 0.0 if it is no number."""
    if isinstance(loss, torch.Tensor):
        return loss.detach().float().mean().item() if loss.numel() else 0.
    try:
        return float(loss)
    except (TypeError, ValueError):
        return 0.


def _any_rank(flag: bool) -> bool:
    if get_world_size() == 1:
        return flag
    t = torch.tensor([float(flag)], device=get_comm_device())
    all_reduce(t, op='max')
    return bool(t.item() > 0)


def _leaves(value, name: str = '') -> list:
    """``(name, tensor / array)`` of an output's fields (no ``gt_*``)."""
    if isinstance(value, BaseDataElement):
        value = dict(value.items())
    if isinstance(value, dict):
        return [
            leaf for k, v in value.items()
            if not str(k).startswith(('gt_', 'ignored_'))
            for leaf in _leaves(v, f'{name}.{k}' if name else str(k))
        ]
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _leaves(v, name)]
    return [(name or 'output',
             value)] if isinstance(value, (torch.Tensor, np.ndarray)) else []


@torch.no_grad()
def _nonfinite(leaves) -> list:
    """The names of the ``leaves`` holding nan / inf, in order."""
    groups, bad = {}, set()
    for _, v in leaves:
        if isinstance(v, np.ndarray):
            if v.dtype.kind in 'fc' and not np.isfinite(v).all():
                bad.add(id(v))
        elif (v.is_floating_point() or v.is_complex()) and v.numel():
            groups.setdefault((v.device, v.dtype), []).append(v)
    for ts in groups.values():
        norms = torch._foreach_norm([t.detach() for t in ts], float('inf'))
        finite = torch.isfinite(torch.stack([n.float() for n in norms]))
        bad |= {id(t) for t, ok in zip(ts, finite.tolist()) if not ok}
    return [name for name, v in leaves if id(v) in bad]


def _bad_params(model, params=None) -> str:
    """'N parameter tensor(s) (names)' of ``params`` (all) with nan / inf."""
    ids = params and {id(p) for p in params}
    names = _nonfinite([(n, p) for n, p in model.named_parameters()
                        if ids is None or id(p) in ids])
    shown = ', '.join(names[:3]) + (', ...' if len(names) > 3 else '')
    return f'{len(names)} parameter tensor(s) ({shown})' if names else ''


def _unwrap(model):
    return model.module if is_model_wrapper(model) else model


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop at (or skip) non-finite losses, steps and outputs."""

    priority = 'VERY_HIGH'  # after_train_iter before the CheckpointHook's

    def __init__(self, max_skipped_steps: int = 0, check_outputs: bool = True):
        if type(max_skipped_steps) is not int or max_skipped_steps < 0:
            raise ValueError(f'NonFiniteLossHook: max_skipped_steps must be '
                             f'an int >= 0, got {max_skipped_steps!r}')
        self.max_skipped_steps, self.check_outputs = (max_skipped_steps,
                                                      check_outputs)
        self.skipped, self._step_skipped, self._runner = 0, False, None

    @staticmethod
    def _where(runner) -> str:
        """'epoch E, iteration I/N' (1-based)."""
        from mmengine.runner import EpochBasedTrainLoop
        max_iters = getattr(runner.train_loop, 'max_iters', None)
        it = f'iteration {runner.iter + 1}' + (f'/{max_iters}'
                                               if max_iters else '')
        if isinstance(runner.train_loop, EpochBasedTrainLoop):
            return f'epoch {runner.epoch + 1}, {it}'
        return it

    def _fail(self, runner, what: str, fix: str = _FIX, kept=True):
        work_dir = kept and getattr(runner, 'work_dir', None)
        kept = work_dir and f'; the checkpoints in {work_dir} are from ' \
            'before the fault'
        msg = f'NonFiniteLossHook: {what}{kept or ""}. {fix}.'
        runner.logger.error(msg)
        raise NonFiniteLossError(msg)

    def _stop(self, runner, value) -> None:
        skipped = (f' after {self.skipped} skipped step(s)'
                   if self.max_skipped_steps else '')
        self._fail(
            runner, f'non-finite training loss ({value}) at '
            f'{self._where(runner)}{skipped}; training stopped before the '
            f'optimizer step', f"{_FIX}, or allow skipped steps with "
            f"custom_hooks=[dict(type='NonFiniteLossHook', "
            f'max_skipped_steps=N)]')

    def _check(self, loss) -> bool:
        """Whether to skip this step (a non-finite loss); raises to stop."""
        value, runner = _value(loss), self._runner
        if not _any_rank(not math.isfinite(value)):
            self.skipped = 0
            return False
        if self.skipped >= self.max_skipped_steps:
            self._stop(runner, value)
        self.skipped += 1
        runner.logger.warning(
            f'NonFiniteLossHook: non-finite loss ({value}) at '
            f'{self._where(runner)}: step skipped ({self.skipped}/'
            f'{self.max_skipped_steps} in a row)')
        return True

    def _guard(self, optim_wrapper) -> None:
        if getattr(optim_wrapper, '_nonfinite_guarded', False):
            return
        original = optim_wrapper.update_params

        def update_params(loss, *args, **kwargs):
            self._step_skipped = self._check(loss)
            if self._step_skipped:
                optim_wrapper.zero_grad()
                return None
            result = original(loss, *args, **kwargs)
            runner = self._runner
            bad = _bad_params(
                _unwrap(runner.model), [
                    p for g in optim_wrapper.optimizer.param_groups
                    for p in g['params']
                ])
            if _any_rank(bool(bad)):
                self._fail(
                    runner, f'the optimizer step at {self._where(runner)} '
                    f'made {bad or "parameters on another rank"} nan / inf '
                    f'although the loss was finite ({_value(loss)}): the '
                    f'gradients or the update overflowed; training stopped')
            return result

        # eager under the config's `compile` (the checks call .item())
        from torch import _dynamo
        optim_wrapper.update_params = _dynamo.disable(update_params)
        optim_wrapper._nonfinite_guarded = True

    def before_train(self, runner) -> None:
        self._runner = runner
        wrappers = runner.optim_wrapper  # OptimWrapperDict or OptimWrapper
        for w in getattr(wrappers, 'optim_wrappers', {}).values() or \
                [wrappers]:
            self._guard(w)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self._step_skipped = False

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        loss = outputs.get('loss') if isinstance(outputs, dict) else None
        if loss is not None and not self._step_skipped and _any_rank(
                not math.isfinite(_value(loss))):
            self._stop(runner, _value(loss))

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        bad = _bad_params(_unwrap(runner.model))
        if bad:
            self._fail(
                runner, f'refusing to save a checkpoint at '
                f'{self._where(runner)}: {bad} hold nan / inf; training '
                f'stopped')

    def _after_iter(self,
                    runner,
                    batch_idx,
                    data_batch=None,
                    outputs=None,
                    mode=None) -> None:
        """Stop a validation / test at non-finite outputs, naming the cause."""
        bad = self.check_outputs and _nonfinite(_leaves(outputs))
        if not self.check_outputs or not _any_rank(bool(bad)):
            return
        what = 'validation' if mode == 'val' else 'test'
        if not bad:
            raise NonFiniteLossError(
                f'NonFiniteLossHook: the {what} outputs of another rank '
                f'hold nan / inf; {what} stopped')
        path = next((getattr(s, 'img_path', None) for s in outputs
                     if getattr(s, 'img_path', None) is not None), None) \
            if isinstance(outputs, (list, tuple)) else None
        where = f'; first image {path}' if path is not None else ''
        model = _unwrap(runner.model)
        params = _bad_params(model)
        std = getattr(getattr(model, 'data_preprocessor', None), 'std', None)
        inputs = data_batch.get('inputs') if isinstance(data_batch,
                                                        dict) else data_batch
        if params:
            cause = (f'the model\'s weights hold nan / inf: {params}',
                     'The checkpoint is broken: test an earlier one')
        elif _nonfinite(_leaves(inputs)):
            cause = ('the inputs from the data pipeline hold nan / inf',
                     'Check the data pipeline and the image files')
        elif isinstance(std, torch.Tensor) and bool((std == 0).any()):
            cause = (f'model.data_preprocessor.std '
                     f'{[round(float(v), 6) for v in std.flatten()]} has a 0 '
                     f'(a division by zero)',
                     'Give the std of the data the model was trained with')
        else:
            cause = ('the inputs, the weights and the preprocessing are '
                     'finite: the computation overflowed',
                     'Evaluate in float32 (without --amp / fp16)')
        self._fail(
            runner, f'the {what} outputs of batch {batch_idx + 1} hold nan / '
            f'inf ({", ".join(sorted(set(bad))[:3])}{where}): {cause[0]}; '
            f'{what} stopped, its metrics would be meaningless',
            cause[1],
            kept=False)
