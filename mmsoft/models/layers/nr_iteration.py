"""SOFT's Newton-Raphson iteration (Alg. 2, Eq. 10): A_0 = alpha A,
A_{k+1} = 2 A_k - A_k A A_k, as batched products or on the eigenvalues l,
v_{k+1} = 2 v_k - v_k^2 l; the alpha rules; the residual of Fig. 4."""
from typing import Dict, Tuple

import torch

from .amp import compiling

INIT_MODES = ('soft_norm_per_sample', 'soft_norm_per_matrix',
              'soft_norm_per_batch', 'soft')
_NORM_BETA = 0.5
_NORM_MAX_HALVINGS = 10
_NORM_TOL = 1.01
_SOFT_SHIFT = 0.01
_SOFT_SCALE = 0.9


def canonical_init(init: str) -> str:
    """``init`` if it is one of :data:`INIT_MODES`, else a ValueError."""
    if init not in INIT_MODES:
        raise ValueError(
            f'unknown Newton-Raphson init (nr_init) {init!r}; choose one of '
            f'{INIT_MODES}')
    return init


def _shared_max(t: torch.Tensor, init: str, trailing: int = 0):
    """Max of per-matrix values (then ``trailing`` dims) over the matrices
    sharing one alpha: a sample or the batch."""
    lead = t.dim() - trailing
    if lead == 0 or init not in ('soft_norm_per_batch',
                                 'soft_norm_per_sample'):
        return t
    tail = t.shape[lead:]
    if init == 'soft_norm_per_batch':
        return t.reshape(-1, *tail).amax(0).expand_as(t)
    shared = t.reshape(t.shape[0], -1, *tail).amax(1)  # per sample
    return shared.view(t.shape[0], *([1] * (lead - 1)), *tail).expand_as(t)


def nr_init_alpha(A, init='soft_norm_per_sample') -> torch.Tensor:
    """alpha of A_0 = alpha A per matrix. ``'soft'``: 0.9 * 2 / ||A||_1^2;
    ``'soft_norm_per_*'``: the official search, the first alpha_n = 2 0.5^n /
    ||A||_1^2 (n <= 10) with max_j sum_i |I - alpha A A|_ij <= 1.01, shared
    by a matrix / sample / the batch."""
    init = canonical_init(init)
    norm1 = A.sum(-1).amax(-1)  # A is non-negative: row sums = abs row sums
    norm1 = _shared_max(norm1, init)
    alpha0 = 2.0 / norm1.clamp_min(torch.finfo(A.dtype).tiny).square()
    if init == 'soft':
        return _SOFT_SCALE * alpha0
    n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, dtype=A.dtype)
    alphas = alpha0[..., None] * _NORM_BETA**n  # (..., K)
    # column j of I - alpha A A (A symmetric, >= 0) has abs sum
    # |1 - alpha (AA)_jj| + alpha sum_{i!=j} (AA)_ij: O(m^2), no A A
    colsum = torch.matmul(A, A.sum(-1, keepdim=True)).squeeze(-1)  # (..., m)
    # (A A)_jj = ||row j||^2 (A symmetric; contiguous rows: 20x faster)
    diag = torch.linalg.vector_norm(A, dim=-1).square()
    off = (colsum - diag).clamp_min(0)
    a = alphas[..., :, None]  # (..., K, 1)
    res = ((1 - a * diag[..., None, :]).abs() +
           a * off[..., None, :]).amax(-1)  # (..., K)
    res = _shared_max(res, init, trailing=1)
    passed = res <= _NORM_TOL
    passed[..., -1] = True  # after 10 halvings the search stops regardless
    first = passed.to(torch.uint8).argmax(-1)  # first True
    return alphas.gather(-1, first[..., None]).squeeze(-1)


def traced_alpha(A, alpha, init) -> torch.Tensor:
    """``alpha`` as the official code differentiates it: c / ||A||_1^2,
    the halving factor c fixed."""
    norm1 = _shared_max(A.sum(-1).amax(-1), canonical_init(init))
    return alpha.detach() * (norm1.detach() / norm1).square()


def nr_iteration_matrix(A: torch.Tensor, init: str) -> torch.Tensor:
    """The matrix iterated on: A, or A + 0.01 I for ``'soft'`` (NeurIPS)."""
    if init == 'soft':
        m = A.shape[-1]
        A = A + _SOFT_SHIFT * torch.eye(m, device=A.device, dtype=A.dtype)
    return A


