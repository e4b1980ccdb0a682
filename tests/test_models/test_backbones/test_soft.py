"""The SOFT backbone, its blocks and arguments (issues 13, 27, 30)."""
import logging
import re
import warnings
from unittest import mock

import pytest
import torch
import torch.nn as nn
from conftest import current_log, tiny_arch
from mmcv.cnn.bricks import DropPath
from mmengine.registry import MODELS, DefaultScope
from torch.nn.modules.batchnorm import _BatchNorm

import mmsoft
import projects.attention_zoo  # noqa: F401 (softmax, linformer)
from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import (ConvPatchEmbed, PyramidStage,
                                          SOFTBlock, SoftmaxAttention,
                                          SoftmaxBlock, SOFTStage,
                                          residual_drop_cfg)
from mmsoft.models.layers import SOFTAttention
from mmsoft.models.layers.amp import SafeConv2d

pytestmark = pytest.mark.usefixtures('one_thread')

TINY = tiny_arch(num_heads=[1, 1, 2, 2])
ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
ARCH2 = tiny_arch(depths=(1, 2, 2, 1))
# paper Table 3 (IJCV Table 8: Tiny), the authors' small: params, rtol
PAPER_PARAMS = {
    'tiny': (13.07e6, .05), 'small': (24e6, .05), 'medium': (45e6, .05),
    'large': (64e6, .05), 'huge': (87e6, .05), 'small-official': (38.9e6, .01)
}  # yapf: disable


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def quick(*arch):
    """SOFT(*arch) without nn.Linear's init (10x faster to build)."""
    with mock.patch.object(nn.Linear, 'reset_parameters', lambda self: 0):
        return SOFT(*arch)


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
def test_preset_param_counts_and_default(arch):
    """SOFT() is tiny; the presets' first letters alias them."""
    model, (want, rtol) = quick(*[arch][:arch != 'tiny']), PAPER_PARAMS[arch]
    assert SOFT.arch_zoo[arch[0]] is SOFT.arch_zoo[arch.split('-')[0]]
    total = n_params(model) + 512 * 1000 + 1000  # + a 1000-class head
    assert abs(total - want) / want < rtol
    if arch == 'small-official':
        assert model.depths == [1, 3, 20, 4]
        custom = quick(
            tiny_arch((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 20, 4)))
        assert n_params(custom) == n_params(model)
        assert model.stages[3].norm.eps == 1e-6
    if arch == 'tiny':
        tiny = SOFT.arch_zoo['tiny']
        assert (model.embed_dims, model.depths,
                model.pretrain_img_size) == (tiny['embed_dims'],
                                             tiny['depths'], 224)
        assert model.stages[0].pos_embed.shape[1] == 56 * 56


@pytest.mark.parametrize('out_type, out_indices, hw',
                         [('featmap', (0, 1, 2, 3), (37, 53)),
                          ('cls_token', (1, 3), (64, 64))])
def test_outputs_out_indices_and_empty_batch(out_type, out_indices, hw):
    model = SOFT(ARCH, out_type=out_type, out_indices=out_indices)
    for mode in (False, True):
        model.train(mode)
        empty, one = model(torch.zeros(0, 3,
                                       *hw)), model(torch.zeros(1, 3, *hw))
        assert len(empty) == len(one) == len(out_indices)
        for e, o in zip(empty, one):
            assert e.shape == (0, ) + o.shape[1:] and e.dtype == o.dtype
    if out_type == 'cls_token':
        return
    for out_indices, want in ((2, (2, )), (-4, (0, )), ((3, -1, 0), (0, 3))):
        model = SOFT(ARCH, pretrain_img_size=32, out_indices=out_indices)
        assert model.out_indices == want
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


