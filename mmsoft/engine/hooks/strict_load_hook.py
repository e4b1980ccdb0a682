"""Refuse checkpoints that do not match the model (``tools/test.py``).

MMEngine's Runner loads ``load_from`` with ``strict=False``: a wrong
checkpoint only logs a WARNING and the test still prints a metric and exits
0. This hook checks the checkpoint in ``after_load_checkpoint``, which the
Runner calls with the loaded file *before* copying it into the model, and
raises :class:`mmsoft.utils.strict_load.CheckpointMismatchError` naming the
missing / unexpected / mis-shaped keys (and the converter command for an
unconverted official SOFT checkpoint). ``allow_partial=True``
(``tools/test.py --partial-load``) logs the mismatch instead.
"""
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmsoft.runtime import setup

__all__ = ['StrictLoadHook']


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
        setup()  # compat fixes before the Runner loads (mmsoft.runtime)
        self.allow_partial = allow_partial
        self.opt_in = opt_in

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        from mmsoft.models.backbones.soft_pretrained import upgrade_legacy_keys
        from mmsoft.models.converters import official_soft_hint
        from mmsoft.utils.strict_load import (check_state_dict, strip_prefix,
                                              unwrap_model)
        sd = checkpoint.get('state_dict', checkpoint) \
            if isinstance(checkpoint, dict) else checkpoint
        model = unwrap_model(runner.model)
        source = str(getattr(runner, '_load_from', None) or 'checkpoint')
        check_state_dict(
            model.state_dict(),
            upgrade_legacy_keys(model, strip_prefix(sd)),
            source,
            f'the model ({type(model).__name__})',
            allow_partial=self.allow_partial,
            opt_in=self.opt_in,
            hint=lambda: official_soft_hint(checkpoint, source))
