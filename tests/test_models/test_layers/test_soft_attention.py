"""SOFT attention (Alg. 1, Eq. 25): kernel, sampling, normalisation."""

import math

import pytest
import torch

from mmsoft.models.backbones.soft import SOFTBlock
from mmsoft.models.layers import (BottleneckSampler, NRConfig, SOFTAttention,
                                  bottleneck_apply, gaussian_kernel,
                                  landmark_grid, soft_attention, with_nr)


def newton_inverse(A, *args, stats=None, **kwargs):
    """``NRConfig(*args, **kwargs).inverse(A, stats)``."""
    return NRConfig(*args, **kwargs).inverse(A, stats)


def test_gaussian_kernel_matches_definition():
    x = torch.randn(2, 3, 50, 8, dtype=torch.float64)
    y = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    ref = torch.exp(-torch.cdist(x, y)**2 / 2)
    torch.testing.assert_close(gaussian_kernel(x, y), ref)


def test_gaussian_kernel_gradcheck():
    x = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    y = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(gaussian_kernel, (x, y))
    # the same tensor on both sides (A = exp(Q~ (-) Q~))
    assert torch.autograd.gradcheck(lambda a: gaussian_kernel(a, a), (y, ))


def test_gaussian_kernel_large_inputs_are_finite_and_bounded():
    x = torch.randn(1, 64, 16) * 1e4
    K = gaussian_kernel(x, x[:, :8])
    assert torch.isfinite(K).all() and (K >= 0).all() and (K <= 1).all()


def dense_soft(q, lm, v, attn_norm, init):
    """Reference: build the n x n matrix S^ = P A_n^+ P^T explicitly."""
    P = torch.exp(-torch.cdist(q, lm)**2 / 2)
    A = torch.exp(-torch.cdist(lm, lm)**2 / 2)
    if init == 'soft':
        A_inv = torch.linalg.inv(A +
                                 0.01 * torch.eye(A.shape[-1], dtype=A.dtype))
    else:
        A_inv = torch.linalg.pinv(A)
    if attn_norm:
        d = A.sum(-1).rsqrt()
        A_inv = d[..., :, None] * A_inv * d[..., None, :]
    S = P @ A_inv @ P.transpose(-1, -2)
    return S @ v


