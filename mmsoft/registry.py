"""mmsoft's registry, a child of MMEngine's root MODELS registry.

Being a child with scope ``'mmsoft'`` makes ``type='mmsoft.SOFT'`` resolvable
from any codebase's registry; :mod:`mmsoft.models` also registers the models in
MMEngine's root MODELS, which mmpretrain's, mmdet's and mmseg's registries fall
back to, so that a plain ``type='SOFT'`` works under their default scopes.
"""
from mmengine.registry import MODELS as MMENGINE_MODELS
from mmengine.registry import Registry

MODELS = Registry(
    'model',
    parent=MMENGINE_MODELS,
    scope='mmsoft',
    locations=['mmsoft.models'])

__all__ = ['MODELS']
