"""SOFT's Newton-Raphson pseudo-inverse (Alg. 2, Eq. 10; backward Eq. 16)."""
import dataclasses
from typing import Mapping, Optional

import torch

from . import amp
from .amp import check_choice, check_int, tf32_off
from .nr_spectral import (LanczosApply, divided_differences, eigh,
                          filter_and_slope, krylov_basis, scalar_iterate)

INIT_MODES = ('soft_norm_per_sample', 'soft_norm_per_matrix',
              'soft_norm_per_batch', 'soft')
NR_METHODS = ('auto', 'iterative', 'spectral', 'lanczos')
NR_BACKWARDS = ('eq16', 'exact')
#: the fields of :class:`NRConfig` (the ``attn_cfg`` keys ``nr_<field>``)
NR_FIELDS = ('iters', 'init', 'method', 'backward')
#: smallest m of ``'auto'``'s spectral / Lanczos (docs/en/benchmarks.md)
SPECTRAL_MIN_M = 80
LANCZOS_MIN_M = {'cpu': 600, 'cuda': 200}
_NORM_BETA, _NORM_MAX_HALVINGS, _NORM_TOL = 0.5, 10, 1.01
_SOFT_SHIFT, _SOFT_SCALE = 0.01, 0.9


@dataclasses.dataclass(frozen=True)
class NRConfig:
    """A^+ as A_T, the T-th Newton-Raphson iterate (Alg. 2, Eq. 10): ``iters``
    T, ``init`` the alpha of A_0 = alpha A, ``backward`` ``'exact'`` or
    ``'eq16'`` (Eq. 16; None: the official one)."""
    iters: int = 20
    init: str = 'soft_norm_per_sample'
    method: str = 'auto'
    backward: Optional[str] = None

    def __post_init__(self):
        iters = check_int('Newton-Raphson iters (nr_iters)', self.iters)
        object.__setattr__(self, 'iters', iters)
        check_choice('Newton-Raphson init (nr_init)', self.init, INIT_MODES)
        if self.backward is None:
            object.__setattr__(self, 'backward',
                               'eq16' if self.init == 'soft' else 'exact')
        check_choice('pseudo-inverse method (nr_method)', self.method,
                     NR_METHODS)
        check_choice('Newton-Raphson backward (nr_backward)', self.backward,
                     NR_BACKWARDS)

    @classmethod
    def of(cls, nr, attn_norm) -> 'NRConfig':
        """``nr``, or one of a dict / None (``init`` None: the official)."""
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
            nr['init'] = 'soft_norm_per_sample' if attn_norm else 'soft'
        return cls(**nr)

    def replace(self, **changes) -> 'NRConfig':
        return dataclasses.replace(self, **changes)

    def inverse(self, A: torch.Tensor) -> torch.Tensor:
        """A_T of (..., m, m) symmetric non-negative A (float32 or 64)."""
        return solve(A, None, self)

    def apply(self, A: torch.Tensor, W: torch.Tensor) -> torch.Tensor:
        """A_T W for W (..., m, d) (A_T not formed where avoidable)."""
        return solve(A, W, self)


def _shared_max(t: torch.Tensor, init: str, trailing: int = 0):
    """Max of per-matrix values over the matrices sharing one alpha."""
    lead, tail = t.dim() - trailing, t.shape[t.dim() - trailing:]
    if lead == 0 or init in ('soft', 'soft_norm_per_matrix'):
        return t
    n = 1 if init == 'soft_norm_per_batch' else t.shape[0]
    shared = t.reshape(n, -1, *tail).amax(1)
    return shared.view(n, *([1] * (lead - 1)), *tail).expand_as(t)


