"""mmsoft models and their registration.

Each model is registered twice:

* in mmsoft's own registry (scope ``'mmsoft'``, a child of MMEngine's root
  MODELS), so ``type='mmsoft.SOFT'`` resolves from any codebase's scope;
* in MMEngine's root MODELS registry, which the MODELS registries of
  mmpretrain, mmdet and mmseg fall back to through their parent chain, so a
  plain ``type='SOFT'`` works under any of their default scopes.

Neither needs the downstream codebases to be imported, which keeps
``import mmsoft`` light.
"""
from mmengine.registry import MODELS as ROOT_MODELS

from mmsoft.registry import MODELS
from .backbones import SOFT

__all__ = ['SOFT']

for _cls in (SOFT, ):
    MODELS.register_module(module=_cls)
    if ROOT_MODELS.get(_cls.__name__) is not _cls:
        ROOT_MODELS.register_module(module=_cls)
