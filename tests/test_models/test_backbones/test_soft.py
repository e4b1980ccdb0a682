"""The SOFT backbone: presets, shapes, blocks, dropouts, init, frozen stages,
norm_eval, NR statistics, with_cp, forward errors."""
import warnings
from unittest import mock

import pytest
import torch
import torch.nn as nn
from conftest import tiny_arch
from mmcv.cnn.bricks import DropPath
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import (ConvPatchEmbed, PyramidStage,
                                          SOFTBlock, SoftmaxAttention,
                                          SoftmaxBlock, SOFTStage,
                                          residual_drop_cfg)
from mmsoft.models.layers.amp import SafeConv2d

pytestmark = pytest.mark.usefixtures('one_thread')

TINY = tiny_arch(num_heads=[1, 1, 2, 2])
ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
ARCH2 = tiny_arch(depths=(1, 2, 2, 1))
# paper Table 3 (IJCV Table 8 for Tiny with conv sampling): classifier params
# and tolerance; the authors' code's small: 38.9M
PAPER_PARAMS = {
    'tiny': (13.07e6, .05), 'small': (24e6, .05), 'medium': (45e6, .05),
    'large': (64e6, .05), 'huge': (87e6, .05), 'small-official': (38.9e6, .01)
}  # yapf: disable


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def quick(arch):
    """SOFT(arch) without nn.Linear's init (10x faster to build)."""
    with mock.patch.object(nn.Linear, 'reset_parameters', lambda self: 0):
        return SOFT(arch)


def _x(h=64, w=96, b=2, seed=0):
    return torch.randn(
        b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def dropouts(module):
    return [
        getattr(m, 'p', getattr(m, 'drop_prob', 0)) for m in module.modules()
        if isinstance(m, (nn.Dropout, DropPath))
    ]


def ffn_parts(blk):  # mmcv FFN: fc1, act, fc2
    return blk.ffn.layers[0][0], blk.ffn.layers[0][1], blk.ffn.layers[1]


@pytest.mark.parametrize('arch', sorted(PAPER_PARAMS))
def test_preset_param_counts(arch):
    model, (want, rtol) = quick(arch), PAPER_PARAMS[arch]
    total = n_params(model) + 512 * 1000 + 1000  # + a 1000-class head
    assert abs(total - want) / want < rtol
    if arch == 'small-official':
        assert model.depths == [1, 3, 20, 4]
        custom = quick(
            tiny_arch((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 20, 4)))
        assert n_params(custom) == n_params(model)
        assert model.stages[3].norm.eps == 1e-6


def test_output_shapes_out_indices_and_cls_token():
    model = SOFT(dict(TINY, num_heads=[1, 1, 1, 1])).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 75, 101))  # odd sizes: ceil(H / 2)
    assert [tuple(o.shape) for o in outs] == [(1, 16, 19, 26), (1, 32, 10, 13),
                                              (1, 32, 5, 7), (1, 64, 3, 4)]
    assert all(torch.isfinite(o).all() for o in outs)
    model = SOFT(TINY, out_indices=(1, -1)).eval()
    assert [o.shape[1] for o in model(torch.randn(1, 3, 64, 64))] == [32, 64]
    assert model.out_channels == [32, 64]
    cls = SOFT(TINY, out_type='cls_token', out_indices=(3, )).eval()
    cls.load_state_dict(model.state_dict())
    with torch.no_grad():
        x = torch.randn(2, 3, 64, 64)
        assert cls(x)[0].shape == (2, 64)
        assert model(x)[-1].shape == (2, 64, 2, 2)


@pytest.mark.parametrize('out_type, out_indices, hw',
                         [('featmap', (0, 1, 2, 3), (37, 53)),
                          ('cls_token', (1, 3), (64, 64))])
def test_empty_batch_returns_empty_outputs(out_type, out_indices, hw):
    model = SOFT(
        tiny_arch([8, 16, 16, 32], [1, 2, 2, 2]),
        out_type=out_type,
        out_indices=out_indices)
    for mode in (False, True):
        model.train(mode)
        empty, one = model(torch.zeros(0, 3,
                                       *hw)), model(torch.zeros(1, 3, *hw))
        assert len(empty) == len(one)
        for e, o in zip(empty, one):
            assert e.shape == (0, ) + o.shape[1:] and e.dtype == o.dtype


@pytest.mark.parametrize('x, error, message', [
    ('(3, 64, 64)', ValueError,
     'SOFT expects (B, C, H, W) images, got shape (3, 64, 64)'),
    ('list', TypeError, 'SOFT expects a (B, C, H, W) tensor, got a list; '
     'stack the images first (torch.stack)')
])
def test_forward_input_errors(x, error, message):
    x = [torch.zeros(3, 32, 32)] if x == 'list' else torch.zeros(3, 64, 64)
    with pytest.raises(error) as e:
        SOFT(ARCH, pretrain_img_size=32)(x)
    assert str(e.value) == message


