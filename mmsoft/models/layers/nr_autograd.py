"""The NR pseudo-inverse (Alg. 2) with the Eq. 16 / exact backwards and
its dispatch: the iterations, one ``eigh`` or (A_T W) block Lanczos."""
from typing import Tuple

import torch

from . import amp
from .amp import autocast_off, compute_dtype, tf32_off, unravel_index
from .nr_iteration import (iterative_stats, leibniz_divided_difference,
                           newton_iterate, nr_init_alpha, nr_iteration_matrix,
                           record_residual, spectral_factors, traced_alpha)
from .nr_lanczos import LanczosApply, filter_and_slope, krylov_basis

NR_METHODS = ('auto', 'iterative', 'spectral', 'lanczos')
#: smallest m for which ``'auto'`` is spectral on the CPU (measured:
#: ``tools/analysis/nr_method_crossover.py``)
SPECTRAL_MIN_M = 80
#: smallest m for which ``'auto'`` applies A_T to W by Lanczos, per device
#: (CPU measured, docs/en/benchmarks.md; CUDA by the multiply-adds)
LANCZOS_MIN_M = {'cpu': 600, 'cuda': 200}
#: pairs with |l_i - l_j| <= _DD_RTOL max(|l_i|, |l_j|) take F_ij from the
#: Leibniz rule (the quotient loses ~T eps / _DD_RTOL)
_DD_RTOL = 0.05