def test_blocks_stages_and_patch_embed():
    """SOFT / softmax blocks, stages, with_cp, patch embedding, attn_cfg."""
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
    calls = []  # with_cp: a block reruns in the backward (x.sin saves x)
    stage.blocks.append(
        type('Count', (nn.Module, ),
             dict(forward=lambda self, x, hw: calls.append(1) or x.sin()))())
    for with_cp, runs in ((False, 1), (True, 2)):
        stage.with_cp, calls[:] = with_cp, []
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            stage(torch.randn(1, 3, 8, 8,
                              requires_grad=True))[0].sum().backward()
        assert len(calls) == runs
    with torch.no_grad():  # no gradient: no checkpoint
        stage(torch.randn(1, 3, 8, 8))
    assert len(calls) == 3
    for stem, n in ((True, 3), (False, 1)):
        with warnings.catch_warnings():
            warnings.simplefilter('error')
            embed = ConvPatchEmbed(3, 8, stem)
        assert [type(layer.conv) for layer in embed.proj] == [SafeConv2d] * n
        assert all(layer.conv.bias is not None for layer in embed.proj)
    # the softmax block: pre-norm ViT (LN 1e-6, exact GELU); where rates go
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
    # attn_cfg: Swin's merge; type may be the class; no warning under mmdet
    attn = SOFTBlock(8, 2, 2, attn_cfg=dict(type='soft', num_heads=1)).attn
    assert (attn.embed_dims, attn.num_heads) == (8, 1)
    assert attn.sampler.ratio == 2 and attn.dw_conv.kernel_size == (3, 3)
    attn = SOFTBlock(
        8, 1, 2, attn_cfg=dict(type=SOFTAttention, nr_iters=3,
                               nr_init='soft')).attn
    assert isinstance(attn, SOFTAttention)
    assert attn.nr.iters == 3 and attn.nr.init == 'soft'
    with current_log(logging.DEBUG) as records, \
            DefaultScope.overwrite_default_scope('mmdet'):
        SOFTBlock(8, 1, 2, attn_cfg=dict(type='SOFTAttention'))
    assert not [r for r in records if r.levelno >= logging.WARNING]


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
    w = torch.cat([m.weight.flatten() for m in model.modules()
                   if isinstance(m, nn.Linear)])  # yapf: disable
    assert 0.018 < w.std() < 0.022
    assert model.stages[0].blocks[0].attn.q.bias.abs().max() == 0
    assert 0.018 < model.stages[0].pos_embed.std() < 0.022
    assert 0.016 < token.detach().std().item() < 0.024
    assert abs(token.detach().mean().item()) < 0.005


@pytest.mark.parametrize('k, norm_eval', [(-1, True), (0, False), (2, False),
                                          (4, False)])
def test_frozen_stages_and_norm_eval(k, norm_eval):
    """The documented frozen parameters; frozen modules / BNs in eval."""
    model = SOFT(
        ARCH2, frozen_stages=k, drop_rate=0.1, norm_eval=norm_eval).train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    stages = tuple(f'stages.{i}.' for i in range(max(k, 0)))
    first = ('stages.0.patch_embed.', 'stages.0.pos_embed') * (k == 0)
    assert frozen == {n for n, _ in model.named_parameters()
                      if n.startswith(stages + first)}  # yapf: disable
    if k == 4:  # stage 4 includes its cls token and final norm
        assert {'stages.3.cls_token', 'stages.3.norm.weight'} <= frozen
    assert [s.patch_embed.training for s in model.stages
            ] == [i >= k and not i == k == 0 for i in range(4)]
    bns = {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm)}
    assert len(bns) >= 6  # stem 3 + one per later patch embedding
    for name, m in model.named_modules():
        params = [f'{name}.{n}' for n, _ in m.named_parameters(recurse=False)]
        if params and not (name.count('.') == 1
                           and name.startswith('stages.')):
            kept = all(p in frozen
                       for p in params) or norm_eval and name in bns
            assert m.training != kept, name
        if name.startswith(stages):
            assert not m.training, name
        assert m.training or k >= 0 or name in bns, name
    before = {n: m.running_mean.clone() for n, m in bns.items()}
    with torch.no_grad():
        model(_x())
    for n, m in bns.items():
        moved = not torch.equal(before[n], m.running_mean)
        assert moved == (f'{n}.weight' not in frozen and not norm_eval), n
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
    assert not any(m.training for m in model.eval().modules())


V, T, K = ValueError, TypeError, KeyError
RATE = 'must be a number in [0, 1), got '
KERNEL = ('must be an odd positive int (or 0 to disable the conv), got {}: '
          'an even kernel changes the token map size')
E = re.escape  # a part of the message


def X(message):  # the whole message
    return '^' + re.escape(message) + '$'


