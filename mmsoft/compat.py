"""Compatibility with the supported stacks (torch 2.1 to 2.14, mmengine 0.10).

Nothing here changes the process: ``import mmsoft`` leaves torch's
weights-only allow-list alone; :func:`mmengine_checkpoints_allowed` widens
it for mmengine's training checkpoints inside a ``with`` block only
(SafeCheckpointHook does so around the Runner's ``load_checkpoint``). The
allow-list and why each entry is safe:
docs/en/advanced_guides/compatibility.md.
"""
from mmsoft.utils.safe_load import (RefusedGlobal, RestrictedUnpickler,
                                    mmengine_checkpoints_allowed,
                                    native_allow_list, safe_torch_load,
                                    torch_version, unsafe_globals)

__all__ = [
    'mmengine_checkpoints_allowed', 'safe_torch_load', 'unsafe_globals',
    'RefusedGlobal', 'RestrictedUnpickler', 'native_allow_list',
    'torch_version', 'unravel_index', 'autocast_dtype'
]


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
