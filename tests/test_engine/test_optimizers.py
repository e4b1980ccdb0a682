"""mmsoft's optim wrappers (``mmsoft.engine.optimizers``)."""
import pytest
import torch
from mmengine.registry import OPTIM_WRAPPERS

from mmsoft.engine.optimizers import CPUAmpOptimWrapper


def test_cpu_amp_optim_wrapper_is_registered_and_autocasts():
    """Registered in mmengine's root OPTIM_WRAPPERS; bfloat16 CPU autocast
    only."""
    assert OPTIM_WRAPPERS.get('CPUAmpOptimWrapper') is CPUAmpOptimWrapper
    model = torch.nn.Linear(4, 2)
    sgd = dict(type='SGD', lr=0.1)
    from mmengine.optim import build_optim_wrapper
    wrapper = build_optim_wrapper(
        model, dict(type='CPUAmpOptimWrapper', optimizer=sgd))
    assert type(wrapper) is CPUAmpOptimWrapper
    x = torch.randn(3, 4)
    with wrapper.optim_context(model):
        assert model(x).dtype == torch.bfloat16
    assert model(x).dtype == torch.float32
    with pytest.raises(ValueError, match='only bfloat16'):
        CPUAmpOptimWrapper(
            dtype='float16',
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1))


def test_cpu_amp_optim_wrapper_casts_to_bfloat16_whatever_the_outer_dtype():
    """bfloat16, whatever an enclosing CPU autocast's dtype."""
    model = torch.nn.Linear(4, 2)
    wrapper = CPUAmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert wrapper.cast_dtype is torch.bfloat16
    x = torch.randn(3, 4)
    with torch.autocast('cpu', dtype=torch.float16):
        with wrapper.optim_context(model):
            assert model(x).dtype == torch.bfloat16
