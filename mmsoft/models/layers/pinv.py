"""Moore-Penrose inverse of the bottleneck matrix A by Newton-Raphson.

Implements Algorithm 2 of SOFT (NeurIPS 2021) / Eq. (10) of the IJCV 2024
paper::

    A_0 = alpha * A,        A_{k+1} = 2 A_k - A_k A A_k

together with the two initialisations used by the official checkpoints:

* ``'soft_norm'`` (IJCV, Sec. 3.2): alpha = 2 beta^n / ||A||_1^2 with beta=0.5
  and n the smallest integer in [0, 10] for which ||I - alpha A A||_1 <= 1.01
  (n = 10 if none passes). The official loop halves alpha until the test
  passes; here all 11 candidates are scored at once (no Python loop, no host
  synchronisation) and the choice is made **per matrix**, so that one sample's
  result never depends on the rest of the batch.
* ``'soft'`` (NeurIPS): the iteration runs on A + 0.01 I with
  alpha = 0.9 * 2 / ||A||_1^2 (||A||_1 of A before the shift).
* ``'soft_norm_sample'``: the official rule applied to each sample: one
  alpha shared by the heads (all leading dims but the first) of a sample.
  Batch-independent, and equal to the official code at batch size 1, where
  the two differ from the per-matrix choice when the iterations have not
  converged (large bottlenecks, e.g. m ~ 950 at 800 x 1216).
* ``'soft_norm_global'`` (opt-in, for bit-level comparison with the official
  code only): the official normalized kernel's rule, one alpha for the whole
  (batch, heads) stack from the largest ||A||_1, halved until *every* matrix
  passes. Its result depends on the other samples of the batch, which is why
  it is not the default; with it the official ``soft_norm_*`` logits are
  reproduced to ~1e-6 (per-matrix alpha: ~1e-4).

The iterations run without autograd; the backward pass uses the closed form
of Eq. (16), grad_A = -Y^T (grad_Y) Y^T with Y the computed inverse.
Everything runs in float32 (or float64 if given), autocast disabled.

Two ways to evaluate the same T iterations (``method``):

* ``'iterative'``: 2T batched m x m products (Alg. 2 as written);
* ``'spectral'``: A is symmetric, and every iterate is a polynomial in A, so
  with one eigendecomposition A = U diag(l) U^T the iteration becomes the
  scalar recurrence v_{k+1} = 2 v_k - v_k^2 l on the eigenvalues, and
  A_T = U diag(v_T) U^T. Same function (up to rounding), much less work for
  large m (detection / segmentation resolutions).
* ``'auto'`` (default): spectral when m >= ``SPECTRAL_MIN_M`` on the CPU,
  iterative otherwise (on GPUs the batched products are fast and eigh is
  not).
"""
from typing import Tuple

import torch

from . import export_ops

__all__ = ['newton_inverse', 'newton_inverse_apply', 'nr_init_alpha',
           'pinv_convergence', 'NewtonInverse', 'NewtonInverseApply',
           'INIT_MODES', 'NR_METHODS', 'SPECTRAL_MIN_M']

INIT_MODES = ('soft_norm', 'soft', 'soft_norm_sample', 'soft_norm_global')
NR_METHODS = ('auto', 'iterative', 'spectral')
#: smallest m for which ``method='auto'`` uses the spectral form on the CPU.
#: Measured crossover of ``newton_inverse_apply`` (16 matrices, d = 32,
#: 2-core CPU): spectral / iterative time 0.93 (1 thread) and 1.56
#: (2 threads) at m = 49, 0.52 / 0.93 at m = 81, 0.25 / 0.37 at m = 128.
SPECTRAL_MIN_M = 80

_NORM_BETA = 0.5
_NORM_MAX_HALVINGS = 10
_NORM_TOL = 1.01
_SOFT_SHIFT = 0.01
_SOFT_SCALE = 0.9


