"""Refuse checkpoints the Runner would load with ``strict=False``."""
import math

from mmengine.hooks import Hook
from mmengine.model.weight_init import PretrainedInit
from mmengine.registry import HOOKS

from mmsoft.utils.strict_load import CheckpointMismatchError


@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Raise ``CheckpointMismatchError`` for a checkpoint that does not fit."""

    priority = 'VERY_HIGH'  # before EMAHook copies the weights

    def __init__(self,
                 allow_partial: bool = False,
                 opt_in: str = 'set allow_partial=True on the '
                 "config's StrictLoadHook (custom_hooks)"):
        self.allow_partial, self.opt_in = allow_partial, opt_in

    def before_run(self, runner) -> None:
        from mmengine.runner import find_latest_checkpoint
        safe = HOOKS.get('SafeCheckpointHook')  # (imports this module)
        path = getattr(runner, '_load_from', None)
        if path is None and getattr(runner, '_resume', False) and not any(
                isinstance(h, safe) for h in getattr(runner, 'hooks', ())):
            path = find_latest_checkpoint(runner.work_dir)
        if path is not None:
            skip_pretrained_init(runner, path)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        from mmsoft.models.loading import check_checkpoint_for_model
        source = str(getattr(runner, '_load_from', None) or 'checkpoint')
        resume = getattr(runner, '_resume', False)
        refusal = resume and (resume_refusal(checkpoint, source)
                              or continue_refusal(runner, checkpoint, source))
        if refusal:
            raise CheckpointMismatchError(refusal)
        config = getattr(getattr(runner, 'cfg', None), 'filename', None)
        check_checkpoint_for_model(runner.model, checkpoint, source,
                                   self.allow_partial, self.opt_in, config)


def resume_refusal(checkpoint, source: str) -> str:
    """What ``checkpoint`` lacks for ``Runner.resume``, else ''."""
    if not isinstance(checkpoint, dict):
        problem = f'it holds a {type(checkpoint).__name__}, not a dict'
    else:
        meta = checkpoint.get('meta')
        absent = [k for k in ('meta', 'message_hub') if k not in checkpoint]
        if isinstance(meta, dict):
            absent += [f'meta.{k}' for k in ('epoch', 'iter') if k not in meta]
        if not absent:
            return ''
        problem = f'it has no {", ".join(absent)}'
    return (f'--resume {source}: not a training checkpoint ({problem}); '
            f'--resume continues a run from an epoch_N.pth / iter_N.pth '
            f'written by tools/train.py. To start training from these '
            f'weights, pass --cfg-options load_from={source} instead')


def continue_refusal(runner, checkpoint: dict, source: str) -> str:
    """Why the training ``checkpoint`` cannot continue the config's run."""
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
    opt = getattr(getattr(runner, 'optim_wrapper', None), 'optimizer', None)
    saved = checkpoint.get('optimizer')
    groups = saved.get('param_groups') if isinstance(saved, dict) else None
    name, defaults = type(opt).__name__, getattr(opt, 'defaults', None)
    if defaults is not None and groups and isinstance(groups[0], dict):
        have = set(groups[0]) - {'params'}
        lacks = sorted(set(defaults) - have)
        extra = sorted(
            k for k in have - set(defaults)
            if not k.startswith('initial_') and not k.endswith('_mult'))
        if lacks and extra:
            return (f'--resume {source}: the checkpoint was trained with '
                    f'another optimizer than the config\'s '
                    f'optim_wrapper.optimizer ({name}): its state has '
                    f'{", ".join(extra)} and no {", ".join(lacks)}, so it '
                    f'cannot continue in {name}. Resume with the optimizer '
                    f'it was trained with, or start a new run from these '
                    f'weights with --cfg-options load_from={source} (without '
                    f'--resume)')
    loop, meta = getattr(runner, '_train_loop', None), checkpoint.get('meta')
    unit = 'epoch' if isinstance(loop, EpochBasedTrainLoop) else 'iter'
    key = f'max_{unit}s'
    limit = getattr(loop, key, None)
    done = meta.get(unit) if isinstance(meta, dict) else None
    if isinstance(loop, (EpochBasedTrainLoop, IterBasedTrainLoop)) and \
            isinstance(done, int) and done > limit:
        return (f'--resume {source}: the checkpoint is at {unit} {done}, '
                f'past the schedule\'s end (train_cfg.{key}={limit}): '
                f'nothing would train. Raise it (--cfg-options '
                f'train_cfg.{key}=...) or resume an earlier checkpoint')
    have = getattr(opt, 'param_groups', None)
    if not groups or not have or len(groups) != len(have):
        return ''  # another optimizer / model: refused or reported elsewhere

    def value(group, key):
        v = group.get(f'initial_{key}', group.get(key))
        return float(v) if isinstance(v, (int, float)) else None

    for key in ('lr', 'weight_decay'):
        for new, old in zip(have, groups):
            a, b = value(new, key), value(old, key)
            if a is None or b is None or math.isclose(
                    a, b, rel_tol=1e-6, abs_tol=1e-12):
                continue
            # the config's value; the checkpoint's at the same scale
            base = (defaults or {}).get(key, a)
            was = b * base / a if a else b
            return (f'--resume {source}: the config\'s '
                    f'optim_wrapper.optimizer.{key} is {base:g}, the '
                    f'checkpoint was trained with {was:g}: a resume restores '
                    f'the saved optimizer and schedule, so the run would '
                    f'continue at {was:g}. To train these weights with '
                    f'{key} {base:g} in a new schedule, pass --cfg-options '
                    f'load_from={source} instead of --resume; to continue '
                    f'the run, drop the new {key}')
    return ''


def skip_pretrained_init(runner, source: str) -> None:
    """Drop ``init_cfg``'s ``Pretrained`` entries that ``source`` replaces."""
    from mmengine.model import is_model_wrapper
    from mmengine.runner import BaseLoop

    from mmsoft.models.loading import PRETRAINED
    if not isinstance(getattr(runner, '_train_loop', None), BaseLoop) or \
            not any(isinstance(h, StrictLoadHook) and not h.allow_partial
                    for h in getattr(runner, 'hooks', ())):
        return  # no init_weights, or partial loads allowed

    def pretrained(c):
        t = c.get('type') if isinstance(c, dict) else None
        return str(t).split('.')[-1] in PRETRAINED or (isinstance(
            t, type) and issubclass(t, PretrainedInit))

    model = runner.model
    while is_model_wrapper(model):
        model = model.module
    how = '--resume' if getattr(runner, '_resume', False) else 'load_from'
    for name, module in model.named_modules():
        init = getattr(module, 'init_cfg', None)
        cfgs = [init] if isinstance(init, dict) else list(init or ())
        drop = [c for c in cfgs if pretrained(c)]
        if getattr(module, 'is_init', False) or not drop:
            continue
        keep = [c for c in cfgs if c not in drop]
        module.init_cfg = (keep[0] if keep else None) if isinstance(
            init, dict) else keep
        key = '.'.join(['model'] + ([name] if name else []) + ['init_cfg'])
        for c in drop:
            runner.logger.info(
                f'mmsoft: {how} {source} replaces every weight of the model '
                f'(StrictLoadHook): {key} checkpoint {c.get("checkpoint")} '
                f'is not read')
