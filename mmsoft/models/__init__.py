"""mmsoft models. Each model is registered (``@register_model`` at its
class, :func:`mmsoft.registry.register_model`) twice:

* in mmsoft's own registry (scope ``'mmsoft'``, a child of MMEngine's root
  MODELS), so ``type='mmsoft.SOFT'`` resolves from any codebase's scope;
* in MMEngine's root MODELS registry, which the MODELS registries of
  mmpretrain, mmdet and mmseg fall back to through their parent chain, so a
  plain ``type='SOFT'`` works under any of their default scopes.

Neither needs the downstream codebases to be imported, which keeps
``import mmsoft`` light.
"""
from .backbones import SOFT

__all__ = ['SOFT']
