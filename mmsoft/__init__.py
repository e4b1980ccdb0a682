"""SOFT (softmax-free linear transformers) for OpenMMLab."""
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