def soft(**options):
    return dict(attn_cfg=dict(type='SOFTAttention', **options))


def arch(**kw):
    return dict(arch=dict(ARCH, **kw))


REFUSALS = [
    (dict(in_channels=0), V,
     X('SOFT: in_channels must be an int >= 1, got 0 (int)')),
    (dict(pretrain_img_size=224.0), V,
     X('SOFT: pretrain_img_size must be an int >= 32, got 224.0 (float)')),
    (dict(frozen_stages=-2), V,
     X('SOFT: frozen_stages must be an int >= -1, got -2 (int)')),
    (soft(nr_iters=True), V, E('nr_iters) must be an int >= 1, got True')),
    (soft(max_landmarks=2.5), V,
     X('max_landmarks must be an int >= 1 or None, got 2.5 (float)')),
    (soft(attn_norm='yes'), V,
     X("attn_norm must be True or False, got 'yes'")),
    (dict(drop_rate=1.5), V, X(f'SOFT: drop_rate {RATE}1.5')),
    (dict(attn_drop_rate=-0.1), V, X(f'SOFT: attn_drop_rate {RATE}-0.1')),
    *[(dict(drop_path_rate=v), V, X(f'SOFT: drop_path_rate {RATE}{v}'))
      for v in (1.0, True)],
    *[(arch(dw_kernel_sizes=[9, k, 3, None]), V,
       X(f'SOFT arch: dw_kernel_sizes[1] {KERNEL.format(k)}'))
      for k in (4, -5, 2.5)],
    (dict(residual_drop='dropblock'), V,
     X("residual_drop must be one of ('drop_path', 'dropout'), got "
       "'dropblock'")),
    (dict(out_type='bogus'), V,
     X("unknown out_type 'bogus'; choose one of ('featmap', 'cls_token')")),
    (dict(x=torch.zeros(3, 64, 64)), V,
     X('SOFT expects (B, C, H, W) images, got shape (3, 64, 64)')),
    (dict(x=[torch.zeros(3, 32, 32)]), T,
     X('SOFT expects a (B, C, H, W) tensor, got a list; stack the images '
       'first (torch.stack)')),
    (dict(frozen_stages=5), V, X('frozen_stages must be in [-1, 4], got 5')),
    (dict(out_indices=()), V,
     X('out_indices is empty; SOFT needs at least one output stage (0-3)')),
    *[(dict(out_indices=i), V,
       X(f'out_indices entry {i[-1]} is out of range; SOFT has stages 0..3'))
      for i in ((0, 4), (-5, ))],
    # Python's own line (mutmut's trampolines rename __init__)
    (dict(bogus=1), T, "unexpected keyword argument 'bogus'$"),
    (dict(norm_cfg='LN'), T,
     X("SOFT: norm_cfg must be a dict (one stage's own: "
       "stage_cfgs[i]['norm_cfg']), got 'LN'")),
    (dict(norm_cfg=dict(eps=1e-6)), T,
     X('SOFT: norm_cfg must be a dict with a "type" (e.g. '
       "dict(type='LN')), got {'eps': 1e-06}")),
    (dict(attn_cfg=dict(type='SOFTAttention', sr_mode='conv')), T, 'sr_mode'),
    (dict(attn_cfg=dict(type='softmax', nr_iters=5)), T, 'nr_iters'),
    (dict(attn_cfg=dict(norm=True)), K, 'must contain the key "type"'),
    (dict(attn_cfg=dict(type='transformer')), K, 'transformer'),
    (dict(stage_cfgs='dropout'), V,
     X('SOFT: stage_cfgs must be a dict (for every stage) or a list of 4 '
       "dicts (one per stage), got 'dropout'")),
    (dict(stage_cfgs=[{}, {}, {}, dict(dw_kernel_size=3)]), V,
     X("SOFT: stage_cfgs[3] has unknown keys ['dw_kernel_size']; a "
       'ClsTokenStage takes act_cfg, attn_drop_rate, drop_path_rates, '
       'drop_rate, mlp_ratio, norm_cfg, patch_act_cfg, patch_norm_cfg, '
       'pos_grid, qkv_bias, stem')),
    (dict(stage_cfgs=dict(depth=3)), V,
     X("SOFT: stage_cfgs sets 'depth', which comes from arch; set it there")),
    (dict(stage_cfgs=[{}, dict(drop_path_rates=[0.1, 0.2]), {}, {}]), V,
     X('SOFT: stage_cfgs[1]: drop_path_rates of stage 2 needs one value per '
       'block (1), got [0.1, 0.2]')),
    (dict(stage_cfgs=dict(bogus=1)), V,
     X("SOFT: stage_cfgs has unknown keys ['bogus']; no stage takes them")),
    (dict(stage_cfgs=[{}, {}, {}, dict(pos_grid=0)]), V,
     X('SOFT: stage_cfgs[3]: pos_grid of stage 4 must be an int >= 1, '
       'got 0 (int)')),  # 0 crashed in forward, < 0 acted as abs
    (dict(arch='gigantic'), V,
     X("unknown SOFT arch 'gigantic'; valid presets: ['h', 'huge', 'l', "
       "'large', 'm', 'medium', 's', 'small', 'small-official', 't', 'tiny']"
       ' (or pass a dict)')),
    (dict(arch=3), T, X('SOFT arch must be a str or dict, got int')),
    (dict(arch=dict(embed_dims=[8] * 4, num_heads=[1] * 4)), V,
     X("SOFT arch dict is missing 'depths'; it needs embed_dims, num_heads, "
       'depths')),
    (arch(bogus=1), V,
     X("SOFT arch dict has unknown keys ['bogus']; valid keys are embed_dims,"
       ' num_heads, depths, sampling_ratios, mlp_ratios, dw_kernel_sizes')),
    (dict(arch=tiny_arch((8, 8, 8, 16), (1, 0, 1, 2))), V,
     X('SOFT arch: num_heads[1]=0 does not divide embed_dims[1]=8')),
    (dict(arch=tiny_arch((8, 8, 8, 16), (1, 1, 1, 2), (1, 0, 1, 1))), V,
     X('SOFT arch: every depth must be >= 1, got [1, 0, 1, 1]')),
    (arch(sampling_ratios=[8, 4, 2.5, 1]), V,
     X('SOFT arch: sampling_ratios[2] must be an int >= 1, got 2.5 (float)')),
    *[(arch(mlp_ratios=[4, r, 4, 4]), V,
       X(f'SOFT arch: mlp_ratios[1] must be a positive number, got {r!r}'))
      for r in (True, 0, '4')],
    (arch(dw_kernel_sizes=[9, 5, 3, 7]), V,
     X("SOFT arch['dw_kernel_sizes'][3] must be None: stage 4 is a "
       'ClsTokenStage, which takes no dw_kernel_size; got 7')),
    (arch(dw_kernel_sizes=[9, 5, 3]), V,
     X("SOFT arch['dw_kernel_sizes'] must be a list of 4 values (one per "
       'stage), got [9, 5, 3]')),
]


