"""The ONNX export path: while a model is exported (:func:`is_exporting`)
the Gaussian kernel and the NR inverse run their forward code as plain ops
(no autograd Function; the iterative method, as ``eigh`` has no ONNX
operator). Inference graphs only."""
import torch

__all__ = ['is_exporting', 'ExportError', 'check_method']


class ExportError(RuntimeError):
    """A model path that cannot be exported to ONNX (with the fix)."""


def is_exporting() -> bool:
    """True while ``torch.onnx.export`` (or ``torch.jit.trace``) runs."""
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


def check_method(method: str) -> None:
    """An explicit ``nr_method='spectral'`` cannot be exported
    (:class:`ExportError`); ``'auto'`` becomes the iterative form."""
    if method == 'spectral':
        raise ExportError(
            "nr_method='spectral' cannot be exported (torch.linalg.eigh has "
            "no ONNX operator); set model.backbone.attn_cfg.nr_method='auto' "
            "or 'iterative' (same function) before exporting")
