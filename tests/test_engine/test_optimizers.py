"""mmsoft's optim wrappers (``mmsoft.engine.optimizers``)."""
import pytest
import torch
from mmengine.optim import build_optim_wrapper
from mmengine.registry import OPTIM_WRAPPERS

from mmsoft.engine.optimizers import CPUAmpOptimWrapper
from mmsoft.utils.safe_load import torch_version


def test_cpu_amp_optim_wrapper_is_registered_and_autocasts():
    """Registered; bfloat16 CPU autocast only, whatever encloses it."""
    assert OPTIM_WRAPPERS.get('CPUAmpOptimWrapper') is CPUAmpOptimWrapper
    model, x = torch.nn.Linear(4, 2), torch.randn(3, 4)
    wrapper = build_optim_wrapper(
        model,
        dict(type='CPUAmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1)))
    assert type(wrapper) is CPUAmpOptimWrapper
    assert wrapper.cast_dtype is torch.bfloat16
    with wrapper.optim_context(model):
        assert model(x).dtype == torch.bfloat16
    assert model(x).dtype == torch.float32
    # float16 CPU autocast from torch 2.4 (before: bfloat16 only)
    outer = dict(dtype=torch.float16) if torch_version() >= (2, 4) else dict(
        dtype=torch.bfloat16, enabled=False)
    with torch.autocast('cpu', **outer), wrapper.optim_context(model):
        assert model(x).dtype == torch.bfloat16
    with pytest.raises(ValueError, match='only bfloat16'):
        CPUAmpOptimWrapper(
            dtype='float16',
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
