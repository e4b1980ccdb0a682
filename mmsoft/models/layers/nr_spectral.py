"""f_T on eigenvalues (Alg. 2, Eq. 10), its divided differences and f_T(A) W
~ Q U f_T(theta) U^T Q^T W by block Lanczos (Kressner 2019)."""
from typing import NamedTuple

import torch
from torch.nn.functional import pad

from .amp import autocast_off, compiling

#: the largest Krylov space; converged when f_T(T) Q^T W moved by <= TOL;
#: new directions below _DROP ||A||_1 dropped (an invariant subspace)
MAX_DIM, TOL, TOL_FLOAT64, _FIRST_CHECK = 384, 3e-5, 1e-12, 5
_DROP = {torch.float32: 1e-6, torch.float64: 1e-12}
#: |a - b| <= _DD_RTOL max(|a|, |b|): f[a, b] by the Leibniz rule
_DD_RTOL = 0.05


def filter_and_slope(lam, alpha, iters, slope=True):
    """v_T(l) (and d v_T / d alpha): v_0 = alpha l, v_{k+1} = 2 v_k - v_k^2
    l (Eq. 10), u_0 = l, u_{k+1} = 2 u_k (1 - v_k l)."""
    v, u = alpha[..., None] * lam, lam
    for _ in range(iters):
        if slope:
            u = 2 * u * (1 - v * lam)
        v = 2 * v - v * v * lam
    return (v, u) if slope else v


def nr_scalar_iterate(lam: torch.Tensor, alpha: torch.Tensor,
                      iters: int) -> torch.Tensor:
    """v_T(l), an opaque op (torch >= 2.4): inductor would inline T steps."""
    return filter_and_slope(lam, alpha, iters, slope=False)


scalar_iterate = nr_scalar_iterate
if hasattr(torch.library, 'custom_op'):
    scalar_iterate = torch.library.custom_op(
        'mmsoft::nr_scalar_iterate', nr_scalar_iterate, mutates_args=())
    scalar_iterate.register_fake(lambda lam, alpha, iters: lam.new_empty(
        torch.broadcast_shapes(alpha.shape + (1, ), lam.shape),
        dtype=torch.result_type(alpha, lam)))


def divided_differences(a, b, alpha, iters):
    """f_T[a_i, b_j] for every pair: the quotient; on the close pairs the
    Leibniz rule on Eq. 10, D_0 = alpha, D_{k+1} = D_k (2 - (v_a + v_b)(a
    + b) / 2) - (v_a^2 + v_b^2) / 2 (f_T'(a) at a = b)."""
    fa = filter_and_slope(a, alpha, iters, False).unsqueeze(-1)
    fb = filter_and_slope(b, alpha, iters, False).unsqueeze(-2)
    a, b = a.unsqueeze(-1), b.unsqueeze(-2)
    close = (a - b).abs() <= _DD_RTOL * torch.maximum(a.abs(), b.abs())
    F = (fa - fb) / torch.where(close, 1, a - b)
    idx = close.nonzero(as_tuple=True)  # few: the rule on these only
    a, b = a.expand_as(close)[idx], b.expand_as(close)[idx]
    D = alpha[idx[:-2]]
    va, vb = D * a, D * b
    for _ in range(iters):
        D = D * (2 - 0.5 * (va + vb) * (a + b)) - 0.5 * (va * va + vb * vb)
        va = 2 * va - va * va * a
        vb = 2 * vb - vb * vb * b
    F[idx] = D
    return F


