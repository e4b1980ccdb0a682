"""The autograd of SOFT's Newton-Raphson pseudo-inverse and its dispatch.

The iterations (:mod:`.nr_iteration`) run without autograd inside two
Functions with a closed-form backward (``backward``):

* ``'eq16'`` (default, as the papers): grad_A = -Y^T (grad_Y) Y^T with Y
  the computed inverse (Eq. 16). It is the gradient of the true
  pseudo-inverse, i.e. of the forward once the T iterations have converged
  on every eigenvalue of A that matters.
* ``'exact'``: the gradient of the function the T iterations compute, alpha
  held fixed. With the spectral method A_T = U diag(f(l)) U^T, f(l) = v_T(l),
  and by the Daleckii-Krein theorem dA_T = U (F o (U^T dA U)) U^T with
  F_ij = (f(l_i) - f(l_j)) / (l_i - l_j) (f'(l_i) for l_i = l_j). F is
  formed directly for well-separated eigenvalues and by differentiating the
  recurrence itself (divided differences obey a Leibniz rule, so no
  cancellation) for close or equal ones. Costs two m x m x m products more
  than Eq. (16). With the iterative method the backward runs through the
  iterations (autograd).

:func:`solve` picks the method (``'auto'``: :func:`resolve_method`), runs
in float32 (float64 if given) with autocast disabled, and on the ONNX
export path (:func:`~.export_ops.is_exporting`) evaluates the same
iterations with plain ops (no ``eigh``, no Function).
"""
from typing import Dict, Optional, Tuple

import torch

from mmsoft.compat import unravel_index
from . import export_ops
from .amp import autocast_off
from .nr_diagnostics import iterative_stats, record_residual
from .nr_iteration import init_iteration, newton_forward, spectral_factors

__all__ = [
    'NewtonInverse', 'NewtonInverseApply', 'NR_METHODS', 'SPECTRAL_MIN_M',
    'resolve_method', 'solve'
]

NR_METHODS = ('auto', 'iterative', 'spectral')
#: smallest m for which ``method='auto'`` uses the spectral form on the CPU.
#: Measured crossover of ``NRConfig.apply`` (16 matrices, d = 32, 2-core
#: CPU): spectral / iterative time 0.93 (1 thread) and 1.56 (2 threads) at
#: m = 49, 0.52 / 0.93 at m = 81, 0.25 / 0.37 at m = 128.
SPECTRAL_MIN_M = 80
#: eigenvalue pairs with |l_i - l_j| <= _DD_RTOL max(|l_i|, |l_j|) get their
#: divided difference from the differentiated recurrence (no cancellation);
#: the direct quotient loses about T eps / _DD_RTOL relative elsewhere.
_DD_RTOL = 0.05


def _pair_divided_differences(a: torch.Tensor, b: torch.Tensor,
                              alpha: torch.Tensor, iters: int) -> torch.Tensor:
    """[a, b] f for f = v_T, elementwise, without cancellation.

    Divided differences obey the Leibniz rule
    [a, b](g h) = mean(g) [a, b] h + [a, b] g mean(h) (mean of the values at
    a and b), so D_k = [a, b] v_k follows the recurrence
    D_0 = alpha,
    D_{k+1} = D_k (2 - (v_a + v_b)(a + b) / 2) - (v_a^2 + v_b^2) / 2,
    which for a = b is f'(a) (the derivative of the scalar recurrence).
    """
    va, vb = alpha * a, alpha * b
    D = alpha.clone()
    for _ in range(iters):
        D = D * (2 - 0.5 * (va + vb) * (a + b)) - 0.5 * (va * va + vb * vb)
        va = 2 * va - va * va * a
        vb = 2 * vb - vb * vb * b
    return D


