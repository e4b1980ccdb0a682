"""mmsoft: SOFT (softmax-free linear transformers) for OpenMMLab.

``import mmsoft`` (e.g. ``custom_imports=dict(imports=['mmsoft'])``)
registers mmsoft's models, hooks and optim wrappers, and adds the
allow-list of :func:`mmsoft.compat.register_safe_globals` to torch's
weights-only unpickler (torch >= 2.6: mmengine 0.10's own training
checkpoints do not load without it, also in mmengine's inferencers, which
load before any model is built). Nothing else in the process changes:
building, initialising and running a model patches no loader, warning
filter, logger or torch setting. The training-safety parts are opt-in,
named in a config: ``SafeCheckpointHook``, ``NonFiniteLossHook``,
``StrictLoadHook``, ``CPUAmpOptimWrapper`` (``tools/train.py`` adds them).
"""
from . import compat as _compat
from .engine import SafeCheckpointHook  # noqa: F401 (registers the hooks)
from .models import SOFT
from .registry import MODELS
from .utils.paths import configs_root, get_config_path
from .version import __version__

_compat.register_safe_globals()


def setup():
    """Deprecated in 0.4 (removed in 0.5): does nothing; ``import mmsoft``
    is all the set-up there is. Returns ``[]``."""
    import warnings
    warnings.warn(
        'mmsoft.setup() is deprecated and does nothing: import mmsoft '
        'registers everything (mmsoft loads checkpoints safely itself)',
        DeprecationWarning,
        stacklevel=2)
    return []


__all__ = [
    '__version__', 'SOFT', 'MODELS', 'SafeCheckpointHook', 'configs_root',
    'get_config_path', 'setup'
]
