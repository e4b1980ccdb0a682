"""mmsoft models, registered in mmsoft's MODELS (``type='mmsoft.SOFT'``)
and MMEngine's root MODELS (``type='SOFT'`` in mmpretrain / mmdet / mmseg)
by :func:`mmsoft.registry.register_model`."""
from .backbones import SOFT

__all__ = ['SOFT']
