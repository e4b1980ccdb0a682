"""mmsoft's registries: ``MODELS`` (a child of mmengine's root MODELS with
scope ``'mmsoft'``: ``type='mmsoft.SOFT'`` resolves from any codebase) and
``ATTENTIONS`` (the token mixers of a SOFT stage's ``attn_cfg``)."""
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
    """Class decorator: register a model in mmsoft's MODELS and, once, in
    mmengine's root MODELS (a plain ``type='X'`` from the mmpretrain /
    mmdet / mmseg scopes)."""
    MODELS.register_module(module=cls)
    if MMENGINE_MODELS.get(cls.__name__) is not cls:
        MMENGINE_MODELS.register_module(module=cls)
    return cls


__all__ = ['MODELS', 'ATTENTIONS', 'register_model']
