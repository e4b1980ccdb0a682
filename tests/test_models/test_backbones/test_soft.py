"""The SOFT backbone: presets, shapes, blocks, dropouts, init, frozen stages,
norm_eval, NR statistics, with_cp, forward errors; amp's convs."""
import copy
import types
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import tiny_arch
from mmcv.cnn.bricks import DropPath
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import (ConvPatchEmbed, PyramidStage,
                                          SOFTBlock, SoftmaxAttention,
                                          SoftmaxBlock, SOFTStage,
                                          residual_drop_cfg)
from mmsoft.models.layers import SOFTAttention
from mmsoft.models.layers import amp as safe_conv
from mmsoft.models.layers.amp import SafeConv2d, conv2d
from mmsoft.models.layers.nr_autograd import SPECTRAL_MIN_M

pytestmark = pytest.mark.usefixtures('one_thread')

TINY = tiny_arch(num_heads=[1, 1, 2, 2])
ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
ARCH2 = tiny_arch(depths=(1, 2, 2, 1))
# paper Table 3 (IJCV Table 8 for Tiny with conv sampling): classifier params
PAPER_PARAMS = dict(
    tiny=13.07e6, small=24e6, medium=45e6, large=64e6, huge=87e6)


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def _x(h=64, w=96, b=2, seed=0):
    return torch.randn(
        b, 3, h, w, generator=torch.Generator().manual_seed(seed))


def dropouts(module):
    """(type name, p) of every dropout-like module, in order."""
    return [(type(m).__name__, getattr(m, 'p', getattr(m, 'drop_prob', 0)))
            for m in module.modules() if isinstance(m, (nn.Dropout, DropPath))]


def ffn_parts(blk):  # mmcv FFN: fc1, act, fc2
    return blk.ffn.layers[0][0], blk.ffn.layers[0][1], blk.ffn.layers[1]


# ------------------------------------------------------ presets, shapes
@pytest.mark.parametrize('arch', sorted(PAPER_PARAMS))
def test_preset_param_counts_and_shapes(arch):
    head = 512 * 1000 + 1000  # the 1000-class linear head on the cls token
    total = n_params(SOFT(arch)) + head
    assert abs(total - PAPER_PARAMS[arch]) / PAPER_PARAMS[arch] < 0.05
    a = copy.deepcopy(SOFT.arch_zoo[arch])
    a['depths'] = [1, 1, 1, 1]  # the preset's widths / heads, for speed
    model = SOFT(a).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 96, 128))
    dims = SOFT.arch_zoo[arch]['embed_dims']
    assert [tuple(o.shape) for o in outs] == [
        (1, d, 96 // s, 128 // s) for d, s in zip(dims, (4, 8, 16, 32))
    ]
    assert model.out_channels == dims


def test_official_small_and_block_details():
    model = SOFT('small-official')
    assert model.depths == [1, 3, 20, 4]
    assert abs(n_params(model) + 513000 - 38.9e6) / 38.9e6 < 0.01
    custom = SOFT(
        tiny_arch((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 20, 4)))
    assert n_params(custom) == n_params(model)
    model = SOFT('tiny')
    blk = model.stages[0].blocks[0]
    assert isinstance(blk, SOFTBlock)
    assert isinstance(model.stages[3].blocks[0], SoftmaxBlock)
    fc1, act, _ = ffn_parts(blk)
    assert fc1.out_features == 4 * 64  # e = 4 (Table 2 text)
    assert isinstance(act, nn.GELU) and act.approximate == 'tanh'
    assert blk.norm1.eps == blk.norm2.eps == 1e-5
    last = model.stages[3]
    assert ffn_parts(last.blocks[0])[1].approximate == 'none'
    assert last.blocks[0].norm1.eps == last.norm.eps == 1e-6
    blocks = [s.blocks[0] for s in model.stages[:3]]
    assert [b.attn.dw_conv.kernel_size[0] for b in blocks] == [9, 5, 3]
    assert [b.attn.sampler.ratio for b in blocks] == [8, 4, 2]
    assert [tuple(s.pos_embed.shape) for s in model.stages] == [(1, 3136, 64),
                                                                (1, 784, 128),
                                                                (1, 196, 320),
                                                                (1, 50, 512)]
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 224, 224))
    # m = 49 bottleneck tokens at 224 x 224 in every SOFT stage
    for i, hw in enumerate([(56, 56), (28, 28), (14, 14)]):
        q = torch.randn(1, 1, hw[0] * hw[1], blocks[i].attn.head_dims)
        assert blocks[i].attn.sampler(q, hw).shape[2] == 49


