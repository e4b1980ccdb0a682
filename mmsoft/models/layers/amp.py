"""Autocast (AMX-checked CPU half convs), torch shims, argument checks."""
import contextlib
import math
import numbers
import warnings
from typing import Any, Dict, Optional, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.modules.utils import _pair
from torch.overrides import TorchFunctionMode


def autocast_dtype(device_type):
    """The autocast dtype of ``device_type``, None where autocast is off."""
    if hasattr(torch, 'get_autocast_dtype'):  # torch >= 2.4
        on = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if on else None
    if device_type == 'cpu':
        on = torch.is_autocast_cpu_enabled()
        return torch.get_autocast_cpu_dtype() if on else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() \
        else None


def autocast_off(device_type: str):
    """Autocast off on ``device_type`` (a no-op on 'meta', where it raises)."""
    return contextlib.nullcontext() if device_type == 'meta' else \
        torch.autocast(device_type=device_type, enabled=False)


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any of ``tensors`` is, else float32."""
    return torch.float64 if any(t.dtype == torch.float64
                                for t in tensors) else torch.float32


@contextlib.contextmanager
def tf32_off(device_type: str):
    """No TF32 matmuls on CUDA in the block (they move the inverse by 4e-4)."""
    flags = torch.backends.cuda.matmul
    if device_type != 'cuda' or not flags.allow_tf32:
        yield
        return
    flags.allow_tf32 = False
    try:
        yield
    finally:
        flags.allow_tf32 = True


#: > a correct half kernel's relative error (2e-3 bf16, 2e-4 fp16; AMX: 1.1)
PROBE_RTOL = {torch.bfloat16: 1e-2, torch.float16: 5e-3}
_HALF = (torch.bfloat16, torch.float16)
#: the verdict of each configuration probed: (dtype, shapes, conv args) -> ok
_verdicts: Dict[tuple, bool] = {}
#: whether torch.compile is tracing (no probe then: unprobed runs float32)
compiling = getattr(getattr(torch, 'compiler', None), 'is_compiling',
                    None) or torch._dynamo.is_compiling  # torch < 2.3
#: the convolution checked (a test stands in a broken kernel)
_raw_conv2d = F.conv2d


def is_exporting() -> bool:
    """True in ``torch.onnx.export`` / ``torch.jit.trace`` (plain ops)."""
    return torch.onnx.is_in_onnx_export() or torch.jit.is_tracing()


class ExportError(RuntimeError):
    """A model path that cannot be exported to ONNX (with the fix)."""


class HalfConvWarning(UserWarning):
    """This CPU's half-precision conv kernel is wrong; run in float32."""


def _probe(key: tuple) -> bool:
    """Whether ``key``'s half kernel matches float32 on seeded inputs."""
    dtype, in_shape, w_shape, stride, _, _, groups = key
    g = torch.Generator().manual_seed(0)
    x, w = (torch.randn(s, generator=g) for s in ((1, ) + in_shape, w_shape))
    x, w = x.to(dtype), (w * math.prod(w_shape[1:])**-0.5).to(dtype)
    with torch.no_grad(), autocast_off('cpu'):
        half, ref = [_raw_conv2d(x.to(t), w.to(t), None, *key[3:])
                     for t in (dtype, torch.float32)]  # yapf: disable
    err = ((half.float() - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    ok = _verdicts[key] = bool(err <= PROBE_RTOL[dtype])
    if not ok:  # about this CPU: no caller's line to show
        warnings.warn(
            f"mmsoft: this CPU's {str(dtype)[6:]} convolution is wrong for "
            f'weight {w_shape}, stride {stride}, groups {groups} on a '
            f'{in_shape} input (relative error {err:.3g} against float32, a '
            'known oneDNN bug on CPUs with AMX); mmsoft runs this '
            'convolution in float32 (correct, slower)', HalfConvWarning)
    return ok


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``F.conv2d``; float32 where this CPU's half kernel is wrong (probed)."""
    dtype = x.dtype if x.device.type == 'cpu' else None  # half inputs or
    if dtype == torch.float32 and weight.dtype in (torch.float32, ) + _HALF:
        dtype = autocast_dtype('cpu')  # float32 ones under CPU autocast
    key = dtype in _HALF and (
        dtype, tuple(x.shape[1:]), tuple(weight.shape), _pair(stride),
        padding if isinstance(padding, str) else _pair(padding),
        _pair(dilation), int(groups))  # yapf: disable
    if not key or (_verdicts.get(key, False) if compiling()
                   or key in _verdicts else _probe(key)):  # yapf: disable
        return _raw_conv2d(x, weight, bias, stride, padding, dilation, groups)
    with autocast_off('cpu'):
        out = _raw_conv2d(x.float(), weight.float(),
                          None if bias is None else bias.float(), stride,
                          padding, dilation, groups)
    return out.to(dtype)


class SafeConv2d(nn.Conv2d):
    """``nn.Conv2d`` whose forward is the checked ``amp.conv2d``."""

    def _conv_forward(self, input, weight, bias) -> torch.Tensor:
        if self.padding_mode != 'zeros':
            return super()._conv_forward(input, weight, bias)
        return conv2d(input, weight, bias, self.stride, self.padding,
                      self.dilation, self.groups)


class CheckedConvs(TorchFunctionMode):
    """Every ``F.conv2d`` in the block runs as :func:`conv2d`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        return (conv2d if func is F.conv2d else func)(*args, **(kwargs or {}))


def _is(value: Any, kind) -> bool:
    """``value`` is a ``kind`` (numbers.Integral / Real), not a bool."""
    return isinstance(value, kind) and not isinstance(value, bool)


def check_int(name, value, minimum=1, allow_none=False) -> Optional[int]:
    """An int >= ``minimum`` (or None with ``allow_none``), as an int."""
    if (value is None and allow_none) or (_is(value, numbers.Integral)
                                          and value >= minimum):
        return value if value is None else int(value)
    raise ValueError(f'{name} must be an int >= {minimum}'
                     f'{" or None" if allow_none else ""}, got {value!r} '
                     f'({type(value).__name__})')


def check_rate(name: str, value: Any) -> float:
    """A dropout / drop-path probability in [0, 1)."""
    if _is(value, numbers.Real) and 0 <= value < 1:
        return float(value)
    raise ValueError(f'{name} must be a number in [0, 1), got {value!r}')


def check_kernel_size(name: str, value: Any) -> int:
    """An odd positive int ('same' padding keeps the map), or 0 (no conv)."""
    if _is(value, numbers.Integral) and value >= 0 and (value % 2 == 1
                                                        or value == 0):
        return int(value)
    raise ValueError(f'{name} must be an odd positive int (or 0 to disable '
                     f'the conv), got {value!r}: an even kernel changes the '
                     f'token map size')


def check_choice(name: str, value: Any, choices: Sequence) -> Any:
    """One of ``choices``; returns it."""
    if value not in choices:
        raise ValueError(f'unknown {name} {value!r}; choose one of {choices}')
    return value
