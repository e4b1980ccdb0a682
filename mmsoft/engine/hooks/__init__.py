"""Hooks of mmsoft (registered in MMEngine's root HOOKS registry)."""
from .checkpoint_hook import SafeCheckpointHook, use_safe_checkpoint_hook

__all__ = ['SafeCheckpointHook', 'use_safe_checkpoint_hook']
