"""What mmsoft changes in the process, done explicitly and once.

``import mmsoft`` registers mmsoft's models, attentions, hooks and optim
wrappers and the allow-list of what mmengine training checkpoints pickle
(:func:`mmsoft.compat.register_safe_globals`: mmengine's inferencers load a
checkpoint before building any model), and changes nothing else.
:func:`setup` applies the fixes of
:mod:`mmsoft.compat` (``torch.load`` of mmengine training checkpoints with
``weights_only=True``; damage and checksum checks on mmengine's local
checkpoint loads) and warns once for installed packages outside the tested
ranges (:func:`mmsoft.deps.check_versions`). It is idempotent and runs
before anything mmsoft builds can load a checkpoint:

* when a SOFT backbone is built (``type='SOFT'`` / ``'mmsoft.SOFT'`` from
  any registry: the configs that load mmsoft through
  ``custom_imports=dict(imports=['mmsoft'])``; the Runner builds the model
  and its hooks before ``resume`` / ``load_from``);
* when ``SafeCheckpointHook`` or ``StrictLoadHook`` is built, and before
  :mod:`mmsoft.models.loading` reads a file (``init_cfg`` ``Pretrained``
  of SOFT, the converters);
* in mmsoft's tools (``tools/train.py``, ``tools/test.py``, ...);
* when called: ``mmsoft.setup()``, e.g. in a script that ``torch.load``\\ s
  a Runner checkpoint without building a SOFT model.
"""
from typing import List

__all__ = ['setup']

_DONE: List[bool] = []


def setup() -> List[str]:
    """Apply the compatibility fixes and check the versions, once.

    Returns:
        list[str]: the names of the fixes in effect
        (:func:`mmsoft.compat.applied`).
    """
    from mmsoft import compat, deps
    if not _DONE:
        _DONE.append(True)
        compat.apply()
        deps.check_versions()
    return compat.applied()
