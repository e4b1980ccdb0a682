from .nonfinite_hook import (NonFiniteLossError, NonFiniteLossHook,
                             add_nonfinite_hook)
from .strict_load_hook import StrictLoadHook

__all__ = ['NonFiniteLossHook', 'NonFiniteLossError', 'add_nonfinite_hook',
           'StrictLoadHook']
