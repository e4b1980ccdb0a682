"""Hooks of mmsoft (registered in MMEngine's root HOOKS registry)."""
from .checkpoint_hook import SafeCheckpointHook, use_safe_checkpoint_hook
from .nr_residual_hook import NRResidualHook

__all__ = ['SafeCheckpointHook', 'use_safe_checkpoint_hook', 'NRResidualHook']