@pytest.mark.parametrize('kwargs, error, match', REFUSALS)
def test_refusal_names_the_option(kwargs, error, match):
    kwargs = dict(kwargs)
    x = kwargs.pop('x', None)  # the others: refused when built
    with pytest.raises(error, match=match):
        SOFT(**{'arch': ARCH, **kwargs})(x)


@pytest.mark.parametrize('key', ['norm_cfg', 'patch_norm_cfg'])
def test_unknown_norm_names_it_and_the_known_norms(key):
    """Issue 27: not mmcv's "Cannot find None"; registered norms only."""
    with pytest.raises(KeyError) as e:
        SOFT(ARCH, **{key: dict(type='BogusNorm')})
    msg = e.value.args[0]
    assert msg.startswith(f"SOFT: {key} has type 'BogusNorm', which is not a "
                          'registered norm layer; known norms: ')
    known = msg.split('known norms: ')[1].split(', ')
    assert {'BN', 'GN', 'LN', 'IN', 'SyncBN'} <= set(known)
    for name in known:
        cls = MODELS.get(name)
        assert isinstance(cls, type) and issubclass(cls, nn.Module)
        assert 'Norm' in cls.__name__, name
    if 'MMSyncBN' in MODELS.module_dict:  # not a torch norm's subclass
        assert 'MMSyncBN' in known


