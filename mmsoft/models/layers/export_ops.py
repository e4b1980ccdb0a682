"""The ONNX export path: while a model is exported (:func:`is_exporting`)
the Gaussian kernel and the NR inverse run their forward code as plain ops
(no autograd Function; the iterative method, as ``eigh`` has no ONNX
operator). Inference graphs only."""
import torch

__all__ = ['is_exporting', 'ExportError']


class ExportError(RuntimeError):
    """A model path that cannot be exported to ONNX (with the fix)."""


def is_exporting() -> bool:
    """True while ``torch.onnx.export`` (or ``torch.jit.trace``) runs."""
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()
