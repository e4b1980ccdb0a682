"""Compatibility with the supported stacks (torch 2.1 to 2.14, mmengine 0.10):
the checkpoint side (the model code's torch-version shims, ``autocast_dtype``
and ``unravel_index``, are in :mod:`mmsoft.models.layers.amp`).

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
    'torch_version'
]
