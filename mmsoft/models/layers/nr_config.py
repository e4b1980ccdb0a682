"""The Newton-Raphson settings of a SOFT attention (:class:`NRConfig`)."""
import dataclasses
from typing import Mapping, Optional

import torch

from .amp import check_choice, check_int
from .nr_autograd import NR_METHODS, solve
from .nr_iteration import canonical_init

NR_BACKWARDS = ('eq16', 'exact')
#: the fields of :class:`NRConfig` (the ``attn_cfg`` keys ``nr_<field>``)
NR_FIELDS = ('iters', 'init', 'method', 'backward')


def default_init(attn_norm: bool) -> str:
    """The official alpha rule: per sample with ``attn_norm`` (IJCV), else
    ``'soft'`` (NeurIPS)."""
    return 'soft_norm_per_sample' if attn_norm else 'soft'


@dataclasses.dataclass(frozen=True)
class NRConfig:
    """A^+ as A_T, the T-th Newton-Raphson iterate (Alg. 2, Eq. 10).

    ``iters``: T; ``init``: the alpha rule of A_0 = alpha A
    (``INIT_MODES``); ``method``: ``NR_METHODS`` (all the same function);
    ``backward``: ``'exact'`` (the gradient of the T iterations) or
    ``'eq16'`` (Eq. 16), None: the official one (Eq. 16 for ``'soft'``,
    the NeurIPS CUDA kernel's; else the Norm code's autograd, exact).
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
            object.__setattr__(self, 'backward',
                               'eq16' if self.init == 'soft' else 'exact')
        check_choice('pseudo-inverse method (nr_method)', self.method,
                     NR_METHODS)
        check_choice('Newton-Raphson backward (nr_backward)', self.backward,
                     NR_BACKWARDS)

    @classmethod
    def of(cls, nr, attn_norm) -> 'NRConfig':
        """``nr``, or one from a dict of the fields / None (``init`` None:
        :func:`default_init`)."""
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
        return dataclasses.replace(self, **changes)

    def inverse(self, A: torch.Tensor, stats=None) -> torch.Tensor:
        """A_T of (..., m, m) symmetric non-negative A (float32 or 64)."""
        return solve(A, None, self, stats)

    def apply(self, A: torch.Tensor, W: torch.Tensor, stats=None):
        """A_T W for W (..., m, d) (A_T not formed where avoidable)."""
        return solve(A, W, self, stats)
