"""Plain-op forms of SOFT's custom autograd Functions, for ONNX export.

The training / inference path of mmsoft uses two custom autograd Functions
(:class:`~mmsoft.models.layers.gaussian_kernel.GaussianKernel` with in-place
updates of one n x m buffer, and
:class:`~mmsoft.models.layers.pinv.NewtonInverse` /
:class:`~mmsoft.models.layers.pinv.NewtonInverseApply` with the Eq. (16)
backward), and on the CPU at dense resolutions it evaluates the
Newton-Raphson iterations spectrally with ``torch.linalg.eigh``, which has
no ONNX operator. While a model is exported (:func:`is_exporting`), the
public functions dispatch here instead: the same forward function written
with out-of-place standard ops, and the Newton-Raphson iterations of
Alg. 2 / Eq. (10) unrolled as matrix products::

    K_ij = exp(min(0, x_i . y_j - |x_i|^2 / 2 - |y_j|^2 / 2))   (Eq. 5)
    A_0 = alpha A,   A_{k+1} = 2 A_k - A_k A A_k               (Eq. 10)

The per-matrix (or per-sample) alpha comes from the same
:func:`~mmsoft.models.layers.pinv.nr_init_alpha` as in PyTorch (pinv
computes it and calls :func:`newton_iterate`; this module imports nothing
of mmsoft): all candidates are scored at once and selected with ``argmax``
/ ``gather``, so the choice is part of the graph (no Python control flow on
tensor values, no host synchronisation). Nothing here is
differentiable-specific: these functions are for inference graphs only.
"""
import torch

__all__ = [
    'is_exporting', 'ExportError', 'fp32', 'gaussian_kernel', 'check_method',
    'newton_iterate'
]


class ExportError(RuntimeError):
    """A model path that cannot be exported to ONNX (with the fix)."""


def is_exporting() -> bool:
    """True while ``torch.onnx.export`` (or ``torch.jit.trace``) runs."""
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


def fp32(t: torch.Tensor) -> torch.Tensor:
    """float32 (float64 stays), as the autograd Functions compute."""
    return t if t.dtype == torch.float64 else t.float()


def gaussian_kernel(x: torch.Tensor,
                    y: torch.Tensor,
                    self_kernel: bool = False) -> torch.Tensor:
    """exp(-||x_i - y_j||^2 / 2) for x (..., n, d), y (..., m, d) (Eq. 5).

    The forward of ``GaussianKernel`` without in-place updates: both token
    sets translated by the mean landmark (stable for large-norm tokens), the
    exponent clamped at 0, and a unit diagonal for the self-kernel, as
    there.
    """
    c = y.mean(-2, keepdim=True)
    y = y - c
    x = y if self_kernel else x - c
    K = torch.matmul(x, y.transpose(-1, -2))
    K = K - 0.5 * x.square().sum(-1, keepdim=True) \
        - 0.5 * y.square().sum(-1).unsqueeze(-2)
    K = K.clamp(max=0.0).exp()
    if self_kernel:  # exp(0) = 1 on the diagonal, exactly (K <= 1)
        K = torch.maximum(
            K, torch.eye(y.shape[-2], dtype=K.dtype, device=K.device))
    return K


def check_method(method: str) -> None:
    """An explicit ``nr_method='spectral'`` cannot be exported
    (:class:`ExportError`); ``'auto'`` becomes the iterative form."""
    if method == 'spectral':
        raise ExportError(
            "nr_method='spectral' cannot be exported (torch.linalg.eigh has "
            "no ONNX operator); set model.backbone.attn_cfg.nr_method='auto' "
            "or 'iterative' (same function) before exporting")


def newton_iterate(A: torch.Tensor, alpha: torch.Tensor,
                   iters: int) -> torch.Tensor:
    """The T-th Newton-Raphson iterate A_T (Alg. 2) as unrolled matmuls,
    from A_0 = alpha A (``A`` the matrix the iterations run on and
    ``alpha`` per matrix, both from
    :func:`~mmsoft.models.layers.pinv.nr_init_alpha`'s rules)."""
    V = alpha[..., None, None] * A
    for _ in range(iters):
        V = 2 * V - torch.matmul(torch.matmul(V, A), V)
    return V