def _shared_max(t: torch.Tensor, init: str, trailing: int = 0):
    """Max of per-matrix values over the matrices that share one alpha.

    ``t`` has the batch dims of A first, then ``trailing`` own dims.
    """
    if init not in ('soft_norm_global', 'soft_norm_sample'):
        return t
    lead = t.dim() - trailing
    if lead == 0:
        return t
    tail = t.shape[lead:]
    if init == 'soft_norm_global':
        return t.reshape(-1, *tail).amax(0).expand_as(t)
    shared = t.reshape(t.shape[0], -1, *tail).amax(1)  # per sample
    return shared.view(t.shape[0], *([1] * (lead - 1)), *tail).expand_as(t)


def nr_init_alpha(A: torch.Tensor, init: str = 'soft_norm') -> torch.Tensor:
    """Per-matrix alpha of A_0 = alpha A. Returns shape ``A.shape[:-2]``.

    For ``'soft_norm'`` the residual test of the official code,
    ``max_j sum_i |I - alpha A A|_ij <= 1.01``, is evaluated for all
    candidates alpha_n = 2 * 0.5^n / ||A||_1^2, n = 0..10, in one batched
    expression; the first passing n is used (10 when none passes).
    """
    if init not in INIT_MODES:
        raise ValueError(f'unknown Newton-Raphson init {init!r}; '
                         f'choose one of {INIT_MODES}')
    norm1 = A.sum(-1).amax(-1)  # A is non-negative: row sums = abs row sums
    # the official SoftmaxFreeNormAttentionKernel.newton_inv uses one alpha
    # for a stack of matrices: max ||A||_1, and the residual test must pass
    # for every matrix; 'soft_norm_global' stacks the whole batch,
    # 'soft_norm_sample' the heads of each sample
    norm1 = _shared_max(norm1, init)
    alpha0 = 2.0 / norm1.clamp_min(torch.finfo(A.dtype).tiny).square()
    if init == 'soft':
        return _SOFT_SCALE * alpha0
    n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, dtype=A.dtype)
    alphas = alpha0[..., None] * _NORM_BETA**n  # (..., K)
    # ||I - alpha_k A A||_1 (max column abs sum, as the official test) for
    # every candidate k, in O(m^2) per matrix instead of forming A A:
    # A is symmetric and non-negative, so A A is non-negative and column j
    # of I - alpha A A has abs sum |1 - alpha (AA)_jj| + alpha sum_{i!=j}
    # (AA)_ij, with (AA)_jj = sum_i A_ij^2 and sum_i (AA)_ij = (A (A 1))_j.
    colsum = torch.matmul(A, A.sum(-1, keepdim=True)).squeeze(-1)  # (..., m)
    diag = A.square().sum(-2)  # (..., m)
    off = (colsum - diag).clamp_min(0)
    a = alphas[..., :, None]  # (..., K, 1)
    res = ((1 - a * diag[..., None, :]).abs() +
           a * off[..., None, :]).amax(-1)  # (..., K)
    res = _shared_max(res, init, trailing=1)
    passed = res <= _NORM_TOL
    passed[..., -1] = True  # after 10 halvings the search stops regardless
    first = passed.to(torch.uint8).argmax(-1)  # first True
    return alphas.gather(-1, first[..., None]).squeeze(-1)


def _newton_iterate(A: torch.Tensor, V: torch.Tensor,
                    iters: int) -> torch.Tensor:
    """A_{k+1} = 2 A_k - A_k A A_k, ``iters`` times (Eq. 10)."""
    shape = V.shape
    m = shape[-1]
    A3 = A.reshape(-1, m, m)
    V = V.reshape(-1, m, m)
    for _ in range(iters):
        # 2 V - (V A) V, the axpy fused into the second product
        V = torch.baddbmm(V, torch.bmm(V, A3), V, beta=2.0, alpha=-1.0)
    return V.reshape(shape)