def _close_pairs(lam: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """Indices (batch..., i, j) of the eigenvalue pairs with
    |l_i - l_j| <= _DD_RTOL max(|l_i|, |l_j|) (the diagonal included).

    ``eigh`` returns l sorted ascending, so the close partners of l_i form
    one run [lo_i, hi_i) found by binary search: no m x m mask. Pairs of
    opposite signs are never close; l_i = 0 is close to exact zeros only.
    """
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


def _divided_differences(lam: torch.Tensor, v: torch.Tensor,
                         alpha: torch.Tensor, iters: int) -> torch.Tensor:
    """F_ij = (f(l_i) - f(l_j)) / (l_i - l_j), f'(l_i) where l_i = l_j.

    The Daleckii-Krein kernel of f = v_T (see the module docstring):
    the quotient for well-separated eigenvalues, the differentiated
    recurrence (:func:`_pair_divided_differences`) for the close pairs
    (:func:`_close_pairs`), which overwrite the quotient there.
    """
    F = v.unsqueeze(-1) - v.unsqueeze(-2)
    F.div_(lam.unsqueeze(-1) - lam.unsqueeze(-2))  # inf / nan where close
    idx = _close_pairs(lam)
    batch = idx[:-2]
    F[idx] = _pair_divided_differences(lam[batch + (idx[-2], )],
                                       lam[batch + (idx[-1], )], alpha[batch],
                                       iters)
    return F


def resolve_method(method: str, A: torch.Tensor) -> str:
    if method not in NR_METHODS:
        raise ValueError(f'unknown pseudo-inverse method {method!r}; choose '
                         f'one of {NR_METHODS}')
    if method != 'auto':
        return method
    if A.device.type == 'cpu' and A.shape[-1] >= SPECTRAL_MIN_M:
        return 'spectral'
    return 'iterative'


class _NewtonFunction(torch.autograd.Function):
    """The forward of :class:`NewtonInverse` (``W`` None) and
    :class:`NewtonInverseApply`: ``apply(A, W, nr, stats)``."""

    @staticmethod
    def forward(ctx,
                A: torch.Tensor,
                W: Optional[torch.Tensor],
                nr,
                stats: Optional[Dict] = None) -> torch.Tensor:
        """Without autograd: Y = A_T (``W`` None) or Z = A_T W, with
        ``nr.method`` resolved ('iterative' or 'spectral'); saves what the
        backward of each subclass needs."""
        ctx.exact = nr.backward == 'exact'
        ctx.iters = nr.iters
        ctx.method = nr.method
        with torch.no_grad():
            if nr.method == 'spectral':
                Aw, alpha = init_iteration(A, nr.init)
                U, v, lam = spectral_factors(Aw, alpha, nr.iters)
                if W is None:
                    out = (U * v.unsqueeze(-2)) @ U.transpose(-1, -2)
                    saved = (U, v, lam, alpha) if ctx.exact else (out, )
                else:
                    UtW = U.transpose(-1, -2) @ W
                    out = U @ (v.unsqueeze(-1) * UtW)
                    exact = (U, v, lam, alpha, UtW)
                    saved = exact if ctx.exact else (U, v, out)
                record_residual(stats, lam, v)
            else:
                assert not ctx.exact, 'exact iterative backward uses autograd'
                Y = newton_forward(A, nr.iters, nr.init)
                out = Y if W is None else Y @ W
                saved = (Y, ) if W is None else (Y, out)
                iterative_stats(stats, A, nr.init, nr.iters)
        ctx.save_for_backward(*saved)
        return out


class NewtonInverse(_NewtonFunction):
    """Y = NR-pseudo-inverse(A) with a closed-form backward: Eq. (16), or
    with ``backward='exact'`` (spectral method only) the Daleckii-Krein
    derivative of the T-iteration function, alpha held fixed.
    ``NewtonInverse.apply(A, None, nr, stats)``."""

    @staticmethod
    def backward(ctx, grad_Y: torch.Tensor):
        if ctx.exact:
            U, v, lam, alpha = ctx.saved_tensors
            F = _divided_differences(lam, v, alpha, ctx.iters)
            Ut = U.transpose(-1, -2)
            grad_A = U @ (F * (Ut @ grad_Y @ U)) @ Ut
            return grad_A, None, None, None
        (Y, ) = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        grad_A = -(Yt @ grad_Y @ Yt)
        return grad_A, None, None, None


class NewtonInverseApply(_NewtonFunction):
    """Z = A_T W, A_T the T-th NR iterate (A_T -> A^+), Eq. (16) backward.

    Never forms A_T with ``'spectral'``: Z = U (v * (U^T W)), O(m^2 d)
    after the eigendecomposition. The backward is Eq. (16) applied to
    Y = A_T with grad_Y = grad_Z W^T, associated so that no m x m product
    is needed either: grad_A = -(Y^T grad_Z) Z^T, grad_W = Y^T grad_Z.
    With ``backward='exact'`` (spectral only) grad_A is the Daleckii-Krein
    derivative U (F o ((U^T grad_Z) (U^T W)^T)) U^T (two m x m x m products).
    ``NewtonInverseApply.apply(A, W, nr, stats)``.
    """

    @staticmethod
    def backward(ctx, grad_Z: torch.Tensor):
        grad_A = None
        if ctx.exact:
            U, v, lam, alpha, UtW = ctx.saved_tensors
            Ut = U.transpose(-1, -2)
            UtG = Ut @ grad_Z
            G = U @ (v.unsqueeze(-1) * UtG)
            if ctx.needs_input_grad[0]:
                F = _divided_differences(lam, v, alpha, ctx.iters)
                M = F.mul_(UtG @ UtW.transpose(-1, -2))
                grad_A = (U @ M) @ Ut
            return grad_A, G, None, None
        if ctx.method == 'spectral':
            U, v, Z = ctx.saved_tensors  # Y = U diag(v) U^T is symmetric
            G = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ grad_Z))
        else:
            Y, Z = ctx.saved_tensors
            G = Y.transpose(-1, -2) @ grad_Z
        if ctx.needs_input_grad[0]:
            grad_A = -(G @ Z.transpose(-1, -2))
        return grad_A, G, None, None


