"""The official T-step Newton-Raphson function applied to a thin matrix by a
Chebyshev expansion: Z = f_T(A) W without an m x m x m product.

Every NR iterate is a polynomial of the symmetric A (Alg. 2, Eq. 10), so
A_T = f_T(A) with f_T(l) = (1 - (1 - alpha l^2)^(2^T)) / l. At detection
sizes (m ~ 1000) the official alpha leaves most of the spectrum where
f_T(l) ~ 2^T alpha l: a smooth filter, not an inverse. On [a, b] holding
the spectrum (b: a Collatz-Wielandt bound on the largest eigenvalue)

    f_T(l) ~ sum_k c_k T_k(x),  x = (2 l - a - b) / (b - a),

with c_k from f_T at Chebyshev nodes (the scalar recurrence of Eq. 10 in
float64) and the degree K chosen from the expansion's own tail. The thin
X_k = T_k(A~) W follow X_{k+1} = 2 A~ X_k - X_{k-1}: K products of
m x m by m x d instead of 2T of m x m by m x m.

The backward is the exact gradient of that polynomial (the official Norm
code trains by autograd through the T steps): the adjoint recurrence
L_k = c_k G + 2 A~ L_{k+1} - L_{k+2} (Clenshaw's), the X_k run backwards
from the last two, grad A~ = L_1 X_0^T + 2 sum_k L_{k+1} X_k^T and
grad alpha = sum_k c'_k <G, X_k> (c'_k: the coefficients of d f_T /
d alpha). Where alpha b^2 nears 2 the expansion needs more than
:data:`MAX_DEGREE` terms: :func:`chebyshev_plan` returns None and the
caller falls back to the iteration.
"""
import math
from typing import Optional, Tuple

import torch

from .amp import autocast_off

__all__ = [
    'MAX_DEGREE', 'NODES', 'TAIL_TOL', 'spectrum_bound', 'chebyshev_plan',
    'filter_and_slope', 'ChebyshevApply'
]

#: Chebyshev nodes the coefficients are computed from (a power of two)
NODES = 512
#: the largest degree used; a tail still above :data:`TAIL_TOL` there
#: means the guard: fall back to the iteration
MAX_DEGREE = 256
#: the expansion stops where the sum of the |c_k| left is below this
#: fraction of the sum of all (f_T and d f_T / d alpha alike)
TAIL_TOL = 1e-8
#: power steps of the Collatz-Wielandt bound, and its safety factor
_CW_STEPS = 8
_CW_SAFETY = 1.0 + 1e-4
#: the interval's lower end, -_LOW_MARGIN b: A is positive semi-definite,
#: its float32 rounding may not be
_LOW_MARGIN = 1e-3
#: steps per segment of the backward (pairs kept every _CHUNK steps; one
#: batched rank-(_CHUNK x d) update of grad A per segment)
_CHUNK = 16
#: the precision of the backward recurrences (see ``_backward``)
_BACKWARD_DTYPE = torch.float64


@torch.no_grad()
def spectrum_bound(A: torch.Tensor) -> torch.Tensor:
    """An upper bound on the largest eigenvalue of the non-negative
    symmetric A (shape ``A.shape[:-2]``): max_i (A x)_i / x_i for the
    positive x = A^k 1 (Collatz-Wielandt; within ~1e-6 of it after a few
    steps, about half of ||A||_1 on SOFT's kernels), never above
    ||A||_1."""
    x = A.sum(-1)
    norm1 = x.amax(-1)
    tiny = torch.finfo(A.dtype).tiny
    bound = norm1
    for _ in range(_CW_STEPS):
        y = torch.matmul(A, x.unsqueeze(-1)).squeeze(-1)
        bound = torch.minimum(bound, (y / x.clamp_min(tiny)).amax(-1))
        x = y / y.amax(-1, keepdim=True).clamp_min(tiny)
    return torch.minimum(bound * _CW_SAFETY, norm1).clamp_min(tiny)


def _dct_matrix(n: int, device) -> torch.Tensor:
    """(n, n) float64: row k is (2 / n) cos(pi k (j + 1/2) / n), row 0
    halved: the Chebyshev coefficients of values at the n nodes."""
    j = torch.arange(n, dtype=torch.float64, device=device)
    C = torch.cos(math.pi * j[:, None] * (j[None] + 0.5) / n) * (2.0 / n)
    C[0] *= 0.5
    return C


def filter_and_slope(lam, alpha, iters):
    """f_T(l) and d f_T / d alpha at ``lam``: v_0 = alpha l, v_{k+1} =
    2 v_k - v_k^2 l (Eq. 10), u_0 = l, u_{k+1} = 2 u_k (1 - v_k l)."""
    v = alpha[..., None] * lam
    u = lam.clone()
    for _ in range(iters):
        u = 2 * u * (1 - v * lam)
        v = 2 * v - v * v * lam
    return v, u