@pytest.mark.parametrize('size', [(333, 500), (800, 1333), (37, 45)])
def test_non_divisible_input_sizes(size):
    model = SOFT(dict(TINY, num_heads=[1, 1, 1, 1])).eval()
    H, W = size
    with torch.no_grad():
        outs = model(torch.randn(1, 3, H, W))
    for i, o in enumerate(outs):
        h, w = H, W
        for _ in range(i + 2):
            h, w = (h + 1) // 2, (w + 1) // 2
        assert tuple(o.shape[2:]) == (h, w) and torch.isfinite(o).all()


def test_cls_token_output_and_out_indices():
    model = SOFT(TINY, out_type='cls_token', out_indices=(3, )).eval()
    assert model(torch.randn(2, 3, 64, 64))[0].shape == (2, 64)
    model2 = SOFT(TINY, out_type='featmap').eval()
    model2.load_state_dict(model.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 64, 64)
        assert model(x)[0].shape == (1, 64)
        assert model2(x)[-1].shape == (1, 64, 2, 2)
    model = SOFT(TINY, out_indices=(1, -1)).eval()
    assert [o.shape[1] for o in model(torch.randn(1, 3, 64, 64))] == [32, 64]
    assert model.out_channels == [32, 64]


@pytest.mark.parametrize('out_type, out_indices', [('featmap', (0, 1, 2, 3)),
                                                   ('cls_token', (1, 3)),
                                                   ('featmap', (2, ))])
@pytest.mark.parametrize('hw', [(64, 64), (37, 53)])
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


@pytest.mark.parametrize('x, error, match', [
    (torch.randn(3, 64, 64), ValueError, 'B, C, H, W'),
    ([torch.zeros(3, 32, 32)], TypeError, 'got a list; stack the images')
])
def test_forward_input_errors(x, error, match):
    with pytest.raises(error, match=match):
        SOFT(ARCH, pretrain_img_size=32)(x)


@pytest.mark.parametrize(
    'stage_cfgs, hw, stage, k',
    [
        ({}, 32, 4, 2),
        ({}, 4, 1, 4),
        ({}, 8, 2, 2),  # stage 1: stride-4 stem
        ([{}, dict(stem=True), {}, {}], 16, 2, 4)
    ])  # a stem given by stage_cfgs
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


