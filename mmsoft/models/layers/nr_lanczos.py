"""The official T-step Newton-Raphson function applied to a thin matrix by
the Lanczos process: Z = f_T(A) W from ~20 products of m x m by m x d.

Every NR iterate is a polynomial of the symmetric A (Alg. 2, Eq. 10), so
A_T = f_T(A) with f_T(l) = (1 - (1 - alpha l^2)^(2^T)) / l. For a column w
of W, Lanczos builds an orthonormal basis Q_k of span{w, A w, ...,
A^(k-1) w} and the tridiagonal T_k = Q_k^T A Q_k = U diag(theta) U^T, and

    f_T(A) w ~ ||w|| Q_k U diag(f_T(theta)) U^T e_1.

At detection sizes (m ~ 1000) the official alpha leaves all but the 10-25
largest eigenvalues where f_T(l) ~ 2^T alpha l is linear, so k ~ 20 steps
resolve it (a Chebyshev expansion on the whole interval needs ~110). k is
chosen per column: it stops once f_T(T_k) e_1 moved by less than
:data:`TOL` (relative) over the last :data:`CHECK` steps. A column not
converged by :data:`MAX_STEPS` is the guard: :func:`krylov_basis` returns
None and the caller falls back to the iteration. Full reorthogonalisation
keeps Q_k orthonormal in float32.

The backward is the exact gradient of f_T (the official Norm code's
autograd through the T steps), on the Krylov spaces of W and of the
incoming gradient G (bivariate Lanczos; Kressner, "A Krylov subspace
method for the approximation of bivariate matrix functions", 2019):

    grad W = f_T(A) G,
    grad A = sum_c ||g|| ||w|| Q_g U_g (F o (U_g^T e_1)(U_w^T e_1)^T) U_w^T
             Q_w^T,  F_ij = f_T[theta^g_i, theta^w_j] (divided differences:
             the Daleckii-Krein kernel of the spectral path on Ritz values),
    grad alpha = sum_c ||w|| g^T Q_w U_w diag(d f_T / d alpha) U_w^T e_1.
"""
from typing import NamedTuple, Optional

import torch

from .amp import autocast_off

__all__ = [
    'MAX_STEPS', 'TOL', 'TOL_FLOAT64', 'CHECK', 'KrylovBasis', 'krylov_basis',
    'filter_and_slope', 'divided_differences', 'LanczosApply'
]

#: most Lanczos steps of the forward before the guard falls back
MAX_STEPS = 64
#: a column has converged when f_T(T_k) e_1 moved by at most TOL
#: (relative, 2-norm; float64 inputs: TOL_FLOAT64) over the last CHECK steps
TOL = 1e-6
TOL_FLOAT64 = 1e-12
CHECK = 4
_FIRST_CHECK = 12
#: steps of basis allocated at a time
_GROW = 32


def filter_and_slope(lam, alpha, iters):
    """f_T(l) and d f_T / d alpha at ``lam``: v_0 = alpha l, v_{k+1} =
    2 v_k - v_k^2 l (Eq. 10), u_0 = l, u_{k+1} = 2 u_k (1 - v_k l)."""
    v = alpha[..., None] * lam
    u = lam.clone()
    for _ in range(iters):
        u = 2 * u * (1 - v * lam)
        v = 2 * v - v * v * lam
    return v, u


def _value_and_derivative(lam, alpha, iters):
    """(f_T(l), d f_T / d l) stacked at ``lam`` (..., K) -> (..., 2, K):
    v' from v_{k+1} = 2 v_k - v_k^2 l, v'_0 = alpha."""
    v = alpha[..., None] * lam
    dv = alpha[..., None].expand_as(lam)
    for _ in range(iters):
        v, dv = 2 * v - v * v * lam, 2 * dv - 2 * v * dv * lam - v * v
    return torch.stack([v, dv], -2)


def divided_differences(a, b, alpha, iters):
    """f_T[a_i, b_j] for every pair (float64, shape a[..., :, None] x
    b[..., None, :]): the quotient (f_T(a) - f_T(b)) / (a - b), and on the
    close pairs (|a - b| <= 0.05 max(|a|, |b|), where it cancels) the
    Leibniz rule on Eq. 10: D_0 = alpha, D_{k+1} = D_k (2 - (v_a + v_b)
    (a + b) / 2) - (v_a^2 + v_b^2) / 2 (f_T'(a) where a = b). Far apart
    the rule multiplies rounding by up to (a - b)^2 / 2ab per step; the
    quotient does not."""
    a, b = a.unsqueeze(-1), b.unsqueeze(-2)
    al = alpha[..., None, None, None]
    D = al.expand(torch.broadcast_shapes(a.shape, b.shape)).clone()
    va, vb = al * a, al * b
    for _ in range(iters):
        D = D * (2 - 0.5 * (va + vb) * (a + b)) - 0.5 * (va * va + vb * vb)
        va = 2 * va - va * va * a
        vb = 2 * vb - vb * vb * b
    close = (a - b).abs() <= 0.05 * torch.maximum(a.abs(), b.abs())
    return torch.where(close, D, (va - vb) / torch.where(close, 1, a - b))


