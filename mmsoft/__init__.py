"""mmsoft: SOFT (softmax-free linear transformers) for OpenMMLab.

``import mmsoft`` registers mmsoft's models, hooks and optim wrappers;
nothing else in the process changes, torch's weights-only allow-list
included (SafeCheckpointHook widens it around the Runner's checkpoint
loads only: :func:`mmsoft.compat.mmengine_checkpoints_allowed`;
docs/en/advanced_guides/compatibility.md).
"""
from .engine import SafeCheckpointHook  # noqa: F401 (registers the hooks)
from .models import SOFT
from .registry import MODELS
from .version import __version__


def __getattr__(name):
    if name in ('configs_root', 'get_config_path'):  # lazy: python -m
        from . import configs  # mmsoft.configs runs it as __main__
        return getattr(configs, name)
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


__all__ = [
    '__version__', 'SOFT', 'MODELS', 'SafeCheckpointHook', 'configs_root',
    'get_config_path'
]