def _tail_degree(c: torch.Tensor) -> torch.Tensor:
    """Per row of ``c`` (..., n): the smallest K with sum_{k >= K} |c_k|
    <= TAIL_TOL sum_k |c_k| (at least 2); n + 1 where none is."""
    t = c.abs()
    tail = t.flip(-1).cumsum(-1).flip(-1)
    ok = tail <= TAIL_TOL * t.sum(-1, keepdim=True)
    K = ok.to(torch.uint8).argmax(-1)  # the first k whose tail is small
    K = torch.where(ok.any(-1), K, torch.full_like(K, c.shape[-1] + 1))
    return K.clamp_min(2)


@torch.no_grad()
def chebyshev_plan(A: torch.Tensor, alpha: torch.Tensor,
                   iters: int) -> Optional[Tuple[torch.Tensor, ...]]:
    """(c, dc, scale, shift) for :class:`ChebyshevApply` on the matrix A
    iterated on (..., m, m), or None (the guard: more than
    :data:`MAX_DEGREE` terms; or on ``meta``, with no values). c, dc:
    (..., K) in A's dtype; A~ = scale A - shift I maps [a, b] onto
    [-1, 1]."""
    if A.device.type == 'meta':  # no values to choose the degree from
        return None
    b = spectrum_bound(A).to(torch.float64)
    a = -_LOW_MARGIN * b
    n = NODES
    j = torch.arange(n, dtype=torch.float64, device=A.device)
    x = torch.cos(math.pi * (j + 0.5) / n)
    lam = 0.5 * (a[..., None] * (1 - x) + b[..., None] * (1 + x))
    f, df = filter_and_slope(lam, alpha.to(torch.float64), iters)
    C = _dct_matrix(n, A.device).T
    c, dc = f @ C, df @ C
    # one degree per sample (the max over its matrices, f and d f / d alpha
    # alike), so that a sample's output does not depend on the others':
    # its coefficients past its own degree are zero
    K = _tail_degree(torch.stack([c, dc], -2)).amax(-1)
    if K.dim():
        K = K.reshape(K.shape[0], -1).amax(-1)
        K = K.view(-1, *[1] * (c.dim() - 2)).expand(c.shape[:-1])
    Kmax = int(K.max())
    if Kmax > MAX_DEGREE:
        return None
    keep = torch.arange(Kmax, device=A.device) < K.unsqueeze(-1)
    scale = 2.0 / (b - a)
    shift = (b + a) / (b - a)
    dtype = A.dtype
    return ((c[..., :Kmax] * keep).to(dtype),
            (dc[..., :Kmax] * keep).to(dtype), scale.to(dtype),
            shift.to(dtype))


def _step(At2, X, X_prev):
    """2 A~ X - X_prev (``At2`` = 2 A~, batched (N, m, m))."""
    return torch.baddbmm(X_prev, At2, X, beta=-1.0)


def _operator(A, plan):
    """2 A~ = 2 (scale A - shift I), batched (N, m, m)."""
    _, _, scale, shift = plan
    m = A.shape[-1]
    At2 = 2 * (
        scale[..., None, None] * A -
        shift[..., None, None] * torch.eye(m, dtype=A.dtype, device=A.device))
    return At2.reshape(-1, m, m)


def _segment(At2, X0, X1, length):
    """[X_j, ..., X_{j+length-1}] from (X_j, X_{j+1})."""
    out = [X0, X1][:length]
    while len(out) < length:
        out.append(_step(At2, out[-1], out[-2]))
    return out