@pytest.mark.parametrize('stage_cfgs, hw, stage, k',
                         [({}, 8, 2, 2),
                          ([{}, dict(stem=True), {}, {}], 16, 2, 4)])
def test_batch_one_batchnorm_message(stage_cfgs, hw, stage, k):
    """Issue 27: the stage, its 1 x 1 map, the cause and the fixes."""
    model = SOFT(ARCH, pretrain_img_size=32, stage_cfgs=stage_cfgs)
    with pytest.raises(ValueError) as e:
        model.train()(torch.zeros(1, 3, hw, hw))
    assert str(e.value) == (
        f'SOFT stage {stage}: in training mode its patch-embedding BatchNorm '
        f"sees one value per channel (batch size 1, a 1 x 1 map from the "
        f"stage's {k} x {k} input), where batch statistics are undefined. "
        'Train with a batch size >= 2 or larger images, or set norm_eval=True'
        ' (BatchNorm uses its running statistics) or patch_norm_cfg='
        "dict(type='GN', num_groups=1) on the backbone")
    model(torch.randn(2, 3, hw, hw))  # batch 2 trains
    model.eval()(torch.randn(1, 3, hw, hw))  # eval: running statistics


def test_soft_block_and_stage_defaults():
    """SOFT attention, 4 x tanh-GELU MLP, LN 1e-5; rate -> DropPath."""
    blk = SOFTBlock(8, 1, 2)
    assert type(blk.attn).__name__ == 'SOFTAttention'
    assert blk.attn.q.bias is not None and blk.attn.v.bias is not None
    assert blk.attn.dw_conv.kernel_size == (3, 3)
    fc1, act, _ = ffn_parts(blk)
    assert fc1.out_features == 32 and act.approximate == 'tanh'
    assert isinstance(blk.norm1, nn.LayerNorm) and blk.norm1.eps == 1e-5
    assert isinstance(blk.drop, nn.Identity)
    assert all(p == 0 for p in dropouts(blk))  # none in the MLP either
    assert residual_drop_cfg(0.1) == dict(type='DropPath', drop_prob=0.1)
    assert residual_drop_cfg(0.1, 'dropout') == dict(
        type='Dropout', drop_prob=0.1)
    assert residual_drop_cfg(0) is None
    cfg = dict(in_channels=3, pos_grid=4, drop_path_rates=[0.25])
    stage = SOFTStage(8, 1, 1, 2, 3, 4., dict(type='SOFTAttention'), True,
                      **cfg)
    assert isinstance(stage.blocks[0].drop, DropPath)
    assert stage.blocks[0].drop.drop_prob == pytest.approx(0.25)
    stage = PyramidStage(3, 8, pos_grid=4)  # no stem, token, dropout, cp
    assert stage.with_cp is False and isinstance(stage.pos_drop, nn.Identity)
    assert stage.pos_embed.shape == (1, 16, 8)
    fmap, cls = stage(torch.randn(1, 3, 8, 8))
    assert fmap.shape == (1, 8, 4, 4) and cls is None


def test_softmax_block():
    """Pre-norm ViT block (LN 1e-6, exact GELU); where each rate goes."""
    torch.manual_seed(0)
    blk = SoftmaxBlock(8, 2).eval()
    assert blk.norm1.eps == blk.norm2.eps == 1e-6
    fc1, act, fc2 = ffn_parts(blk)
    assert fc1.out_features == 32 and act.approximate == 'none'
    assert blk.attn.q.bias is not None and blk.attn.kv.bias is not None
    attn = SoftmaxAttention(8, 2, qkv_bias=False)
    assert attn.q.bias is None and attn.kv.bias is None
    assert attn.proj.bias is not None
    assert blk.attn.attn_drop == 0 and all(p == 0 for p in dropouts(blk))
    assert isinstance(blk.drop_path, nn.Identity)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        h = x + blk.attn(blk.norm1(x))
        torch.testing.assert_close(blk(x), h + fc2(act(fc1(blk.norm2(h)))))
    blk = SoftmaxBlock(
        8, 2, drop_rate=0.1, attn_drop_rate=0.2, drop_path_rate=0.3)
    assert blk.attn.proj_drop.p == pytest.approx(0.1)
    assert blk.attn.attn_drop == pytest.approx(0.2)
    for drop in (blk.drop_path, blk.ffn.dropout_layer):
        assert isinstance(drop, DropPath)
        assert drop.drop_prob == pytest.approx(0.3)
    assert dropouts(blk.ffn.layers) == pytest.approx([0.1, 0.1])
    assert isinstance(SoftmaxAttention(8, 2).proj_drop, nn.Identity)
    drop = SoftmaxAttention(8, 2, proj_drop=0.5).proj_drop
    assert isinstance(drop, nn.Dropout) and drop.p == 0.5


