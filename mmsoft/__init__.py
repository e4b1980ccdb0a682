"""mmsoft: SOFT (softmax-free linear transformers) for OpenMMLab.

Importing mmsoft (e.g. via ``custom_imports=dict(imports=['mmsoft'])``)
applies the torch/mmengine compatibility fixes of :mod:`mmsoft.compat` and
registers the SOFT models so that ``type='SOFT'`` and ``type='mmsoft.SOFT'``
work in mmpretrain, mmdet and mmseg configs (see :mod:`mmsoft.models`), and
``SafeCheckpointHook`` (atomic, checksummed, resumable checkpoints; see
:mod:`mmsoft.engine.hooks.checkpoint_hook`).
"""
from . import compat  # noqa: E402  (must run before anything loads weights)
from . import deps  # noqa: E402
from .version import __version__

compat.apply()
deps.check_versions()  # warns for installed packages outside tested ranges

from .engine import \
    SafeCheckpointHook  # noqa: E402,F401  (registers the hooks)
from .models import SOFT  # noqa: E402
from .registry import MODELS  # noqa: E402
from .utils.paths import configs_root, get_config_path  # noqa: E402

__all__ = [
    '__version__', 'SOFT', 'MODELS', 'SafeCheckpointHook', 'configs_root',
    'get_config_path'
]