class KrylovBasis(NamedTuple):
    """Per column c of the (N, m, d) input: the basis Q (N, d, K, m), the
    Ritz values theta (N, d, K) and U (N, d, K, K) of its own T_{k_c}
    (zero-padded past k_c, float64), ||w_c|| (N, 1, d), and per matrix
    whether all its columns converged (N,) (the others: zeros, the
    caller's fallback)."""
    Q: torch.Tensor
    theta: torch.Tensor
    U: torch.Tensor
    norm: torch.Tensor
    converged: torch.Tensor

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """||w|| Q U diag(values) U^T e_1 (N, m, d) for values (N, d, K):
        f(A) w for values = f(theta)."""
        y = self.U @ (values * self.U[..., 0, :]).unsqueeze(-1)  # (N,d,K,1)
        y = y.to(self.Q.dtype).mT @ self.Q  # (N, d, 1, m)
        return y.squeeze(-2).mT * self.norm


def _ritz(alphas, betas):
    """(theta, U) of the tridiagonal T of every column (float64): alphas
    (N, d, k) its diagonal, betas (N, d, k - 1) the off-diagonal."""
    T = torch.diag_embed(alphas) + torch.diag_embed(
        betas, 1) + torch.diag_embed(betas, -1)
    return torch.linalg.eigh(T)


def _collect(found, Q, norm, done) -> KrylovBasis:
    """The basis with each column's (theta, U) from the step at which it
    converged (``found``: (columns, theta, U)), zero-padded to Q's K."""
    N, d, K = Q.shape[:3]
    theta = norm.new_zeros(N, d, K, dtype=torch.float64)
    U = theta.new_zeros(N, d, K, K)
    for cols, th, Uk in found:
        k = th.shape[-1]
        theta[cols, :k] = th[cols]
        U[cols, :k, :k] = Uk[cols]
    return KrylovBasis(Q, theta, U, norm, done.all(-1))


@torch.no_grad()
def krylov_basis(A: torch.Tensor,
                 W: torch.Tensor,
                 alpha: torch.Tensor,
                 iters: int,
                 max_steps: Optional[int] = None) -> Optional[KrylovBasis]:
    """The Lanczos basis of each column of W (N, m, d) under A (N, m, m),
    each column stopped at its own converged k (for f_T with ``alpha``
    (N,)) or at ``max_steps`` (default :data:`MAX_STEPS`; ``converged``
    False: the guard), or None on ``meta`` (no values to decide from). A
    column's basis depends on that column alone."""
    if A.device.type == 'meta':
        return None
    N, m, d = W.shape
    max_steps = min(max_steps or MAX_STEPS, m)
    tol = TOL_FLOAT64 if W.dtype == torch.float64 else TOL
    norm = W.norm(dim=1, keepdim=True)  # (N, 1, d)
    tiny = torch.finfo(W.dtype).tiny
    # below this the next vector is noise: an invariant subspace was found
    breakdown = (1e-6 * A.sum(-1).amax(-1)).unsqueeze(-1)  # ||A||_1
    size = min(_GROW, max_steps)  # q_1 .. q_k, grown by _GROW steps
    Q = W.new_empty(N, d, size, m)
    Q[:, :, 0] = (W / norm.clamp_min(tiny)).mT
    ab = torch.zeros(N, d, 2, size, dtype=torch.float64, device=W.device)
    alpha64 = alpha.to(torch.float64).reshape(N, 1)
    done = torch.zeros(N, d, dtype=torch.bool, device=W.device)
    found, y_prev = [], None
    for k in range(1, max_steps + 1):
        if k == Q.shape[2] < max_steps:  # room for q_{k+1}
            grow = min(_GROW, max_steps - k)
            Q = torch.cat([Q, Q.new_empty(N, d, grow, m)], 2)
            ab = torch.cat([ab, ab.new_zeros(N, d, 2, grow)], -1)
        z = torch.bmm(A, Q[:, :, k - 1].mT).mT.reshape(N * d, m, 1)  # A q_k
        # full reorthogonalisation, twice (Kahan-Parlett); the first pass's
        # coefficient of q_k is alpha_k
        Qk = Q[:, :, :k].reshape(N * d, k, m)  # a view
        coef = torch.bmm(Qk, z)
        a = coef[:, k - 1, 0].view(N, d)
        z = torch.baddbmm(z, Qk.mT, coef, alpha=-1)
        z = torch.baddbmm(z, Qk.mT, torch.bmm(Qk, z), alpha=-1)
        b = z.norm(dim=1).view(N, d)
        ok = b > breakdown  # else an invariant subspace: zeros from here
        ab[..., 0, k - 1], ab[..., 1, k - 1] = a, b * ok
        if k < Q.shape[2]:
            inv = torch.where(ok, 1 / b.clamp_min(tiny), torch.zeros_like(b))
            torch.mul(z.view(N, d, m), inv.unsqueeze(-1), out=Q[:, :, k])
        if k < min(_FIRST_CHECK, max_steps) or (k % CHECK and k != max_steps):
            continue
        th, Uk = _ritz(ab[..., 0, :k], ab[..., 1, :k - 1])
        # f_T(T) e_1 and f_T'(T) e_1: the gradient needs the derivative's
        # space as well (where f_T nears an inverse it converges later)
        y = Uk @ (_value_and_derivative(th, alpha64, iters) *
                  Uk[..., 0, None, :]).mT  # (N, d, k, 2)
        new = None
        if k == m:  # the whole space: exact
            new = ~done
        elif y_prev is not None:
            y_prev = torch.nn.functional.pad(y_prev,
                                             (0, 0, 0, k - y_prev.shape[-2]))
            moved = (y - y_prev).norm(dim=-2)  # (N, d, 2)
            new = ~done & (moved <= tol * y.norm(dim=-2)).all(-1)
        y_prev = y
        if new is not None:
            found.append((new, th, Uk))
            done |= new
            if bool(done.all()):
                break
    return _collect(found, Q[:, :, :k].contiguous(), norm, done)


