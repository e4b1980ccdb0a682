"""SOFT's Newton-Raphson diagnostics (paper Fig. 4) as an mmsoft project:
importing it registers :class:`NRResidualHook` in mmengine's ``HOOKS``
(configs: ``custom_imports=dict(imports=['mmsoft',
'projects.nr_diagnostics'])``)."""
from .diagnostics import (NRRecorder, NRResidualHook, nr_residual,
                          pinv_convergence)

__all__ = ['NRResidualHook', 'NRRecorder', 'nr_residual', 'pinv_convergence']
