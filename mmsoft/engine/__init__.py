"""Training-engine parts of mmsoft (hooks)."""
from .hooks import (NonFiniteLossError, NonFiniteLossHook, SafeCheckpointHook,
                    StrictLoadHook, add_nonfinite_hook,
                    use_safe_checkpoint_hook)

__all__ = [
    'SafeCheckpointHook', 'use_safe_checkpoint_hook', 'NonFiniteLossHook',
    'NonFiniteLossError', 'add_nonfinite_hook', 'StrictLoadHook'
]
