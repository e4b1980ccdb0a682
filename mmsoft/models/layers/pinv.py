"""Deprecated (mmsoft <= 0.3): the Newton-Raphson inverse lives in
:mod:`.nr_config`, :mod:`.nr_iteration`, :mod:`.nr_autograd` and
:mod:`.nr_diagnostics`; these names work for one more release.
``newton_inverse`` / ``newton_inverse_apply`` warn: write
``NRConfig(iters, init, method, backward).inverse(A, stats)`` /
``.apply(A, W, stats)``."""
import warnings

import torch  # noqa: F401 (pinv.torch, as before)

from .nr_autograd import (NR_METHODS, SPECTRAL_MIN_M, NewtonInverse,
                          resolve_method)
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

#: one Function now serves both (``apply(A, W, nr, stats)``)
NewtonInverseApply = NewtonInverse


def _deprecated(name: str, use: str) -> None:
    warnings.warn(
        f'{name} is deprecated; use NRConfig(...).{use}',
        DeprecationWarning,
        stacklevel=3)


def newton_inverse(A,
                   iters=20,
                   init='soft_norm_per_sample',
                   method='auto',
                   backward='eq16',
                   stats=None):
    """Deprecated: ``NRConfig(iters, init, method, backward).inverse(A)``."""
    _deprecated('newton_inverse', 'inverse(A, stats)')
    return NRConfig(iters, init, method, backward).inverse(A, stats)


def newton_inverse_apply(A,
                         W,
                         iters=20,
                         init='soft_norm_per_sample',
                         method='auto',
                         backward='eq16',
                         stats=None):
    """Deprecated: ``NRConfig(iters, init, method, backward).apply(A, W)``."""
    _deprecated('newton_inverse_apply', 'apply(A, W, stats)')
    return NRConfig(iters, init, method, backward).apply(A, W, stats)