def _close_pairs(lam: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Indices (batch..., i, j) of the close pairs of ascending l, the
    diagonal included, by binary search (no m x m mask)."""
    m = lam.shape[-1]
    flat = lam.reshape(-1, m).contiguous()
    keep = 1.0 - _DD_RTOL
    pos = flat >= 0
    lower = torch.where(pos, flat * keep, flat / keep)
    upper = torch.where(pos, flat / keep, flat * keep)
    lo = torch.searchsorted(flat, lower.contiguous(), side='left')
    hi = torch.searchsorted(flat, upper.contiguous(), side='right')
    counts = (hi - lo).flatten()  # >= 1: l_i itself
    rows = torch.arange(counts.numel(), device=lam.device)
    row = torch.repeat_interleave(rows, counts)  # flat (batch, i) index
    start = torch.cumsum(counts, 0) - counts
    j = torch.arange(row.numel(), device=lam.device) - start[row] + \
        lo.flatten()[row]
    b, i = row // m, row % m
    batch = unravel_index(b, lam.shape[:-1]) if lam.dim() > 1 else ()
    return tuple(batch) + (i, j)


def _divided_differences(lam, v, alpha, iters) -> torch.Tensor:
    """The Daleckii-Krein kernel F of f = v_T: the quotient, the Leibniz
    rule on the close pairs."""
    F = v.unsqueeze(-1) - v.unsqueeze(-2)
    F.div_(lam.unsqueeze(-1) - lam.unsqueeze(-2))  # inf / nan where close
    idx = _close_pairs(lam)
    batch = idx[:-2]
    a, b = lam[batch + (idx[-2], )], lam[batch + (idx[-1], )]
    F[idx] = leibniz_divided_difference(a, b, alpha[batch], iters)
    return F


def resolve_method(method: str, A: torch.Tensor, apply: bool = True) -> str:
    """``'auto'``: Lanczos for A_T W from :data:`LANCZOS_MIN_M`, else
    spectral from :data:`SPECTRAL_MIN_M` on the CPU, else iterative. The
    inverse itself is never Lanczos (``'lanczos'`` is ``'auto'`` there)."""
    if method not in NR_METHODS:
        raise ValueError(f'unknown pseudo-inverse method {method!r}; choose '
                         f'one of {NR_METHODS}')
    if method not in ('auto', 'lanczos') or (method == 'lanczos' and apply):
        return method
    m, device = A.shape[-1], A.device.type
    if apply and m >= LANCZOS_MIN_M.get(device, float('inf')):
        return 'lanczos'
    if device == 'cpu' and m >= SPECTRAL_MIN_M:
        return 'spectral'
    return 'iterative'


def _iterative(A, W, alpha, nr) -> Tuple[torch.Tensor, torch.Tensor]:
    """(A_T, A_T or A_T W) by the iterations (autograd through them)."""
    Aw = nr_iteration_matrix(A, nr.init)
    Y = newton_iterate(Aw, alpha[..., None, None] * Aw, nr.iters)
    return Y, Y if W is None else Y @ W


class NewtonInverse(torch.autograd.Function):
    """Y = A_T or Z = A_T W: ``apply(A, W, alpha, nr)``. ``'eq16'``: grad_A
    = -Y^T grad_Y Y^T (Eq. 16). ``'exact'`` (spectral): Daleckii-Krein,
    grad_A = U (F o ((U^T grad_Z)(U^T W)^T)) U^T, F_ij = f[l_i, l_j]."""

    @staticmethod
    def forward(ctx, A, W, alpha, nr, stats=None):
        ctx.exact = nr.backward == 'exact'
        ctx.iters = nr.iters
        ctx.inverse = W is None
        ctx.spectral = nr.method == 'spectral'
        with torch.no_grad():
            if ctx.spectral:
                Aw = nr_iteration_matrix(A, nr.init)
                U, v, lam = spectral_factors(Aw, alpha, nr.iters)
                record_residual(stats, lam, v)  # from the same eigenvalues
                if W is None:
                    out = (U * v.unsqueeze(-2)) @ U.transpose(-1, -2)
                    saved = (U, v, lam, alpha) if ctx.exact else (out, out)
                else:
                    UtW = U.transpose(-1, -2) @ W
                    out = U @ (v.unsqueeze(-1) * UtW)
                    saved = (U, v, lam, alpha, UtW) if ctx.exact else \
                        (U, v, out)
            else:
                assert not ctx.exact, 'exact iterative backward uses autograd'
                saved = Y, out = _iterative(A, W, alpha, nr)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad):
        with tf32_off(grad.device.type):
            return NewtonInverse._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad):
        grad_A = G = grad_alpha = None
        if ctx.exact:
            U, v, lam, alpha, *UtW = ctx.saved_tensors
            Ut = U.transpose(-1, -2)
            UtG = Ut @ grad
            right = U if ctx.inverse else UtW[0].mT  # (U^T W)^T
            if not ctx.inverse:
                G = U @ (v.unsqueeze(-1) * UtG)
            if ctx.needs_input_grad[0]:
                F = _divided_differences(lam, v, alpha, ctx.iters)
                M = F.mul_(UtG @ right)
                grad_A = (U @ M) @ Ut
            if ctx.needs_input_grad[2]:  # d out / d alpha = U diag(u) ...
                u = filter_and_slope(lam, alpha, ctx.iters)[1]
                grad_alpha = (UtG * (u.unsqueeze(-1) * right.mT)).sum((-2, -1))
            return grad_A, G, grad_alpha, None, None
        if ctx.spectral and not ctx.inverse:  # Y = U diag(v) U^T
            U, v, Z = ctx.saved_tensors
            G = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ grad))
        else:
            Y, Z = ctx.saved_tensors
            G = Y.transpose(-1, -2) @ grad
        if ctx.needs_input_grad[0]:
            grad_A = -(G @ Z.transpose(-1, -2))
        return grad_A, None if ctx.inverse else G, None, None, None


def _lanczos(A, W, alpha, alpha_in, nr):
    """A_T W by Lanczos; a matrix not converged in ``MAX_DIM`` by the
    spectral method (CPU) or the iterations."""
    Aw = nr_iteration_matrix(A, nr.init)
    m, d = W.shape[-2:]
    A3, W3 = Aw.reshape(-1, m, m), W.reshape(-1, m, d)
    alpha3, alpha_in3 = alpha.reshape(-1), alpha_in.reshape(-1)
    basis = krylov_basis(A3.detach(), W3.detach(), alpha3, nr.iters)
    fallback = 'spectral' if A.device.type == 'cpu' else 'iterative'
    if basis is None:  # no values (meta)
        return _direct(fallback, A, W, alpha_in, nr, None)
    A0 = A.reshape(-1, m, m)

    def gradient_fallback(index, grad):
        """The spectral gradients of the matrices ``index``."""
        A_, W_, a_ = (
            t.detach()[index].requires_grad_() for t in (A0, W3, alpha_in3))
        with torch.enable_grad():
            Z_ = NewtonInverse.apply(A_, W_, a_, nr.replace(method='spectral'))
            out = torch.autograd.grad(
                Z_, (A_, W_, a_), grad, allow_unused=True)
        return tuple(
            torch.zeros_like(t) if g is None else g
            for g, t in zip(out, (A_, W_, a_)))

    Z = LanczosApply.apply(A3, W3, alpha_in3, basis, nr.iters,
                           nr.backward == 'exact', gradient_fallback)
    if not bool(basis.converged.all()):
        bad = (~basis.converged).nonzero().squeeze(1)
        Z = Z.index_copy(
            0, bad,
            _direct(fallback, A0[bad], W3[bad], alpha_in3[bad], nr, None))
    return Z.reshape(W.shape)


def _direct(method, A, W, alpha_in, nr, stats):
    """A_T or A_T W by the iterations or the spectral method."""
    if method != nr.method:
        nr = nr.replace(method=method)
    if method != 'spectral':  # spectral: from its own eigenvalues
        iterative_stats(stats, A, nr.init, nr.iters)
    if nr.backward == 'exact' and method == 'iterative':
        # the gradient of the T iterations: autograd through them
        return _iterative(A, W, alpha_in, nr)[1]
    return NewtonInverse.apply(A, W, alpha_in, nr, stats)


def solve(A, W, nr, stats) -> torch.Tensor:
    """A_T (``W`` None) or A_T W with the settings ``nr`` (NRConfig)."""
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'the Newton-Raphson inverse expects (..., m, m) '
                         f'matrices, got shape {tuple(A.shape)}')
    if W is not None and W.shape[:-1] != A.shape[:-1]:
        raise ValueError(f'NRConfig.apply: W of shape {tuple(W.shape)} does '
                         f'not match A of shape {tuple(A.shape)}; expected '
                         f'(..., m, d) with the batch dims and m of A')
    dtype = compute_dtype(A)
    A = A.to(dtype)
    W = None if W is None else W.to(dtype)
    with torch.no_grad():
        alpha = nr_init_alpha(A, nr.init)
    if amp.is_exporting():  # ONNX: the iterations as plain products
        if nr.method in ('spectral', 'lanczos'):
            why = dict(
                spectral='torch.linalg.eigh has no ONNX operator',
                lanczos='its steps are chosen from the data at run time')[
                    nr.method]
            raise amp.ExportError(
                f"nr_method={nr.method!r} cannot be exported ({why}); set "
                f"model.backbone.attn_cfg.nr_method='auto' or 'iterative' "
                f"(same function) before exporting")
        return _iterative(A, W, alpha, nr)[1]
    method = resolve_method(nr.method, A, W is not None)
    with autocast_off(A.device.type), tf32_off(A.device.type):
        exact = nr.backward == 'exact'
        alpha_in = traced_alpha(A, alpha, nr.init) if exact and \
            torch.is_grad_enabled() and A.requires_grad else alpha
        if method == 'lanczos':
            iterative_stats(stats, A, nr.init, nr.iters)
            return _lanczos(A, W, alpha, alpha_in, nr)
        return _direct(method, A, W, alpha_in, nr, stats)
