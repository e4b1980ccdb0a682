"""The demo of the README's main job (``make demo``: ``tools/demo.py``).

* :mod:`.synthetic` - deterministic synthetic data sets in the
  COCO / ADE20K / ImageNet on-disk formats (numpy + OpenCV only; also
  ``tools/misc/make_demo_data.py``, which loads it from its file);
* :mod:`.tasks` - the three demo tasks: configs, training, metrics and
  drawings of the predictions.
"""
from . import synthetic  # noqa: F401
from .synthetic import SEG_CLASSES  # noqa: F401
from .synthetic import CLS_CLASSES, DET_CLASSES, dataset_paths, make_demo_data

__all__ = [
    'synthetic', 'make_demo_data', 'dataset_paths', 'DET_CLASSES',
    'SEG_CLASSES', 'CLS_CLASSES'
]
