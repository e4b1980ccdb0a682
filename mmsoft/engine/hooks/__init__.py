from .nr_residual_hook import NRResidualHook

__all__ = ['NRResidualHook']
