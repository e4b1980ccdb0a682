"""mmsoft: SOFT (softmax-free linear transformers) for OpenMMLab.

Importing mmsoft (e.g. via ``custom_imports=dict(imports=['mmsoft'])``)
applies the torch/mmengine compatibility fixes of :mod:`mmsoft.compat` and
registers the SOFT models in mmsoft's registry and in the MODELS registries of
mmpretrain, mmdet and mmseg (those that are installed).
"""
from .version import __version__
from . import compat  # noqa: E402  (must run before anything loads weights)

compat.apply()

from .models import SOFT, register_downstream  # noqa: E402
from .registry import MODELS  # noqa: E402

register_downstream()

__all__ = ['__version__', 'SOFT', 'MODELS', 'register_downstream']
