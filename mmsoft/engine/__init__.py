"""Hooks and optim wrappers, registered in mmengine's root registries."""
from .hooks import *  # noqa: F401,F403
from .hooks import __all__ as _hooks
from .optimizers import CPUAmpOptimWrapper

__all__ = list(_hooks) + ['CPUAmpOptimWrapper']
