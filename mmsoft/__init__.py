"""mmsoft: SOFT (softmax-free linear transformers) for OpenMMLab.

Importing mmsoft (e.g. via ``custom_imports=dict(imports=['mmsoft'])``)
registers the SOFT models so that ``type='SOFT'`` and ``type='mmsoft.SOFT'``
work in mmpretrain, mmdet and mmseg configs (see :mod:`mmsoft.models`),
``SafeCheckpointHook`` (atomic, checksummed, resumable checkpoints; see
:mod:`mmsoft.engine.hooks.checkpoint_hook`) and ``CPUAmpOptimWrapper``. It
changes nothing else: the torch/mmengine compatibility fixes of
:mod:`mmsoft.compat` and the version check of :mod:`mmsoft.deps` are
applied by :func:`setup`, which building a SOFT backbone or an mmsoft hook
and the tools call (once; see :mod:`mmsoft.runtime`).
"""
from .engine import \
    SafeCheckpointHook  # noqa: F401  (registers the hooks, optim wrappers)
from .models import SOFT
from .registry import MODELS
from .runtime import setup
from .utils.paths import configs_root, get_config_path
from .version import __version__

__all__ = [
    '__version__', 'SOFT', 'MODELS', 'SafeCheckpointHook', 'configs_root',
    'get_config_path', 'setup'
]
