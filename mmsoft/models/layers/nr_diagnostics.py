"""Newton-Raphson convergence diagnostics: how far A_T is from A^+.

:func:`record_residual` fills the ``stats`` dict of
:meth:`NRConfig.inverse <.nr_config.NRConfig.inverse>` / ``apply`` (what a
SOFT attention with ``nr_diagnostics`` keeps in ``last_nr_stats``, and the
backbone's ``nr_stats`` reduces); :func:`nr_residual` computes the same
for given matrices and :func:`pinv_convergence` the paper's metric after
every step (Fig. 4).
"""
from typing import Dict, Optional, Tuple

import torch

from .nr_iteration import (canonical_init, first_iterate, init_iteration,
                           newton_iterate, scalar_iterate)

__all__ = [
    'record_residual', 'iterative_stats', 'nr_residual', 'pinv_convergence'
]


def record_residual(stats: Optional[Dict], lam: torch.Tensor,
                    v: torch.Tensor) -> None:
    """Fill ``stats`` with the NR convergence of the last forward.

    From the eigenvalues l of the matrix iterated on and v = f(l):

    * ``'residual'``: ||A A_T A - A||_2 / ||A||_2 = max |l (l v - 1)| /
      max |l| per matrix (the paper's metric, Fig. 4);
    * ``'unconverged'``: the fraction of the numerical rank of A (the
      eigenvalues above m eps max |l|, as ``torch.linalg.matrix_rank``) on
      which the iterations are far from the pseudo-inverse,
      |1 - l v| > 0.5 (A_T scales those directions by v instead of 1 / l),
      per matrix.
    """
    if stats is None:
        return
    lam, v = lam.detach(), v.detach()
    absl = lam.abs()
    lmax = absl.amax(-1, keepdim=True)
    stats['residual'] = (lam * (lam * v - 1)).abs().amax(-1) / \
        lmax.squeeze(-1).clamp_min(torch.finfo(lam.dtype).tiny)
    rank = absl > lmax * (lam.shape[-1] * torch.finfo(lam.dtype).eps)
    far = ((1 - lam * v).abs() > 0.5) & rank
    stats['unconverged'] = far.sum(-1).to(lam.dtype) / \
        rank.sum(-1).clamp_min(1).to(lam.dtype)


def iterative_stats(stats: Optional[Dict], A: torch.Tensor, init: str,
                    iters: int) -> None:
    """The same statistics for the iterative method (one ``eigvalsh``)."""
    if stats is None:
        return
    with torch.no_grad():
        Aw, alpha = init_iteration(A, init)
        lam = torch.linalg.eigvalsh(Aw)
        record_residual(stats, lam, scalar_iterate(lam, alpha, iters))


@torch.no_grad()
def nr_residual(A: torch.Tensor,
                iters: int = 20,
                init: str = 'soft_norm_per_sample') -> Dict[str, torch.Tensor]:
    """Convergence of the T iterations on A, from its eigenvalues.

    Returns ``{'residual': ||A A_T A - A||_2 / ||A||_2,
    'unconverged': fraction of the numerical rank with |1 - l v_T(l)| >
    0.5}``,
    each of shape ``A.shape[:-2]`` (what ``stats`` of
    :meth:`NRConfig.inverse <.nr_config.NRConfig.inverse>` receives).
    """
    init = canonical_init(init)
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'nr_residual expects (..., m, m) matrices, got '
                         f'shape {tuple(A.shape)}')
    stats: Dict[str, torch.Tensor] = {}
    iterative_stats(stats, A, init, iters)
    return stats


@torch.no_grad()
def pinv_convergence(A: torch.Tensor,
                     iters: int = 20,
                     init: str = 'soft_norm_per_sample'
                     ) -> Tuple[torch.Tensor, ...]:
    """The paper's convergence metric ||A A_k A - A||_2 / ||A||_2 per step.

    Returns a tuple of ``iters + 1`` tensors of shape ``A.shape[:-2]``
    (k = 0..iters), as plotted in Fig. 4.
    """
    init = canonical_init(init)
    A = A.double()
    Aw, V = first_iterate(A, init)

    def norm2(M):  # symmetric: the spectral norm is the largest |eigenvalue|
        return torch.linalg.eigvalsh(0.5 * (M + M.mT)).abs().amax(-1)

    normA = norm2(A)
    out = []
    for k in range(iters + 1):
        out.append(norm2(A @ V @ A - A) / normA)
        if k < iters:
            V = newton_iterate(Aw, V, 1)
    return tuple(out)
