"""SOFT's arguments: refusals naming the option, value and fix (issues 13,
27, 30); what accepted options build (arch, stage_cfgs, attn_cfg, norms)."""
import logging
import re

import pytest
import torch
import torch.nn as nn
from conftest import current_log, tiny_arch
from mmengine.registry import MODELS, DefaultScope

import mmsoft
import projects.attention_zoo  # noqa: F401 (softmax, linformer)
from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import SOFTBlock
from mmsoft.models.layers import SOFTAttention

ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
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
    # amp's check_int / check_rate / check_kernel_size / check_choice
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
    (dict(out_type='bogus'), V,
     X("unknown out_type 'bogus'; choose one of ('featmap', 'cls_token')")),
    # SOFT's own
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
    # stage_cfgs: the key and the fix
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
    # arch
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
    with pytest.raises(error, match=match):
        SOFT(**{'arch': ARCH, **kwargs})


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


def test_defaults_aliases_and_out_indices():
    model, tiny = SOFT(), SOFT.arch_zoo['tiny']
    assert (model.embed_dims, model.depths) == (tiny['embed_dims'],
                                                tiny['depths'])
    assert model.pretrain_img_size == 224
    assert model.stages[0].pos_embed.shape[1] == 56 * 56
    for full in ('tiny', 'small', 'medium', 'large', 'huge'):
        assert SOFT.arch_zoo[full[0]] is SOFT.arch_zoo[full]
    for out_indices, want in ((2, (2, )), (-4, (0, )), ((3, -1, 0), (0, 3))):
        model = SOFT(ARCH, pretrain_img_size=32, out_indices=out_indices)
        assert model.out_indices == want


def test_arch_stage_cfgs_and_attn_cfg_are_copied_not_shared():
    """Editing the user's dicts (or arch_settings) later changes nothing."""
    arch_ = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
    model = SOFT(arch_)
    arch_['embed_dims'][0] = 999
    assert model.embed_dims == [8, 8, 8, 16]
    zoo = [list(v) for v in SOFT.arch_zoo['tiny'].values()]
    SOFT('tiny').arch_settings['depths'][0] = 99
    assert [list(v) for v in SOFT.arch_zoo['tiny'].values()] == zoo
    user = [{}, dict(attn_cfg=dict(type='SOFTAttention')), {}, {}]
    attn = dict(type='SOFTAttention', nr=dict(iters=10))
    model = SOFT(ARCH, pretrain_img_size=32, stage_cfgs=user, attn_cfg=attn)
    user[1]['attn_cfg']['type'] = 'Bogus'
    attn['nr']['iters'] = 3  # each stage: its own deep copy
    assert model.stage_cfgs[1]['attn_cfg']['type'] == 'SOFTAttention'
    assert [model.stage_cfgs[i]['attn_cfg']['nr']['iters']
            for i in (0, 2)] == [10, 10]


def test_options_reach_each_stage():
    """pos grids, stem, linear drop-path rates and the shared options."""
    model = SOFT(
        ARCH,
        pretrain_img_size=64,
        in_channels=1,
        qkv_bias=False,
        drop_rate=0.1,
        attn_drop_rate=0.2,
        drop_path_rate=0.3,
        residual_drop='dropout')
    cfgs = model.stage_cfgs
    assert model.pretrain_img_size == 64
    assert [c['pos_grid'] for c in cfgs] == [16, 8, 4, 2]
    assert [c['stem'] for c in cfgs] == [True, False, False, False]
    assert [c['in_channels'] for c in cfgs] == [1, 8, 8, 8]
    assert [r for c in cfgs for r in c['drop_path_rates']
            ] == pytest.approx([0., 0.1, 0.2, 0.3])  # one per block
    assert {c['qkv_bias'] for c in cfgs} == {False}
    assert {c['drop_rate'] for c in cfgs} == {0.1}
    assert [c.get('residual_drop') for c in cfgs] == ['dropout'] * 3 + [None]
    assert [c.get('attn_drop_rate') for c in cfgs] == [None] * 3 + [0.2]
    assert [c['type'] for c in cfgs] == ['SOFTStage'] * 3 + ['ClsTokenStage']
    assert [type(s).__name__ for s in model.stages] == list(SOFT.stage_types)
    for with_cp in (False, True):
        model = SOFT(ARCH, pretrain_img_size=32, with_cp=with_cp)
        assert [s.with_cp for s in model.stages] == [with_cp] * 4


