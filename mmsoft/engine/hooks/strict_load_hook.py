"""Refuse checkpoints that do not match the model (``tools/test.py``,
``tools/train.py``: ``load_from`` and ``--resume``).

MMEngine's Runner loads ``load_from`` with ``strict=False``: a wrong
checkpoint only logs a WARNING and the test still prints a metric and exits
0. This hook checks the checkpoint in ``after_load_checkpoint``, which the
Runner calls with the loaded file *before* copying it into the model, and
raises :class:`mmsoft.utils.strict_load.CheckpointMismatchError` naming the
missing / unexpected / mis-shaped keys (and the converter command for an
unconverted official SOFT checkpoint). ``allow_partial=True``
(``--partial-load`` of both tools) logs the mismatch instead. Weights
converted for the other attention normalisation (``meta['attn_norm']`` of
``soft2mmsoft.py``) are refused too, and with ``resume`` a checkpoint that
is not a training checkpoint.
"""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmsoft.utils.strict_load import CheckpointMismatchError

__all__ = ['StrictLoadHook', 'not_resumable', 'resume_refusal']


@HOOKS.register_module()
class StrictLoadHook(Hook):
    """Check every checkpoint the Runner loads against its model.

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
        if getattr(runner, '_resume', False):
            problem = not_resumable(checkpoint)
            if problem:
                raise CheckpointMismatchError(resume_refusal(source, problem))
        cfg = getattr(runner, 'cfg', None)
        check_checkpoint_for_model(
            runner.model,
            checkpoint,
            source,
            allow_partial=self.allow_partial,
            opt_in=self.opt_in,
            config=getattr(cfg, 'filename', None))


#: what mmengine's ``Runner.resume`` reads besides the weights
RESUME_KEYS = ('meta', 'message_hub')


def not_resumable(checkpoint) -> str:
    """Why ``checkpoint`` (a loaded dict) cannot be resumed from, or ''.

    ``Runner.resume`` reads ``meta['epoch']``, ``meta['iter']`` and the
    ``message_hub`` (then the optimizer and schedulers): a weights-only file
    (a converted or published checkpoint) used to be half-loaded and then
    fail with ``KeyError: 'epoch'``."""
    if not isinstance(checkpoint, dict):
        return f'it holds a {type(checkpoint).__name__}, not a dict'
    meta = checkpoint.get('meta')
    absent = [k for k in RESUME_KEYS if k not in checkpoint]
    if isinstance(meta, dict):
        absent += [f'meta.{k}' for k in ('epoch', 'iter') if k not in meta]
    if absent:
        return f'it has no {", ".join(absent)}'
    return ''


def resume_refusal(source: str, problem: str) -> str:
    """The one-line refusal of ``--resume`` with a weights-only file."""
    return (f'--resume {source}: not a training checkpoint ({problem}); '
            f'--resume continues a run from an epoch_N.pth / iter_N.pth '
            f'written by tools/train.py. To start training from these '
            f'weights, pass --cfg-options load_from={source} instead')
