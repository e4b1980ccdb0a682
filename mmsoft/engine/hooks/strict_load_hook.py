"""Refuse checkpoints that do not match the model, which mmengine's Runner
loads with ``strict=False`` (a WARNING and a metric of wrong weights)."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmsoft.utils.strict_load import CheckpointMismatchError

__all__ = [
    'StrictLoadHook', 'resume_refusal', 'optimizer_refusal', 'progress_refusal'
]


@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Check every checkpoint the Runner loads against its model (in
    ``after_load_checkpoint``, before the Runner copies it): missing,
    unexpected or mis-shaped keys (an authors' unconverted file: the
    converter command), the other ``attn_norm``, and with ``resume`` a file
    that is not a training checkpoint or one of another optimizer raise
    :class:`~mmsoft.utils.strict_load.CheckpointMismatchError`. Named in
    the shipped configs' ``custom_hooks``: the host codebases' own
    ``tools/train.py`` / ``tools/test.py`` check as mmsoft's do.

    Args:
        allow_partial (bool): log a mismatch instead of raising (loading no
            tensor at all is an error even then).
        opt_in (str): how to allow partial loads, shown in the error.
    """

    priority = 'VERY_HIGH'  # before EMAHook copies the weights

    def __init__(self,
                 allow_partial: bool = False,
                 opt_in: str = 'set allow_partial=True on the '
                 "config's StrictLoadHook (custom_hooks)"):
        self.allow_partial = allow_partial
        self.opt_in = opt_in

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        from mmsoft.models.loading import check_checkpoint_for_model
        source = str(getattr(runner, '_load_from', None) or 'checkpoint')
        resume = getattr(runner, '_resume', False)
        refusal = resume and (resume_refusal(checkpoint, source)
                              or optimizer_refusal(runner, checkpoint, source)
                              or progress_refusal(runner, checkpoint, source))
        if refusal:
            raise CheckpointMismatchError(refusal)
        check_checkpoint_for_model(
            runner.model,
            checkpoint,
            source,
            allow_partial=self.allow_partial,
            opt_in=self.opt_in,
            config=getattr(getattr(runner, 'cfg', None), 'filename', None))


def resume_refusal(checkpoint, source: str) -> str:
    """The one-line refusal of ``--resume source`` when ``checkpoint`` (a
    loaded dict) lacks what ``Runner.resume`` reads, else ''."""
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


def optimizer_refusal(runner, checkpoint, source: str) -> str:
    """The refusal of ``--resume source`` when ``checkpoint`` holds another
    optimizer's state than the Runner's (mmengine would load its settings
    into this one), else '': the saved param groups lack settings the
    optimizer has *and* have others (a newer torch adds keys one way)."""
    opt = getattr(getattr(runner, 'optim_wrapper', None), 'optimizer', None)
    saved = checkpoint.get('optimizer') if isinstance(checkpoint,
                                                      dict) else None
    groups = saved.get('param_groups') if isinstance(saved, dict) else None
    if not hasattr(opt, 'defaults') or not groups or not isinstance(
            groups[0], dict):
        return ''
    have = set(groups[0]) - {'params'}
    lacks = sorted(set(opt.defaults) - have)
    extra = sorted(k for k in have - set(opt.defaults)
                   if not k.startswith('initial_') and not k.endswith('_mult'))
    if not (lacks and extra):
        return ''
    name = type(opt).__name__
    return (f'--resume {source}: the checkpoint was trained with another '
            f'optimizer than the config\'s optim_wrapper.optimizer ({name}): '
            f'its state has {", ".join(extra)} and no {", ".join(lacks)}, '
            f'so it cannot continue in {name}. Resume with the optimizer it '
            f'was trained with, or start a new run from these weights with '
            f'--cfg-options load_from={source} (without --resume)')


def progress_refusal(runner, checkpoint, source: str) -> str:
    """The refusal of ``--resume source`` when ``checkpoint`` is past the
    end of the Runner's schedule (its epoch above ``max_epochs`` of an
    epoch-based loop, its iteration above ``max_iters`` of an iteration-
    based one): nothing would train and the run would end at once, exit 0.
    Else '' (at the end exactly: a finished run, resumed as mmengine
    does)."""
    from mmengine.runner import EpochBasedTrainLoop, IterBasedTrainLoop
    loop = getattr(runner, '_train_loop', None)
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    if isinstance(loop, EpochBasedTrainLoop):
        unit, key, limit = 'epoch', 'max_epochs', loop.max_epochs
    elif isinstance(loop, IterBasedTrainLoop):
        unit, key, limit = 'iter', 'max_iters', loop.max_iters
    else:
        return ''
    done = meta.get(unit) if isinstance(meta, dict) else None
    if not isinstance(done, int) or done <= limit:
        return ''
    return (f'--resume {source}: the checkpoint is at {unit} {done}, past '
            f'the schedule\'s end (train_cfg.{key}={limit}): nothing would '
            f'train. Raise it (--cfg-options train_cfg.{key}=...) or resume '
            f'an earlier checkpoint')
