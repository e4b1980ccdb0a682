"""``--amp`` without CUDA."""
import contextlib

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from mmsoft.models.layers.amp import CheckedConvs

__all__ = ['CPUAmpOptimWrapper']


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """The forward under bfloat16 CPU autocast with ``CheckedConvs``."""

    def __init__(self, dtype: str = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(
                f'CPU autocast supports only bfloat16, got {dtype!r}')
        self.cast_dtype = torch.bfloat16

    @contextlib.contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast(
                device_type='cpu', dtype=self.cast_dtype), CheckedConvs():
            yield