class ChebyshevApply(torch.autograd.Function):
    """Z = sum_k c_k T_k(A~) W with A~ = scale A - shift I: ``apply(A, W,
    alpha, plan)`` (A (..., m, m), W (..., m, d), alpha (...), ``plan``
    from :func:`chebyshev_plan`). The backward is the exact gradient of
    the polynomial in A, W and alpha (c depends on alpha through dc): the
    X_k are recomputed from the pairs (X_j, X_{j+1}) the forward kept every
    :data:`_CHUNK` steps (the same values; O(K / _CHUNK) thin matrices
    kept), one segment at a time from the top, beside the adjoint."""

    @staticmethod
    def _run(A, W, plan, keep=False):
        """(Z, 2 A~, the pairs (X_j, X_{j+1}) of j = 0, _CHUNK, ... if
        ``keep``)."""
        c = plan[0]
        K = c.shape[-1]
        m, d = W.shape[-2:]
        At2 = _operator(A, plan)
        cf = c.reshape(-1, K, 1, 1)
        X0 = W.reshape(-1, m, d)
        X1 = torch.bmm(At2, X0).mul_(0.5)
        Z = X0 * cf[:, 0] + X1 * cf[:, 1]
        pairs = [(X0, X1)]
        for k in range(2, K):
            X0, X1 = X1, _step(At2, X1, X0)
            Z.addcmul_(X1, cf[:, k])
            if keep and (k - 1) % _CHUNK == 0:
                pairs.append((X0, X1))
        if keep and (K - 1) % _CHUNK == 0 and K > 1:  # a one-step segment
            pairs.append((X1, X1))
        return Z.reshape(W.shape), At2, pairs

    @staticmethod
    def evaluate(A, W, plan) -> torch.Tensor:
        """Z without autograd."""
        return ChebyshevApply._run(A, W, plan)[0]

    @staticmethod
    def forward(ctx, A, W, alpha, plan):
        Z, At2, pairs = ChebyshevApply._run(A, W, plan, keep=True)
        c, dc, scale, _ = plan
        ctx.save_for_backward(At2, c, dc, scale,
                              *[x for pair in pairs for x in pair])
        ctx.shapes = A.shape[:-2], A.shape, W.shape
        return Z

    @staticmethod
    def backward(ctx, grad):
        with autocast_off(grad.device.type):
            return ChebyshevApply._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        # float64: the adjoint of T_k grows as U_{k-1} (~k) near the ends
        # of [-1, 1], where most of SOFT's spectrum lies; in float32 the
        # gradient would lose ~K eps relative (1e-4 at m ~ 1000)
        At2, c, dc, scale, *flat = (
            t.to(_BACKWARD_DTYPE) for t in ctx.saved_tensors)
        pairs = list(zip(flat[0::2], flat[1::2]))
        lead, a_shape, w_shape = ctx.shapes
        K = c.shape[-1]
        N, m, _ = At2.shape
        d = w_shape[-1]
        G = grad.reshape(N, m, d).to(At2.dtype)
        cf, dcf = c.reshape(N, K, 1, 1), dc.reshape(N, K)
        need_A, need_W, need_alpha = ctx.needs_input_grad[:3]
        grad_At = torch.zeros_like(At2) if need_A else None
        galpha = G.new_zeros(N)
        # the adjoint L_k = d loss / d X_k: L_{K-1} = c_{K-1} G,
        # L_{k-1} = c_{k-1} G + 2 A~ L_k - L_{k+1} (k >= 2),
        # L_0 = c_0 G + A~ L_1 - L_2 (= grad W); d loss / d (2 A~) =
        # sum_{k >= 2} L_k X_{k-1}^T + L_1 X_0^T / 2
        L, L_next = G * cf[:, K - 1], torch.zeros_like(G)
        k = K - 1
        for j in reversed(range(len(pairs))):
            start = j * _CHUNK
            X = _segment(At2, *pairs[j], min(_CHUNK, K - start))
            if need_alpha:
                for i, Xi in enumerate(X):
                    galpha += (G * Xi).sum((-2, -1)) * dcf[:, start + i]
            if need_A:  # fixed slots: the same sums whatever the batch
                Ls = G.new_zeros(N, m, _CHUNK * d)
                Xs = torch.zeros_like(Ls)
            while k >= max(start + 1, 1):
                if need_A:
                    i = (k - 1 - start) * d
                    Ls[..., i:i + d] = L if k >= 2 else 0.5 * L
                    Xs[..., i:i + d] = X[k - 1 - start]
                if k >= 2:
                    L, L_next = _step(At2, L,
                                      L_next).addcmul_(G, cf[:, k - 1]), L
                else:
                    L = torch.baddbmm(
                        L_next, At2, L, beta=-1.0,
                        alpha=0.5).addcmul_(G, cf[:, 0])
                k -= 1
            if need_A:
                grad_At.baddbmm_(Ls, Xs.transpose(-1, -2))
        if K == 1:  # no step: Z = c_0 W
            L = G * cf[:, 0]
        grad_A = grad_W = grad_alpha = None
        if need_A:
            # At2 = 2 (scale A - shift I): d / d A = 2 scale d / d At2
            grad_A = (grad_At * (2 * scale.reshape(N, 1, 1))).reshape(a_shape)
        dtype = ctx.saved_tensors[0].dtype
        if need_A:
            grad_A = grad_A.to(dtype)
        if need_W:
            grad_W = L.reshape(w_shape).to(dtype)
        if need_alpha:
            grad_alpha = galpha.reshape(lead).to(dtype)
        return grad_A, grad_W, grad_alpha, None
