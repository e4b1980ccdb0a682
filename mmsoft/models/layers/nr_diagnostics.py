"""How far the Newton-Raphson iterate A_T is from A^+ (the paper's Fig. 4):
the ``stats`` of ``NRConfig.inverse`` / ``apply`` (``last_nr_stats``)."""
from typing import Dict

import torch

from .nr_iteration import init_iteration, newton_iterate, scalar_iterate

__all__ = [
    'record_residual', 'iterative_stats', 'nr_residual', 'pinv_convergence'
]


def record_residual(stats, lam, v) -> None:
    """Fill ``stats`` from the eigenvalues l of the matrix iterated on and
    v = v_T(l), per matrix: ``'residual'`` ||A A_T A - A||_2 / ||A||_2 =
    max |l (l v - 1)| / max |l|; ``'unconverged'`` the fraction of the
    numerical rank (l > m eps max |l|) with |1 - l v| > 0.5."""
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


def iterative_stats(stats, A, init, iters) -> None:
    """:func:`record_residual` for the iterative method (one ``eigvalsh``)."""
    if stats is None:
        return
    with torch.no_grad():
        Aw, alpha = init_iteration(A, init)
        lam = torch.linalg.eigvalsh(Aw)
        record_residual(stats, lam, scalar_iterate(lam, alpha, iters))


@torch.no_grad()
def nr_residual(A, iters=20, init='soft_norm_per_sample'):
    """``{'residual', 'unconverged'}`` of T iterations on (..., m, m) A,
    each of shape ``A.shape[:-2]`` (see :func:`record_residual`)."""
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'nr_residual expects (..., m, m) matrices, got '
                         f'shape {tuple(A.shape)}')
    stats: Dict[str, torch.Tensor] = {}
    iterative_stats(stats, A, init, iters)
    return stats


@torch.no_grad()
def pinv_convergence(A, iters=20, init='soft_norm_per_sample'):
    """||A A_k A - A||_2 / ||A||_2 for k = 0..iters (Fig. 4), each of shape
    ``A.shape[:-2]``."""
    A = A.double()
    Aw, alpha = init_iteration(A, init)
    V = alpha[..., None, None] * Aw

    def norm2(M):  # symmetric: the spectral norm is the largest |eigenvalue|
        return torch.linalg.eigvalsh(0.5 * (M + M.mT)).abs().amax(-1)

    normA = norm2(A)
    out = []
    for k in range(iters + 1):
        out.append(norm2(A @ V @ A - A) / normA)
        if k < iters:
            V = newton_iterate(Aw, V, 1)
    return tuple(out)