def test_patch_embed_convs_are_safe_and_build_quietly():
    """``SafeConv2d`` convs; no "Unnecessary conv bias" warning."""
    for stem, n in ((True, 3), (False, 1)):
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            embed = ConvPatchEmbed(3, 8, stem)
        assert len(embed.proj) == n
        for layer in embed.proj:
            assert type(layer.conv) is SafeConv2d
            assert layer.conv.bias is not None


# ---------------------------------------------------------- dropouts
def test_residual_drop_reaches_both_residuals_of_every_soft_block():
    """linspace(0, rate) over the blocks; DropPath or nn.Dropout."""
    for residual_drop, kind in (('drop_path', DropPath), ('dropout',
                                                          nn.Dropout)):
        model = SOFT(
            dict(TINY, depths=[1, 1, 2, 1]),
            drop_path_rate=0.5,
            residual_drop=residual_drop)
        drops = [(b.drop, b.ffn.dropout_layer) for s in model.stages[1:3]
                 for b in s.blocks]
        assert all(isinstance(d, kind) for pair in drops for d in pair)
        assert dropouts(model.stages[1]) == [0.125, 0, 0, 0.125]
        assert isinstance(model.stages[0].blocks[0].drop, nn.Identity)
        assert [dropouts(d)[0] for d, _ in drops] == [.125, .25, .375]
        assert model.stages[3].blocks[0].drop_path.drop_prob == 0.5
    with pytest.raises(ValueError) as e:
        SOFT(TINY, residual_drop='dropblock')
    assert str(e.value) == ("residual_drop must be one of ('drop_path', "
                            "'dropout'), got 'dropblock'")


@pytest.mark.parametrize(
    'opts, out_type', [
        (dict(drop_rate=0.3), 'cls_token'),
        (dict(attn_drop_rate=0.5), 'featmap'),
        (dict(drop_path_rate=0.5), 'cls_token'),
        (dict(drop_path_rate=0.5, residual_drop='dropout'), 'featmap'),
        (dict(attn_cfg=dict(type='SOFTAttention', sampling='random')),
         'featmap'),
    ],
    ids=lambda o: '-'.join(o) if isinstance(o, dict) else o)
def test_eval_is_bitwise_repeatable_with_dropouts(opts, out_type):
    """Issue 30: the option is live in training, off in eval."""
    torch.manual_seed(0)
    model = SOFT(ARCH2, out_type=out_type, **opts)
    model.init_weights()
    x = _x()
    with torch.no_grad():
        t1, t2 = model.train()(x), model(x)
    assert any(not torch.equal(a, b) for a, b in zip(t1, t2)), opts
    model.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        e1 = model(x)
        torch.manual_seed(2)
        e2 = model(x)
    assert all(torch.equal(a, b) for a, b in zip(e1, e2)), opts
    if 'attn_cfg' not in opts:  # equal to the model without the option
        plain = SOFT(ARCH2, out_type=out_type).eval()
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            for a, b in zip(plain(x), e1):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# ------------------------------------------------------------- init
@pytest.mark.parametrize(  # also for a Pretrained init with no checkpoint
    'init_cfg',
    [None, dict(type='Pretrained', checkpoint=None, prefix='backbone.')])
def test_default_init_is_truncated_normal(init_cfg):
    """std 0.02 as the official timm init; the cls token (zeros) too."""
    torch.manual_seed(0)
    model = SOFT(tiny_arch((16, 32, 32, 256), (1, 1, 2, 2)), init_cfg=init_cfg)
    token = model.stages[3].cls_token
    assert token.numel() == 256 and not token.any()
    model.init_weights()
    w = torch.cat([
        m.weight.flatten() for m in model.modules()
        if isinstance(m, nn.Linear)
    ])
    assert 0.018 < w.std() < 0.022
    assert model.stages[0].blocks[0].attn.q.bias.abs().max() == 0
    assert 0.018 < model.stages[0].pos_embed.std() < 0.022
    assert 0.016 < token.detach().std().item() < 0.024
    assert abs(token.detach().mean().item()) < 0.005


