"""mmsoft's registries.

* ``MODELS``: a child of MMEngine's root MODELS registry. Being a child with
  scope ``'mmsoft'`` makes ``type='mmsoft.SOFT'`` resolvable from any
  codebase's registry; :mod:`mmsoft.models` also registers the backbone in
  MMEngine's root MODELS, which mmpretrain's, mmdet's and mmseg's registries
  fall back to, so that a plain ``type='SOFT'`` works under their default
  scopes.
* ``ATTENTIONS``: the token mixers a SOFT stage can use (its ``attn_cfg``):
  SOFT attention and the attentions of the comparison zoo, each registered
  at its class under its class name and a short alias (``'soft'``,
  ``'linformer'``, ...).
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry(
    'model',
    parent=MMENGINE_MODELS,
    scope='mmsoft',
    locations=['mmsoft.models'])

ATTENTIONS = Registry(
    'attention', scope='mmsoft', locations=['mmsoft.models.layers'])


def register_model(cls):
    """Class decorator: register a model in mmsoft's MODELS (``type=
    'mmsoft.X'``) and in MMEngine's root MODELS (plain ``type='X'`` from
    mmpretrain / mmdet / mmseg scopes), once."""
    MODELS.register_module(module=cls)
    if MMENGINE_MODELS.get(cls.__name__) is not cls:
        MMENGINE_MODELS.register_module(module=cls)
    return cls


__all__ = ['MODELS', 'ATTENTIONS', 'register_model']
