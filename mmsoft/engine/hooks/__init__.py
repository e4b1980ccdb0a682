from .checkpoint_hook import SafeCheckpointHook
from .nonfinite_hook import NonFiniteLossError, NonFiniteLossHook
from .strict_load_hook import StrictLoadHook

__all__ = [
    'SafeCheckpointHook', 'NonFiniteLossHook', 'NonFiniteLossError',
    'StrictLoadHook'
]
