"""Conversion between the official SOFT checkpoints (fudan-zvg/SOFT) and
mmsoft, beside the backbone whose keys they map:

* :mod:`.official_keys` - the key map (one key at a time) and the
  recognition of an unconverted official checkpoint;
* :mod:`.official_arch` - the architecture read off tensor shapes, the
  official key -> shape table, the matching ``SOFT.arch_zoo`` preset;
* :mod:`.convert` - whole-checkpoint conversion with validation;
* :mod:`.legacy_keys` - the keys of older mmsoft checkpoints renamed.

Nothing here imports the backbone (the presets are
:mod:`mmsoft.models.arch_zoo`); :mod:`mmsoft.models.loading` uses these to
load any of the layouts into a model.

The files themselves (loading, layouts, atomic writing) are handled by
:mod:`mmsoft.utils.checkpoint_files`; the scripts are
``tools/model_converters/soft2mmsoft.py`` and ``mmsoft2soft.py``.
"""
from mmsoft.utils.checkpoint_files import ConversionError
from .convert import (convert_mmpretrain_to_official,
                      convert_official_to_mmpretrain)
from .legacy_keys import upgrade_legacy_state_dict
from .official_arch import (OFFICIAL_FILES, OFFICIAL_MODELS, OFFICIAL_PAGE,
                            OFFICIAL_PRESETS, OFFICIAL_STEM_CHANNELS,
                            arch_for_mmsoft, describe_arch,
                            infer_official_arch, match_arch_preset,
                            official_model_name, official_shapes)
from .official_keys import (find_official_state_dict, mmsoft_to_official_key,
                            official_soft_hint, official_to_mmsoft_key)

__all__ = [
    'ConversionError', 'convert_mmpretrain_to_official',
    'convert_official_to_mmpretrain', 'OFFICIAL_FILES', 'OFFICIAL_MODELS',
    'OFFICIAL_PAGE', 'OFFICIAL_PRESETS', 'OFFICIAL_STEM_CHANNELS',
    'arch_for_mmsoft', 'describe_arch', 'infer_official_arch',
    'match_arch_preset', 'official_model_name', 'official_shapes',
    'mmsoft_to_official_key', 'official_soft_hint', 'official_to_mmsoft_key',
    'find_official_state_dict', 'upgrade_legacy_state_dict'
]
