"""The SOFT backbone: presets, shapes, options, errors, init."""
import copy

import pytest
import torch
from conftest import tiny_arch

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import SOFTBlock, SoftmaxBlock
from mmsoft.models.layers import SOFTAttention
from mmsoft.models.layers.nr_autograd import SPECTRAL_MIN_M

TINY = tiny_arch(num_heads=[1, 1, 2, 2])

# paper Table 3 (IJCV Table 8 for Tiny with conv sampling): classifier params
PAPER_PARAMS = {
    'tiny': 13.07e6,
    'small': 24e6,
    'medium': 45e6,
    'large': 64e6,
    'huge': 87e6
}


def n_params(model):
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize('arch', sorted(PAPER_PARAMS))
def test_preset_param_counts_and_shapes(arch):
    model = SOFT(arch)
    head = 512 * 1000 + 1000  # the 1000-class linear head on the cls token
    total = n_params(model) + head
    assert abs(total - PAPER_PARAMS[arch]) / PAPER_PARAMS[arch] < 0.05
    # the preset's widths / heads with depth 1 per stage (for speed)
    a = copy.deepcopy(SOFT.arch_zoo[arch])
    a['depths'] = [1, 1, 1, 1]
    model = SOFT(a).eval()
    with torch.no_grad():
        outs = model(torch.randn(1, 3, 96, 128))
    dims = SOFT.arch_zoo[arch]['embed_dims']
    assert [tuple(o.shape) for o in outs] == [
        (1, d, 96 // s, 128 // s) for d, s in zip(dims, (4, 8, 16, 32))
    ]
    assert model.out_channels == dims


def test_official_small_depths_expressible():
    model = SOFT('small-official')
    assert model.depths == [1, 3, 20, 4]
    assert abs(n_params(model) + 513000 - 38.9e6) / 38.9e6 < 0.01
    custom = SOFT(
        tiny_arch((64, 128, 320, 512), (2, 4, 10, 16), (1, 3, 20, 4)))
    assert n_params(custom) == n_params(model)


def test_official_block_details():
    model = SOFT('tiny')
    blk = model.stages[0].blocks[0]
    assert isinstance(blk, SOFTBlock)
    assert isinstance(model.stages[3].blocks[0], SoftmaxBlock)
    fc1, act = blk.ffn.layers[0][0], blk.ffn.layers[0][1]  # mmcv FFN
    assert fc1.out_features == 4 * 64  # e = 4 (Table 2 text)
    assert isinstance(act, torch.nn.GELU) and act.approximate == 'tanh'
    assert blk.norm1.eps == blk.norm2.eps == 1e-5
    last = model.stages[3]
    assert last.blocks[0].ffn.layers[0][1].approximate == 'none'
    assert last.blocks[0].norm1.eps == last.norm.eps == 1e-6
    blocks = [s.blocks[0] for s in model.stages[:3]]
    assert [b.attn.dw_conv.kernel_size[0] for b in blocks] == [9, 5, 3]
    assert [b.attn.sampler.ratio for b in blocks] == [8, 4, 2]
    assert [tuple(s.pos_embed.shape) for s in model.stages] == [(1, 3136, 64),
                                                                (1, 784, 128),
                                                                (1, 196, 320),
                                                                (1, 50, 512)]
    # m = 49 bottleneck tokens at 224 x 224 in every SOFT stage
    with torch.no_grad():
        model.eval()(torch.randn(1, 3, 224, 224))
    for i, hw in enumerate([(56, 56), (28, 28), (14, 14)]):
        q = torch.randn(1, 1, hw[0] * hw[1], blocks[i].attn.head_dims)
        assert blocks[i].attn.sampler(q, hw).shape[2] == 49


@pytest.mark.parametrize('size', [(333, 500), (800, 1333), (37, 45)])
def test_non_divisible_input_sizes(size):
    arch = dict(TINY, num_heads=[1, 1, 1, 1])
    model = SOFT(arch).eval()
    H, W = size
    with torch.no_grad():
        outs = model(torch.randn(1, 3, H, W))
    for i, o in enumerate(outs):
        h, w = H, W
        for _ in range(i + 2):
            h, w = (h + 1) // 2, (w + 1) // 2
        assert tuple(o.shape[2:]) == (h, w)
        assert torch.isfinite(o).all()


def test_cls_token_output():
    model = SOFT(TINY, out_type='cls_token', out_indices=(3, )).eval()
    (cls, ) = model(torch.randn(2, 3, 64, 64))
    assert cls.shape == (2, 64)
    model2 = SOFT(TINY, out_type='featmap').eval()
    model2.load_state_dict(model.state_dict())
    with torch.no_grad():
        x = torch.randn(1, 3, 64, 64)
        assert model(x)[0].shape == (1, 64)
        assert model2(x)[-1].shape == (1, 64, 2, 2)


def test_out_indices_subset_and_negative():
    model = SOFT(TINY, out_indices=(1, -1)).eval()
    outs = model(torch.randn(1, 3, 64, 64))
    assert [o.shape[1] for o in outs] == [32, 64]
    assert model.out_channels == [32, 64]


def test_batch_independence():
    for attn_norm in (True, False):
        torch.manual_seed(0)
        model = SOFT(
            TINY, attn_cfg=dict(type='SOFTAttention',
                                attn_norm=attn_norm)).eval()
        x = torch.randn(4, 3, 64, 64)
        x[1:] *= 30  # very different samples in the same batch
        with torch.no_grad():
            batched = model(x)
            single = model(x[:1])
        for b, s in zip(batched, single):
            torch.testing.assert_close(b[:1], s, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_autocast_finite(dtype):
    model = SOFT(TINY)
    x = torch.randn(2, 3, 64, 64) * 50
    with torch.autocast('cpu', dtype=dtype):
        outs = model(x)
    assert all(torch.isfinite(o.float()).all() for o in outs)
    sum(o.float().mean() for o in outs).backward()
    assert all(
        torch.isfinite(p.grad).all() for p in model.parameters()
        if p.grad is not None)


def test_with_cp_same_gradients():
    torch.manual_seed(0)
    a = SOFT(TINY)
    b = SOFT(TINY, with_cp=True)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 3, 64, 64)
    for m in (a, b):
        sum(o.sum() for o in m(x)).backward()
    for (n, p), (_, q) in zip(a.named_parameters(), b.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)


def test_drop_path_rate_schedule():
    model = SOFT(dict(TINY, depths=[1, 1, 1, 2]), drop_path_rate=0.3)
    assert model.stages[0].blocks[0].drop.__class__.__name__ == 'Identity'
    assert model.stages[3].blocks[1].drop_path.drop_prob == pytest.approx(0.3)
    rates = [b.drop.drop_prob for s in model.stages[1:3] for b in s.blocks]
    assert rates == pytest.approx([0.075, 0.15])  # linspace(0, .3, 5)


def _residual_drops(model):
    """(attention, FFN) residual drops of the SOFT blocks."""
    return [(b.drop, b.ffn.dropout_layer) for s in model.stages[:3]
            for b in s.blocks if not isinstance(b.drop, torch.nn.Identity)]


@pytest.mark.parametrize('residual_drop', [None, 'drop_path', 'dropout'])
def test_drop_path_rate_means_stochastic_depth(residual_drop):
    """Whole branches of a sample by default; 'dropout' element-wise."""
    kw = {} if residual_drop is None else dict(residual_drop=residual_drop)
    model = SOFT(dict(TINY, depths=[1, 1, 2, 1]), drop_path_rate=0.5, **kw)
    model.train()
    drops = _residual_drops(model)
    assert len(drops) == 3
    torch.manual_seed(0)
    x = torch.ones(64, 49, 16)
    for attn_drop, ffn_drop in drops:
        for drop in (attn_drop, ffn_drop):
            y = drop(x)
            keep = 1 - drop.drop_prob if hasattr(drop, 'drop_prob') else \
                1 - drop.p
            vals = y.unique().tolist()
            assert len(vals) == 2 and vals[0] == 0
            assert vals[1] == pytest.approx(1 / keep)
            per_sample = y.flatten(1).std(1)
            if residual_drop == 'dropout':  # element-wise
                assert (per_sample > 0).all()
            else:  # the whole branch of a sample
                assert (per_sample == 0).all()
    with pytest.raises(ValueError, match='residual_drop must be one of'):
        SOFT(TINY, residual_drop='dropblock')


@pytest.mark.parametrize(  # also for a Pretrained init with no checkpoint
    'init_cfg',
    [None, dict(type='Pretrained', checkpoint=None, prefix='backbone.')])
def test_default_init_is_truncated_normal(init_cfg):
    model = SOFT(TINY, init_cfg=init_cfg)
    model.init_weights()
    # std 0.02 as the official timm init (truncation bounds are +-2 absolute)
    w = torch.cat([
        m.weight.flatten() for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ])
    assert 0.018 < w.std() < 0.022
    assert model.stages[0].blocks[0].attn.q.bias.abs().max() == 0
    assert 0.018 < model.stages[0].pos_embed.std() < 0.022


def test_wrong_input_rank():
    with pytest.raises(ValueError, match='B, C, H, W'):
        SOFT(TINY)(torch.randn(3, 64, 64))


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
