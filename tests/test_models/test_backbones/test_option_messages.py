"""``SOFT``'s keyword options: exact refusals, and their ``stage_cfgs``."""
import re

import pytest
from conftest import tiny_arch

from mmsoft.models.backbones import SOFT

ARCH = tiny_arch((8, 8, 8, 16), (1, 1, 1, 2))
RATE = 'must be a number in [0, 1), got '


@pytest.mark.parametrize('kwargs, error, message', [
    (dict(in_channels=0), ValueError,
     'SOFT: in_channels must be an int >= 1, got 0 (int)'),
    (dict(pretrain_img_size=16), ValueError,
     'SOFT: pretrain_img_size must be an int >= 32, got 16 (int)'),
    (dict(drop_rate=1.5), ValueError, f'SOFT: drop_rate {RATE}1.5'),
    (dict(attn_drop_rate=-0.1), ValueError,
     f'SOFT: attn_drop_rate {RATE}-0.1'),
    *[(dict(drop_path_rate=v), ValueError, f'SOFT: drop_path_rate {RATE}{v}')
      for v in (1.0, 1, -0.1, False, True)],
    (dict(out_type='bogus'), ValueError,
     "unknown out_type 'bogus'; choose one of ('featmap', 'cls_token')"),
    (dict(frozen_stages=-2), ValueError,
     'SOFT: frozen_stages must be an int >= -1, got -2 (int)'),
    (dict(frozen_stages=5), ValueError,
     'frozen_stages must be in [-1, 4], got 5'),
    (dict(out_indices=()), ValueError,
     'out_indices is empty; SOFT needs at least one output stage (0-3)'),
    (dict(out_indices=(0, 4)), ValueError,
     'out_indices entry 4 is out of range; SOFT has stages 0..3'),
    (dict(out_indices=(-5, )), ValueError,
     'out_indices entry -5 is out of range; SOFT has stages 0..3'),
    (dict(bogus=1), TypeError,
     "SOFT.__init__() got an unexpected keyword argument 'bogus'"),
    (dict(attn_nrom=True), TypeError,
     "SOFT.__init__() got an unexpected keyword argument 'attn_nrom'"),
])
def test_refusal_names_the_option_the_value_and_the_rule(
        kwargs, error, message):
    with pytest.raises(error, match='^' + re.escape(message) + '$'):
        SOFT(ARCH, **kwargs)


@pytest.mark.parametrize('out_indices, want', [(2, (2, )), (-4, (0, )),
                                               ((3, -1, 0), (0, 3))])
def test_out_indices_int_negative_and_repeated(out_indices, want):
    """An int is one stage; -n..-1 count from the end; repeats merge."""
    model = SOFT(ARCH, pretrain_img_size=32, out_indices=out_indices)
    assert model.out_indices == want


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
            ] == pytest.approx([0., 0.1, 0.2, 0.3])
    assert [len(c['drop_path_rates']) for c in cfgs] == [1, 1, 1, 1]
    assert {c['qkv_bias'] for c in cfgs} == {False}
    assert {c['drop_rate'] for c in cfgs} == {0.1}
    assert [c.get('residual_drop') for c in cfgs] == ['dropout'] * 3 + [None]
    assert [c.get('attn_drop_rate') for c in cfgs] == [None] * 3 + [0.2]
    assert [c['type'] for c in cfgs] == ['SOFTStage'] * 3 + ['ClsTokenStage']


@pytest.mark.parametrize('name, value', [
    ('act_cfg', [dict(type='GELU')] * 4),
    ('norm_cfg', 'LN'),
    ('norm_cfg', [dict(type='LN')] * 3),
    ('attn_cfg', [dict(type='SOFTAttention')] * 3 + [None]),
])
def test_config_of_the_wrong_shape_names_the_option(name, value):
    """A list (mmsoft 0.3's per-stage form) or a name: what to write."""
    message = (f"SOFT: {name} must be a dict (one stage's own: "
               f"stage_cfgs[i][{name!r}]), got {value!r}")
    with pytest.raises(TypeError, match='^' + re.escape(message) + '$'):
        SOFT(ARCH, **{name: value})


@pytest.mark.parametrize('with_cp', [False, True])
def test_with_cp_reaches_every_stage_as_given(with_cp):
    model = SOFT(ARCH, pretrain_img_size=32, with_cp=with_cp)
    assert [s.with_cp for s in model.stages] == [with_cp] * 4
    assert all(type(s.with_cp) is bool for s in model.stages)