def lapack(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` on one CPU thread (docs/en/benchmarks.md)."""
    tensor = next(a for a in args if isinstance(a, torch.Tensor))
    threads = 1 if tensor.device.type != 'cpu' or compiling() else \
        torch.get_num_threads()  # compiling: no graph break
    if threads == 1:
        return fn(*args, **kwargs)
    torch.set_num_threads(1)
    try:
        return fn(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)


def eigh(A: torch.Tensor):
    """``torch.linalg.eigh`` through :func:`lapack`."""
    return lapack(torch.linalg.eigh, A)


class KrylovBasis(NamedTuple):
    """Q (N, m, K), Ritz values theta (N, K), vectors U (N, K, K) (float64,
    zero-padded), E = Q^T W, converged (N)."""
    Q: torch.Tensor
    theta: torch.Tensor
    U: torch.Tensor
    E: torch.Tensor
    converged: torch.Tensor

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """f(A) W = Q U diag(f(theta)) U^T Q^T W."""
        C = self.U @ (values.unsqueeze(-1) * (self.U.mT @ self.E))
        return self.Q @ C.to(self.Q.dtype)


def _orthonormal(Z, scale):
    """Orthonormal columns spanning Z: Cholesky QR twice (float64)."""
    X = Z.double()
    for _ in range(2):
        G = X.mT @ X
        L, info = lapack(torch.linalg.cholesky_ex, G)
        weak = (info > 0) | (L.diagonal(dim1=-2, dim2=-1) <= scale).any(-1)
        if bool(weak.any()):
            lam, V = eigh(G)
            keep = lam > scale.square()
            S = V * torch.where(keep,
                                lam.clamp_min(1e-300).rsqrt(), 0).unsqueeze(-2)
            X = X @ S
        else:  # X L^-T via the d x d inverse: one product, 50x faster
            eye = torch.eye(L.shape[-1], dtype=L.dtype, device=L.device)
            X = X @ lapack(
                torch.linalg.solve_triangular,
                L,
                eye.expand_as(L),
                upper=False).mT
        scale = torch.full_like(scale, 0.5)  # columns of norm 1 or 0
    return X.to(Z.dtype)


@torch.no_grad()
def krylov_basis(A, W, alpha, iters, max_dim=None):
    """The block Lanczos basis of W (N, m, d) under A; None on meta."""
    if A.device.type == 'meta':
        return None
    N, m, d = W.shape
    J = max(min(max_dim or MAX_DIM, m) // d, 1)
    tol = TOL_FLOAT64 if W.dtype == torch.float64 else TOL
    drop = _DROP.get(W.dtype, 1e-6)
    norm1 = A.sum(-1).amax(-1, keepdim=True).double()  # ||A||_1, (N, 1)
    Q = W.new_zeros(N, m, J * d)
    Q[..., :d] = _orthonormal(W, drop * W.norm(dim=1).amax(-1, True).double())
    # dropped directions: distinct values near 0 (eigh fails on repeated)
    f64 = dict(dtype=torch.float64, device=W.device)
    ramp = torch.linspace(1e-3, 2e-3, J * d, **f64)
    E = (Q[..., :d].mT @ W).double()  # (N, d, d); Q^T W is zero below
    # T = Q^T A Q: block column j, its transpose, the symmetrised diagonal
    T = torch.zeros(N, J * d, J * d, **f64)
    dead = torch.zeros(N, J * d, dtype=torch.bool, device=W.device)
    dead[:, :d] = (Q[..., :d] == 0).all(1)
    alpha64 = alpha.to(torch.float64).reshape(N)
    done = torch.zeros(N, dtype=torch.bool, device=W.device)
    found, y_prev = [], None
    for j in range(J):
        K = (j + 1) * d
        Qp = Q[..., :K]
        Z = torch.bmm(A, Q[..., K - d:K])
        # orthogonalised twice; the coefficients: block column j of T
        C = torch.bmm(Qp.mT, Z)
        Z = torch.baddbmm(Z, Qp, C, alpha=-1)
        C2 = torch.bmm(Qp.mT, Z)
        Z = torch.baddbmm(Z, Qp, C2, alpha=-1)
        col = (C + C2).double()
        T[:, :K - d, K - d:K] = col[:, :K - d]
        T[:, K - d:K, :K - d] = col[:, :K - d].mT
        T[:, K - d:K, K - d:K] = 0.5 * (col[:, K - d:] + col[:, K - d:].mT)
        if K < J * d:
            Q[..., K:K + d] = _orthonormal(Z, drop * norm1)
            dead[:, K:K + d] = (Q[..., K:K + d] == 0).all(1)
        if j + 1 < min(_FIRST_CHECK, J):
            continue
        Ts = T[:, :K, :K].clone()
        Ts.diagonal(dim1=-2, dim2=-1).sub_(dead[:, :K] * ramp[:K] * norm1)
        th, U = eigh(Ts)
        y = U @ (filter_and_slope(th, alpha64, iters, False).unsqueeze(-1) *
                 (U.mT @ pad(E, (0, 0, 0, K - d))))  # f_T(T) Q^T W (N, K, d)
        new = None
        if K >= m:  # the whole space: exact
            new = ~done
        elif y_prev is not None:
            moved = (y - pad(y_prev, (0, 0, 0, d))).norm(dim=(-2, -1))
            new = ~done & (moved <= tol * y.norm(dim=(-2, -1)))
        y_prev = y
        if new is not None:
            found.append((new, th, U))
            done |= new
            if bool(done.all()):
                break
    found.append((~done, th, U))  # the guard's: the last iterate
    theta, Uall = T.new_zeros(N, K), T.new_zeros(N, K, K)
    for rows, th, U in found:
        k = th.shape[-1]
        theta[rows, :k] = th[rows]
        Uall[rows, :k, :k] = U[rows]
    return KrylovBasis(Q[..., :K].contiguous(), theta, Uall,
                       pad(E, (0, 0, 0, K - d)), done)


class LanczosApply(torch.autograd.Function):
    """Z = f_T(A) W; backward: the exact gradient of f_T, or Eq. 16."""

    @staticmethod
    def forward(ctx, A, W, alpha, basis, iters, exact, fallback):
        alpha64 = alpha.detach().to(torch.float64).reshape(-1)
        Z = basis.apply(filter_and_slope(basis.theta, alpha64, iters, False))
        ctx.iters, ctx.exact, ctx.fallback = iters, exact, fallback
        ctx.save_for_backward(A, alpha, Z, *basis)
        return Z

    @staticmethod
    def backward(ctx, grad):
        with autocast_off(grad.device.type):
            A, alpha, Z, *saved = ctx.saved_tensors
            w, iters = KrylovBasis(*saved), ctx.iters
            alpha64 = alpha.detach().to(torch.float64).reshape(-1)
            G = grad.to(Z.dtype)
            # f_T(A) G, in up to twice the forward's dimensions
            g = krylov_basis(A, G, alpha, iters, max_dim=2 * MAX_DIM)
            grad_W = g.apply(filter_and_slope(g.theta, alpha64, iters, False))
            grad_A = grad_alpha = None
            if ctx.needs_input_grad[0] and not ctx.exact:
                grad_A = -(grad_W @ Z.transpose(-1, -2))
            elif ctx.needs_input_grad[0]:
                F = divided_differences(g.theta, w.theta, alpha64, iters)
                X = F * ((g.U.mT @ g.E) @ (w.U.mT @ w.E).mT)  # (N, Kg, Kw)
                left = g.Q @ (g.U @ X @ w.U.mT).to(Z.dtype)  # (N, m, Kw)
                grad_A = left @ w.Q.mT
            if ctx.needs_input_grad[2] and ctx.exact:
                slope = filter_and_slope(w.theta, alpha64, iters)[1]
                grad_alpha = (G * w.apply(slope)).sum((-2, -1)).to(alpha.dtype)
            if not bool(g.converged.all()):  # the guard of the gradient
                bad = (~g.converged).nonzero().squeeze(1)
                sub = ctx.fallback(bad, grad[bad])
                grad_A, grad_W, grad_alpha = (
                    None if full is None else full.index_copy(
                        0, bad, part.to(full.dtype))
                    for full, part in zip((grad_A, grad_W, grad_alpha), sub))
        return grad_A, grad_W, grad_alpha, None, None, None, None
