"""Utilities of mmsoft: the official-checkpoint key mapping."""
from .official_keys import (OFFICIAL_MODELS, ConversionError, arch_for_mmsoft,
                            convert_mmpretrain_to_official,
                            convert_official_to_mmpretrain, describe_arch,
                            extract_state_dict, infer_official_arch,
                            load_checkpoint_file, match_arch_preset,
                            mmsoft_to_official_key, official_model_name,
                            official_shapes, official_to_mmsoft_key,
                            save_checkpoint_atomic, strip_module_prefix)

__all__ = [
    'OFFICIAL_MODELS', 'ConversionError', 'arch_for_mmsoft',
    'convert_mmpretrain_to_official', 'convert_official_to_mmpretrain',
    'describe_arch', 'extract_state_dict', 'infer_official_arch',
    'load_checkpoint_file', 'match_arch_preset', 'mmsoft_to_official_key',
    'official_model_name', 'official_shapes', 'official_to_mmsoft_key',
    'save_checkpoint_atomic', 'strip_module_prefix'
]
