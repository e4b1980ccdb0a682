"""Issue 13: SOFT's argument checks (naming the option), empty batches."""
import re

import pytest
import torch
from conftest import tiny_arch

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import SOFTAttention

ARCH = tiny_arch([8, 16, 16, 32], [1, 2, 2, 2])
TINY = tiny_arch(num_heads=[1, 1, 2, 2])


def soft(**options):
    return dict(attn_cfg=dict(type='SOFTAttention', **options))


@pytest.mark.parametrize('kwargs, match', [
    (soft(nr_iters=0), 'nr_iters'),
    (soft(nr_iters=2.5), 'nr_iters'),
    (soft(nr_iters='20'), 'nr_iters'),
    (soft(nr_iters=True), 'nr_iters'),
    (soft(max_landmarks=2.5), 'max_landmarks'),
    (soft(max_landmarks='49'), 'max_landmarks'),
    (soft(max_landmarks=0), 'max_landmarks'),
    (soft(attn_norm='yes'), 'attn_norm'),
    (dict(pretrain_img_size=224.0), 'pretrain_img_size'),
    (dict(out_indices=[]), 'out_indices'),
    (dict(arch=dict(ARCH, dw_kernel_sizes=[4, 5, 3, None])),
     'dw_kernel_sizes'),
    (dict(arch=dict(ARCH, dw_kernel_sizes=[9, -5, 3, None])),
     'dw_kernel_sizes'),
    (dict(arch=dict(ARCH, dw_kernel_sizes=[9, 5, 2.5, None])),
     'dw_kernel_sizes'),
    (dict(frozen_stages=2.5), 'frozen_stages'),
    (dict(arch=dict(ARCH, mlp_ratios=[4, 0, 4, 4])), 'mlp_ratios\\[1\\]'),
    (dict(arch='gigantic'), "valid presets: .*'tiny'"),
    (dict(arch=dict(embed_dims=[8] * 4, num_heads=[1] * 4)), "'depths'"),
    (dict(arch=dict(TINY, depth=[1] * 4)), "unknown keys \\['depth'\\]"),
    (dict(arch=dict(TINY, depths=[1, 1, 1])), "arch\\['depths'\\]"),
    (dict(arch=dict(TINY, num_heads=[3, 1, 1, 1])), 'num_heads\\[0\\]=3'),
    (dict(arch=TINY, out_indices=(4, )), 'out_indices entry 4'),
    (dict(arch=TINY, out_type='tokens'), 'out_type'),
    (dict(arch=TINY, attn_cfg=dict(type='soft',
                                   sampling='nearest')), 'sampling'),
    (dict(arch=TINY, frozen_stages=7), 'frozen_stages'),
])
def test_bad_arguments_are_rejected_naming_the_option(kwargs, match):
    kwargs.setdefault('arch', ARCH)
    with pytest.raises(ValueError, match=match):
        SOFT(**kwargs)


@pytest.mark.parametrize('attn_cfg, error, match', [
    (dict(type='softmax', nr_iters=5), TypeError, 'nr_iters'),
    (dict(type='performer', attn_norm=False), TypeError, 'attn_norm'),
    (dict(type='sima', sampling='avgpool'), TypeError, 'sampling'),
    (dict(type='softmax', max_landmarks=16), TypeError, 'max_landmarks'),
    (dict(type='linformer', nr_method='spectral'), TypeError, 'nr_method'),
    (dict(type='SOFTAttention', sr_mode='conv'), TypeError, 'sr_mode'),
    ('soft', TypeError, 'attn_cfg must be a dict'),
    ([dict(type='soft')] * 4, TypeError, 'attn_cfg must be a dict'),
    (dict(norm=True), KeyError, 'must contain the key "type"'),
    (dict(type='transformer'), KeyError, 'transformer'),
])
def test_malformed_attn_cfg_or_an_option_it_does_not_take(
        attn_cfg, error, match):
    with pytest.raises(error, match=match):
        SOFT(ARCH, attn_cfg=attn_cfg)


@pytest.mark.parametrize('kwargs', [
    soft(nr_iters=1),
    soft(max_landmarks=16),
    soft(max_landmarks=None),
    dict(pretrain_img_size=32),
    dict(drop_path_rate=0.5),
    dict(arch=dict(ARCH, dw_kernel_sizes=[7, 0, 1, None])),
    dict(attn_cfg=dict(type='linformer', max_landmarks=16)),
    dict(attn_cfg=dict(type='nystromformer', max_landmarks=16)),
    dict(attn_cfg=dict(type='softmax')),
    dict(attn_cfg=dict(type='PerformerAttention', num_features=8)),
    soft(attn_norm=False, nr_iters=5, sampling='avgpool'),
    dict(stage_cfgs=[
        dict(attn_cfg=dict(type='soft', attn_norm=False)),
        dict(attn_cfg=dict(type='linformer', sr_mode='avgpool')),
        dict(attn_cfg=dict(type='soft', nr_method='spectral')), {}
    ]),
])
def test_valid_arguments_are_accepted(kwargs):
    kwargs.setdefault('arch', ARCH)
    model = SOFT(**kwargs).eval()
    outs = model(torch.randn(1, 3, 64, 64))
    assert all(torch.isfinite(o).all() for o in outs)


