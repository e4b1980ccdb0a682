from .checkpoint_hook import SafeCheckpointHook
from .nonfinite_hook import NonFiniteLossError, NonFiniteLossHook
from .nr_residual_hook import NRResidualHook
from .strict_load_hook import StrictLoadHook

__all__ = [
    'SafeCheckpointHook', 'NRResidualHook', 'NonFiniteLossHook',
    'NonFiniteLossError', 'StrictLoadHook'
]
