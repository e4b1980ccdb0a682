"""Refuse checkpoints that do not match the model, which mmengine's Runner
loads with ``strict=False`` (a WARNING and a metric of wrong weights)."""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmsoft.utils.strict_load import CheckpointMismatchError

__all__ = ['StrictLoadHook', 'resume_refusal']


@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Check every checkpoint the Runner loads against its model (in
    ``after_load_checkpoint``, before the Runner copies it): missing,
    unexpected or mis-shaped keys, the other ``attn_norm``, and with
    ``resume`` a file that is not a training checkpoint raise
    :class:`~mmsoft.utils.strict_load.CheckpointMismatchError`.

    Args:
        allow_partial (bool): log a mismatch instead of raising (loading no
            tensor at all is an error even then).
        opt_in (str): how to allow partial loads, shown in the error.
    """

    priority = 'VERY_HIGH'  # before EMAHook copies the weights

    def __init__(self,
                 allow_partial: bool = False,
                 opt_in: str = 'set allow_partial=True on StrictLoadHook'):
        self.allow_partial = allow_partial
        self.opt_in = opt_in

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        from mmsoft.models.loading import check_checkpoint_for_model
        source = str(getattr(runner, '_load_from', None) or 'checkpoint')
        refusal = getattr(runner, '_resume', False) and resume_refusal(
            checkpoint, source)
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
