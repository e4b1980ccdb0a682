"""Contracts of the SOFT backbone's init (the class token) and forward
(type / BatchNorm errors, stage_cfgs checks, activation checkpointing), and
of :mod:`mmsoft.models.layers.amp` (``conv2d`` / ``SafeConv2d``
equal torch's convolution)."""
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
    """A list of images is a TypeError naming the type it got."""
    model = SOFT(ARCH, pretrain_img_size=32)
    with pytest.raises(TypeError, match=r'got a list; stack the images'):
        model([torch.zeros(3, 32, 32)])


def test_batchnorm_error_reports_the_stride_4_stem_map():
    """Stage 1's stem has stride 4: batch 1 of a 4 x 4 image gives its
    patch-embedding BatchNorm a 1 x 1 map, which the error reports."""
    model = SOFT(ARCH, pretrain_img_size=32).train()
    with pytest.raises(
            ValueError,
            match=r"stage 1: .* a 1 x 1 map from the stage's "
            r'4 x 4 input'):
        model(torch.zeros(1, 3, 4, 4))


def test_batchnorm_error_reports_a_later_stems_map():
    """A stage given the stride-4 stem by ``stage_cfgs`` reports its own
    map: stage 2 of a 16 x 16 image gets a 4 x 4 input and, with the stem,
    a 1 x 1 map (not 2 x 2, the stride-2 embedding's)."""
    model = SOFT(
        ARCH, pretrain_img_size=32, stage_cfgs=[{},
                                                dict(stem=True), {}, {}])
    with pytest.raises(
            ValueError,
            match=r"stage 2: .* a 1 x 1 map from the stage's "
            r'4 x 4 input'):
        model.train()(torch.zeros(1, 3, 16, 16))


def test_batchnorm_error_reports_a_stride_2_stages_map():
    """Stage 2 (stride 2, no stem) of an 8 x 8 image gets a 2 x 2 input
    and makes the 1 x 1 map of batch 1."""
    model = SOFT(ARCH, pretrain_img_size=32)
    with pytest.raises(
            ValueError,
            match=r"stage 2: .* \(batch size 1, a 1 x 1 map from the "
            r"stage's 2 x 2 input\)"):
        model.train()(torch.zeros(1, 3, 8, 8))


@pytest.mark.parametrize('grid', [0, -2, 1.5])
def test_pos_grid_of_stage_cfgs_is_checked(grid):
    """``stage_cfgs``' pos_grid (the position embedding's side) is an int
    >= 1, refused by name otherwise (0 crashed in forward, a negative one
    acted as its absolute value)."""
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
    """``with_cp`` checkpoints the blocks without changing results: the
    same outputs and ``torch.autograd.grad`` gradients (parameters and
    input) as without it, and no torch warning."""
    torch.manual_seed(0)
    plain = SOFT(ARCH, pretrain_img_size=32).eval()
    ckpt = SOFT(ARCH, pretrain_img_size=32, with_cp=True).eval()
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 32, 32)
    grads = []
    for model in (plain, ckpt):
        inp = x.clone().requires_grad_()
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            outs = model(inp)
            params = [inp] + list(model.parameters())
            grads.append((outs,
                          torch.autograd.grad(
                              sum(o.sum() for o in outs),
                              params,
                              allow_unused=True)))
    (outs_a, ga), (outs_b, gb) = grads
    for a, b in zip(outs_a, outs_b):
        torch.testing.assert_close(a, b)
    assert gb[0] is not None
    for a, b in zip(ga, gb):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# ---------------------------------------------------------------- conv2d
def test_conv2d_defaults_are_f_conv2ds():
    """``conv2d(x, w)`` is ``F.conv2d(x, w)``: stride 1, padding 0,
    dilation 1, groups 1 by default."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 7, 7, generator=g)
    w = torch.randn(4, 4, 3, 3, generator=g)
    torch.testing.assert_close(conv2d(x, w), F.conv2d(x, w))


@pytest.mark.parametrize('padding', ['same', 'valid', [1, 2], (2, 0), 1])
def test_conv2d_half_path_any_padding(monkeypatch, padding):
    """The probed CPU half-precision path takes every padding F.conv2d
    takes (str, int, tuple, list) and returns F.conv2d's result."""
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
    """``SafeConv2d`` gives ``nn.Conv2d``'s results for the same
    parameters (float32; any dilation, groups, padding mode)."""
    torch.manual_seed(0)
    ref = nn.Conv2d(4, 4, 3, **kwargs)
    nn.init.normal_(ref.bias)
    safe = SafeConv2d(4, 4, 3, **kwargs)
    safe.load_state_dict(ref.state_dict())
    x = torch.randn(2, 4, 9, 9)
    torch.testing.assert_close(safe(x), ref(x))


# ------------------------------------------------------------ init_weights
def test_init_weights_cls_token_is_trunc_normal_002():
    """The official init: the ClsTokenStage's cls token (created as zeros)
    is drawn from a truncated normal with std 0.02 by ``init_weights``."""
    torch.manual_seed(0)
    model = SOFT(tiny_arch(embed_dims=(16, 32, 32, 256)))
    token = model.stages[3].cls_token
    assert token.numel() == 256 and not token.any()
    model.init_weights()
    std = token.detach().std().item()
    assert 0.016 < std < 0.024, std
    assert abs(token.detach().mean().item()) < 0.005