class LanczosApply(torch.autograd.Function):
    """Z = f_T(A) W: ``apply(A, W, alpha, basis, iters, exact)`` with
    ``basis = krylov_basis(A, W, alpha, iters)``. The backward: ``exact``
    the gradient of f_T in A, W and alpha (module docstring), else Eq. 16
    (G = f_T(A) grad_Z, grad_A = -G Z^T)."""

    @staticmethod
    def forward(ctx, A, W, alpha, basis, iters, exact):
        alpha64 = alpha.detach().to(torch.float64).reshape(-1, 1)
        f = filter_and_slope(basis.theta, alpha64, iters)[0]
        Z = basis.apply(f)
        ctx.iters, ctx.exact = iters, exact
        ctx.save_for_backward(A, alpha, Z, *basis)
        return Z

    @staticmethod
    def backward(ctx, grad):
        with autocast_off(grad.device.type):
            return LanczosApply._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        A, alpha, Z, *saved = ctx.saved_tensors
        w = KrylovBasis(*saved)
        iters = ctx.iters
        alpha64 = alpha.detach().to(torch.float64).reshape(-1, 1)
        G = grad.to(Z.dtype)
        # f_T(A) G: no guard here (the full space at the latest is exact)
        g = krylov_basis(A, G, alpha, iters, max_steps=A.shape[-1])
        grad_W = g.apply(filter_and_slope(g.theta, alpha64, iters)[0])
        grad_A = grad_alpha = None
        if not ctx.exact:
            if ctx.needs_input_grad[0]:
                grad_A = -(grad_W @ Z.transpose(-1, -2))
            return grad_A, grad_W, None, None, None, None
        if ctx.needs_input_grad[0]:
            F = divided_differences(g.theta, w.theta, alpha64.squeeze(-1),
                                    iters)  # (N, d, Kg, Kw)
            X = g.U @ (F * (g.U[..., 0, :].unsqueeze(-1) *
                            w.U[..., 0, :].unsqueeze(-2))) @ w.U.mT
            X = X * (g.norm * w.norm).transpose(1, 2).unsqueeze(-1)
            left = (g.Q.mT @ X.to(Z.dtype)).transpose(1, 2)  # (N,m,d,Kw)
            right = w.Q.permute(0, 3, 1, 2)  # (N, m, d, Kw)
            N, m = left.shape[:2]
            grad_A = left.reshape(N, m, -1) @ right.reshape(N, m, -1).mT
        if ctx.needs_input_grad[2]:
            slope = filter_and_slope(w.theta, alpha64, iters)[1]
            grad_alpha = (G * w.apply(slope)).sum((-2, -1)).to(alpha.dtype)
        return grad_A, grad_W, grad_alpha, None, None, None
