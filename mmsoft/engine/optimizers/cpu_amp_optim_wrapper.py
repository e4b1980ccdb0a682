"""``--amp`` without CUDA: an optim wrapper with bfloat16 CPU autocast."""
import contextlib

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from mmsoft.models.layers.safe_conv import guard_convs

__all__ = ['CPUAmpOptimWrapper']


@OPTIM_WRAPPERS.register_module()
class CPUAmpOptimWrapper(OptimWrapper):
    """``--amp`` on CPU: the forward pass runs under bfloat16 autocast.

    bfloat16 has the exponent range of float32, so no loss scaling is done.
    SOFT's kernel, pseudo-inverse and attention products stay float32 (they
    disable autocast themselves). Before the first step every convolution
    of the model (the neck's and heads' too) is put under mmsoft's check
    of the CPU's bfloat16 convolution kernel
    (:func:`mmsoft.models.layers.safe_conv.guard_convs`): a configuration
    that this CPU computes wrongly in bfloat16 (oneDNN on CPUs with AMX)
    runs in float32. Ops without a bfloat16 CPU kernel (some
    mmcv ops) may raise; train without ``--amp`` then.
    """

    def __init__(self, dtype: str = 'bfloat16', **kwargs):
        super().__init__(**kwargs)
        if dtype not in ('bfloat16', torch.bfloat16):
            raise ValueError(
                f'CPU autocast supports only bfloat16, got {dtype!r}')
        self.cast_dtype = torch.bfloat16
        self._guarded = set()

    @contextlib.contextmanager
    def optim_context(self, model):
        if id(model) not in self._guarded:
            guard_convs(model)
            self._guarded.add(id(model))
        with super().optim_context(model), torch.autocast(
                device_type='cpu', dtype=self.cast_dtype):
            yield
