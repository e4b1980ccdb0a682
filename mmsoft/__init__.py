"""SOFT (softmax-free linear transformers) for OpenMMLab."""
from .configs import configs_root, get_config_path
from .engine import SafeCheckpointHook  # noqa: F401 (registers the hooks)
from .models import SOFT
from .registry import MODELS
from .version import __version__

__all__ = [
    '__version__', 'SOFT', 'MODELS', 'SafeCheckpointHook', 'configs_root',
    'get_config_path'
]
