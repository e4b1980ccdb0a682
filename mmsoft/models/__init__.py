"""mmsoft models, registered in mmsoft's and the downstream registries."""
import importlib

from mmsoft.registry import MODELS
from .backbones import SOFT

__all__ = ['SOFT', 'register_downstream', 'DOWNSTREAM_REGISTRIES']

_MODELS = (SOFT, )

#: module path of each OpenMMLab codebase's MODELS registry
DOWNSTREAM_REGISTRIES = {
    'mmpretrain': 'mmpretrain.registry',
    'mmdet': 'mmdet.registry',
    'mmseg': 'mmseg.registry',
}


def register_downstream(codebases=None):
    """Register mmsoft's models in each installed codebase's MODELS.

    Returns the names of the codebases the models were registered in;
    codebases that are not installed are skipped.
    """
    done = []
    for name in (codebases or DOWNSTREAM_REGISTRIES):
        try:
            reg = importlib.import_module(DOWNSTREAM_REGISTRIES[name]).MODELS
        except ImportError:
            continue
        for cls in _MODELS:
            if reg.get(cls.__name__) is not cls:
                reg.register_module(module=cls, force=True)
        done.append(name)
    return done


for _cls in _MODELS:
    MODELS.register_module(module=_cls)