def _spectral_factors(A: torch.Tensor, alpha: torch.Tensor,
                      iters: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The NR iterations on the eigenvalues of the symmetric A.

    Returns (U, v) with A_T = U diag(v) U^T: A = U diag(l) U^T, and every
    iterate is the same polynomial of A, so A_0 = alpha A becomes
    v_0 = alpha l and Eq. (10) becomes v_{k+1} = 2 v_k - v_k^2 l.
    """
    lam, U = torch.linalg.eigh(A)
    v = alpha[..., None] * lam
    for _ in range(iters):
        v = 2 * v - v * v * lam
    return U, v


def _newton_spectral(A: torch.Tensor, alpha: torch.Tensor,
                     iters: int) -> torch.Tensor:
    """A_T = U diag(v_T) U^T (see :func:`_spectral_factors`)."""
    U, v = _spectral_factors(A, alpha, iters)
    return (U * v.unsqueeze(-2)) @ U.transpose(-1, -2)


def resolve_method(method: str, A: torch.Tensor) -> str:
    if method not in NR_METHODS:
        raise ValueError(f'unknown pseudo-inverse method {method!r}; choose '
                         f'one of {NR_METHODS}')
    if method != 'auto':
        return method
    if A.device.type == 'cpu' and A.shape[-1] >= SPECTRAL_MIN_M:
        return 'spectral'
    return 'iterative'


def _init(A: torch.Tensor, init: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """(matrix the iterations run on, per-matrix alpha)."""
    alpha = nr_init_alpha(A, init)
    if init == 'soft':
        m = A.shape[-1]
        A = A + _SOFT_SHIFT * torch.eye(m, device=A.device, dtype=A.dtype)
    return A, alpha


def _newton_forward(A: torch.Tensor, iters: int, init: str,
                    method: str = 'iterative') -> torch.Tensor:
    A, alpha = _init(A, init)
    if method == 'spectral':
        return _newton_spectral(A, alpha, iters)
    V = alpha[..., None, None] * A
    return _newton_iterate(A, V, iters)


class NewtonInverse(torch.autograd.Function):
    """Y = NR-pseudo-inverse(A) with the Eq. (16) closed-form backward."""

    @staticmethod
    def forward(ctx, A: torch.Tensor, iters: int, init: str,
                method: str = 'iterative') -> torch.Tensor:
        with torch.no_grad():
            Y = _newton_forward(A, iters, init, method)
        ctx.save_for_backward(Y)
        return Y

    @staticmethod
    def backward(ctx, grad_Y: torch.Tensor):
        (Y, ) = ctx.saved_tensors
        Yt = Y.transpose(-1, -2)
        grad_A = -(Yt @ grad_Y @ Yt)
        return grad_A, None, None, None


class NewtonInverseApply(torch.autograd.Function):
    """Z = A_T W, A_T the T-th NR iterate (A_T -> A^+), Eq. (16) backward.

    Never forms A_T with ``'spectral'``: Z = U (v * (U^T W)), O(m^2 d)
    after the eigendecomposition. The backward is Eq. (16) applied to
    Y = A_T with grad_Y = grad_Z W^T, associated so that no m x m product
    is needed either: grad_A = -(Y^T grad_Z) Z^T, grad_W = Y^T grad_Z.
    """

    @staticmethod
    def forward(ctx, A: torch.Tensor, W: torch.Tensor, iters: int,
                init: str, method: str = 'iterative') -> torch.Tensor:
        with torch.no_grad():
            if method == 'spectral':
                U, v = _spectral_factors(*_init(A, init), iters)
                Z = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ W))
                ctx.save_for_backward(U, v, Z)
            else:
                Y = _newton_forward(A, iters, init, method)
                Z = Y @ W
                ctx.save_for_backward(Y, Z)
        ctx.method = method
        return Z

    @staticmethod
    def backward(ctx, grad_Z: torch.Tensor):
        if ctx.method == 'spectral':
            U, v, Z = ctx.saved_tensors  # Y = U diag(v) U^T is symmetric
            G = U @ (v.unsqueeze(-1) * (U.transpose(-1, -2) @ grad_Z))
        else:
            Y, Z = ctx.saved_tensors
            G = Y.transpose(-1, -2) @ grad_Z
        grad_A = -(G @ Z.transpose(-1, -2)) if ctx.needs_input_grad[0] \
            else None
        return grad_A, G, None, None, None


def _check(A: torch.Tensor, iters: int, init: str) -> None:
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ValueError(f'newton_inverse expects (..., m, m) matrices, '
                         f'got shape {tuple(A.shape)}')
    if init not in INIT_MODES:
        raise ValueError(f'unknown Newton-Raphson init {init!r}; '
                         f'choose one of {INIT_MODES}')
    if iters < 0:
        raise ValueError(f'iters must be >= 0, got {iters}')


def newton_inverse(A: torch.Tensor, iters: int = 20,
                   init: str = 'soft_norm',
                   method: str = 'auto') -> torch.Tensor:
    """Moore-Penrose inverse of a batch of symmetric non-negative matrices.

    Args:
        A: (..., m, m) bottleneck matrices (Gaussian-kernel Gram matrices).
        iters: Newton-Raphson iterations (the papers use 20).
        init: ``'soft_norm'`` (IJCV alpha search) or ``'soft'`` (NeurIPS,
            A + 0.01 I, 0.9 alpha).
        method: ``'auto'``, ``'iterative'`` or ``'spectral'`` (see module
            docstring); all compute the same T iterations.

    Returns:
        (..., m, m) tensor in float32 (float64 if A is float64), independent
        of autocast.
    """
    _check(A, iters, init)
    if export_ops.is_exporting():  # ONNX: plain ops, iterative, no eigh
        return export_ops.newton_inverse(A, int(iters), init, method)
    method = resolve_method(method, A)
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=A.device.type, enabled=False):
        return NewtonInverse.apply(A.to(dtype), int(iters), init, method)


def newton_inverse_apply(A: torch.Tensor, W: torch.Tensor, iters: int = 20,
                         init: str = 'soft_norm',
                         method: str = 'auto') -> torch.Tensor:
    """A^+ W with A^+ from :func:`newton_inverse`, without forming A^+.

    The same function as ``newton_inverse(A, iters, init, method) @ W``
    (up to rounding) at a fraction of the cost for large m: with the
    spectral method the m x m inverse is never built, and the backward
    needs only (m x m) x (m x d) products.

    Args:
        A: (..., m, m) symmetric non-negative matrices.
        W: (..., m, d) right-hand sides (broadcast batch dims not supported:
            A and W share theirs).

    Returns:
        (..., m, d) in float32 (float64 if A is float64), autocast disabled.
    """
    _check(A, iters, init)
    if W.shape[:-1] != A.shape[:-1]:
        raise ValueError(f'newton_inverse_apply: W of shape '
                         f'{tuple(W.shape)} does not match A of shape '
                         f'{tuple(A.shape)}; expected (..., m, d) with the '
                         f'batch dims and m of A')
    if export_ops.is_exporting():  # ONNX: plain ops, iterative, no eigh
        return export_ops.newton_inverse_apply(A, W, int(iters), init, method)
    method = resolve_method(method, A)
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=A.device.type, enabled=False):
        return NewtonInverseApply.apply(A.to(dtype), W.to(dtype), int(iters),
                                        init, method)


@torch.no_grad()
def pinv_convergence(A: torch.Tensor, iters: int = 20,
                     init: str = 'soft_norm') -> Tuple[torch.Tensor, ...]:
    """The paper's convergence metric ||A A_k A - A||_2 / ||A||_2 per step.

    Returns a tuple of ``iters + 1`` tensors of shape ``A.shape[:-2]``
    (k = 0..iters), as plotted in Fig. 4.
    """
    A = A.double()
    Aw = A
    if init == 'soft':
        alpha = nr_init_alpha(A, 'soft')
        Aw = A + _SOFT_SHIFT * torch.eye(A.shape[-1], dtype=A.dtype,
                                         device=A.device)
    else:
        alpha = nr_init_alpha(A, init)
    V = alpha[..., None, None] * Aw

    def norm2(M):  # symmetric: the spectral norm is the largest |eigenvalue|
        return torch.linalg.eigvalsh(0.5 * (M + M.mT)).abs().amax(-1)

    normA = norm2(A)
    out = []
    for k in range(iters + 1):
        out.append(norm2(A @ V @ A - A) / normA)
        if k < iters:
            V = _newton_iterate(Aw, V, 1)
    return tuple(out)
