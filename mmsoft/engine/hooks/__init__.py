from .checkpoint_hook import SafeCheckpointHook, use_safe_checkpoint_hook
from .nonfinite_hook import (NonFiniteLossError, NonFiniteLossHook,
                             add_nonfinite_hook)
from .nr_residual_hook import NRResidualHook
from .strict_load_hook import StrictLoadHook

__all__ = [
    'SafeCheckpointHook', 'use_safe_checkpoint_hook', 'NRResidualHook',
    'NonFiniteLossHook', 'NonFiniteLossError', 'add_nonfinite_hook',
    'StrictLoadHook'
]
