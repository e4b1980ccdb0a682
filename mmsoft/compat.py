"""The checkpoint side of the supported stacks; ``import mmsoft`` leaves
torch's weights-only allow-list alone (docs/en/advanced_guides/
compatibility.md)."""
from mmsoft.utils.safe_load import (RefusedGlobal, RestrictedUnpickler,
                                    mmengine_checkpoints_allowed,
                                    native_allow_list, safe_torch_load,
                                    torch_version, unsafe_globals)

__all__ = [
    'mmengine_checkpoints_allowed', 'safe_torch_load', 'unsafe_globals',
    'RefusedGlobal', 'RestrictedUnpickler', 'native_allow_list',
    'torch_version'
]
