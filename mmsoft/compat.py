"""Compatibility with the supported stacks (torch 2.1 to 2.14, mmengine 0.10).

``import mmsoft`` calls :func:`register_safe_globals`; nothing else here
changes the process. The allow-list and why each entry is safe:
docs/en/advanced_guides/compatibility.md.
"""
from mmsoft.utils.safe_load import (RefusedGlobal, RestrictedUnpickler,
                                    mmengine_safe_globals, native_allow_list,
                                    safe_torch_load, torch_version,
                                    unsafe_globals)

__all__ = [
    'register_safe_globals', 'MMENGINE_SAFE_GLOBALS', 'safe_torch_load',
    'unsafe_globals', 'RefusedGlobal', 'RestrictedUnpickler',
    'native_allow_list', 'torch_version', 'unravel_index', 'autocast_dtype'
]

#: filled by :func:`register_safe_globals`
MMENGINE_SAFE_GLOBALS = []


def register_safe_globals():
    """Add what mmengine 0.10's training checkpoints pickle to torch's
    weights-only allow-list (torch >= 2.6 loads them weights-only by
    default); idempotent. Returns False (nothing added) before torch 2.6."""
    if not native_allow_list():
        return False
    from torch.serialization import add_safe_globals
    MMENGINE_SAFE_GLOBALS[:] = mmengine_safe_globals()
    add_safe_globals(MMENGINE_SAFE_GLOBALS)  # a set union: idempotent
    return True


def autocast_dtype(device_type):
    """The autocast dtype of ``device_type`` ('cpu', 'cuda') if autocast is
    on there, else None, on every torch (chosen by the version: a caught
    ``TypeError`` breaks Dynamo on torch 2.1)."""
    import torch
    if hasattr(torch, 'get_autocast_dtype'):  # torch >= 2.4
        on = torch.is_autocast_enabled(device_type)
        return torch.get_autocast_dtype(device_type) if on else None
    if device_type == 'cpu':
        on = torch.is_autocast_cpu_enabled()
        return torch.get_autocast_cpu_dtype() if on else None
    return torch.get_autocast_gpu_dtype() if torch.is_autocast_enabled() \
        else None


def unravel_index(indices, shape):
    """``torch.unravel_index`` (torch >= 2.2) on every torch."""
    import torch
    if hasattr(torch, 'unravel_index'):
        return tuple(torch.unravel_index(indices, tuple(shape)))
    out = []
    for size in reversed(tuple(shape)):
        out.append(torch.remainder(indices, size))
        indices = torch.div(indices, size, rounding_mode='floor')
    return tuple(reversed(out))