LOW = soft(nr_iters=1, max_landmarks=None, attn_norm=False, sampling='avgpool')


@pytest.mark.parametrize('kwargs', [
    dict(pretrain_img_size=32, drop_path_rate=0., **LOW),
    arch(dw_kernel_sizes=[7, 0, 1, None], mlp_ratios=[1, 0.5, 4, 4]),
    dict(stage_cfgs=[
        dict(attn_cfg=dict(type='soft', attn_norm=False)),
        dict(attn_cfg=dict(type='linformer', sr_mode='avgpool')),
        dict(attn_cfg=dict(type='soft', nr_method='spectral')), {}
    ]),
])
def test_valid_arguments_are_accepted(kwargs):
    model = SOFT(**{'arch': ARCH, **kwargs}).eval()
    assert all(
        torch.isfinite(o).all() for o in model(torch.randn(1, 3, 64, 64)))
    if 'mlp_ratios' in kwargs.get('arch', {}):  # a ratio <= 1 is allowed
        fc1 = [s.blocks[0].ffn.layers[0][0] for s in model.stages[:2]]
        assert [f.out_features for f in fc1] == [8, 4]


@pytest.mark.parametrize('residual_drop, kind', [('drop_path', DropPath),
                                                 ('dropout', nn.Dropout)])
def test_options_reach_each_stage(residual_drop, kind):
    """pos grids, stem, drop-path rates, with_cp, the shared options."""
    cp = residual_drop == 'dropout'
    model = SOFT(ARCH, pretrain_img_size=64, in_channels=1, qkv_bias=False,
                 drop_rate=0.1, attn_drop_rate=0.2, drop_path_rate=0.3,
                 residual_drop=residual_drop, with_cp=cp)  # yapf: disable
    cfgs = model.stage_cfgs
    assert model.pretrain_img_size == 64
    assert [c['pos_grid'] for c in cfgs] == [16, 8, 4, 2]
    assert [c['stem'] for c in cfgs] == [True, False, False, False]
    assert [c['in_channels'] for c in cfgs] == [1, 8, 8, 8]
    assert [r for c in cfgs for r in c['drop_path_rates']
            ] == pytest.approx([0., 0.1, 0.2, 0.3])  # one per block
    assert {c['qkv_bias'] for c in cfgs} == {False}
    assert {c['drop_rate'] for c in cfgs} == {0.1}
    assert [c.get('residual_drop')
            for c in cfgs] == [residual_drop] * 3 + [None]
    assert [c.get('attn_drop_rate') for c in cfgs] == [None] * 3 + [0.2]
    assert [c['type'] for c in cfgs] == ['SOFTStage'] * 3 + ['ClsTokenStage']
    assert [type(s).__name__ for s in model.stages] == list(SOFT.stage_types)
    assert [s.with_cp for s in model.stages] == [cp] * 4
    drops = [(b.drop, b.ffn.dropout_layer) for s in model.stages[1:3]
             for b in s.blocks]
    assert all(isinstance(d, kind) for pair in drops for d in pair)
    assert dropouts(model.stages[1].blocks) == pytest.approx([.1, 0, 0, .1])
    assert isinstance(model.stages[0].blocks[0].drop, nn.Identity)
    assert [dropouts(d)[0] for d, _ in drops] == pytest.approx([.1, .2])
    assert model.stages[3].blocks[0].drop_path.drop_prob == pytest.approx(.3)


