"""Optim wrappers of mmsoft (registered in MMEngine's root OPTIM_WRAPPERS,
so that ``optim_wrapper=dict(type='CPUAmpOptimWrapper')`` works in any
codebase's config after ``import mmsoft``)."""
from .cpu_amp_optim_wrapper import CPUAmpOptimWrapper

__all__ = ['CPUAmpOptimWrapper']