def solve(A: torch.Tensor, W: Optional[torch.Tensor], nr,
          stats: Optional[Dict]) -> torch.Tensor:
    """A_T (``W`` None) or A_T W with the settings ``nr`` (an
    :class:`~.nr_config.NRConfig`): the export path, the autograd path of
    ``backward='exact'`` with the iterative method, or the Functions."""
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'the Newton-Raphson inverse expects (..., m, m) '
                         f'matrices, got shape {tuple(A.shape)}')
    if W is not None and W.shape[:-1] != A.shape[:-1]:
        raise ValueError(f'NRConfig.apply: W of shape {tuple(W.shape)} does '
                         f'not match A of shape {tuple(A.shape)}; expected '
                         f'(..., m, d) with the batch dims and m of A')
    if export_ops.is_exporting():  # ONNX: the iterations as plain products
        export_ops.check_method(nr.method)
        Y = newton_forward(export_ops.fp32(A), nr.iters, nr.init)
        return Y if W is None else torch.matmul(Y, export_ops.fp32(W))
    method = resolve_method(nr.method, A)
    if method != nr.method:
        nr = nr.replace(method=method)
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    A = A.to(dtype)
    W = None if W is None else W.to(dtype)
    with autocast_off(A.device.type):
        if nr.backward == 'exact' and method == 'iterative':
            # the gradient of the T iterations: autograd through them
            iterative_stats(stats, A, nr.init, nr.iters)
            Y = newton_forward(A, nr.iters, nr.init)
            return Y if W is None else Y @ W
        if W is None:
            return NewtonInverse.apply(A, None, nr, stats)
        return NewtonInverseApply.apply(A, W, nr, stats)