# ------------------------------------------- frozen_stages, norm_eval
@pytest.mark.parametrize('k', [-1, 0, 2, 4])
def test_frozen_stages_freezes_the_documented_parameters(k):
    model = SOFT(ARCH2, frozen_stages=k, drop_rate=0.1).train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    stages = tuple(f'stages.{i}.' for i in range(max(k, 0)))
    assert frozen == {  # the frozen_stages docstring's list
        n
        for n, _ in model.named_parameters()
        if n.startswith(stages) or k == 0 and
        (n.startswith('stages.0.patch_embed.') or n == 'stages.0.pos_embed')
    }
    if k == 4:  # stage 4 includes its cls token and final norm
        assert {'stages.3.cls_token', 'stages.3.norm.weight'} <= frozen
    # frozen modules (all of a frozen stage) are in eval mode, others train
    assert [s.patch_embed.training for s in model.stages
            ] == [i >= k and not i == k == 0 for i in range(4)]
    for name, m in model.named_modules():
        params = [f'{name}.{n}' for n, _ in m.named_parameters(recurse=False)]
        if params and not (name.count('.') == 1
                           and name.startswith('stages.')):
            assert m.training != all(p in frozen for p in params), name
        if name.startswith(stages):
            assert not m.training, name
    # the frozen BatchNorms keep their statistics through training steps
    bns = {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm)}
    before = {n: m.running_mean.clone() for n, m in bns.items()}
    with torch.no_grad():
        model(_x())
    for n, m in bns.items():
        moved = not torch.equal(before[n], m.running_mean)
        assert moved == (f'{n}.weight' not in frozen), n
    if k < 4:  # a frozen parameter gets no gradient, the others do
        sum(o.float().sum() for o in model(_x(b=1))).backward()
        for n, p in model.named_parameters():
            assert (p.grad is None) == (n in frozen), n
    if k == 2:  # and it survives train() / eval() calls
        for mode in (True, False, True) * 2:
            model.train(mode)
        assert not model.stages[1].blocks[0].training
        assert not model.stages[1].patch_embed.proj[0].bn.training
        assert model.stages[2].blocks[0].training


@pytest.mark.parametrize('norm_eval', [False, True])
def test_norm_eval(norm_eval):
    model = SOFT(ARCH2, norm_eval=norm_eval).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert len(bns) >= 6  # stem 3 + one per later patch embedding
    assert all(m.training != norm_eval for m in bns)
    # every other module trains (LayerNorms, dropouts, attention)
    assert not [
        n for n, m in model.named_modules()
        if not isinstance(m, _BatchNorm) and not m.training
    ]
    stats = [m.running_var.clone() for m in bns]
    with torch.no_grad():
        model(_x())
    assert all((not torch.equal(s, m.running_var)) != norm_eval
               for s, m in zip(stats, bns))
    assert not any(m.training for m in model.eval().modules())


def test_with_cp_reruns_each_block_in_the_backward():
    """Only with ``with_cp`` (and a gradient); no torch warning."""
    calls = []

    class Count(nn.Module):

        def forward(self, x, hw):
            calls.append(1)
            return x.sin()  # saves x: a checkpoint recomputes it

    stage = PyramidStage(3, 8, pos_grid=4)
    stage.blocks.append(Count())
    for with_cp, runs in ((False, 1), (True, 2)):
        stage.with_cp, calls[:] = with_cp, []
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            stage(torch.randn(1, 3, 8, 8,
                              requires_grad=True))[0].sum().backward()
        assert len(calls) == runs
    with torch.no_grad():
        stage(torch.randn(1, 3, 8, 8))
    assert len(calls) == 3


# ------------------------------------------------------- NR diagnostics
def test_nr_stats_and_set_nr_diagnostics():
    """Per stage the max over matrices; on keeps them, off clears."""
    torch.manual_seed(0)
    model = SOFT(
        tiny_arch((16, 32, 32, 64), (2, 2, 2, 2), (2, 2, 1, 1)),
        attn_cfg=dict(type='SOFTAttention', nr_iters=3)).eval()
    model.set_nr_diagnostics()  # on by default
    attns = [m for m in model.modules() if hasattr(m, 'last_nr_stats')]
    assert attns and all(m.nr_diagnostics for m in attns)
    with torch.no_grad():
        model(_x(64, 96, b=2))
    stats = model.nr_stats()
    assert sorted(stats) == ['stage1', 'stage2', 'stage3']
    for i in range(3):
        per = [
            m.last_nr_stats for m in model.stages[i].modules()
            if hasattr(m, 'last_nr_stats')
        ]
        for key in ('residual', 'unconverged'):
            vals = torch.stack([p[key] for p in per])
            assert vals.shape == (len(per), 2, 2)  # blocks, B, heads
            assert stats[f'stage{i + 1}'][key] == float(vals.max())
        res = torch.stack([p['residual'] for p in per])
        assert len(set(res.flatten().tolist())) > 1  # matrices differ
    model.set_nr_diagnostics(True)
    assert model.nr_stats() == stats
    model.set_nr_diagnostics(False)
    assert not any(m.nr_diagnostics for m in attns)
    assert all(m.last_nr_stats is None for m in attns)
    assert model.nr_stats() == {}
