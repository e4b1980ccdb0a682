"""The pyramid's blocks and stages on their own: defaults, dropout places."""
import logging
import warnings

import pytest
import torch
import torch.nn as nn
from conftest import tiny_arch
from mmcv.cnn.bricks import DropPath
from mmengine.registry import DefaultScope

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import (ConvPatchEmbed, PyramidStage,
                                          SOFTBlock, SoftmaxAttention,
                                          SoftmaxBlock, SOFTStage,
                                          check_norm_cfg, residual_drop_cfg)
from mmsoft.models.layers import SafeConv2d, SOFTAttention

ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))


def dropouts(module):
    """(type name, p) of every dropout-like module, in order."""
    return [(type(m).__name__, getattr(m, 'p', getattr(m, 'drop_prob', 0)))
            for m in module.modules() if isinstance(m, (nn.Dropout, DropPath))]


# --------------------------------------------------------------- SOFTBlock
def test_soft_block_defaults():
    """SOFT attention (q / v bias, 3 x 3 dw conv), 4 x tanh-GELU MLP, LN."""
    blk = SOFTBlock(8, 1, 2)
    assert type(blk.attn).__name__ == 'SOFTAttention'
    assert blk.attn.q.bias is not None and blk.attn.v.bias is not None
    assert blk.attn.dw_conv.kernel_size == (3, 3)
    fc1, act = blk.ffn.layers[0][0], blk.ffn.layers[0][1]
    assert fc1.out_features == 32 and act.approximate == 'tanh'
    assert isinstance(blk.norm1, nn.LayerNorm) and blk.norm1.eps == 1e-5
    assert isinstance(blk.drop, nn.Identity)
    assert all(p == 0 for _, p in dropouts(blk))  # none in the MLP either


def test_residual_drop_cfg_defaults_to_drop_path():
    assert residual_drop_cfg(0.1) == dict(type='DropPath', drop_prob=0.1)
    assert residual_drop_cfg(0.1, 'dropout') == dict(
        type='Dropout', drop_prob=0.1)
    assert residual_drop_cfg(0) is None


@pytest.mark.parametrize('cfg', [dict(eps=1e-6), 'LN'])
def test_norm_cfg_without_a_type_is_refused_by_name(cfg):
    with pytest.raises(
            TypeError,
            match=r'SOFT: norm_cfg must be a dict with a "type" \(e\.g\. '
            r"dict\(type='LN'\)\), got"):
        check_norm_cfg('norm_cfg', cfg)


# ------------------------------------------------------------ SoftmaxBlock
def test_softmax_block_defaults():
    """LN eps 1e-6, exact GELU, 4 x MLP, q / kv bias, no dropout."""
    blk = SoftmaxBlock(8, 2)
    for norm in (blk.norm1, blk.norm2):
        assert isinstance(norm, nn.LayerNorm) and norm.eps == 1e-6
    fc1, act = blk.ffn.layers[0][0], blk.ffn.layers[0][1]
    assert fc1.out_features == 32
    assert isinstance(act, nn.GELU) and act.approximate == 'none'
    assert blk.attn.q.bias is not None and blk.attn.kv.bias is not None
    assert blk.attn.attn_drop == 0
    assert all(p == 0 for _, p in dropouts(blk))
    assert isinstance(blk.drop_path, nn.Identity)


def test_softmax_block_is_pre_norm_with_both_residuals():
    """x += Attn(LN(x)); x += MLP(LN(x))."""
    torch.manual_seed(0)
    blk = SoftmaxBlock(8, 2).eval()
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        h = x + blk.attn(blk.norm1(x))
        fc1, act = blk.ffn.layers[0][0], blk.ffn.layers[0][1]
        fc2 = blk.ffn.layers[1]
        want = h + fc2(act(fc1(blk.norm2(h))))
        torch.testing.assert_close(blk(x), want)


def test_softmax_block_places_each_rate():
    """drop_rate: projection, MLP; attn_drop: weights; drop_path: both."""
    blk = SoftmaxBlock(
        8, 2, drop_rate=0.1, attn_drop_rate=0.2, drop_path_rate=0.3)
    assert isinstance(blk.attn.proj_drop, nn.Dropout)
    assert blk.attn.proj_drop.p == pytest.approx(0.1)
    assert blk.attn.attn_drop == pytest.approx(0.2)
    assert isinstance(blk.drop_path, DropPath)
    assert blk.drop_path.drop_prob == pytest.approx(0.3)
    assert isinstance(blk.ffn.dropout_layer, DropPath)
    assert blk.ffn.dropout_layer.drop_prob == pytest.approx(0.3)
    mlp_drops = [
        m.p for m in blk.ffn.layers.modules() if isinstance(m, nn.Dropout)
    ]
    assert mlp_drops == pytest.approx([0.1, 0.1])


