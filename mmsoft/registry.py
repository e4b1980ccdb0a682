"""``MODELS`` and ``ATTENTIONS`` (a SOFT stage's ``attn_cfg``)."""
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
    """Register ``cls`` in mmsoft's and mmengine's root ``MODELS``."""
    MODELS.register_module(module=cls)
    if MMENGINE_MODELS.get(cls.__name__) is not cls:
        MMENGINE_MODELS.register_module(module=cls)
    return cls


__all__ = ['MODELS', 'ATTENTIONS', 'register_model']
