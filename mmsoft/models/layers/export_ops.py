"""The ONNX export path of SOFT's custom autograd Functions.

While a model is exported (:func:`is_exporting`), the Gaussian kernel and
the Newton-Raphson inverse skip their autograd Functions and run their
forward functions directly: the same code as the model
(:func:`gaussian_kernel`, :func:`~.nr_iteration.newton_forward`),
the iterations as batched products (``torch.linalg.eigh``, which the
spectral method uses on the CPU, has no ONNX operator). The per-matrix
alpha is selected with ``argmax`` / ``gather`` inside the graph (no Python
control flow on tensor values). For inference graphs only.
"""
import torch

__all__ = [
    'is_exporting', 'ExportError', 'fp32', 'gaussian_kernel', 'check_method'
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
    """exp(-||x_i - y_j||^2 / 2) for x (..., n, d), y (..., m, d), no
    autograd: the forward of :class:`~.gaussian_kernel.GaussianKernel` and,
    as it is, the export path.

    Both sets translated by the mean landmark c (K depends on x - y only:
    the expansion then cancels relative to the tokens' spread, not to their
    norm); one (n, m) buffer updated in place; a unit diagonal for the
    self-kernel (exp(-||y_i - y_i||^2 / 2) = 1 exactly; K <= 1 elsewhere).
    """
    c = y.mean(-2, keepdim=True)
    yc = y - c
    xc = yc if self_kernel else x - c
    K = torch.matmul(xc, yc.transpose(-1, -2))
    K.sub_(xc.square().sum(-1, keepdim=True), alpha=0.5)
    K.sub_(yc.square().sum(-1).unsqueeze(-2), alpha=0.5)
    K.clamp_(max=0.0).exp_()
    if self_kernel:
        eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        K = torch.maximum(K, eye)
    return K


def check_method(method: str) -> None:
    """An explicit ``nr_method='spectral'`` cannot be exported
    (:class:`ExportError`); ``'auto'`` becomes the iterative form."""
    if method == 'spectral':
        raise ExportError(
            "nr_method='spectral' cannot be exported (torch.linalg.eigh has "
            "no ONNX operator); set model.backbone.attn_cfg.nr_method='auto' "
            "or 'iterative' (same function) before exporting")