def test_softmax_attention_proj_drop_only_when_positive():
    assert isinstance(SoftmaxAttention(8, 2).proj_drop, nn.Identity)
    drop = SoftmaxAttention(8, 2, proj_drop=0.5).proj_drop
    assert isinstance(drop, nn.Dropout) and drop.p == 0.5


# ------------------------------------------------------------ PyramidStage
def test_pyramid_stage_defaults():
    """No stem, token, position dropout or checkpointing."""
    stage = PyramidStage(3, 8, pos_grid=4)
    assert stage.with_cp is False
    assert isinstance(stage.pos_drop, nn.Identity)
    assert stage.pos_embed.shape == (1, 16, 8)
    fmap, cls = stage(torch.randn(1, 3, 8, 8))
    assert fmap.shape == (1, 8, 4, 4) and cls is None


def test_pyramid_stage_runs_each_block_once_by_default():
    """Once without ``with_cp``, twice with it (the backward re-runs)."""
    calls = []

    class Count(nn.Module):

        def forward(self, x, hw):
            calls.append(1)
            return x.sin()  # saves x: a checkpoint recomputes it

    stage = PyramidStage(3, 8, pos_grid=4)
    stage.blocks.append(Count())
    for with_cp, runs in ((False, 1), (True, 2)):
        stage.with_cp, calls[:] = with_cp, []
        stage(torch.randn(1, 3, 8, 8))[0].sum().backward()
        assert len(calls) == runs


def test_soft_stage_residual_drop_defaults_to_drop_path():
    stage = SOFTStage(
        embed_dims=8,
        num_heads=1,
        depth=1,
        sampling_ratio=2,
        dw_kernel_size=3,
        mlp_ratio=4.,
        attn_cfg=dict(type='SOFTAttention'),
        qkv_bias=True,
        drop_path_rates=[0.25],
        in_channels=3,
        pos_grid=4)
    assert isinstance(stage.blocks[0].drop, DropPath)
    assert stage.blocks[0].drop.drop_prob == pytest.approx(0.25)


# ------------------------------------------------------- SOFT's stage_cfgs
def test_unknown_key_for_all_stages_is_named():
    with pytest.raises(
            ValueError,
            match=r"^SOFT: stage_cfgs has unknown keys \['bogus'\]; no "
            r'stage takes them$'):
        SOFT(ARCH, pretrain_img_size=32, stage_cfgs=dict(bogus=1))


# ------------------------------------------------ attn_cfg -> the attention
def test_attention_is_built_from_the_block_settings_and_attn_cfg():
    """The block's settings, ``attn_cfg`` over them (Swin's merge)."""
    blk = SOFTBlock(8, 2, 2, attn_cfg=dict(type='linformer', num_heads=1))
    assert type(blk.attn).__name__ == 'LinformerAttention'
    assert (blk.attn.embed_dims, blk.attn.num_heads) == (8, 1)
    assert blk.attn.sampling_ratio == 2 and blk.attn.dw_conv.kernel_size == \
        (3, 3)


def test_attn_cfg_without_a_type_is_refused_by_the_registry():
    with pytest.raises(KeyError, match='must contain the key "type"'):
        SOFTBlock(8, 1, 2, attn_cfg=dict(nr_iters=3))


def test_attention_class_as_type_takes_the_nr_keys():
    """``type`` may be the class; ``nr_*`` keys are its arguments."""
    attn = SOFTBlock(
        8, 1, 2, attn_cfg=dict(type=SOFTAttention, nr_iters=3,
                               nr_init='soft')).attn
    assert isinstance(attn, SOFTAttention)
    assert attn.nr.iters == 3 and attn.nr.init == 'soft'


def test_building_under_a_detectors_scope_logs_no_registry_warning():
    """Built in mmsoft's scope: no "Failed to search registry" warning."""
    from conftest import current_log
    with current_log(logging.DEBUG) as records, \
            DefaultScope.overwrite_default_scope('mmdet'):
        SOFTBlock(8, 1, 2, attn_cfg=dict(type='SOFTAttention'))
    assert not [
        r.getMessage() for r in records if r.levelno >= logging.WARNING
    ]


# ---------------------------------------------------------- ConvPatchEmbed
@pytest.mark.parametrize('stem', [True, False])
def test_patch_embed_convs_are_safe_and_build_quietly(stem):
    """``SafeConv2d`` convs; no "Unnecessary conv bias" warning."""
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        embed = ConvPatchEmbed(3, 8, stem)
    layers = list(embed.proj)
    assert len(layers) == (3 if stem else 1)
    for layer in layers:
        assert type(layer.conv) is SafeConv2d
        assert layer.conv.bias is not None
