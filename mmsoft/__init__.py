"""mmsoft: SOFT (softmax-free linear transformers) for OpenMMLab.

Importing mmsoft (e.g. via ``custom_imports=dict(imports=['mmsoft'])``)
registers the SOFT models so that ``type='SOFT'`` and ``type='mmsoft.SOFT'``
work in mmpretrain, mmdet and mmseg configs (see :mod:`mmsoft.models`),
``SafeCheckpointHook`` (atomic, checksummed, resumable checkpoints; see
:mod:`mmsoft.engine.hooks.checkpoint_hook`) and ``CPUAmpOptimWrapper``, and
adds the allow-list of :func:`mmsoft.compat.register_safe_globals` to
torch's weights-only unpickler, so that checkpoints written by
``tools/train.py`` (mmengine's message hub) load wherever mmsoft is
imported, also in mmengine's inferencers, which load the checkpoint before
any model is built. It changes nothing else: the other compatibility fixes
of :mod:`mmsoft.compat` (mmengine's verified local loader) and the version
check of :mod:`mmsoft.deps` are applied by :func:`setup`, which building a
SOFT backbone or an mmsoft hook and the tools call (once; see
:mod:`mmsoft.runtime`).
"""
from . import compat as _compat
# registers the hooks and optim wrappers
from .engine import SafeCheckpointHook  # noqa: F401
from .models import SOFT
from .registry import MODELS
from .runtime import setup
from .utils.paths import configs_root, get_config_path
from .version import __version__

# what Runner checkpoints pickle (HistoryBuffer, numpy arrays), allow-listed
# for torch.load(weights_only=True): mmengine's inferencers load the
# checkpoint before they build a model (mmsoft.compat.register_safe_globals)
_compat.register_safe_globals()

__all__ = [
    '__version__', 'SOFT', 'MODELS', 'SafeCheckpointHook', 'configs_root',
    'get_config_path', 'setup'
]