@pytest.mark.parametrize('attn_norm', [True, False])
def test_soft_attention_equals_dense_formula(attn_norm):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 64, 8, generator=g, dtype=torch.float64) / 8**.25
    lm = q[:, :, ::8]  # 8 landmarks
    v = torch.randn(2, 2, 64, 8, generator=g, dtype=torch.float64)
    init = 'soft_norm_per_sample' if attn_norm else 'soft'
    out = soft_attention(q, lm, v, attn_norm, NRConfig(40, init))
    torch.testing.assert_close(
        out, dense_soft(q, lm, v, attn_norm, init), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('attn_norm', [True, False])
@pytest.mark.parametrize('landmarks', ['strided', 'the queries'])
def test_training_path_gradients_equal_autograds(attn_norm, landmarks):
    """With a gradient, out = P Z(P^T V) runs as one Function
    (KernelAttention: grad P = G Z^T + V H^T in one product, the kernel's
    backward in place): its gradients equal plain autograd through the same
    ops, float64 (the self-kernel m = n included), and gradcheck passes."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 24, 4, generator=g, dtype=torch.float64) / 2
    q.requires_grad_()
    v = torch.randn(2, 2, 24, 4, generator=g, dtype=torch.float64)
    v.requires_grad_()
    G = torch.randn(2, 2, 24, 4, generator=g, dtype=torch.float64)

    def plain(q, lm, v):
        P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
        Z = bottleneck_apply(A, P.transpose(-1, -2) @ v, attn_norm)
        return P @ Z

    def landmarks_of(q):
        return q if landmarks == 'the queries' else q[:, :, ::3] * 1.1

    out = soft_attention(q, landmarks_of(q), v, attn_norm)
    assert out.grad_fn.name() == 'KernelAttentionBackward'
    got = torch.autograd.grad(out, (q, v), G)
    ref = plain(q, landmarks_of(q), v)
    want = torch.autograd.grad(ref, (q, v), G)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if attn_norm:  # its default gradient is exact (Eq. 16 without)
        assert torch.autograd.gradcheck(
            lambda q, v: soft_attention(q, landmarks_of(q), v, attn_norm),
            (q, v))


def test_normalisation_lowers_spectral_norm():
    """Prop. 6: ||D^-1/2 A^+ D^-1/2||_2 <= ||D^-1||_2 ||A^+||_2 < ||A^+||_2."""
    for m in (16, 49, 100):
        x = torch.randn(8, m, 32, dtype=torch.float64) * 0.3 / 32**0.25
        A = gaussian_kernel(x, x)
        A_inv = newton_inverse(A, 30)
        d = A.sum(-1).rsqrt()
        normed = d[..., :, None] * A_inv * d[..., None, :]
        s_plain = torch.linalg.matrix_norm(A_inv, ord=2)
        s_norm = torch.linalg.matrix_norm(normed, ord=2)
        bound = s_plain / A.sum(-1).amin(-1)
        assert (s_norm <= bound * (1 + 1e-9)).all()
        assert (s_norm < s_plain).all()


@pytest.mark.parametrize('mode', ['conv', 'avgpool', 'random', 'biased'])
@pytest.mark.parametrize('hw', [(16, 16), (13, 22), (3, 5)])
def test_sampler_counts(mode, hw):
    r = 4
    s = BottleneckSampler(8, r, mode).eval()
    q = torch.randn(2, 3, hw[0] * hw[1], 8)
    lm = s(q, hw)
    gh, gw = landmark_grid(hw, r)
    assert lm.shape == (2, 3, gh * gw, 8)
    assert gh == max(1, hw[0] // r) and gw == max(1, hw[1] // r)


def test_avgpool_sampler_is_window_mean():
    s = BottleneckSampler(4, 2, 'avgpool')
    q = torch.randn(1, 1, 16, 4)
    lm = s(q, (4, 4))
    grid = q.reshape(4, 4, 4)
    torch.testing.assert_close(lm[0, 0, 0], grid[:2, :2].mean((0, 1)))


def test_biased_sampler_takes_first_tokens():
    s = BottleneckSampler(4, 2, 'biased')
    q = torch.randn(1, 2, 16, 4)
    torch.testing.assert_close(s(q, (4, 4)), q[:, :, :4])


def test_random_sampler_random_in_train_fixed_in_eval():
    s = BottleneckSampler(4, 2, 'random')
    q = torch.arange(64.).reshape(1, 1, 64, 1).expand(1, 1, 64, 4)
    torch.manual_seed(0)
    draws = {tuple(s(q, (8, 8))[0, 0, :, 0].tolist()) for _ in range(5)}
    assert len(draws) > 1
    s.eval()
    assert s(q, (8, 8)).equal(s(q, (8, 8)))


def test_conv_sampler_official_layout():
    s = BottleneckSampler(32, 8, 'conv')
    assert tuple(s.conv.weight.shape) == (32, 32, 8, 8)
    assert s.conv.bias is None
    assert isinstance(s.norm, torch.nn.LayerNorm)


def test_sampler_errors():
    with pytest.raises(ValueError, match='conv'):
        BottleneckSampler(8, 2, 'nearest')
    with pytest.raises(ValueError, match='tokens'):
        BottleneckSampler(8, 2)(torch.randn(1, 1, 10, 8), (3, 3))


def test_attention_module_shapes_and_dw_conv():
    attn = SOFTAttention(64, 2, 4, dw_kernel_size=5)
    assert tuple(attn.dw_conv.weight.shape) == (2, 1, 5, 5)
    x = torch.randn(2, 12 * 20, 64)
    assert attn(x, (12, 20)).shape == x.shape


def test_attention_heads_must_divide():
    with pytest.raises(ValueError, match='divide'):
        SOFTAttention(64, 3, 4)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_attention_autocast_finite(dtype):
    attn = SOFTAttention(64, 2, 4)
    x = torch.randn(2, 256, 64) * 100
    with torch.autocast('cpu', dtype=dtype):
        out = attn(x, (16, 16))
    assert out.dtype == dtype
    assert torch.isfinite(out.float()).all()
    out.float().sum().backward()
    assert all(
        torch.isfinite(p.grad).all() for p in attn.parameters()
        if p.grad is not None)


@pytest.mark.parametrize('hw, cap', [((200, 304), 49), ((13, 400), 49),
                                     ((64, 64), 49), ((40, 40), 7)])
def test_max_landmarks_caps_m(hw, cap):
    for mode in ('conv', 'avgpool', 'random', 'biased'):
        s = BottleneckSampler(8, 4, mode, max_landmarks=cap).eval()
        q = torch.randn(1, 1, hw[0] * hw[1], 8)
        m = s(q, hw).shape[2]
        assert m <= cap
        assert m == math.prod(landmark_grid(hw, 4, cap))
        gh, gw = landmark_grid(hw, 4)
        if gh * gw <= cap:
            assert m == gh * gw  # the cap does not bind
        else:
            assert m >= cap // 4  # shrunk, not collapsed


def test_max_landmarks_inactive_below_cap_is_identical():
    torch.manual_seed(0)
    a = SOFTAttention(32, 1, 4)
    b = SOFTAttention(32, 1, 4, max_landmarks=49)
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 28 * 28, 32)
    torch.testing.assert_close(a(x, (28, 28)), b(x, (28, 28)))


@pytest.mark.parametrize('hw,want', [((28, 28), (7, 5)), ((28, 84), (7, 5)),
                                     ((13, 40), (3, 5)), ((6, 6), (1, 1))])
def test_landmark_hw_fixes_the_grid(hw, want):
    """m = gh * gw wherever the strided grid is at least that large;
    avgpool: the strided grid pooled to it. A smaller strided grid is never
    up-sampled (13 x 40 at r = 4: 3 x 10 -> 3 x 5; 6 x 6: 1 x 1), so
    m <= n / r^2 (issue 27: 24 x 24 landmarks on a 16 x 16 map used to give
    m = 576 > n = 256)."""
    import torch.nn.functional as F
    q = torch.randn(1, 2, hw[0] * hw[1], 8)
    m = want[0] * want[1]
    for mode in ('conv', 'avgpool', 'random', 'biased'):
        s = BottleneckSampler(8, 4, mode, landmark_hw=(7, 5)).eval()
        assert s(q, hw).shape == (1, 2, m, 8)
    grid = BottleneckSampler(8, 4, 'avgpool')(q, hw)  # (1, 2, gh * gw, 8)
    gh, gw = landmark_grid(hw, 4)
    pooled = F.adaptive_avg_pool2d(
        grid.reshape(2, gh, gw, 8).permute(0, 3, 1, 2), want)
    torch.testing.assert_close(
        BottleneckSampler(8, 4, 'avgpool', landmark_hw=[7, 5])(q, hw),
        pooled.flatten(2).transpose(1, 2)[None])


def test_landmark_grid_larger_than_token_map_is_clamped():
    """Issue 27: 24 x 24 landmarks on the 16 x 16 token map of a 64 x 64
    input (r = 1) were up-sampled to m = 576 > n = 256; the grid is now the
    token map itself (m = n), and with r = 4 the strided 4 x 4 grid."""
    q = torch.randn(1, 1, 16 * 16, 8)
    for r, m in ((1, 256), (4, 16)):
        for mode in ('conv', 'avgpool', 'random', 'biased'):
            s = BottleneckSampler(8, r, mode, landmark_hw=(24, 24)).eval()
            assert s(q, (16, 16)).shape[2] == m, (r, mode)
    attn = SOFTAttention(32, 1, 4, landmark_hw=(24, 24)).eval()
    ref = SOFTAttention(32, 1, 4).eval()
    ref.load_state_dict(attn.state_dict())
    x = torch.randn(1, 256, 32)
    # clamped to the strided grid: exactly plain SOFT at this size
    torch.testing.assert_close(attn(x, (16, 16)), ref(x, (16, 16)))


def test_landmark_hw_default_and_errors():
    torch.manual_seed(0)
    a = SOFTAttention(32, 1, 4)
    b = SOFTAttention(32, 1, 4, landmark_hw=(7, 7))  # = the strided grid
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 28 * 28, 32)
    torch.testing.assert_close(a(x, (28, 28)), b(x, (28, 28)))
    assert a.sampler.landmark_hw is None and 'landmark_hw=(7, 7)' in repr(b)
    with pytest.raises(ValueError, match='either max_landmarks or '):
        SOFTAttention(32, 1, 4, max_landmarks=49, landmark_hw=(7, 7))
    for bad in (7, (7, ), (7, 0), (7.0, 7)):
        with pytest.raises(ValueError, match='landmark_hw'):
            BottleneckSampler(8, 4, landmark_hw=bad)


def test_dw_conv_equals_official_grouped_layout():
    """Per-head filter on V, as the official (B*d, h, H, W) grouped conv."""
    attn = SOFTAttention(64, 4, 4, dw_kernel_size=5)
    B, (H, W) = 2, (6, 10)
    v = torch.randn(B, 4, H * W, 16)
    ref = attn.dw_conv(v.permute(0, 3, 1, 2).reshape(B * 16, 4, H, W))
    ref = ref.reshape(B, 16, 4, H * W).permute(0, 2, 3, 1)
    tokens = v.transpose(1, 2).reshape(B, H * W, 64)
    got = attn.dw_conv_tokens(tokens, (H, W)).view(B, H * W, 4, 16)
    torch.testing.assert_close(got.transpose(1, 2), ref)


@pytest.mark.parametrize('attn_norm', [True, False])
@pytest.mark.parametrize('method', ['iterative', 'spectral'])
def test_bottleneck_apply_equals_inverse_product(attn_norm, method):
    """A_n^+ W without forming A_n^+ (Eq. 25 normalisation applied to W)."""
    from mmsoft.models.layers.soft_attention import (bottleneck_apply,
                                                     bottleneck_inverse)
    g = torch.Generator().manual_seed(3)
    lm = torch.randn(2, 2, 140, 16, generator=g, dtype=torch.float64) / 2
    A = gaussian_kernel(lm, lm).requires_grad_()
    W = torch.randn(2, 2, 140, 16, generator=g, dtype=torch.float64)
    nr = NRConfig.of(dict(method=method), attn_norm)
    ref = bottleneck_inverse(A, attn_norm, nr) @ W
    got = bottleneck_apply(A, W, attn_norm, nr)
    torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12)
    gr = torch.autograd.grad(ref.square().sum(), A)[0]
    gg = torch.autograd.grad(got.square().sum(), A)[0]
    torch.testing.assert_close(gg, gr, rtol=1e-9, atol=1e-12)


def test_nr_settings_built_once_and_frozen(monkeypatch):
    """The NR settings become one frozen NRConfig at construction, checked
    once (NRConfig.__post_init__), whatever the spelling; the forward
    passes it down; nothing changes them on a built attention."""
    import dataclasses

    from mmsoft.models.layers import nr_config as pinv
    checks = []
    post_init = pinv.NRConfig.__post_init__
    monkeypatch.setattr(pinv.NRConfig, '__post_init__',
                        lambda self: checks.append(1) or post_init(self))
    attn = SOFTAttention(16, 2, 2, nr=dict(iters=7, method='iterative'))
    assert attn.nr == NRConfig(7, 'soft_norm_per_sample', 'iterative', 'exact')
    checks.clear()
    attn(torch.randn(2, 16, 16), (4, 4))
    attn.attention_matrix(torch.randn(1, 16, 16), (4, 4))
    assert checks == []  # iterative: the forward reuses the settings
    # the same settings from an NRConfig and from the attn_cfg keys
    assert SOFTAttention(16, 2, 2, nr=attn.nr).nr is attn.nr
    cfg = dict(type='SOFTAttention', nr_iters=7, nr_method='iterative')
    built = SOFTBlock(16, 2, 2, attn_cfg=cfg).attn
    assert built.nr == attn.nr
    with pytest.raises(ValueError, match='nr_iters'):
        SOFTBlock(16, 2, 2, attn_cfg=dict(cfg, nr=dict(iters=7)))
    # frozen: the settings, their fields and the attention's views of them
    with pytest.raises(dataclasses.FrozenInstanceError):
        attn.nr.iters = 3
    for name, value in (('nr', NRConfig()), ('nr_method', 'spectral'),
                        ('nr_iters', 3), ('nr_init', 'soft'), ('nr_backward',
                                                               'exact')):
        with pytest.raises(AttributeError, match='fixed at construction'):
            setattr(attn, name, value)
    assert attn.nr_method == attn.nr.method == 'iterative'
    assert attn.nr.iters == attn.nr_iters == 7
    # invalid settings: one clear error, from NRConfig, in every spelling
    with pytest.raises(ValueError, match=r'pseudo-inverse method \(nr_method'):
        SOFTAttention(16, 2, 2, nr=dict(method='svd'))
    with pytest.raises(ValueError, match='nr_method'):
        NRConfig(method='svd')
    with pytest.raises(ValueError, match='nr_backward'):
        attn.nr.replace(backward='autograd')
    with pytest.raises(ValueError, match='nr_iters'):
        NRConfig(iters=0)
    with pytest.raises(TypeError, match='unknown Newton-Raphson settings'):
        SOFTAttention(16, 2, 2, nr=dict(iter=3))
    # the flat keys are SOFTAttention's own arguments (attn_cfg's spelling)
    assert SOFTAttention(16, 2, 2, nr_iters=3, nr_init='soft').nr == \
        NRConfig(3, 'soft')
    with pytest.raises(ValueError, match="'soft_norm'"):
        NRConfig(init='soft_norm')  # the name before 0.3: removed
    assert SOFTAttention(16, 2, 2, attn_norm=False).nr.init == 'soft'
    assert SOFTAttention(
        16, 2, 2, attn_norm=False, nr=dict(iters=5)).nr == NRConfig(5, 'soft')


def test_with_nr_builds_a_copy_with_other_settings():
    """with_nr: a new model whose SOFT attentions were built with other
    settings, with the same weights, mode and requires_grad; the model
    given and the global random state are unchanged."""
    model = torch.nn.Sequential(
        SOFTAttention(16, 2, 2, nr=dict(method='iterative')),
        torch.nn.Identity()).double().eval()
    model[0].q.weight.requires_grad_(False)
    state = torch.random.get_rng_state()
    copy = with_nr(model, method='spectral', iters=30)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert model[0].nr.method == 'iterative' and model[0].nr.iters == 20
    assert copy[0].nr == NRConfig(30, 'soft_norm_per_sample', 'spectral')
    assert copy[0] is not model[0] and not copy.training
    assert copy[0].q.weight.dtype == torch.float64
    assert not copy[0].q.weight.requires_grad
    for k, v in model.state_dict().items():
        assert torch.equal(copy.state_dict()[k], v), k
    x = torch.randn(2, 16, 16, dtype=torch.float64)
    same = with_nr(model[0], method='spectral', iters=20)
    torch.testing.assert_close(same(x, (4, 4)), model[0](x, (4, 4)))
    reference = with_nr(model, nr=NRConfig(5, 'soft'))
    assert reference[0].nr == NRConfig(5, 'soft')


def test_fixed_settings_error_names_the_attention():
    """Setting an NR field of a built attention: the AttributeError names
    the attention's class."""
    attn = SOFTAttention(16, 2, 2)
    with pytest.raises(
            AttributeError,
            match='the Newton-Raphson settings of SOFTAttention are fixed at '
            'construction'):
        attn.nr_iters = 3


@pytest.mark.parametrize('batch', [(), (3, ), (2, 2)])
def test_bottleneck_inverse_default_is_eq25(batch):
    """bottleneck_inverse(A) (attn_norm default True, nr default: the IJCV
    rule 'soft_norm_per_sample') is D^-1/2 A^+ D^-1/2 (Eq. 25), D = diag(A
    1), for unbatched (m, m) and batched (..., m, m) A; attn_norm=False:
    A^+ alone."""
    from mmsoft.models.layers.soft_attention import bottleneck_inverse
    g = torch.Generator().manual_seed(5)
    lm = torch.randn(*batch, 12, 8, generator=g, dtype=torch.float64) / 2
    A = gaussian_kernel(lm, lm)
    A_inv = newton_inverse(A, 20, 'soft_norm_per_sample')
    d = A.sum(-1)
    ref = A_inv / (d[..., :, None] * d[..., None, :]).sqrt()
    got = bottleneck_inverse(A)
    assert got.shape == A.shape
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(  # NeurIPS: A^+ with its rule 'soft'
        bottleneck_inverse(A, False),
        newton_inverse(A, 20, 'soft'),
        rtol=0,
        atol=0)


def test_bottleneck_inverse_normalises_half_input_in_float32():
    """A^+ and its normalisation D^-1/2 run in float32 for half A: the
    result is that of the float32 copy of A."""
    from mmsoft.models.layers.soft_attention import bottleneck_inverse
    g = torch.Generator().manual_seed(6)
    lm = torch.randn(2, 16, 8, generator=g) / 2
    A = gaussian_kernel(lm, lm).bfloat16()
    got = bottleneck_inverse(A)
    assert got.dtype == torch.float32
    torch.testing.assert_close(
        got, bottleneck_inverse(A.float()), rtol=1e-6, atol=1e-7)


def test_with_nr_starts_from_each_attentions_own_settings():
    """with_nr: no ``nr``: each attention's own settings with ``changes``;
    ``nr`` a dict without init: the attention's variant rule (attn_norm);
    ``nr`` an NRConfig without changes: that very NRConfig."""
    own = NRConfig(7, 'soft_norm_per_matrix', 'iterative', 'exact')
    model = torch.nn.Sequential(
        SOFTAttention(16, 2, 2, nr=own),
        SOFTAttention(16, 2, 2, attn_norm=False, nr=dict(iters=4)))
    same = with_nr(model)
    assert same[0].nr == own and same[1].nr == NRConfig(4, 'soft')
    changed = with_nr(model, iters=9)
    assert changed[0].nr == own.replace(iters=9)
    assert changed[1].nr == NRConfig(9, 'soft')
    by_dict = with_nr(model, nr=dict(iters=5))
    assert by_dict[0].nr == NRConfig(5, 'soft_norm_per_sample')
    assert by_dict[1].nr == NRConfig(5, 'soft')
    cfg = NRConfig(3, 'soft_norm_per_batch', 'spectral')
    given = with_nr(model, nr=cfg)
    assert given[0].nr is cfg and given[1].nr is cfg


def test_sampler_extra_repr():
    """The sampler's repr line: mode and ratio, then the opt-in cap or the
    fixed grid when set."""
    assert BottleneckSampler(8, 4).extra_repr() == 'mode=conv, ratio=4'
    assert BottleneckSampler(8, 2, 'avgpool', max_landmarks=49).extra_repr() \
        == 'mode=avgpool, ratio=2, max_landmarks=49'
    assert BottleneckSampler(8, 4, 'biased', landmark_hw=(3, 5)).extra_repr() \
        == 'mode=biased, ratio=4, landmark_hw=(3, 5)'