def test_stage_cfgs_and_attn_cfg_per_stage():
    """stage_cfgs[i] merged over the computed config, or one dict."""
    plain = SOFT(ARCH, drop_path_rate=0.1)
    own = dict(type='SOFTAttention', nr_iters=3)
    model = SOFT(
        ARCH,
        drop_path_rate=0.1,
        attn_drop_rate=0.1,
        attn_cfg=dict(type='soft', nr_iters=7),
        stage_cfgs=[
            dict(attn_cfg=dict(type='soft', attn_norm=False)),
            dict(attn_cfg=own),
            dict(dw_kernel_size=7, residual_drop='dropout'),
            dict(attn_drop_rate=0.2)
        ])
    cfgs = model.stage_cfgs
    assert [c.get('dw_kernel_size') for c in cfgs] == [9, 5, 7, None]
    assert [c['sampling_ratio'] for c in cfgs[:3]] == [8, 4, 2]
    assert cfgs[1]['attn_cfg'] == own
    assert 'attn_cfg' not in cfgs[3] and cfgs[3]['attn_drop_rate'] == 0.2
    assert plain.stage_cfgs[3]['attn_drop_rate'] == 0
    assert [c['in_channels'] for c in cfgs] == [3] + ARCH['embed_dims'][:3]
    attns = [s.blocks[0].attn for s in model.stages[:3]]
    assert attns[0].attn_norm is False and attns[2].attn_norm is True
    assert [a.nr_iters for a in attns] == [20, 3, 7]
    assert attns[2].dw_conv.kernel_size == (7, 7)
    assert isinstance(model.stages[2].blocks[0].drop, nn.Dropout)
    assert not isinstance(model.stages[0].blocks[0].drop, nn.Dropout)
    every = SOFT(ARCH, stage_cfgs=dict(sampling_ratio=1, qkv_bias=False))
    assert [c.get('sampling_ratio') for c in every.stage_cfgs] == \
        [1, 1, 1, None]
    assert every.stages[3].blocks[0].attn.q.bias is None
    assert SOFT(ARCH, stage_cfgs=[{}] * 4).stage_cfgs == SOFT(ARCH).stage_cfgs


def test_attention_from_the_block_settings_and_attn_cfg():
    """Swin's merge; type may be the class; no warning under mmdet."""
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
    assert not [
        r.getMessage() for r in records if r.levelno >= logging.WARNING
    ]


def test_norm_and_act_cfgs():
    """norm / act_cfg reach the blocks, patch_* the patch embeddings."""
    model = SOFT(
        ARCH,
        norm_cfg=dict(type='LN', eps=1e-3),
        stage_cfgs=[
            dict(act_cfg=dict(type='ReLU')), {}, {},
            dict(act_cfg=dict(type='GELU', approximate='tanh'))
        ],
        patch_norm_cfg=dict(type='GN', num_groups=8),
        patch_act_cfg=dict(type='GELU'))
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


# a plain type: mmengine's root registry; 'mmsoft.SOFT': mmsoft's scope
@pytest.mark.parametrize('codebase, type_name', [('mmpretrain', 'SOFT'),
                                                 ('mmseg', 'mmsoft.SOFT')])
def test_build_from_codebase_registry(codebase, type_name, monkeypatch):
    """Attentions too (mmsoft's ATTENTIONS), without mmengine's "Failed to
    search registry with scope ..." warning."""
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
