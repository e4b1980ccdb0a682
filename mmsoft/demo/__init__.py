"""The demo of the README's main job (``tools/demo.py``).

* :mod:`mmsoft.demo.synthetic` - deterministic synthetic data sets in the
  COCO / ADE20K / ImageNet on-disk formats (numpy + OpenCV only).
"""
from . import synthetic  # noqa: F401
from .synthetic import SEG_CLASSES  # noqa: F401
from .synthetic import CLS_CLASSES, DET_CLASSES, dataset_paths, make_demo_data

__all__ = [
    'synthetic', 'make_demo_data', 'dataset_paths', 'DET_CLASSES',
    'SEG_CLASSES', 'CLS_CLASSES'
]
