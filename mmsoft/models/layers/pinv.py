"""Deprecated (mmsoft <= 0.3): the Newton-Raphson inverse lives in
:mod:`.nr_config`, :mod:`.nr_iteration`, :mod:`.nr_autograd` and
:mod:`.nr_diagnostics`; the old names work for one more release, with a
``DeprecationWarning`` naming the new home. ``newton_inverse`` /
``newton_inverse_apply``: ``NRConfig(iters, init, method, backward)``
``.inverse(A, stats)`` / ``.apply(A, W, stats)``."""
import importlib
import warnings

import torch  # noqa: F401 (pinv.torch, as before)

from .nr_config import NRConfig

#: the old names -> their modules (``NewtonInverseApply``: ``NewtonInverse``
#: serves both, ``apply(A, W, nr, stats)``)
MOVED = {
    name: module
    for module, names in dict(
        nr_config='NRConfig NR_BACKWARDS NR_FIELDS default_init',
        nr_autograd='NewtonInverse NewtonInverseApply NR_METHODS '
        'SPECTRAL_MIN_M resolve_method',
        nr_diagnostics='nr_residual pinv_convergence',
        nr_iteration='INIT_ALIASES INIT_MODES canonical_init nr_init_alpha '
        'nr_iteration_matrix').items()
    for name in names.split()
}
__all__ = ['newton_inverse', 'newton_inverse_apply', *MOVED]


def __getattr__(name: str):
    if name not in MOVED:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    home = f'{__package__}.{MOVED[name]}'
    warnings.warn(f'{__name__}.{name} is deprecated; use {home}.{name}',
                  DeprecationWarning, 2)
    return getattr(importlib.import_module(home), name.replace('Apply', ''))


def _deprecated(name: str, use: str, *settings) -> NRConfig:
    warnings.warn(f'{name} is deprecated; use NRConfig(...).{use}',
                  DeprecationWarning, 3)
    return NRConfig(*settings)


def newton_inverse(A,
                   iters=20,
                   init='soft_norm_per_sample',
                   method='auto',
                   backward='eq16',
                   stats=None):
    """Deprecated: ``NRConfig(iters, init, method, backward).inverse(A)``."""
    return _deprecated('newton_inverse', 'inverse(A, stats)', iters, init,
                       method, backward).inverse(A, stats)


def newton_inverse_apply(A,
                         W,
                         iters=20,
                         init='soft_norm_per_sample',
                         method='auto',
                         backward='eq16',
                         stats=None):
    """Deprecated: ``NRConfig(iters, init, method, backward).apply(A, W)``."""
    return _deprecated('newton_inverse_apply', 'apply(A, W, stats)', iters,
                       init, method, backward).apply(A, W, stats)
