"""torch version shims that only the tools need (torch 2.1 to 2.14)."""
import inspect

import torch

__all__ = ['onnx_export_takes_dynamo', 'sdpa_math', 'grad_scaler']


def onnx_export_takes_dynamo():
    """Whether ``torch.onnx.export`` takes ``dynamo`` (torch >= 2.5)."""
    return 'dynamo' in inspect.signature(torch.onnx.export).parameters


def sdpa_math():
    """A context where SDPA runs its math kernel (any torch)."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return torch.backends.cuda.sdp_kernel(
            enable_flash=False, enable_math=True, enable_mem_efficient=False)
    return sdpa_kernel(SDPBackend.MATH)


def grad_scaler(device_type, **kwargs):
    """``torch.amp.GradScaler`` (torch >= 2.3), else CUDA's."""
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler(device_type, **kwargs)
    return torch.cuda.amp.GradScaler(**kwargs)
