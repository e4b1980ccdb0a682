from .nonfinite_hook import (NonFiniteLossError, NonFiniteLossHook,
                             add_nonfinite_hook)

__all__ = ['NonFiniteLossHook', 'NonFiniteLossError', 'add_nonfinite_hook']
