"""Documented contracts of the attention layers' construction: the NR
inverse's ONNX export path (``'spectral'`` refused with the fix, ``'auto'``
/ ``'iterative'`` the eager values), the bottleneck sampler's argument
checks and bias-free conv, the verdict cache of that conv's CPU
half-precision guard (``SafeConv2d``), SOFT attention's diagnostics flag
and q / v biases, the softmax attention of stage 4 (biases, no dropout by
default) and the cls-token stage's ``drop_rate``."""
import importlib
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.models.backbones.soft import ClsTokenStage, SoftmaxAttention
from mmsoft.models.layers import amp
from mmsoft.models.layers.nr_config import NRConfig
from mmsoft.models.layers.soft_attention import (SAMPLING_MODES,
                                                 BottleneckSampler,
                                                 SOFTAttention,
                                                 gaussian_kernel)

SAFE = importlib.import_module('mmsoft.models.layers.amp')


def _randn(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def _kernel_matrix(m=6, d=4):
    """A (2, m, m) Gaussian kernel of random landmarks (the bottleneck A)
    and a (2, m, 3) right-hand side W."""
    x = _randn(2, m, d, seed=1)
    return gaussian_kernel(x, x), _randn(2, m, 3, seed=2)


# ------------------------------------------------- NR inverse, ONNX export
SPECTRAL_EXPORT_ERROR = (
    "nr_method='spectral' cannot be exported (torch.linalg.eigh has no ONNX "
    "operator); set model.backbone.attn_cfg.nr_method='auto' or 'iterative' "
    '(same function) before exporting')


def test_spectral_method_refused_while_exporting(monkeypatch):
    """``nr_method='spectral'`` while a model is exported: an
    ``ExportError`` whose message says why and names the fix, word for
    word."""
    A, W = _kernel_matrix()
    nr = NRConfig(iters=6, method='spectral')
    nr.apply(A, W)  # fine eagerly
    monkeypatch.setattr(amp, 'is_exporting', lambda: True)
    for call in (lambda: nr.apply(A, W), lambda: nr.inverse(A)):
        with pytest.raises(
                amp.ExportError,
                match='^' + re.escape(SPECTRAL_EXPORT_ERROR) + '$'):
            call()


@pytest.mark.parametrize('method', ['auto', 'iterative'])
def test_auto_and_iterative_export_the_eager_values(monkeypatch, method):
    """While exporting, ``'auto'`` / ``'iterative'`` are accepted (the
    fix the error names) and give A_T W and A_T as in eager mode."""
    A, W = _kernel_matrix()
    nr = NRConfig(iters=6, method=method)
    want_apply, want_inv = nr.apply(A, W), nr.inverse(A)
    monkeypatch.setattr(amp, 'is_exporting', lambda: True)
    got_apply, got_inv = nr.apply(A, W), nr.inverse(A)
    assert got_apply.shape == (2, 6, 3) and got_inv.shape == (2, 6, 6)
    torch.testing.assert_close(got_apply, want_apply, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got_inv, want_inv, rtol=1e-4, atol=1e-5)


# ------------------------------------------------------ bottleneck sampler
def test_sampler_rejects_unknown_mode_by_name():
    """An unknown ``mode``: ``unknown sampling <mode>; choose one of
    SAMPLING_MODES``."""
    with pytest.raises(
            ValueError,
            match='^' + re.escape(f"unknown sampling 'bogus'; choose one of "
                                  f'{SAMPLING_MODES}') + '$'):
        BottleneckSampler(4, 2, mode='bogus')


def test_sampler_rejects_bad_ratio_by_name():
    """``ratio`` must be an int >= 1; the error calls it the sampling
    ratio."""
    with pytest.raises(
            ValueError,
            match=r'^sampling ratio must be an int >= 1, got 0 \(int\)$'):
        BottleneckSampler(4, 0)


def test_sampler_rejects_bad_max_landmarks_by_name():
    """``max_landmarks`` must be an int >= 1 or None; the error names
    ``max_landmarks``."""
    with pytest.raises(
            ValueError,
            match=r'^max_landmarks must be an int >= 1 or None, got 0 '
            r'\(int\)$'):
        BottleneckSampler(4, 2, max_landmarks=0)


def test_sampler_refuses_max_landmarks_with_landmark_hw():
    """``max_landmarks`` and ``landmark_hw`` are exclusive, with this
    exact message."""
    with pytest.raises(
            ValueError,
            match=r'^set either max_landmarks or landmark_hw \(a fixed '
            r'grid\), not both$'):
        BottleneckSampler(4, 2, max_landmarks=4, landmark_hw=(2, 2))


def test_sampler_conv_has_no_bias():
    """The official ``'conv'`` sampler: an r x r conv of stride r without a
    bias, then LayerNorm."""
    sampler = BottleneckSampler(4, 2)
    assert sampler.conv.bias is None
    assert sampler.conv.weight.shape == (4, 4, 2, 2)
    assert sampler.conv.stride == (2, 2)


# ---------------------------------------- the sampler conv's half guard
def _rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def _broken_half(x, w, b, *args):
    """F.conv2d, wrong in half precision (as the AMX bfloat16 kernel)."""
    out = F.conv2d(x, w, b, *args)
    if x.dtype != torch.float32 or torch.is_autocast_enabled('cpu'):
        out = out.flip(-1) * 0.5 + 1.0
    return out


def test_unprobed_conv_under_compile_runs_in_float32(monkeypatch):
    """Under ``torch.compile`` no probe runs and an unprobed half
    configuration runs in float32 (right even where the half kernel is
    wrong)."""
    monkeypatch.setattr(SAFE, '_verdicts', {})
    monkeypatch.setattr(SAFE, 'compiling', lambda: True)
    monkeypatch.setattr(SAFE, '_raw_conv2d', _broken_half)
    torch.manual_seed(0)
    conv = SAFE.SafeConv2d(4, 4, 2, 2, bias=False)
    x = torch.randn(1, 4, 8, 8)
    ref = F.conv2d(x, conv.weight, None, 2)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        out = conv(x)
    assert out.dtype == torch.bfloat16 and SAFE._verdicts == {}
    assert _rel_err(out, ref) < 2e-2


def test_correct_half_verdict_keeps_the_half_kernel(monkeypatch):
    """A configuration probed correct is remembered: later calls run the
    half kernel again (no second probe, no float32 fallback)."""
    calls = []

    def correct_half(x, w, b, *args):
        calls.append(x.dtype)
        with torch.autocast('cpu', enabled=False):
            out = F.conv2d(x.float(), w.float(), None, *args)
        return out.to(x.dtype)

    monkeypatch.setattr(SAFE, '_verdicts', {})
    monkeypatch.setattr(SAFE, '_raw_conv2d', correct_half)
    conv = SAFE.SafeConv2d(4, 4, 2, 2, bias=False).to(torch.bfloat16)
    x = torch.randn(1, 4, 8, 8).to(torch.bfloat16)
    with torch.no_grad():
        conv(x)
        assert list(SAFE._verdicts.values()) == [True]
        calls.clear()
        conv(x)
    assert calls == [torch.bfloat16]


@pytest.mark.parametrize('groups, dilation', [(4, 1), (1, 2)])
def test_float32_fallback_keeps_groups_and_dilation(monkeypatch, groups,
                                                    dilation):
    """A half kernel found wrong runs in float32 with the conv's own
    arguments (grouped / dilated convs give the float32 result)."""
    monkeypatch.setattr(SAFE, '_verdicts', {})
    monkeypatch.setattr(SAFE, '_raw_conv2d', _broken_half)
    torch.manual_seed(0)
    conv = SAFE.SafeConv2d(
        4, 4, 3, padding=dilation, dilation=dilation, groups=groups)
    x = torch.randn(1, 4, 8, 8)
    ref = F.conv2d(x, conv.weight, conv.bias, 1, dilation, dilation, groups)
    with torch.no_grad(), torch.autocast('cpu', dtype=torch.bfloat16):
        with pytest.warns(SAFE.HalfConvWarning):
            out = conv(x)
    assert out.dtype == torch.bfloat16
    assert _rel_err(out, ref) < 2e-2


# ----------------------------------------------------------- SOFT attention
def test_soft_attention_diagnostics_flag_and_stats():
    """``nr_diagnostics``: kept as given; ``last_nr_stats`` is None before
    any forward, and after one a dict of the NR convergence with the flag
    on (None with it off)."""
    x, hw = _randn(1, 16, 8, seed=3), (4, 4)
    attn = SOFTAttention(8, 2, 2, nr=dict(iters=4), nr_diagnostics=True)
    assert attn.nr_diagnostics is True and attn.last_nr_stats is None
    attn(x, hw)
    assert isinstance(attn.last_nr_stats, dict)
    assert 'residual' in attn.last_nr_stats
    off = SOFTAttention(8, 2, 2, nr=dict(iters=4))
    assert off.nr_diagnostics is False and off.last_nr_stats is None
    off(x, hw)
    assert off.last_nr_stats is None


def test_soft_attention_q_v_biases_follow_qkv_bias():
    """``qkv_bias``: the biases of ``q`` and ``v`` (both, or neither)."""
    for qkv_bias in (True, False):
        attn = SOFTAttention(8, 2, 2, qkv_bias=qkv_bias)
        for lin in (attn.q, attn.v):
            assert (lin.bias is not None) is qkv_bias


# --------------------------------------------- softmax attention, stage 4
def test_softmax_attention_defaults_biases_and_no_dropout():
    """Defaults: ``qkv_bias=True`` (q and fused kv have biases),
    ``attn_drop=0.`` and ``proj_drop=0.`` (training mode gives the eval
    values)."""
    attn = SoftmaxAttention(8, 2)
    assert attn.q.bias is not None and attn.kv.bias is not None
    assert attn.attn_drop == 0.
    assert isinstance(attn.proj_drop, nn.Identity)
    x = _randn(2, 5, 8, seed=4)
    want = attn.eval()(x)
    torch.testing.assert_close(attn.train()(x), want)


def test_softmax_attention_without_qkv_bias():
    """``qkv_bias=False``: neither ``q`` nor ``kv`` has a bias (``proj``
    keeps its own)."""
    attn = SoftmaxAttention(8, 2, qkv_bias=False)
    assert attn.q.bias is None and attn.kv.bias is None
    assert attn.proj.bias is not None


def test_softmax_attention_heads_must_divide_dims():
    """``num_heads`` not dividing ``embed_dims``: a ValueError naming
    both."""
    with pytest.raises(
            ValueError,
            match=r'^num_heads \(3\) must divide embed_dims \(8\)$'):
        SoftmaxAttention(8, 3)


# ---------------------------------------------------------- cls-token stage
def _cls_stage(**kwargs):
    return ClsTokenStage(
        embed_dims=8,
        num_heads=2,
        depth=1,
        mlp_ratio=2.,
        qkv_bias=True,
        attn_drop_rate=0.,
        drop_path_rates=[0.],
        in_channels=4,
        pos_grid=2,
        **kwargs)


def test_cls_token_stage_drop_rate_default_and_pass_through():
    """``drop_rate``: default 0. (no position-embedding dropout, none after
    the attention projection); a rate given is the parent stage's
    ``pos_drop`` rate."""
    stage = _cls_stage()
    assert isinstance(stage.pos_drop, nn.Identity)
    assert isinstance(stage.blocks[0].attn.proj_drop, nn.Identity)
    stage = _cls_stage(drop_rate=0.25)
    assert isinstance(stage.pos_drop, nn.Dropout)
    assert stage.pos_drop.p == 0.25
