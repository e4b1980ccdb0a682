"""The Newton-Raphson settings of a SOFT attention (:class:`NRConfig`)."""
import dataclasses
from typing import Mapping, Optional

import torch

from .amp import check_choice, check_int
from .nr_autograd import NR_METHODS, solve
from .nr_iteration import canonical_init

__all__ = [
    'NRConfig', 'NR_BACKWARDS', 'NR_FIELDS', 'default_init', 'default_backward'
]

NR_BACKWARDS = ('eq16', 'exact')
#: the fields of :class:`NRConfig` (the ``attn_cfg`` keys ``nr_<field>``)
NR_FIELDS = ('iters', 'init', 'method', 'backward')


def default_init(attn_norm: bool) -> str:
    """The alpha rule of the official variant: per sample with
    ``attn_norm`` (IJCV), else ``'soft'`` (NeurIPS)."""
    return 'soft_norm_per_sample' if attn_norm else 'soft'


def default_backward(init: str) -> str:
    """The official variant's gradient: ``'eq16'`` for the NeurIPS model
    (``init='soft'``, its CUDA kernel), else ``'exact'`` (the Norm code's
    autograd through the iterations)."""
    return 'eq16' if init == 'soft' else 'exact'


@dataclasses.dataclass(frozen=True)
class NRConfig:
    """A^+ as A_T, the T-th Newton-Raphson iterate (Alg. 2, Eq. 10).

    Args:
        iters (int): T >= 1. Default: 20.
        init (str): the alpha of A_0 = alpha A (:data:`INIT_MODES`):
            ``'soft_norm_per_sample'`` / ``_per_matrix`` /
            ``_per_batch`` (the official search, one
            alpha per sample / matrix / batch) or ``'soft'`` (NeurIPS).
            Default: 'soft_norm_per_sample'.
        method (str): ``'iterative'`` (2T batched products), ``'spectral'``
            (one ``eigh``), ``'lanczos'`` (A_T W on Krylov spaces of the
            same function, ``nr_lanczos``; the inverse itself as
            ``'auto'``) or ``'auto'`` (for A_T W Lanczos from
            ``LANCZOS_MIN_M[(device, with gradient)]`` (CPU: inference
            only), else spectral for m >=
            ``SPECTRAL_MIN_M`` on the CPU, else iterative). All compute
            the official function. Default: 'auto'.
        backward (str | None): ``'exact'`` (the gradient of the T
            iterations, alpha included: what the official Norm code trains
            with, autograd through its ``newton_inv``) or ``'eq16'`` (Eq.
            16, the gradient of a true inverse: the official NeurIPS CUDA
            kernel's). Default: None, the variant's official one:
            ``'eq16'`` for ``init='soft'``, else ``'exact'``.

    Frozen; the ``attn_cfg`` keys are ``nr_<field>``. :meth:`inverse` /
    :meth:`apply`: float32 (float64 stays), autocast off; ``stats``: a dict
    for ``'residual'`` and ``'unconverged'`` (``nr_diagnostics``).
    """
    iters: int = 20
    init: str = 'soft_norm_per_sample'
    method: str = 'auto'
    backward: Optional[str] = None

    def __post_init__(self):
        iters = check_int('Newton-Raphson iters (nr_iters)', self.iters)
        object.__setattr__(self, 'iters', iters)
        object.__setattr__(self, 'init', canonical_init(self.init))
        if self.backward is None:
            object.__setattr__(self, 'backward', default_backward(self.init))
        check_choice('pseudo-inverse method (nr_method)', self.method,
                     NR_METHODS)
        check_choice('Newton-Raphson backward (nr_backward)', self.backward,
                     NR_BACKWARDS)

    @classmethod
    def of(cls, nr, attn_norm) -> 'NRConfig':
        """``nr`` as it is, or from a dict of the fields / None: ``init``
        missing or None is :func:`default_init`."""
        if isinstance(nr, NRConfig):
            return nr
        if nr is not None and not isinstance(nr, Mapping):
            raise TypeError(f'nr must be an NRConfig, a dict of its fields '
                            f'{NR_FIELDS} or None, got {nr!r}')
        nr = dict(nr or {})
        unknown = sorted(set(nr) - set(NR_FIELDS))
        if unknown:
            raise TypeError(f'nr: unknown Newton-Raphson settings {unknown}; '
                            f'the settings are {NR_FIELDS}')
        if nr.get('init') is None:
            nr['init'] = default_init(attn_norm)
        return cls(**nr)

    def replace(self, **changes) -> 'NRConfig':
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def inverse(self, A: torch.Tensor, stats=None) -> torch.Tensor:
        """A_T for (..., m, m) symmetric non-negative A."""
        return solve(A, None, self, stats)

    def apply(self, A: torch.Tensor, W: torch.Tensor, stats=None):
        """A_T W for W (..., m, d), ``inverse(A) @ W`` up to rounding
        without forming A_T with the spectral method."""
        return solve(A, W, self, stats)