def test_per_stage_attn_cfg():
    """``stage_cfgs[i]['attn_cfg']`` replaces ``attn_cfg`` for stage i."""
    model = SOFT(
        ARCH,
        attn_cfg=dict(type='soft', nr_iters=7),
        stage_cfgs=[
            dict(attn_cfg=dict(type='soft', attn_norm=False)),
            dict(attn_cfg=dict(type='linformer')), {}, {}
        ])
    attns = [s.blocks[0].attn for s in model.stages[:3]]
    assert attns[0].attn_norm is False and attns[2].attn_norm is True
    assert type(attns[1]).__name__ == 'LinformerAttention'
    assert attns[2].nr_iters == 7


def test_layer_checks():
    with pytest.raises(ValueError, match='nr_iters'):
        SOFTAttention(16, 2, 2, nr=dict(iters=0))
    with pytest.raises(ValueError, match='dw_kernel_size'):
        SOFTAttention(16, 2, 2, dw_kernel_size=4)


@pytest.mark.parametrize('out_type, out_indices', [('featmap', (0, 1, 2, 3)),
                                                   ('cls_token', (1, 3)),
                                                   ('featmap', (2, ))])
@pytest.mark.parametrize('hw', [(64, 64), (37, 53)])
def test_empty_batch_returns_empty_outputs(out_type, out_indices, hw):
    model = SOFT(ARCH, out_type=out_type, out_indices=out_indices)
    for mode in (False, True):
        model.train(mode)
        empty = model(torch.zeros(0, 3, *hw))
        one = model(torch.zeros(1, 3, *hw))
        assert len(empty) == len(one)
        for e, o in zip(empty, one):
            assert e.shape == (0, ) + o.shape[1:]
            assert e.dtype == o.dtype


# ------------------------------------------------- per-stage spec, bricks
def test_stages_built_from_per_stage_spec():
    """Each stage's type and settings come from its ``stage_cfgs`` spec."""
    model = SOFT(
        ARCH,
        stage_cfgs=[{}, dict(attn_cfg=dict(type='linformer')), {}, {}],
        attn_drop_rate=0.1)
    cfgs = model.stage_cfgs
    assert [c['type'] for c in cfgs] == list(SOFT.stage_types)
    assert [type(s).__name__ for s in model.stages] == list(SOFT.stage_types)
    assert [c['sampling_ratio'] for c in cfgs[:3]] == [8, 4, 2]
    assert [c['dw_kernel_size'] for c in cfgs[:3]] == [9, 5, 3]
    assert cfgs[1]['attn_cfg'] == dict(type='linformer')
    assert 'attn_cfg' not in cfgs[3] and cfgs[3]['attn_drop_rate'] == 0.1
    assert [c['in_channels'] for c in cfgs] == [3] + ARCH['embed_dims'][:3]
    assert [c['stem'] for c in cfgs] == [True, False, False, False]
    assert type(model.stages[1].blocks[0].attn).__name__ == \
        'LinformerAttention'


def test_stage_cfgs_override_the_computed_stage_config():
    """Per stage, merged over the computed config; or one for every stage."""
    plain = SOFT(ARCH, drop_path_rate=0.1)
    model = SOFT(
        ARCH,
        drop_path_rate=0.1,
        stage_cfgs=[{}, {},
                    dict(dw_kernel_size=7, residual_drop='dropout'),
                    dict(attn_drop_rate=0.2)])
    cfgs = model.stage_cfgs
    assert [c.get('dw_kernel_size') for c in cfgs] == [9, 5, 7, None]
    assert model.stages[2].blocks[0].attn.dw_conv.kernel_size == (7, 7)
    assert isinstance(model.stages[2].blocks[0].drop, torch.nn.Dropout)
    assert not isinstance(model.stages[1].blocks[0].drop, torch.nn.Dropout)
    assert cfgs[3]['attn_drop_rate'] == 0.2
    assert plain.stage_cfgs[3]['attn_drop_rate'] == 0
    assert cfgs[:2] == plain.stage_cfgs[:2]  # the other stages unchanged
    every = SOFT(ARCH, stage_cfgs=dict(sampling_ratio=1, qkv_bias=False))
    assert [c.get('sampling_ratio') for c in every.stage_cfgs] == \
        [1, 1, 1, None]
    assert not any(c['qkv_bias'] for c in every.stage_cfgs)
    assert every.stages[3].blocks[0].attn.q.bias is None
    assert SOFT(ARCH, stage_cfgs=[{}] * 4).state_dict().keys() == \
        plain.state_dict().keys()


