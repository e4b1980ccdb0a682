"""The Newton-Raphson settings of a SOFT attention (:class:`NRConfig`).

The pseudo-inverse A^+ of the bottleneck matrix is the T-th iterate of
Alg. 2 / Eq. (10), ``A_0 = alpha A, A_{k+1} = 2 A_k - A_k A A_k``
(:mod:`.nr_iteration`), with the alpha rules of the official checkpoints
(``init``, see :func:`~.nr_iteration.nr_init_alpha`), evaluated as written
or on the eigenvalues (``method``) and differentiated by Eq. (16) or
exactly (``backward``, :mod:`.nr_autograd`).

* ``init``: ``'soft_norm_per_sample'`` (default with ``attn_norm=True``,
  the official normalised rule with one alpha per sample: batch-independent
  and identical to the official model at batch size 1),
  ``'soft_norm_per_matrix'`` (one alpha per matrix), ``'soft_norm_per_batch'``
  (one alpha per batch, as the official kernel; opt-in), ``'soft'``
  (NeurIPS: iterations on A + 0.01 I, alpha = 0.9 * 2 / ||A||_1^2).
* ``method``: ``'iterative'`` (2T batched m x m products), ``'spectral'``
  (one ``eigh``, then the scalar recurrence v_{k+1} = 2 v_k - v_k^2 l on
  the eigenvalues; the same function), ``'auto'`` (spectral for
  m >= :data:`SPECTRAL_MIN_M` on the CPU, iterative elsewhere).
* ``backward``: ``'eq16'`` (the papers' closed form, the gradient of the
  true pseudo-inverse) or ``'exact'`` (the gradient of the T iterations as
  computed, alpha held fixed).
"""
import dataclasses
from typing import Dict, Mapping, Optional, Union

import torch

from .checks import check_int
from .nr_autograd import NR_METHODS, SPECTRAL_MIN_M, resolve_method, solve
from .nr_iteration import INIT_ALIASES, INIT_MODES, canonical_init

__all__ = [
    'NRConfig', 'INIT_MODES', 'INIT_ALIASES', 'NR_METHODS', 'NR_BACKWARDS',
    'NR_FIELDS', 'SPECTRAL_MIN_M', 'canonical_init', 'default_init',
    'resolve_method'
]

NR_BACKWARDS = ('eq16', 'exact')
#: the fields of :class:`NRConfig` (the ``attn_cfg`` keys ``nr_<field>``)
NR_FIELDS = ('iters', 'init', 'method', 'backward')


def default_init(attn_norm: bool) -> str:
    """The alpha rule of each official variant: the official normalized rule
    per sample with ``attn_norm`` (IJCV), else ``'soft'`` (NeurIPS)."""
    return 'soft_norm_per_sample' if attn_norm else 'soft'


@dataclasses.dataclass(frozen=True)
class NRConfig:
    """The Newton-Raphson settings of one attention, validated once.

    Args:
        iters (int): T, the iterations (>= 1). Default: 20.
        init (str): the alpha rule, one of :data:`INIT_MODES` (an old name
            of :data:`INIT_ALIASES` is replaced by its new one). Default:
            'soft_norm_per_sample'.
        method (str): ``'auto'``, ``'iterative'`` or ``'spectral'`` (see
            the module docstring). Default: 'auto'.
        backward (str): ``'eq16'`` or ``'exact'``. Default: 'eq16'.

    Frozen: a SOFT attention's settings are chosen by building it with them
    (``SOFTAttention(..., nr=...)``, or the ``attn_cfg`` keys ``nr_iters``,
    ``nr_init``, ``nr_method``, ``nr_backward``). :meth:`inverse` and
    :meth:`apply` evaluate A_T and A_T W: float32 (float64 for float64
    inputs), autocast disabled; ``stats``: an optional dict that receives
    the convergence of the call (``'residual'``, ``'unconverged'`` per
    matrix, see ``nr_diagnostics.nr_residual``).
    """
    iters: int = 20
    init: str = 'soft_norm_per_sample'
    method: str = 'auto'
    backward: str = 'eq16'

    def __post_init__(self):
        # errors name the attn_cfg key too (nr_<field>), the usual spelling
        iters = check_int('Newton-Raphson iters (nr_iters)', self.iters)
        object.__setattr__(self, 'iters', iters)
        object.__setattr__(self, 'init', canonical_init(self.init))
        if self.method not in NR_METHODS:
            raise ValueError(f'unknown pseudo-inverse method (nr_method) '
                             f'{self.method!r}; choose one of {NR_METHODS}')
        if self.backward not in NR_BACKWARDS:
            raise ValueError(f'unknown Newton-Raphson backward (nr_backward) '
                             f'{self.backward!r}; choose one of '
                             f'{NR_BACKWARDS}')

    @classmethod
    def of(cls, nr: Union['NRConfig', Mapping, None],
           attn_norm: bool) -> 'NRConfig':
        """The settings of a SOFT attention from its ``nr`` argument: an
        NRConfig as it is; a dict of the fields or None: the defaults for
        the fields it leaves out, where ``init`` missing or None is the
        official rule of the variant (:func:`default_init`)."""
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

    def inverse(self,
                A: torch.Tensor,
                stats: Optional[Dict] = None) -> torch.Tensor:
        """A_T for (..., m, m) symmetric non-negative matrices A."""
        return solve(A, None, self, stats)

    def apply(self,
              A: torch.Tensor,
              W: torch.Tensor,
              stats: Optional[Dict] = None) -> torch.Tensor:
        """A_T W for W (..., m, d) without forming A_T (with the spectral
        method; the Eq. (16) backward needs only m x d products): the same
        function as ``inverse(A) @ W`` up to rounding."""
        return solve(A, W, self, stats)
