"""mmsoft models, in mmsoft's and MMEngine's root MODELS."""
from .backbones import SOFT

__all__ = ['SOFT']
