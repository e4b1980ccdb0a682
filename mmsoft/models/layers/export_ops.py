"""The ONNX export path of SOFT's custom autograd Functions.

While a model is exported (:func:`is_exporting`), the Gaussian kernel and
the Newton-Raphson inverse skip their autograd Functions and run their
forward functions directly: the same code as the model
(:func:`~.gaussian_kernel.kernel`, :func:`~.nr_iteration.newton_forward`),
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
    """The kernel on the export path: :func:`~.gaussian_kernel.kernel`."""
    from .gaussian_kernel import kernel
    return kernel(x, y, self_kernel)


def check_method(method: str) -> None:
    """An explicit ``nr_method='spectral'`` cannot be exported
    (:class:`ExportError`); ``'auto'`` becomes the iterative form."""
    if method == 'spectral':
        raise ExportError(
            "nr_method='spectral' cannot be exported (torch.linalg.eigh has "
            "no ONNX operator); set model.backbone.attn_cfg.nr_method='auto' "
            "or 'iterative' (same function) before exporting")
