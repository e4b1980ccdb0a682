"""``SOFT``'s ``arch``: defaults, exact refusals, own copies of its configs."""
import re

import pytest
import torch.nn as nn
from conftest import tiny_arch
from mmengine.registry import MODELS

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import check_norm_cfg

ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))


def test_defaults_are_tiny_at_224():
    model = SOFT()
    tiny = SOFT.arch_zoo['tiny']
    assert model.embed_dims == tiny['embed_dims']
    assert model.depths == tiny['depths']
    assert model.pretrain_img_size == 224
    assert model.stages[0].pos_embed.shape[1] == 56 * 56


@pytest.mark.parametrize('error, message, arch', [
    (TypeError, 'SOFT arch must be a str or dict, got int', 3),
    (ValueError, "SOFT arch dict is missing 'depths'; it needs embed_dims, "
     'num_heads, depths', dict(embed_dims=[8] * 4, num_heads=[1] * 4)),
    (ValueError, "SOFT arch dict has unknown keys ['bogus']; valid keys are "
     'embed_dims, num_heads, depths, sampling_ratios, mlp_ratios, '
     'dw_kernel_sizes', dict(ARCH, bogus=1)),
    (ValueError, 'SOFT arch: num_heads[1]=0 does not divide embed_dims[1]=8',
     tiny_arch((8, 8, 8, 16), (1, 0, 1, 2))),
    (ValueError, 'SOFT arch: every depth must be >= 1, got [1, 0, 1, 1]',
     tiny_arch((8, 8, 8, 16), (1, 1, 1, 2), (1, 0, 1, 1))),
    (ValueError, 'SOFT arch: sampling_ratios[2] must be an int >= 1, got 2.5',
     dict(ARCH, sampling_ratios=[8, 4, 2.5, 1])),
    *[(ValueError, 'SOFT arch: mlp_ratios[1] must be a positive number, got '
       f'{ratio!r}', dict(ARCH, mlp_ratios=[4, ratio, 4, 4]))
      for ratio in (True, 0, -1, '4')],
    (ValueError, "SOFT arch['dw_kernel_sizes'][3] must be None: stage 4 is a "
     'ClsTokenStage, which takes no dw_kernel_size; got 7',
     dict(ARCH, dw_kernel_sizes=[9, 5, 3, 7])),
    (ValueError, "arch['dw_kernel_sizes'] must be a list of 4 values (one per "
     'stage), got [9, 5, 3]', dict(ARCH, dw_kernel_sizes=[9, 5, 3])),
    (ValueError, "arch['dw_kernel_sizes'][3] must be None: stage 4 is a "
     'ClsTokenStage', dict(ARCH, dw_kernel_sizes=[9, 5, 3, 3])),
    (ValueError, "arch['sampling_ratios'] must be a list of 4 values",
     dict(ARCH, sampling_ratios=[8, 4, 2])),
])
def test_arch_refusal_is_one_exact_message(error, message, arch):
    with pytest.raises(error, match=re.escape(message)):
        SOFT(arch=arch)


def test_mlp_ratio_of_one_or_less_is_allowed():
    model = SOFT(dict(ARCH, mlp_ratios=[1, 0.5, 4, 4]))
    assert model.stages[0].blocks[0].ffn.layers[0][0].out_features == 8
    assert model.stages[1].blocks[0].ffn.layers[0][0].out_features == 4


def test_arch_is_copied_not_shared():
    """Editing ``arch`` or ``arch_settings`` changes no model / arch_zoo."""
    arch = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
    model = SOFT(arch)
    arch['embed_dims'][0] = 999
    assert model.embed_dims == [8, 8, 8, 16]
    zoo = [list(v) for v in SOFT.arch_zoo['tiny'].values()]
    SOFT('tiny').arch_settings['depths'][0] = 99
    assert [list(v) for v in SOFT.arch_zoo['tiny'].values()] == zoo


def test_stage_cfgs_are_copied_not_shared():
    """Editing the user's nested dicts after the build changes nothing."""
    user = [{}, dict(attn_cfg=dict(type='SOFTAttention')), {}, {}]
    model = SOFT(ARCH, pretrain_img_size=32, stage_cfgs=user)
    user[1]['attn_cfg']['type'] = 'Bogus'
    assert model.stage_cfgs[1]['attn_cfg']['type'] == 'SOFTAttention'


def test_attn_cfg_for_all_stages_is_copied_not_shared():
    """Each stage gets its own deep copy of one ``attn_cfg``."""
    attn = dict(type='SOFTAttention', nr=dict(iters=10))
    model = SOFT(ARCH, pretrain_img_size=32, attn_cfg=attn)
    attn['nr']['iters'] = 3
    assert [c['attn_cfg']['nr']['iters']
            for c in model.stage_cfgs[:3]] == [10, 10, 10]


def test_known_norms_are_the_norm_layers_only():
    """The unknown-norm error lists registered ``*Norm*`` modules only."""
    with pytest.raises(KeyError) as e:
        check_norm_cfg('norm_cfg', dict(type='BogusNorm'))
    known = e.value.args[0].split('known norms: ')[1].split(', ')
    assert {'BN', 'GN', 'LN', 'IN', 'SyncBN'} <= set(known)
    for name in known:
        cls = MODELS.get(name)
        assert isinstance(cls, type) and issubclass(cls, nn.Module)
        assert 'Norm' in cls.__name__, name
    assert not {'Conv2d', 'ReLU', 'Linear', 'GELU'} & set(known)
    if 'MMSyncBN' in MODELS.module_dict:  # not a torch norm's subclass
        assert 'MMSyncBN' in known