def nr_init_alpha(A, init='soft_norm_per_sample') -> torch.Tensor:
    """alpha of A_0 = alpha A per matrix. ``'soft'``: 0.9 * 2 / ||A||_1^2;
    ``'soft_norm_per_*'``: the first alpha_n = 2 0.5^n / ||A||_1^2 (n <= 10)
    with max_j sum_i |I - alpha A A|_ij <= 1.01, per matrix/sample/batch."""
    check_choice('Newton-Raphson init (nr_init)', init, INIT_MODES)
    norm1 = _shared_max(A.sum(-1).amax(-1), init)  # A >= 0: ||A||_1
    alpha0 = 2.0 / norm1.clamp_min(torch.finfo(A.dtype).tiny).square()
    if init == 'soft':
        return _SOFT_SCALE * alpha0
    n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, dtype=A.dtype)
    alphas = alpha0[..., None] * _NORM_BETA**n  # (..., K)
    # |col j| of I - alpha A A: |1 - alpha (AA)_jj| + alpha sum_i!=j (AA)_ij
    colsum = torch.matmul(A, A.sum(-1, keepdim=True)).squeeze(-1)  # (..., m)
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


def nr_iteration_matrix(A: torch.Tensor, init: str) -> torch.Tensor:
    """The matrix iterated on: A, or A + 0.01 I for ``'soft'`` (NeurIPS)."""
    if init != 'soft':
        return A
    return A + _SOFT_SHIFT * torch.eye(
        A.shape[-1], device=A.device, dtype=A.dtype)


def newton_iterate(A, V, iters) -> torch.Tensor:
    """V_{k+1} = 2 V_k - V_k A V_k, ``iters`` times (Eq. 10)."""
    shape, m = V.shape, V.shape[-1]
    A3, V = A.reshape(-1, m, m), V.reshape(-1, m, m)
    for _ in range(iters):  # 2 V - (V A) V, the axpy fused into a product
        V = torch.baddbmm(V, torch.bmm(V, A3), V, beta=2.0, alpha=-1.0)
    return V.reshape(shape)


def resolve_method(method: str, A: torch.Tensor, apply: bool = True) -> str:
    """``'auto'``: Lanczos (A_T W only), spectral (CPU) or iterative by m."""
    check_choice('pseudo-inverse method', method, NR_METHODS)
    if method not in ('auto', 'lanczos') or (method == 'lanczos' and apply):
        return method
    m, device = A.shape[-1], A.device.type
    if apply and m >= LANCZOS_MIN_M.get(device, float('inf')):
        return 'lanczos'
    if device == 'cpu' and m >= SPECTRAL_MIN_M:
        return 'spectral'
    return 'iterative'


def _iterative(A, W, alpha, nr):
    """(A_T, A_T or A_T W) by the iterations (autograd through them)."""
    Aw = nr_iteration_matrix(A, nr.init)
    Y = newton_iterate(Aw, alpha[..., None, None] * Aw, nr.iters)
    return Y, Y if W is None else Y @ W


class NewtonInverse(torch.autograd.Function):
    """Y = A_T or Z = A_T W: ``apply(A, W, alpha, nr)``. ``'eq16'``: grad_A
    = -Y^T grad_Y Y^T (Eq. 16). ``'exact'`` (spectral): Daleckii-Krein,
    grad_A = U (F o ((U^T grad_Z)(U^T W)^T)) U^T, F_ij = f[l_i, l_j]."""

    @staticmethod
    def forward(ctx, A, W, alpha, nr):
        ctx.exact, ctx.iters = nr.backward == 'exact', nr.iters
        ctx.inverse, ctx.spectral = W is None, nr.method == 'spectral'
        with torch.no_grad():
            if ctx.spectral:
                lam, U = eigh(nr_iteration_matrix(A, nr.init))
                v = scalar_iterate(lam, alpha, nr.iters)
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
            grad_A = G = grad_alpha = None
            if ctx.exact:
                U, v, lam, alpha, *UtW = ctx.saved_tensors
                Ut = U.transpose(-1, -2)
                UtG = Ut @ grad
                right = U if ctx.inverse else UtW[0].mT  # (U^T W)^T
                if not ctx.inverse:
                    G = U @ (v.unsqueeze(-1) * UtG)
                if ctx.needs_input_grad[0]:
                    F = divided_differences(lam, lam, alpha, ctx.iters)
                    grad_A = (U @ F.mul_(UtG @ right)) @ Ut
                if ctx.needs_input_grad[2]:  # d out / d alpha = U diag(u)..
                    u = filter_and_slope(lam, alpha, ctx.iters)[1]
                    grad_alpha = (UtG * (u.unsqueeze(-1) * right.mT)).sum(
                        (-2, -1))
                return grad_A, G, grad_alpha, None
            if ctx.spectral and not ctx.inverse:  # Y = U diag(v) U^T
                U, v, Z = ctx.saved_tensors
                G = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ grad))
            else:
                Y, Z = ctx.saved_tensors
                G = Y.transpose(-1, -2) @ grad
            if ctx.needs_input_grad[0]:
                grad_A = -(G @ Z.transpose(-1, -2))
            return grad_A, None if ctx.inverse else G, None, None


