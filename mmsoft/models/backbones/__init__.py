from .soft import SOFT
from .soft_pretrained import SOFTPretrainedInit  # registers 'SOFTPretrained'

__all__ = ['SOFT', 'SOFTPretrainedInit']
