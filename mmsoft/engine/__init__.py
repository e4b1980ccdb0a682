"""Training-engine parts of mmsoft (hooks)."""
from .hooks import SafeCheckpointHook, use_safe_checkpoint_hook

__all__ = ['SafeCheckpointHook', 'use_safe_checkpoint_hook']