def init_iteration(A, init) -> Tuple[torch.Tensor, torch.Tensor]:
    """(matrix iterated on, alpha without autograd)."""
    with torch.no_grad():
        alpha = nr_init_alpha(A, init)
    return nr_iteration_matrix(A, init), alpha


def newton_iterate(A, V, iters) -> torch.Tensor:
    """V_{k+1} = 2 V_k - V_k A V_k, ``iters`` times (Eq. 10)."""
    shape = V.shape
    m = shape[-1]
    A3 = A.reshape(-1, m, m)
    V = V.reshape(-1, m, m)
    for _ in range(iters):
        # 2 V - (V A) V, the axpy fused into the second product
        V = torch.baddbmm(V, torch.bmm(V, A3), V, beta=2.0, alpha=-1.0)
    return V.reshape(shape)


def _scalar_iterate_impl(lam, alpha, iters) -> torch.Tensor:
    """v_T(l): v_0 = alpha l, v_{k+1} = 2 v_k - v_k^2 l (Eq. 10)."""
    v = alpha[..., None] * lam
    for _ in range(iters):
        v = 2 * v - v * v * lam
    return v


#: the opaque op ``mmsoft::nr_scalar_iterate`` (torch >= 2.4): inductor
#: would inline the T steps, compile time ~3^T
scalar_iterate = _scalar_iterate_impl
if hasattr(torch.library, 'custom_op'):

    @torch.library.custom_op('mmsoft::nr_scalar_iterate', mutates_args=())
    def nr_scalar_iterate(lam: torch.Tensor, alpha: torch.Tensor,
                          iters: int) -> torch.Tensor:
        return _scalar_iterate_impl(lam, alpha, iters)

    @nr_scalar_iterate.register_fake
    def _(lam, alpha, iters):
        shape = torch.broadcast_shapes(alpha.shape + (1, ), lam.shape)
        return lam.new_empty(shape, dtype=torch.result_type(alpha, lam))

    scalar_iterate = nr_scalar_iterate


def leibniz_divided_difference(a, b, alpha, iters) -> torch.Tensor:
    """[a, b] v_T without cancellation (Leibniz rule on Eq. 10): D_0 =
    alpha, D_{k+1} = D_k (2 - (v_a + v_b)(a + b) / 2) - (v_a^2 + v_b^2) / 2.
    For close pairs only (far apart it amplifies rounding)."""
    D = alpha
    va, vb = D * a, D * b
    for _ in range(iters):
        D = D * (2 - 0.5 * (va + vb) * (a + b)) - 0.5 * (va * va + vb * vb)
        va = 2 * va - va * va * a
        vb = 2 * vb - vb * vb * b
    return D


def lapack(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on one intra-op thread on the CPU (the count
    restored after): LAPACK syncs its threads per column, 5x slower on
    shared cores (docs/en/benchmarks.md)."""
    tensor = next(a for a in args if isinstance(a, torch.Tensor))
    if tensor.device.type != 'cpu' or compiling():  # no graph break
        return fn(*args, **kwargs)
    threads = torch.get_num_threads()
    if threads == 1:
        return fn(*args, **kwargs)
    torch.set_num_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)


def eigh(A: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """``torch.linalg.eigh`` through :func:`lapack`."""
    return lapack(torch.linalg.eigh, A)


def spectral_factors(A, alpha, iters):
    """(U, v, l): A = U diag(l) U^T, A_T = U diag(v) U^T (Eq. 10 on l)."""
    lam, U = eigh(A)
    return U, scalar_iterate(lam, alpha, iters), lam


def record_residual(stats, lam, v) -> None:
    """``stats`` per matrix from l and v = v_T(l): ``'residual'`` ||A A_T A
    - A||_2 / ||A||_2 (Fig. 4), ``'unconverged'`` the share of the
    numerical rank with |1 - l v| > 0.5."""
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
    """:func:`record_residual`'s stats of T iterations on A."""
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'nr_residual expects (..., m, m) matrices, got '
                         f'shape {tuple(A.shape)}')
    stats: Dict[str, torch.Tensor] = {}
    iterative_stats(stats, A, init, iters)
    return stats


@torch.no_grad()
def pinv_convergence(A, iters=20, init='soft_norm_per_sample'):
    """||A A_k A - A||_2 / ||A||_2 for k = 0..iters (Fig. 4)."""
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
