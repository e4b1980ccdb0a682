"""SOFT's init / forward errors / with_cp, and amp's conv2d / SafeConv2d."""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tiny_arch

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import amp as safe_conv
from mmsoft.models.layers.amp import SafeConv2d, conv2d

ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))


# ------------------------------------------------------------ SOFT.forward
def test_non_tensor_input_error_names_its_type():
    model = SOFT(ARCH, pretrain_img_size=32)
    with pytest.raises(TypeError, match=r'got a list; stack the images'):
        model([torch.zeros(3, 32, 32)])


@pytest.mark.parametrize('stage_cfgs, hw, match', [
    ({}, 4, r"stage 1: .* a 1 x 1 map from the stage's 4 x 4 input"),
    ([{}, dict(stem=True), {}, {}
      ], 16, r"stage 2: .* a 1 x 1 map from the stage's 4 x 4 input"),
    ({}, 8, r"stage 2: .* \(batch size 1, a 1 x 1 map from the stage's "
     r'2 x 2 input\)'),
])
def test_batchnorm_error_reports_the_stages_map(stage_cfgs, hw, match):
    """Batch 1: the stride-4 stem (stage 1, or a stage given it by
    ``stage_cfgs``) or stride-2 embedding's 1 x 1 map is reported."""
    model = SOFT(ARCH, pretrain_img_size=32, stage_cfgs=stage_cfgs)
    with pytest.raises(ValueError, match=match):
        model.train()(torch.zeros(1, 3, hw, hw))


@pytest.mark.parametrize('grid', [0, -2, 1.5])
def test_pos_grid_of_stage_cfgs_is_checked(grid):
    """pos_grid is an int >= 1 (0 crashed in forward, < 0 acted as abs)."""
    with pytest.raises(
            ValueError,
            match=r'SOFT: stage_cfgs\[3\]: pos_grid of stage 4 must be an int '
            r'>= 1, got'):
        SOFT(
            ARCH,
            pretrain_img_size=32,
            stage_cfgs=[{}, {}, {}, dict(pos_grid=grid)])


# ------------------------------------------------ activation checkpointing
def test_with_cp_is_transparent_to_autograd_grad():
    """Same outputs and autograd.grad gradients, no torch warning."""
    torch.manual_seed(0)
    plain = SOFT(ARCH, pretrain_img_size=32).eval()
    ckpt = SOFT(ARCH, pretrain_img_size=32, with_cp=True).eval()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 32, 32)
    got = []
    for model in (plain, ckpt):
        inp = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            outs = model(inp)
            got.append((outs,
                        torch.autograd.grad(
                            sum(o.sum() for o in outs),
                            [inp] + list(model.parameters()),
                            allow_unused=True)))
    (outs_a, ga), (outs_b, gb) = got
    torch.testing.assert_close(outs_a, outs_b)
    assert gb[0] is not None
    assert [a is None for a in ga] == [b is None for b in gb]
    torch.testing.assert_close([a for a in ga if a is not None],
                               [b for b in gb if b is not None],
                               rtol=1e-4,
                               atol=1e-5)


# ---------------------------------------------------------------- conv2d
def test_conv2d_defaults_are_f_conv2ds():
    """``conv2d(x, w)`` is ``F.conv2d(x, w)``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 7, 7, generator=g)
    w = torch.randn(4, 4, 3, 3, generator=g)
    torch.testing.assert_close(conv2d(x, w), F.conv2d(x, w))


@pytest.mark.parametrize('padding', ['same', 'valid', [1, 2], (2, 0), 1])
def test_conv2d_half_path_any_padding(monkeypatch, padding):
    """The CPU half path takes F.conv2d's paddings and gives its result."""
    monkeypatch.setattr(safe_conv, '_verdicts', {})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, 8, generator=g).bfloat16()
    w = (torch.randn(4, 4, 3, 3, generator=g) / 6).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', safe_conv.HalfConvWarning)
        out = conv2d(x, w, None, 1, padding)
    ref = F.conv2d(x.float(), w.float(), None, 1, padding)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


# ------------------------------------------------------------ SafeConv2d
@pytest.mark.parametrize('kwargs', [
    dict(dilation=2),
    dict(groups=2),
    dict(dilation=(2, 1), groups=4, padding='same'),
    dict(padding_mode='reflect', padding=1),
    dict(padding_mode='circular', padding=(1, 2)),
    dict(padding_mode='replicate', padding=1, dilation=2, groups=2),
])
def test_safe_conv2d_equals_nn_conv2d(kwargs):
    """Any dilation, groups, padding mode (float32)."""
    torch.manual_seed(0)
    ref = nn.Conv2d(4, 4, 3, **kwargs)
    nn.init.normal_(ref.bias)
    safe = SafeConv2d(4, 4, 3, **kwargs)
    safe.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(safe(x), ref(x))


# ------------------------------------------------------------ init_weights
def test_init_weights_cls_token_is_trunc_normal_002():
    """The cls token, created as zeros, is trunc-normal(0.02) after init."""
    torch.manual_seed(0)
    model = SOFT(tiny_arch(embed_dims=(16, 32, 32, 256)))
    token = model.stages[3].cls_token
    assert token.numel() == 256 and not token.any()
    model.init_weights()
    std = token.detach().std().item()
    assert 0.016 < std < 0.024, std
    assert abs(token.detach().mean().item()) < 0.005
