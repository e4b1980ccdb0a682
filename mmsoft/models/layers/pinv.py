"""Deprecated home of the Newton-Raphson pseudo-inverse (mmsoft <= 0.4).

Its parts now live by concern: the settings in :mod:`.nr_config`
(:class:`NRConfig`), the iteration in :mod:`.nr_iteration`, the autograd
and the exact backward in :mod:`.nr_autograd`, the diagnostics in
:mod:`.nr_diagnostics`. The names below keep working for one release;
:func:`newton_inverse` and :func:`newton_inverse_apply` warn: use
``NRConfig(iters, init, method, backward).inverse(A, stats)`` /
``.apply(A, W, stats)``.
"""
import warnings
from typing import Dict, Optional

import torch

from .nr_autograd import (NR_METHODS, SPECTRAL_MIN_M, NewtonInverse,
                          NewtonInverseApply, resolve_method)
from .nr_config import NR_BACKWARDS, NR_FIELDS, NRConfig, default_init
from .nr_diagnostics import nr_residual, pinv_convergence
from .nr_iteration import (INIT_ALIASES, INIT_MODES, canonical_init,
                           nr_init_alpha, nr_iteration_matrix)

__all__ = [
    'newton_inverse', 'newton_inverse_apply', 'nr_init_alpha',
    'pinv_convergence', 'NewtonInverse', 'NewtonInverseApply', 'NRConfig',
    'INIT_MODES', 'INIT_ALIASES', 'NR_METHODS', 'NR_BACKWARDS', 'NR_FIELDS',
    'SPECTRAL_MIN_M', 'canonical_init', 'default_init', 'nr_residual',
    'nr_iteration_matrix', 'resolve_method'
]


def _deprecated(name: str, new: str) -> None:
    warnings.warn(
        f'mmsoft.models.layers.{name} is deprecated and will be removed in '
        f'the next release; use {new}',
        DeprecationWarning,
        stacklevel=3)


def newton_inverse(A: torch.Tensor,
                   iters: int = 20,
                   init: str = 'soft_norm_per_sample',
                   method: str = 'auto',
                   backward: str = 'eq16',
                   stats: Optional[Dict] = None) -> torch.Tensor:
    """Deprecated: ``NRConfig(iters, init, method, backward).inverse(A,
    stats)``."""
    _deprecated('newton_inverse', 'NRConfig(...).inverse(A, stats)')
    return NRConfig(iters, init, method, backward).inverse(A, stats)


def newton_inverse_apply(A: torch.Tensor,
                         W: torch.Tensor,
                         iters: int = 20,
                         init: str = 'soft_norm_per_sample',
                         method: str = 'auto',
                         backward: str = 'eq16',
                         stats: Optional[Dict] = None) -> torch.Tensor:
    """Deprecated: ``NRConfig(iters, init, method, backward).apply(A, W,
    stats)``."""
    _deprecated('newton_inverse_apply', 'NRConfig(...).apply(A, W, stats)')
    return NRConfig(iters, init, method, backward).apply(A, W, stats)
