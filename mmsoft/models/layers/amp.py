"""The precision of SOFT's kernel, pseudo-inverse and attention products:
float32 (float64 stays) with autocast off, on every device."""
import contextlib

import torch

__all__ = ['autocast_off', 'compute_dtype', 'tf32_off']


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


@contextlib.contextmanager
def tf32_off(device_type: str):
    """Full float32 matrix products on CUDA inside the block: TF32 (10-bit
    mantissas) turned off where the user turned it on, and back after.
    The pseudo-inverse needs it: TF32 operands move its result by 4e-4 to
    divergence. Other devices: nothing to do."""
    flags = torch.backends.cuda.matmul
    if device_type != 'cuda' or not flags.allow_tf32:
        yield
        return
    flags.allow_tf32 = False
    try:
        yield
    finally:
        flags.allow_tf32 = True
