"""The precision of SOFT's kernel, pseudo-inverse and attention products:
float32 (float64 stays) with autocast off, on every device."""
import contextlib

import torch

__all__ = ['autocast_off', 'compute_dtype']


def autocast_off(device_type: str):
    """``torch.autocast(device_type, enabled=False)``; a no-op context on
    ``'meta'``, where ``torch.autocast`` raises."""
    if device_type == 'meta':
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, enabled=False)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any of ``tensors`` is, else float32."""
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32