UNKNOWN_KEY = ("stage_cfgs[3] has unknown keys ['dw_kernel_size']; a "
               'ClsTokenStage takes act_cfg, attn_drop_rate')
FROM_ARCH = "stage_cfgs sets 'depth', which comes from arch"


@pytest.mark.parametrize('stage_cfgs, match', [
    ([{}] * 3, 'or a list of 4 dicts (one per stage)'),
    ('dropout', 'must be a dict (for every stage)'),
    ([{}, {}, {}, dict(dw_kernel_size=3)], UNKNOWN_KEY),
    (dict(window_size=7), "stage_cfgs has unknown keys ['window_size']"),
    (dict(depth=3), FROM_ARCH + '; set it there'),
    ([{}, dict(drop_path_rates=[0.1, 0.2]), {}, {}
      ], 'drop_path_rates of stage 2 needs one value per block (1)'),
])
def test_bad_stage_cfgs_name_the_key_and_the_fix(stage_cfgs, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        SOFT(ARCH, stage_cfgs=stage_cfgs)


def test_arch_aliases():
    for full in ('tiny', 'small', 'medium', 'large', 'huge'):
        assert SOFT.arch_zoo[full[0]] is SOFT.arch_zoo[full]
    a, b = SOFT('s'), SOFT('small')
    assert a.arch_settings == b.arch_settings
    assert a.state_dict().keys() == b.state_dict().keys()


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
        if isinstance(m, torch.nn.LayerNorm) and '.sampler.' not in n
    ]
    assert len(lns) == 2 * sum(ARCH['depths']) + 1  # + stage 4's final norm
    assert {m.eps for m in lns} == {1e-3}
    acts = [b.ffn.layers[0][1] for s in model.stages for b in s.blocks]
    assert isinstance(acts[0], torch.nn.ReLU)
    assert all(a.approximate == 'tanh' for a in acts[1:])
    pe = model.stages[0].patch_embed.proj
    assert all(isinstance(layer.gn, torch.nn.GroupNorm) for layer in pe)
    assert all(isinstance(layer.activate, torch.nn.GELU) for layer in pe)
    outs = model(torch.randn(1, 3, 64, 64))
    assert all(torch.isfinite(o).all() for o in outs)


def test_classifier_checkpoint_loads_through_init_cfg(tmp_path):
    """A classifier file (the backbone under ``backbone.``, a head)."""
    src = SOFT(ARCH)
    src.init_weights()
    sd = {'backbone.' + k: v for k, v in src.state_dict().items()}
    sd['head.fc.weight'] = torch.zeros(3, ARCH['embed_dims'][-1])
    path = tmp_path / 'classifier.pth'
    torch.save({'state_dict': sd, 'meta': {}}, path)
    model = SOFT(
        ARCH,
        init_cfg=dict(
            type='Pretrained', checkpoint=str(path), prefix='backbone.'))
    model.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


@pytest.mark.parametrize('key', ['norm_cfg', 'patch_norm_cfg'])
def test_unknown_norm_names_it_and_the_known_norms(key):
    """Issue 27: not mmcv's "Cannot find None in registry"."""
    with pytest.raises(KeyError) as e:
        SOFT(ARCH, **{key: dict(type='BogusNorm')})
    msg = e.value.args[0]
    assert msg.startswith(f"SOFT: {key} has type 'BogusNorm', which is not a "
                          'registered norm layer; known norms: ')
    known = msg.split('known norms: ')[1].split(', ')
    assert {'BN', 'GN', 'LN', 'SyncBN'} <= set(known), known
    assert 'None' not in msg


def test_batch_one_batchnorm_message():
    """Issue 27: stage 4's 1 x 1 map: the stage, the cause and the fixes."""
    model = SOFT(ARCH, pretrain_img_size=32).train()
    with pytest.raises(ValueError) as e:
        model(torch.randn(1, 3, 32, 32))
    msg = str(e.value)
    assert msg.startswith('SOFT stage 4: in training mode its '
                          'patch-embedding BatchNorm sees one value per '
                          'channel (batch size 1, a 1 x 1 map'), msg
    assert 'batch size >= 2' in msg and 'norm_eval=True' in msg
    model(torch.randn(2, 3, 32, 32))  # batch 2 trains
    model.eval()(torch.randn(1, 3, 32, 32))  # eval: running statistics