def test_batch_independence():
    for attn_norm in (True, False):
        torch.manual_seed(0)
        model = SOFT(
            TINY, attn_cfg=dict(type='SOFTAttention',
                                attn_norm=attn_norm)).eval()
        x = torch.randn(4, 3, 64, 64)
        x[1:] *= 30  # very different samples in the same batch
        with torch.no_grad():
            for b, s in zip(model(x), model(x[:1])):
                torch.testing.assert_close(b[:1], s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_autocast_finite(dtype):
    model = SOFT(TINY)
    with torch.autocast('cpu', dtype=dtype):
        outs = model(torch.randn(2, 3, 64, 64) * 50)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    sum(o.float().mean() for o in outs).backward()
    assert all(
        torch.isfinite(p.grad).all() for p in model.parameters()
        if p.grad is not None)


def test_max_landmarks_backbone():
    arch = dict(TINY, num_heads=[1, 1, 1, 1])
    torch.manual_seed(0)
    plain = SOFT(arch).eval()
    capped = SOFT(arch, attn_cfg=dict(type='soft', max_landmarks=16)).eval()
    capped.load_state_dict(plain.state_dict())
    x = torch.randn(1, 3, 128, 128)  # m = 16 in every SOFT stage: no change
    with torch.no_grad():
        for a, b in zip(plain(x), capped(x)):
            torch.testing.assert_close(a, b)
    for i, hw in enumerate([(100, 150), (50, 75), (25, 38)]):
        attn = capped.stages[i].blocks[0].attn
        q = torch.randn(1, 1, hw[0] * hw[1], attn.head_dims)
        assert attn.sampler(q, hw).shape[2] <= 16


@pytest.mark.parametrize('attn_norm', [True, False])
def test_fast_path_equals_reference_nr_end_to_end(attn_norm):
    """m = 100: 'auto' (spectral) == iterative NR (issue #8 tolerances)."""
    torch.manual_seed(0)
    fast = SOFT(TINY, attn_cfg=dict(type='soft', attn_norm=attn_norm))
    ref = SOFT(
        TINY,
        attn_cfg=dict(type='soft', attn_norm=attn_norm, nr_method='iterative'))
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(1, 3, 320, 320)  # 10 x 10 landmarks in stages 1-3
    assert 100 >= SPECTRAL_MIN_M
    assert all(a.nr_method == 'auto' for a in fast.modules()
               if isinstance(a, SOFTAttention))
    for dtype, tol in ((torch.float32, 1e-4), (torch.float64, 1e-9)):
        outs, grads = [], []
        for model in (fast, ref):
            model.to(dtype).train()
            model.zero_grad()
            out = model(x.to(dtype))
            sum((o * torch.linspace(-1, 1, o.numel(), dtype=dtype).view_as(o)
                 ).sum() for o in out).backward()
            outs.append(out)
            grads.append(
                torch.cat([p.grad.flatten() for p in model.parameters()]))
        for a, b in zip(*outs):
            assert ((a - b).abs().max() / b.abs().max()) < tol
        assert ((grads[0] - grads[1]).abs().max() / grads[1].abs().max()) < tol


# ------------------------------------------------------ blocks and stages
def test_soft_block_and_stage_defaults():
    """SOFT attention (q / v bias, 3 x 3 dw conv), 4 x tanh-GELU MLP, LN;
    drop_path_rate -> DropPath unless residual_drop says dropout."""
    blk = SOFTBlock(8, 1, 2)
    assert type(blk.attn).__name__ == 'SOFTAttention'
    assert blk.attn.q.bias is not None and blk.attn.v.bias is not None
    assert blk.attn.dw_conv.kernel_size == (3, 3)
    fc1, act, _ = ffn_parts(blk)
    assert fc1.out_features == 32 and act.approximate == 'tanh'
    assert isinstance(blk.norm1, nn.LayerNorm) and blk.norm1.eps == 1e-5
    assert isinstance(blk.drop, nn.Identity)
    assert all(p == 0 for _, p in dropouts(blk))  # none in the MLP either
    assert residual_drop_cfg(0.1) == dict(type='DropPath', drop_prob=0.1)
    assert residual_drop_cfg(0.1, 'dropout') == dict(
        type='Dropout', drop_prob=0.1)
    assert residual_drop_cfg(0) is None
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
    stage = PyramidStage(3, 8, pos_grid=4)  # no stem, token, dropout, cp
    assert stage.with_cp is False and isinstance(stage.pos_drop, nn.Identity)
    assert stage.pos_embed.shape == (1, 16, 8)
    fmap, cls = stage(torch.randn(1, 3, 8, 8))
    assert fmap.shape == (1, 8, 4, 4) and cls is None


def test_softmax_block():
    """Pre-norm x += Attn(LN(x)); x += MLP(LN(x)); LN eps 1e-6, exact GELU,
    4 x MLP, q / kv bias, no dropout; drop_rate: projection, MLP;
    attn_drop: weights; drop_path: both residuals."""
    torch.manual_seed(0)
    blk = SoftmaxBlock(8, 2).eval()
    for norm in (blk.norm1, blk.norm2):
        assert isinstance(norm, nn.LayerNorm) and norm.eps == 1e-6
    fc1, act, fc2 = ffn_parts(blk)
    assert fc1.out_features == 32
    assert isinstance(act, nn.GELU) and act.approximate == 'none'
    assert blk.attn.q.bias is not None and blk.attn.kv.bias is not None
    assert blk.attn.attn_drop == 0 and all(p == 0 for _, p in dropouts(blk))
    assert isinstance(blk.drop_path, nn.Identity)
    x = torch.randn(2, 5, 8)
    with torch.no_grad():
        h = x + blk.attn(blk.norm1(x))
        torch.testing.assert_close(blk(x), h + fc2(act(fc1(blk.norm2(h)))))
    blk = SoftmaxBlock(
        8, 2, drop_rate=0.1, attn_drop_rate=0.2, drop_path_rate=0.3)
    assert isinstance(blk.attn.proj_drop, nn.Dropout)
    assert blk.attn.proj_drop.p == pytest.approx(0.1)
    assert blk.attn.attn_drop == pytest.approx(0.2)
    for drop in (blk.drop_path, blk.ffn.dropout_layer):
        assert isinstance(drop, DropPath)
        assert drop.drop_prob == pytest.approx(0.3)
    assert [
        m.p for m in blk.ffn.layers.modules() if isinstance(m, nn.Dropout)
    ] == pytest.approx([0.1, 0.1])
    assert isinstance(SoftmaxAttention(8, 2).proj_drop, nn.Identity)
    drop = SoftmaxAttention(8, 2, proj_drop=0.5).proj_drop
    assert isinstance(drop, nn.Dropout) and drop.p == 0.5


@pytest.mark.parametrize('stem', [True, False])
def test_patch_embed_convs_are_safe_and_build_quietly(stem):
    """``SafeConv2d`` convs; no "Unnecessary conv bias" warning."""
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        embed = ConvPatchEmbed(3, 8, stem)
    assert len(embed.proj) == (3 if stem else 1)
    for layer in embed.proj:
        assert type(layer.conv) is SafeConv2d and layer.conv.bias is not None


# ---------------------------------------------------------- dropouts
def test_drop_path_rate_schedule():
    model = SOFT(dict(TINY, depths=[1, 1, 1, 2]), drop_path_rate=0.3)
    assert isinstance(model.stages[0].blocks[0].drop, nn.Identity)
    assert model.stages[3].blocks[1].drop_path.drop_prob == pytest.approx(0.3)
    rates = [b.drop.drop_prob for s in model.stages[1:3] for b in s.blocks]
    assert rates == pytest.approx([0.075, 0.15])  # linspace(0, .3, 5)


@pytest.mark.parametrize('residual_drop', [None, 'drop_path', 'dropout'])
def test_drop_path_rate_means_stochastic_depth(residual_drop):
    """Whole branches of a sample by default; 'dropout' element-wise."""
    kw = {} if residual_drop is None else dict(residual_drop=residual_drop)
    model = SOFT(dict(TINY, depths=[1, 1, 2, 1]), drop_path_rate=0.5, **kw)
    model.train()
    drops = [(b.drop, b.ffn.dropout_layer) for s in model.stages[:3]
             for b in s.blocks if not isinstance(b.drop, nn.Identity)]
    assert len(drops) == 3
    torch.manual_seed(0)
    x = torch.ones(64, 49, 16)
    for drop in (d for pair in drops for d in pair):
        y = drop(x)
        keep = 1 - getattr(drop, 'drop_prob', getattr(drop, 'p', None))
        vals = y.unique().tolist()
        assert len(vals) == 2 and vals[0] == 0
        assert vals[1] == pytest.approx(1 / keep)
        per_sample = y.flatten(1).std(1)  # 'dropout': element-wise
        assert ((per_sample > 0) if residual_drop == 'dropout' else
                (per_sample == 0)).all()
    with pytest.raises(ValueError, match='residual_drop must be one of'):
        SOFT(TINY, residual_drop='dropblock')


@pytest.mark.parametrize(
    'opts', [
        dict(drop_rate=0.3),
        dict(attn_drop_rate=0.5),
        dict(drop_path_rate=0.5),
        dict(drop_path_rate=0.5, residual_drop='dropout'),
        dict(attn_cfg=dict(type='SOFTAttention', sampling='random')),
    ],
    ids=lambda o: '-'.join(o))
@pytest.mark.parametrize('out_type', ['featmap', 'cls_token'])
def test_eval_is_bitwise_repeatable_with_dropouts(opts, out_type):
    """Issue 30: the option is live in training, off in eval."""
    torch.manual_seed(0)
    model = SOFT(ARCH2, out_type=out_type, **opts)
    model.init_weights()
    x = _x()
    model.train()
    with torch.no_grad():
        t1, t2 = model(x), model(x)
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
    """std 0.02 as the official timm init (bounds +-2 absolute); the cls
    token, created as zeros, too."""
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


def test_classifier_checkpoint_loads_through_init_cfg(tmp_path):
    """A classifier file (the backbone under ``backbone.``, a head)."""
    src = SOFT(ARCH)
    src.init_weights()
    sd = {'backbone.' + k: v for k, v in src.state_dict().items()}
    sd['head.fc.weight'] = torch.zeros(3, ARCH['embed_dims'][-1])
    torch.save({'state_dict': sd, 'meta': {}}, tmp_path / 'cls.pth')
    model = SOFT(
        ARCH,
        init_cfg=dict(
            type='Pretrained',
            prefix='backbone.',
            checkpoint=str(tmp_path / 'cls.pth')))
    model.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


# ------------------------------------------- frozen_stages, norm_eval
def documented_frozen(model, k):
    """The parameter names the ``frozen_stages`` docstring lists."""
    names = [n for n, _ in model.named_parameters()]
    if k == 0:
        return {
            n
            for n in names if n.startswith('stages.0.patch_embed.')
            or n == 'stages.0.pos_embed'
        }
    return {
        n
        for n in names
        if n.startswith(tuple(f'stages.{i}.' for i in range(max(k, 0))))
    }


@pytest.mark.parametrize('k', [-1, 0, 1, 2, 3, 4])
def test_frozen_stages_freezes_the_documented_parameters(k):
    model = SOFT(ARCH2, frozen_stages=k, drop_rate=0.1).train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == documented_frozen(model, k)
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
        if any(name.startswith(f'stages.{i}.') for i in range(max(k, 0))):
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


# ------------------------------------------------- activation checkpointing
def test_with_cp_is_transparent_to_autograd():
    """Same outputs, input and parameter gradients (train mode), no torch
    warning; the backward re-runs each block once more."""
    torch.manual_seed(0)
    plain = SOFT(TINY)
    ckpt = SOFT(TINY, with_cp=True)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(2, 3, 64, 64)
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


# ------------------------------------------------------- NR diagnostics
def _nr_model(forward=False):
    torch.manual_seed(0)
    model = SOFT(
        tiny_arch((16, 32, 32, 64), (2, 2, 2, 2), (2, 2, 1, 1)),
        attn_cfg=dict(type='SOFTAttention', nr_iters=3))
    model.init_weights()
    if forward:
        model.eval().set_nr_diagnostics(True)
        with torch.no_grad():
            model(_x(64, 96, b=2))
    return model.eval()


def _soft_attns(module):
    return [m for m in module.modules() if hasattr(m, 'last_nr_stats')]


def test_nr_stats_per_matrix_and_their_maximum():
    """``last_nr_stats``: one value per matrix; ``nr_stats``: the stage max,
    also of crafted maxima in another sample / head / block; the hook logs
    per stage the largest over the backbones."""
    from mmengine.logging import MessageHub

    from mmsoft.engine.hooks import NRResidualHook
    model = _nr_model(forward=True)
    stats = model.nr_stats()
    assert sorted(stats) == ['stage1', 'stage2', 'stage3']
    for i in range(3):
        per = [m.last_nr_stats for m in _soft_attns(model.stages[i])]
        for key in ('residual', 'unconverged'):
            vals = torch.stack([p[key] for p in per])
            assert vals.shape == (len(per), 2, 2)  # blocks, B, heads
            assert stats[f'stage{i + 1}'][key] == float(vals.max())
        res = torch.stack([p['residual'] for p in per])
        assert len(set(res.flatten().tolist())) > 1  # matrices differ
    where = {0: (1, 0, 1), 1: (0, 1, 1), 2: (0, 1, 0)}  # block, sample, head
    for i, (blk, b, h) in where.items():
        attns = _soft_attns(model.stages[i])
        for j, m in enumerate(attns):
            res, unc = torch.full((2, 2), 0.01 * (i + 1)), torch.zeros(2, 2)
            if j == blk % len(attns):
                res[b, h], unc[b, h] = 0.1 * (i + 1), 0.25 * (i + 1)
            m.last_nr_stats = dict(residual=res, unconverged=unc)
    stats = model.nr_stats()
    for i in range(3):
        assert stats[f'stage{i + 1}'] == pytest.approx(
            dict(residual=0.1 * (i + 1), unconverged=0.25 * (i + 1)))
    other = _nr_model()
    other.set_nr_diagnostics(True)
    for i in range(3):
        for m in _soft_attns(other.stages[i]):
            m.last_nr_stats = dict(
                residual=torch.full((2, 2), 0.05 if i != 1 else 0.9),
                unconverged=torch.zeros(2, 2))
    hook = NRResidualHook(interval=1, warn_unconverged=None)
    hub = MessageHub.get_instance('test_soft_nr_hook')
    net = nn.Module()
    net.a, net.b = model, other
    hook._backbones = [model, other]
    hook.after_train_iter(
        types.SimpleNamespace(model=net, message_hub=hub, iter=0), 0)
    got = {
        s: hub.get_scalar(f'train/nr_residual_s{s}').current()
        for s in '123'
    }
    assert got == pytest.approx({'1': 0.1, '2': 0.9, '3': 0.3})
    assert hub.get_scalar('train/nr_unconverged_s3').current() == \
        pytest.approx(0.75)


def test_set_nr_diagnostics_switches_on_by_default_and_off_clears():
    """On by default, on again keeps the stats, off drops them."""
    model = _nr_model()
    model.set_nr_diagnostics()
    attns = _soft_attns(model)
    assert attns and all(m.nr_diagnostics for m in attns)
    with torch.no_grad():
        model(_x(64, 96, b=1))
    stats = model.nr_stats()
    assert sorted(stats) == ['stage1', 'stage2', 'stage3']
    model.set_nr_diagnostics(True)
    assert model.nr_stats() == stats
    model.set_nr_diagnostics(False)
    assert not any(m.nr_diagnostics for m in attns)
    assert all(m.last_nr_stats is None for m in attns)
    assert model.nr_stats() == {}


# ------------------------------------------------- amp's conv2d, SafeConv2d
@pytest.mark.parametrize('padding', ['same', 'valid', [1, 2], (2, 0), 1])
def test_conv2d_half_path_any_padding(monkeypatch, padding):
    """The CPU half path takes F.conv2d's paddings and gives its result;
    ``conv2d(x, w)`` is ``F.conv2d(x, w)``."""
    monkeypatch.setattr(safe_conv, '_verdicts', {})
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 4, 8, 8, generator=g)
    w = torch.randn(4, 4, 3, 3, generator=g) / 6
    torch.testing.assert_close(conv2d(x, w), F.conv2d(x, w))
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', safe_conv.HalfConvWarning)
        out = conv2d(x.bfloat16(), w.bfloat16(), None, 1, padding)
    ref = F.conv2d(x.bfloat16().float(),
                   w.bfloat16().float(), None, 1, padding)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


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