def test_stage_cfgs_attn_cfg_and_norms_per_stage():
    """stage_cfgs / attn_cfg / norms per stage; the user's dicts copied."""
    own, top = dict(
        type='SOFTAttention', nr_iters=3), dict(
            type='soft', nr=dict(iters=7))
    user = [
        dict(
            attn_cfg=dict(type='soft', attn_norm=False),
            act_cfg=dict(type='ReLU')),
        dict(attn_cfg=own),
        dict(dw_kernel_size=7, residual_drop='dropout'),
        dict(
            attn_drop_rate=0.2, act_cfg=dict(type='GELU', approximate='tanh'))
    ]
    arch_ = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
    model = SOFT(arch_, drop_path_rate=0.1, attn_drop_rate=0.1, attn_cfg=top,
                 stage_cfgs=user, norm_cfg=dict(type='LN', eps=1e-3),
                 patch_norm_cfg=dict(type='GN', num_groups=8),
                 patch_act_cfg=dict(type='GELU'))  # yapf: disable
    arch_['embed_dims'][0], user[1]['attn_cfg']['type'] = 999, 'Bogus'
    top['nr']['iters'] = 3
    assert model.embed_dims == [8, 8, 8, 16]
    zoo = [list(v) for v in SOFT.arch_zoo['tiny'].values()]
    quick('tiny').arch_settings['depths'][0] = 99
    assert [list(v) for v in SOFT.arch_zoo['tiny'].values()] == zoo
    cfgs = model.stage_cfgs
    assert [c.get('dw_kernel_size') for c in cfgs] == [9, 5, 7, None]
    assert [c['sampling_ratio'] for c in cfgs[:3]] == [8, 4, 2]
    assert cfgs[1]['attn_cfg'] == dict(type='SOFTAttention', nr_iters=3)
    assert cfgs[2]['attn_cfg'] == dict(type='soft', nr=dict(iters=7))
    assert 'attn_cfg' not in cfgs[3] and cfgs[3]['attn_drop_rate'] == 0.2
    assert [c['in_channels'] for c in cfgs] == [3] + ARCH['embed_dims'][:3]
    attns = [s.blocks[0].attn for s in model.stages[:3]]
    assert attns[0].attn_norm is False and attns[2].attn_norm is True
    assert [a.nr_iters for a in attns] == [20, 3, 7]
    assert attns[2].dw_conv.kernel_size == (7, 7)
    assert isinstance(model.stages[2].blocks[0].drop, nn.Dropout)
    assert not isinstance(model.stages[0].blocks[0].drop, nn.Dropout)
    lns = [
        m for n, m in model.named_modules()
        if isinstance(m, nn.LayerNorm) and '.sampler.' not in n
    ]
    assert len(lns) == 2 * sum(ARCH['depths']) + 1  # + stage 4's final norm
    assert {m.eps for m in lns} == {1e-3}
    acts = [b.ffn.layers[0][1] for s in model.stages for b in s.blocks]
    assert isinstance(acts[0], nn.ReLU)
    assert all(a.approximate == 'tanh' for a in acts[1:])
    pe = model.stages[0].patch_embed.proj
    assert all(isinstance(layer.gn, nn.GroupNorm) for layer in pe)
    assert all(isinstance(layer.activate, nn.GELU) for layer in pe)
    assert all(
        torch.isfinite(o).all() for o in model(torch.randn(1, 3, 64, 64)))
    every = SOFT(ARCH, stage_cfgs=dict(sampling_ratio=1, qkv_bias=False))
    assert [c.get('sampling_ratio') for c in every.stage_cfgs] == \
        [1, 1, 1, None]
    assert every.stages[3].blocks[0].attn.q.bias is None
    plain = SOFT(ARCH, stage_cfgs=[{}] * 4).stage_cfgs
    assert plain == SOFT(ARCH).stage_cfgs and plain[3]['attn_drop_rate'] == 0


# a plain type: mmengine's root registry; 'mmsoft.SOFT': mmsoft's scope
@pytest.mark.parametrize('codebase, type_name', [('mmpretrain', 'SOFT'),
                                                 ('mmseg', 'mmsoft.SOFT')])
def test_build_from_codebase_registry(codebase, type_name, monkeypatch):
    """Attentions too, no "Failed to search registry" warning."""
    import mmengine.logging as mm_logging
    assert mmsoft.MODELS.get(
        'SOFT') is SOFT and mmsoft.MODELS.scope == 'mmsoft'
    logged, real_print_log = [], mm_logging.print_log
    monkeypatch.setattr(
        mm_logging, 'print_log',
        lambda msg, *a, **kw: logged.append(str(msg)) or real_print_log(
            msg, *a, **kw))
    registry = pytest.importorskip(f'{codebase}.registry')
    with DefaultScope.overwrite_default_scope(codebase):
        model = registry.MODELS.build(dict(type=type_name, arch=ARCH))
    assert isinstance(model, SOFT)
    assert type(model.stages[0].blocks[0].attn).__name__ == 'SOFTAttention'
    assert not [m for m in logged if 'Failed to search registry' in m]