def _lanczos(A, W, alpha, alpha_in, nr):
    """A_T W by Lanczos; unconverged matrices spectral (CPU) / iterative."""
    m, d = W.shape[-2:]
    A0 = A.reshape(-1, m, m)
    A3 = nr_iteration_matrix(A, nr.init).reshape(-1, m, m)
    W3, alpha_in3 = W.reshape(-1, m, d), alpha_in.reshape(-1)
    basis = krylov_basis(A3.detach(), W3.detach(), alpha.reshape(-1), nr.iters)
    fallback = 'spectral' if A.device.type == 'cpu' else 'iterative'
    if basis is None:  # no values (meta)
        return _direct(fallback, A, W, alpha_in, nr)

    def gradient_fallback(index, grad):  # spectral, of matrices ``index``
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
            0, bad, _direct(fallback, A0[bad], W3[bad], alpha_in3[bad], nr))
    return Z.reshape(W.shape)


def _direct(method, A, W, alpha_in, nr):
    """A_T or A_T W by the iterations or the spectral method."""
    if method != nr.method:
        nr = nr.replace(method=method)
    if nr.backward == 'exact' and method == 'iterative':
        # the gradient of the T iterations: autograd through them
        return _iterative(A, W, alpha_in, nr)[1]
    return NewtonInverse.apply(A, W, alpha_in, nr)


def solve(A, W, nr) -> torch.Tensor:
    """A_T (``W`` None) or A_T W with the settings ``nr`` (NRConfig)."""
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'the Newton-Raphson inverse expects (..., m, m) '
                         f'matrices, got shape {tuple(A.shape)}')
    if W is not None and W.shape[:-1] != A.shape[:-1]:
        raise ValueError(f'NRConfig.apply: W of shape {tuple(W.shape)} does '
                         f'not match A of shape {tuple(A.shape)}; expected '
                         f'(..., m, d) with the batch dims and m of A')
    dtype = amp.compute_dtype(A)
    A = A.to(dtype)
    W = None if W is None else W.to(dtype)
    with torch.no_grad():
        alpha = nr_init_alpha(A, nr.init)
    if amp.is_exporting():  # ONNX: the iterations as plain products
        if nr.method in ('spectral', 'lanczos'):
            why = ('torch.linalg.eigh has no ONNX operator'
                   if nr.method == 'spectral' else
                   'its steps are chosen from the data at run time')
            raise amp.ExportError(
                f"nr_method={nr.method!r} cannot be exported ({why}); set "
                f"model.backbone.attn_cfg.nr_method='auto' or 'iterative' "
                f"(same function) before exporting")
        return _iterative(A, W, alpha, nr)[1]
    method = resolve_method(nr.method, A, W is not None)
    with amp.autocast_off(A.device.type), tf32_off(A.device.type):
        alpha_in = alpha
        if nr.backward == 'exact' and torch.is_grad_enabled() and \
                A.requires_grad:  # as the official code differentiates it:
            norm1 = _shared_max(A.sum(-1).amax(-1), nr.init)  # c / ||A||_1^2
            alpha_in = alpha * (norm1.detach() / norm1).square()
        if method == 'lanczos':
            return _lanczos(A, W, alpha, alpha_in, nr)
        return _direct(method, A, W, alpha_in, nr)
