"""``--amp`` without CUDA: an optim wrapper with bfloat16 CPU autocast."""
import contextlib

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

__all__ = ['CPUAmpOptimWrapper']


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """``--amp`` on CPU: the forward pass runs under bfloat16 autocast.

    bfloat16 has the exponent range of float32, so no loss scaling is done.
    SOFT's kernel, pseudo-inverse and attention products stay float32 (they
    disable autocast themselves). Ops without a bfloat16 CPU kernel (some
    mmcv ops) may raise; train without ``--amp`` then.
    """

    def __init__(self, dtype: str = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(
                f'CPU autocast supports only bfloat16, got {dtype!r}')
        self.cast_dtype = torch.bfloat16

    @contextlib.contextmanager
    def optim_context(self, model):
        with super().optim_context(model), torch.autocast(
                device_type='cpu', dtype=self.cast_dtype):
            yield
