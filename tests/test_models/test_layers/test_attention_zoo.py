"""The attention zoo of Table 1: each entry's defining property.

Tiny dimensions, float64 where exactness is asserted.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import SOFTBlock
from mmsoft.models.layers import (BottleneckSampler, SOFTAttention,
                                  gaussian_kernel, landmark_grid, query_index,
                                  reduce_map)
from mmsoft.models.layers.nr_config import NRConfig
from mmsoft.models.layers.zoo import (LinformerAttention,
                                      NystromformerAttention,
                                      PerformerAttention, SimAAttention,
                                      SoftmaxZooAttention, favor_features,
                                      iterative_pinv, l1_normalize_tokens,
                                      orthogonal_gaussian, sima_order,
                                      spread_to_tokens)
from mmsoft.registry import ATTENTIONS


def newton_inverse(A, *args, stats=None, **kwargs):
    """``NRConfig(*args, **kwargs).inverse(A, stats)``."""
    return NRConfig(*args, **kwargs).inverse(A, stats)


HW = (7, 5)  # not a multiple of the ratio on purpose
N = HW[0] * HW[1]
C, HEADS = 16, 2
D = C // HEADS

#: one short name per registered attention
ATTENTION_TYPES = ('soft', 'softmax', 'linformer', 'performer',
                   'nystromformer', 'sima')


def tokens(B=2, n=N, c=C, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, c, generator=g, dtype=torch.float64)


def build(t, ratio=2, dw_kernel_size=3, **options):
    """``t`` as a SOFT block builds it (``attn_cfg=dict(type=t, ...)``)."""
    torch.manual_seed(0)
    return SOFTBlock(
        C,
        HEADS,
        ratio,
        dw_kernel_size,
        attn_cfg=dict(type=t, **options),
        qkv_bias=True).attn.double().eval()


def values(attn, x):
    return attn._split(attn.v(x))


def merge(t):
    B, h, n, d = t.shape
    return t.transpose(1, 2).reshape(B, n, h * d)


# ---------------------------------------------------------------- registry
def test_registry_lists_the_zoo_under_class_names_and_aliases():
    ATTENTIONS.import_from_location()
    types = sorted(ATTENTIONS.module_dict)
    for t in ATTENTION_TYPES:
        cls = ATTENTIONS.get(t)
        assert cls is not None and t in types
        assert ATTENTIONS.get(cls.__name__) is cls  # registered at the class
        assert cls.__name__ in types
    assert set(types) == {t
                          for t in ATTENTION_TYPES} | {
                              ATTENTIONS.get(t).__name__
                              for t in ATTENTION_TYPES
                          }
    with pytest.raises(KeyError, match='nope'):
        build('nope')


def test_attn_cfg_errors_name_the_problem():
    # an option the chosen attention does not take (no silent dropping)
    with pytest.raises(TypeError, match='nr_iters'):
        build('linformer', nr_iters=10)
    with pytest.raises(TypeError, match='sr_mode'):
        build('soft', sr_mode='conv')
    with pytest.raises(TypeError, match='not a mapping'):
        SOFTBlock(C, HEADS, 2, attn_cfg='soft')


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_block_kwargs_build_and_forward_backward(attn_type):
    attn = build(attn_type).train()
    x = tokens().requires_grad_()
    out = attn(x, HW)
    assert out.shape == x.shape
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_every_entry_keeps_the_per_head_dw_conv_on_v(attn_type):
    attn = build(attn_type, dw_kernel_size=5)
    soft = SOFTAttention(C, HEADS, 2, dw_kernel_size=5)
    assert attn.dw_conv.weight.shape == soft.dw_conv.weight.shape
    assert build(attn_type, dw_kernel_size=0).dw_conv is None
    # the same function as SOFT's branch for the same filters
    soft = soft.double()
    with torch.no_grad():
        soft.dw_conv.weight.copy_(attn.dw_conv.weight)
        v = torch.randn(2, HEADS, N, D, dtype=torch.float64)
        torch.testing.assert_close(
            attn.dw_conv_tokens(merge(v), HW),
            soft.dw_conv_tokens(merge(v), HW))


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_forward_is_the_attention_matrix_times_v_plus_dw_conv(attn_type):
    """The rows given to visualize_attention are the module's real mixing
    weights: proj(M V + dwconv(V)) == forward (linformer: average-pooling
    reduction, for which the reduced values are pooled values)."""
    kw = dict(sr_mode='avgpool') if attn_type == 'linformer' else {}
    attn = build(attn_type, **kw)
    x = tokens()
    with torch.no_grad():
        M = attn.attention_matrix(x, HW)
        v = values(attn, x)
        ref = attn.proj(merge(M @ v) + attn.dw_conv_tokens(merge(v), HW))
        out = attn(x, HW)
    assert M.shape == (2, HEADS, N, N)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_attention_row_is_a_row_of_the_matrix(attn_type):
    attn = build(attn_type)
    x = tokens()
    M = attn.attention_matrix(x, HW)
    for index, i in [((3, 2), 17), (0, 0), (N - 1, N - 1)]:
        row = attn.attention_row(x, HW, index)
        torch.testing.assert_close(row, M[:, :, i], rtol=1e-9, atol=1e-12)
    with pytest.raises(IndexError):
        attn.attention_row(x, HW, (7, 0))


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_zoo_in_the_backbone(attn_type):
    arch = dict(
        embed_dims=[8, 16, 16, 32],
        num_heads=[1, 2, 2, 2],
        depths=[1, 1, 1, 1])
    ref = SOFT(arch).eval()
    model = SOFT(arch, attn_cfg=dict(type=attn_type)).eval()
    x = torch.randn(1, 3, 72, 40)
    outs = model(x)
    assert [o.shape for o in outs] == [o.shape for o in ref(x)]
    assert all(torch.isfinite(o).all() for o in outs)
    # stage 4 (softmax + cls token) and the convs are shared architecture
    same = [k for k in ref.state_dict() if '.attn.' not in k]
    assert set(same) <= set(model.state_dict())


# ---------------------------------------------------------------- softmax
def test_softmax_rows_are_a_distribution_and_match_the_formula():
    attn = build('softmax', dw_kernel_size=0)
    x = tokens()
    M = attn.attention_matrix(x, HW)
    assert (M > 0).all()
    torch.testing.assert_close(
        M.sum(-1), torch.ones(2, HEADS, N, dtype=M.dtype))
    q, k, v = (attn._split(f(x)) for f in (attn.q, attn.k, attn.v))
    S = (q @ k.transpose(-1, -2) / math.sqrt(D)).softmax(-1)
    torch.testing.assert_close(M, S)
    with torch.no_grad():
        out, _ = attn._mix(x, HW)
    torch.testing.assert_close(out, S @ v)


# ---------------------------------------------------------------- linformer
@pytest.mark.parametrize('sr_mode', ['conv', 'avgpool'])
def test_linformer_attends_softmax_over_m_reduced_tokens(sr_mode):
    attn = build('linformer', ratio=2, sr_mode=sr_mode)
    x = tokens()
    w = attn.reduced_attention_row(x, HW, 11)
    m = math.prod(landmark_grid(HW, 2))
    assert w.shape == (2, HEADS, m) and (w > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(2, HEADS, dtype=w.dtype))
    # spread over the token map, the row keeps total weight 1; the last row
    # (7 mod 2) and column (5 mod 2) are outside every reduced cell
    row = attn.attention_row(x, HW, 11).reshape(2, HEADS, *HW)
    torch.testing.assert_close(row.sum((-2, -1)), w.sum(-1))
    assert row[..., -1, :].abs().max() == 0 and \
        row[..., :, -1].abs().max() == 0


def test_linformer_without_reduction_is_softmax_attention():
    lin = build('linformer', ratio=1)
    soft = build('softmax', ratio=1)
    soft.load_state_dict(lin.state_dict())  # same parameters at r = 1
    x = tokens()
    with torch.no_grad():
        torch.testing.assert_close(lin(x, HW), soft(x, HW))


def test_linformer_cap_and_fixed_grid():
    lin = LinformerAttention(C, HEADS, 1, landmark_hw=(2, 3)).double()
    w = lin.reduced_attention_row(tokens(), HW, 0)
    assert w.shape[-1] == 6
    lin = LinformerAttention(
        C, HEADS, 1, sr_mode='avgpool', max_landmarks=8).double()
    assert lin.reduced_attention_row(tokens(), HW, 0).shape[-1] <= 8


@pytest.mark.parametrize('kw, m', [({}, 12), (dict(max_landmarks=6), 4),
                                   (dict(landmark_hw=(1, 3)), 3)])
def test_spread_to_tokens_is_the_transpose_of_pooling(kw, m):
    """The transpose of the r x r average pooling of the map (with
    ``max_landmarks`` / ``landmark_hw``: of the capped grid, ``reduce_map``),
    each row's total weight kept; weights of another length are one
    line."""
    w = torch.rand(3, m, dtype=torch.float64)
    z = torch.randn(6, 8, dtype=torch.float64)
    spread = spread_to_tokens(w, (6, 8), 2, **kw)
    pooled = reduce_map(z[None, None], 2, **kw).flatten()
    assert pooled.numel() == m
    torch.testing.assert_close(spread @ z.flatten(), w @ pooled)
    if not kw:
        pooled = F.avg_pool2d(z[None, None], 2).flatten()
        torch.testing.assert_close(spread @ z.flatten(), w @ pooled)
        torch.testing.assert_close(spread.sum(-1), w.sum(-1))
    for bad in (torch.rand(m + 1), torch.rand(3, 4, m - 1)):  # any dims
        with pytest.raises(ValueError) as info:
            spread_to_tokens(bad, (6, 8), 2, **kw)
        n = bad.shape[-1]
        assert str(info.value) == f'{n} weights for {m} reduced tokens'


# ---------------------------------------------------------------- performer
def softmax_matrix(q, k):
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)


def test_performer_approximates_softmax_as_features_grow():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 24, C, generator=g, dtype=torch.float64) * 0.5
    errs = {}
    for M in (4, 64, 1024):
        e = []
        for seed in range(4):
            attn = PerformerAttention(
                C, HEADS, 1, num_features=M, dw_kernel_size=0).double().eval()
            torch.manual_seed(100)  # the same projections for every M
            for lin in (attn.q, attn.k):
                torch.nn.init.normal_(lin.weight, std=0.3)
            attn.redraw(torch.Generator().manual_seed(seed))
            S = softmax_matrix(attn._split(attn.q(x)), attn._split(attn.k(x)))
            A = attn.attention_matrix(x, (4, 6))
            e.append(((A - S).norm() / S.norm()).item())
        errs[M] = sum(e) / len(e)
    # Monte-Carlo error ~ 1 / sqrt(M): about 0.6, 0.29, 0.10 here
    assert errs[1024] < errs[64] < errs[4]
    assert errs[1024] < 0.15 and errs[4] > 4 * errs[1024]


def test_performer_weights_positive_normalised_and_saved():
    attn = build('performer')
    M = attn.attention_matrix(tokens(), HW)
    assert (M > 0).all()  # positive features: no negative weights
    torch.testing.assert_close(
        M.sum(-1), torch.ones_like(M[..., 0]), rtol=0, atol=1e-4)  # eps in D
    assert 'features' in attn.state_dict()
    before = attn.features.clone()
    attn.redraw()
    assert not torch.equal(before, attn.features)
    # orthogonal blocks: the first d rows are mutually orthogonal
    w = attn.features[:D]
    gram = w @ w.t()
    torch.testing.assert_close(
        gram - torch.diag(torch.diagonal(gram)),
        torch.zeros_like(gram),
        atol=1e-5,
        rtol=0)


def test_performer_is_stable_for_large_logits():
    attn = PerformerAttention(C, HEADS, 1, dw_kernel_size=0).eval()
    x = torch.randn(2, N, C) * 30
    with torch.no_grad():
        out = attn(x, HW)
    assert torch.isfinite(out).all()


# ---------------------------------------------------------------- nystrom
def test_nystromformer_with_all_tokens_as_landmarks_is_softmax():
    """m = n (r = 1) and an exact inverse: F A^+ B = S S^+ S = S."""
    attn = build('nystromformer', ratio=1, pinv='exact', dw_kernel_size=0)
    x = tokens()
    M = attn.attention_matrix(x, HW)
    S = softmax_matrix(attn._split(attn.q(x)), attn._split(attn.k(x)))
    torch.testing.assert_close(M, S, rtol=1e-6, atol=1e-8)


def test_nystromformer_landmarks_rows_sum_to_one_and_iterative_pinv():
    attn = build('nystromformer', ratio=2, pinv='exact')
    x = tokens()
    M = attn.attention_matrix(x, HW)
    # A invertible: F A^-1 B 1 = F A^-1 1 = F 1 = 1
    torch.testing.assert_close(M.sum(-1), torch.ones_like(M[..., 0]))
    F_, A_inv, B_ = attn._kernels(x, HW)
    assert F_.shape[-1] == math.prod(landmark_grid(HW, 2))
    # the Nystromformer iteration converges to the pseudo-inverse
    g = torch.Generator().manual_seed(0)
    A = (torch.randn(3, 10, 10, generator=g, dtype=torch.float64)).softmax(-1)
    exact = torch.linalg.pinv(A)
    e2 = (iterative_pinv(A, 2) - exact).norm() / exact.norm()
    e20 = (iterative_pinv(A, 20) - exact).norm() / exact.norm()
    assert e20 < 1e-8 < e2


# ---------------------------------------------------------------- sima
def test_sima_normalises_each_channel_over_tokens():
    t = torch.randn(2, 3, 40, 5, dtype=torch.float64)
    tn = l1_normalize_tokens(t, eps=0)
    torch.testing.assert_close(tn.abs().sum(-2),
                               torch.ones(2, 3, 5, dtype=t.dtype))


@pytest.mark.parametrize('order', ['auto', 'linear', 'quadratic'])
def test_sima_equals_its_quadratic_form_in_any_order(order):
    attn = build('sima', order=order, dw_kernel_size=0)
    x = tokens()
    q = l1_normalize_tokens(attn._split(attn.q(x)))
    k = l1_normalize_tokens(attn._split(attn.k(x)))
    v = values(attn, x)
    with torch.no_grad():
        out, _ = attn._mix(x, HW)
    torch.testing.assert_close(out, (q @ k.transpose(-1, -2)) @ v)


def test_sima_order_follows_n_vs_d_and_no_softmax():
    assert sima_order(100, 32) == 'linear'
    assert sima_order(16, 32) == 'quadratic'
    attn = build('sima')
    x = tokens()
    M = attn.attention_matrix(x, HW)
    assert (M < 0).any()  # no softmax: negative weights exist
    assert M.abs().max() <= D  # bounded by d (SimA Sec. 3)


def test_sima_is_invariant_to_channel_scale():
    """A dominating (scaled) q / k channel is normalised away."""
    attn = build('sima')
    x = tokens()
    with torch.no_grad():
        ref = attn(x, HW)
        attn.q.weight[3] *= 50
        attn.q.bias[3] *= 50
        attn.k.weight[:4] *= 0.01
        attn.k.bias[:4] *= 0.01
        torch.testing.assert_close(attn(x, HW), ref, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------- SOFT
@pytest.mark.parametrize('attn_norm', [True, False])
def test_soft_row_is_row_of_p_ainv_pt(attn_norm):
    attn = SOFTAttention(
        C, HEADS, 2, attn_norm=attn_norm, sampling='avgpool').double().eval()
    x = tokens()
    q = attn._split(attn.q(x)) * D**-0.25
    lm = F.avg_pool2d(q.reshape(2 * HEADS, *HW, D).permute(0, 3, 1, 2), 2)
    lm = lm.flatten(2).transpose(1, 2).reshape(2, HEADS, -1, D)
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    A_inv = newton_inverse(A, 20,
                           'soft_norm_per_sample' if attn_norm else 'soft')
    if attn_norm:
        d = A.sum(-1).rsqrt()
        A_inv = d[..., :, None] * A_inv * d[..., None, :]
    S = P @ A_inv @ P.transpose(-1, -2)
    row = attn.attention_row(x, HW, (2, 3))
    torch.testing.assert_close(row, S[:, :, 13], rtol=1e-7, atol=1e-9)
    assert S.transpose(-1, -2).allclose(S)  # symmetric, unlike softmax


def test_max_landmarks_reaches_reduced_zoo_entries_through_the_block():
    for t in ('linformer', 'nystromformer'):
        blk = SOFTBlock(C, HEADS, 1, attn_cfg=dict(type=t, max_landmarks=4))
        assert blk.attn.max_landmarks == 4
    with pytest.raises(TypeError, match='max_landmarks'):
        SOFTBlock(C, HEADS, 1, attn_cfg=dict(type='softmax', max_landmarks=4))
    blk = SOFTBlock(C, HEADS, 1, attn_cfg=dict(type='softmax'))
    assert isinstance(blk.attn, SoftmaxZooAttention)
    assert isinstance(build('sima'), SimAAttention)
    assert isinstance(build('nystromformer'), NystromformerAttention)


def test_query_index_of_a_pair_or_a_flat_index():
    """(row, col) -> row * W + col; every token of the H x W map is a
    query, nothing outside it (one line naming the query and the map)."""
    hw = (3, 4)
    assert [
        query_index((r, c), hw) for r, c in [(0, 0), (0, 3), (2, 0), (2, 3)]
    ] == [0, 3, 8, 11]
    assert query_index([1, 2], hw) == 6
    assert [query_index(i, hw) for i in (0, 11)] == [0, 11]
    assert query_index(torch.tensor(5), hw) == 5
    for bad, msg in [((3, 0), 'query (3, 0) outside the 3x4 map'),
                     ((0, 4), 'query (0, 4) outside the 3x4 map'),
                     ((-1, 0), 'query (-1, 0) outside the 3x4 map'),
                     ((0, -1), 'query (0, -1) outside the 3x4 map'),
                     (12, 'query index 12 outside the 3x4 map'),
                     (-1, 'query index -1 outside the 3x4 map')]:
        with pytest.raises(IndexError) as info:
            query_index(bad, hw)
        assert str(info.value) == msg


def test_print_names_each_mixers_settings():
    """``print(model)`` shows the heads, the ratio and what each mixer adds
    (``repr_keys``), and the sampler's cap on the landmarks."""
    assert [
        cls(16, 2, 2, **kw).extra_repr() for cls, kw in
        [(SoftmaxZooAttention,
          {}), (LinformerAttention, dict(
              sr_mode='avgpool')), (PerformerAttention, dict(
                  num_features=5)), (NystromformerAttention, dict(
                      pinv_iters=3)), (SimAAttention, dict(order='linear'))]
    ] == [
        'heads=2, ratio=2', 'heads=2, ratio=2, sr_mode=avgpool',
        'heads=2, ratio=2, num_features=5',
        'heads=2, ratio=2, pinv=iterative, pinv_iters=3',
        'heads=2, ratio=2, order=linear'
    ]
    assert [
        BottleneckSampler(8, 2, **kw).extra_repr()
        for kw in [{}, dict(max_landmarks=9),
                   dict(landmark_hw=(2, 3))]
    ] == [
        'mode=conv, ratio=2', 'mode=conv, ratio=2, max_landmarks=9',
        'mode=conv, ratio=2, landmark_hw=(2, 3)'
    ]


# ------------------------------------------------ contracts, one at a time
def test_zoo_qkv_biases_default_on_and_can_be_turned_off():
    """``qkv_bias`` (default True) gives q / k / v their biases."""
    for cls in (SoftmaxZooAttention, LinformerAttention, PerformerAttention,
                NystromformerAttention, SimAAttention):
        on = cls(C, HEADS, 2)
        assert all(f.bias is not None for f in (on.q, on.k, on.v)), cls
        off = cls(C, HEADS, 2, qkv_bias=False)
        assert all(f.bias is None for f in (off.q, off.k, off.v)), cls


def test_zoo_choices_are_refused_in_one_line_naming_the_option():
    cases = [(lambda: LinformerAttention(C, HEADS, 2, sr_mode='pool'),
              "unknown sr_mode 'pool'; choose one of ('conv', 'avgpool')"),
             (lambda: NystromformerAttention(C, HEADS, 2, pinv='svd'),
              "unknown pinv 'svd'; choose one of ('iterative', 'exact')"),
             (lambda: SimAAttention(C, HEADS, 2, order='cubic'),
              "unknown order 'cubic'; choose one of "
              "('auto', 'quadratic', 'linear')"),
             (lambda: sima_order(4, 4, 'cubic'),
              "unknown order 'cubic'; choose one of "
              "('auto', 'quadratic', 'linear')"),
             (lambda: PerformerAttention(C, HEADS, 2, num_features=0),
              'num_features must be an int >= 1, got 0 (int)')]
    for make, msg in cases:
        with pytest.raises(ValueError) as info:
            make()
        assert str(info.value) == msg


def test_linformer_conv_mode_reduces_by_conv_then_layernorm():
    """``sr_mode='conv'``: X_r = LN(Conv_{r x r, stride r}(X)), the keys
    X_r W_k (docstring formula), at r = 2."""
    attn = build('linformer', ratio=2, sr_mode='conv')
    assert {'sr.weight', 'norm.weight'} <= set(attn.state_dict())
    x = tokens()
    xm = x.transpose(1, 2).reshape(2, C, *HW)
    xr = F.conv2d(xm, attn.sr.weight, attn.sr.bias, stride=2)
    xr = F.layer_norm(
        xr.flatten(2).transpose(1, 2), (C, ), attn.norm.weight, attn.norm.bias,
        attn.norm.eps)
    with torch.no_grad():
        q = attn._split(attn.q(x))
        k = attn._split(attn.k(xr))
        ref = softmax_matrix(q, k)[:, :, 11]
        torch.testing.assert_close(attn.reduced_attention_row(x, HW, 11), ref)
    # no reduction parameters in avgpool mode or at r = 1
    for a in (build('linformer', ratio=2,
                    sr_mode='avgpool'), build('linformer', ratio=1)):
        assert a.sr is None and a.norm is None


@pytest.mark.parametrize('kw',
                         [dict(landmark_hw=(2, 3)),
                          dict(max_landmarks=4)])
def test_linformer_rows_follow_the_landmark_cap(kw):
    """With a capped grid the rows are still the real mixing weights:
    proj(M V + dwconv(V)) == forward (average-pooling reduction)."""
    attn = build('linformer', sr_mode='avgpool', **kw)
    hw = (6, 4)  # a 3 x 2 grid before the cap
    x = tokens(n=24)
    with torch.no_grad():
        M = attn.attention_matrix(x, hw)
        v = values(attn, x)
        ref = attn.proj(merge(M @ v) + attn.dw_conv_tokens(merge(v), hw))
        torch.testing.assert_close(attn(x, hw), ref, rtol=1e-9, atol=1e-9)


# ---------------------------------------------------- performer contracts
def test_favor_features_are_exp_features_up_to_a_cancelling_factor():
    """phi(x) = exp(W x - |x|^2 / 2) / sqrt(M), times a stabilising factor
    exp(-max) that cancels in D^-1: one per query row, one per (batch,
    head) for the keys; the largest feature is exp(0) / sqrt(M), so
    nothing overflows or underflows, for any scale of x; in x's dtype for
    a float32 W."""
    M, d = 12, 4
    w = orthogonal_gaussian(M, d, torch.Generator().manual_seed(1))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 6, d, generator=g, dtype=torch.float64)
    x[0, 0, 0] *= 40  # a query of a very large norm
    x[1] = x[1] / x[1].norm(dim=-1, keepdim=True) * 40  # keys of norm 40

    def log_phi(t):
        return (t @ w.double().t() - t.square().sum(-1, keepdim=True) / 2 -
                math.log(M) / 2)

    pq, pk = favor_features(x, w, True), favor_features(x, w, False)
    assert pq.dtype == pk.dtype == torch.float64
    assert pq.shape == pk.shape == (2, 2, 6, M)
    # queries: exact up to one factor per row
    r = pq.log() - log_phi(x)
    torch.testing.assert_close(r, r[..., :1].expand_as(r))
    torch.testing.assert_close(
        pq.amax(-1), torch.full((2, 2, 6), M**-0.5, dtype=torch.float64))
    # keys (well-scaled per head): exact up to one factor per (batch, head)
    xk = x.clone()
    xk[0, 0, 0] /= 40
    pk = favor_features(xk, w, False)
    r = pk.log() - log_phi(xk)
    torch.testing.assert_close(r, r[..., :1, :1].expand_as(r))
    torch.testing.assert_close(
        pk.amax((-2, -1)), torch.full((2, 2), M**-0.5, dtype=torch.float64))


def test_performer_matrix_is_the_favor_formula():
    """eps = 0: A = D^-1 phi(Q') phi(K')^T with q' = q / d^(1/4) and the
    features of the buffer (docstring formula)."""
    attn = PerformerAttention(
        C, HEADS, 1, num_features=12, dw_kernel_size=0, eps=0).double().eval()
    x = tokens()
    w = attn.features

    def phi(t):
        t = t * D**-0.25
        return torch.exp(t @ w.t() - t.square().sum(-1, keepdim=True) / 2)

    with torch.no_grad():
        K = phi(attn._split(attn.q(x))) @ phi(attn._split(
            attn.k(x))).transpose(-1, -2)
        ref = K / K.sum(-1, keepdim=True)
        torch.testing.assert_close(attn.attention_matrix(x, HW), ref)
        out, _ = attn._mix(x, HW)
        torch.testing.assert_close(out, ref @ values(attn, x))


def test_performer_rows_stay_distributions_for_queries_of_any_norm():
    """A query of a large norm only sharpens its row (as in softmax): every
    row is still a distribution, none underflows to zero."""
    attn = PerformerAttention(
        C, HEADS, 1, num_features=12, dw_kernel_size=0, eps=0).double().eval()
    with torch.no_grad():
        attn.k.weight.mul_(0.01)  # moderate keys
    s = torch.ones(2, 12, 1, dtype=torch.float64)
    s[:, ::3] = 30  # every third query large
    x = tokens(n=12) * s
    M = attn.attention_matrix(x, (3, 4))
    assert torch.isfinite(M).all() and (M >= 0).all()
    torch.testing.assert_close(M.sum(-1), torch.ones_like(M[..., 0]))
    with torch.no_grad():
        out = attn(x, (3, 4))
    assert torch.isfinite(out).all()


def test_performer_default_feature_count():
    """num_features=None: max(16, round(d ln d)) for head dim d."""
    for embed_dims, heads, m in [(16, 4, 16), (16, 2, 17), (128, 2, 266)]:
        attn = PerformerAttention(embed_dims, heads, 1)
        assert attn.num_features == m
        assert attn.features.shape == (m, embed_dims // heads)


@pytest.mark.parametrize('interval, redraws', [(1, [1, 1, 1, 1]),
                                               (2, [1, 0, 1, 0, 1]),
                                               (3, [1, 0, 0, 1, 0, 0, 1]),
                                               (0, [0, 0, 0])])
def test_performer_redraws_every_interval_training_forwards(interval, redraws):
    """``redraw_interval`` k > 0: new features on training forwards 1,
    k + 1, 2k + 1, ...; never with k = 0 or in eval mode."""
    torch.manual_seed(0)
    attn = PerformerAttention(
        C, HEADS, 1, redraw_interval=interval).double().train()
    x = tokens()
    seen = []
    for _ in redraws:
        before = attn.features.clone()
        attn(x, HW)
        seen.append(int(not torch.equal(before, attn.features)))
    assert seen == redraws
    attn.eval()
    before = attn.features.clone()
    for _ in range(3):
        attn(x, HW)
    assert torch.equal(before, attn.features)


def test_orthogonal_gaussian_reproducible_dtype_and_orthogonal():
    """The same generator seed gives the same features whatever the
    global RNG; computed in float64 and cast to ``dtype`` (default
    float32); each block of d rows is exactly orthogonal in float64."""
    M, d = 10, 4

    def draw(dtype=torch.float32, global_seed=0):
        torch.manual_seed(global_seed)
        return orthogonal_gaussian(
            M, d, torch.Generator().manual_seed(3), dtype=dtype)

    a = orthogonal_gaussian(M, d, torch.Generator().manual_seed(3))
    assert a.dtype == torch.float32 and a.shape == (M, d)
    assert torch.equal(a, draw(global_seed=1))
    assert torch.equal(a, draw(global_seed=2))
    w = draw(torch.float64)
    assert w.dtype == torch.float64
    assert torch.equal(w.to(torch.float32), a)  # one draw, cast
    n = w.norm(dim=1, keepdim=True)
    u = w / n
    for b in range(0, M, d):
        blk = u[b:b + d]
        torch.testing.assert_close(
            blk @ blk.t(),
            torch.eye(len(blk), dtype=torch.float64),
            rtol=0,
            atol=1e-12)
    # float64 norms (not float32 draws upcast)
    rel = (n - n.float().double()).abs() / n
    assert (rel > 1e-13).all()


def test_orthogonal_gaussian_draws_only_the_blocks_it_needs(monkeypatch):
    """M rows take ceil(M / d) d x d orthogonal blocks."""
    calls = []
    qr = torch.linalg.qr

    def counting_qr(a):
        calls.append(tuple(a.shape))
        return qr(a)

    monkeypatch.setattr(torch.linalg, 'qr', counting_qr)
    for M, d in [(10, 4), (4, 4), (3, 8)]:
        calls.clear()
        assert orthogonal_gaussian(M, d).shape == (M, d)
        assert calls == [(d, d)] * math.ceil(M / d)


# ---------------------------------------------------- nystrom contracts
def test_iterative_pinv_start_step_default_and_precision():
    """Z_0 = A^T / (||A||_1 ||A||_inf) per matrix, one step is the
    docstring's update, 6 steps by default (Nystromformer's), and a
    half-precision A is inverted in float32."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 5, 5, generator=g, dtype=torch.float64)
    A[1] *= 10  # matrices of different norms in one batch
    n1 = torch.linalg.matrix_norm(A, 1)
    ninf = torch.linalg.matrix_norm(A, float('inf'))
    Z0 = A.transpose(-1, -2) / (n1 * ninf)[..., None, None]
    torch.testing.assert_close(iterative_pinv(A, 0), Z0)
    eye = torch.eye(5, dtype=torch.float64)
    AZ = A @ Z0
    Z1 = Z0 @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ))) / 4
    torch.testing.assert_close(iterative_pinv(A, 1), Z1)
    torch.testing.assert_close(
        iterative_pinv(A, 3), torch.stack([iterative_pinv(a, 3) for a in A]))
    assert torch.equal(iterative_pinv(A), iterative_pinv(A, 6))
    S = A.softmax(-1)
    for dtype in (torch.bfloat16, torch.float16):
        Z = iterative_pinv(S.to(dtype))
        assert Z.dtype == torch.float32
        torch.testing.assert_close(Z, iterative_pinv(S.to(dtype).float()))


def test_nystromformer_uses_pinv_iters_and_defaults_to_six():
    assert NystromformerAttention(C, HEADS, 2).pinv_iters == 6
    x = tokens()
    for iters in (1, 3):
        attn = build('nystromformer', pinv_iters=iters)
        with torch.no_grad():
            q, k = attn._split(attn.q(x)), attn._split(attn.k(x))
            ql, kl = (
                reduce_map(
                    t.reshape(2 * HEADS, *HW, D).permute(0, 3, 1, 2),
                    2).flatten(2).transpose(1, 2).reshape(2, HEADS, -1, D)
                for t in (q, k))
            A = softmax_matrix(ql, kl)
            _, A_inv, _ = attn._kernels(x, HW)
        torch.testing.assert_close(A_inv, iterative_pinv(A, iters))


@pytest.mark.parametrize('pinv', ['iterative', 'exact'])
def test_nystromformer_in_bfloat16_inverts_in_float32(pinv):
    """A bfloat16 module: A^+ in float32, the output in bfloat16, the
    rows in float32."""
    torch.manual_seed(0)
    attn = NystromformerAttention(C, HEADS, 2, pinv=pinv).to(torch.bfloat16)
    x = tokens().to(torch.bfloat16)
    with torch.no_grad():
        _, A_inv, _ = attn._kernels(x, HW)
        out = attn(x, HW)
    row = attn.attention_row(x, HW, 5)
    assert A_inv.dtype == torch.float32
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert row.dtype == torch.float32 and row.shape == (2, HEADS, N)
    assert torch.isfinite(out).all() and torch.isfinite(row).all()


# ---------------------------------------------------- sima contracts
def test_l1_normalize_tokens_formula_over_the_token_axis():
    """t / (||t_{:,c}||_1 + eps) over the tokens (axis -2) for any number
    of leading dims; eps defaults to 1e-6."""
    g = torch.Generator().manual_seed(0)
    for shape in [(6, 3), (2, 6, 3), (2, 2, 6, 3)]:
        t = torch.randn(*shape, generator=g, dtype=torch.float64)
        t[..., 0] *= 1e-8  # a channel with an l1 norm below eps
        for kw, eps in [({}, 1e-6), (dict(eps=0.5), 0.5)]:
            ref = t / (t.abs().sum(-2, keepdim=True) + eps)
            torch.testing.assert_close(l1_normalize_tokens(t, **kw), ref)


def test_sima_uses_its_eps():
    attn = build('sima', eps=10.0)
    x = tokens()
    with torch.no_grad():
        q = l1_normalize_tokens(attn._split(attn.q(x)), 10.0)
        k = l1_normalize_tokens(attn._split(attn.k(x)), 10.0)
    row = attn.attention_row(x, HW, 4)
    torch.testing.assert_close(row, (q @ k.transpose(-1, -2))[:, :, 4])


@pytest.mark.parametrize('order, hw, linear', [('linear', (7, 5), True),
                                               ('linear', (2, 2), True),
                                               ('quadratic', (7, 5), False),
                                               ('auto', (7, 5), True),
                                               ('auto', (2, 2), False),
                                               ('auto', (2, 4), False),
                                               ('auto', (3, 3), True)])
def test_sima_multiplies_in_the_chosen_order(order, hw, linear):
    """'linear': Q^ (K^^T V); 'quadratic': (Q^ K^^T) V; 'auto': linear
    when n > d (d = 8 here). The orders round differently in float32."""
    assert sima_order(hw[0] * hw[1], D,
                      order) == ('linear' if linear else 'quadratic')
    torch.manual_seed(0)
    attn = SimAAttention(C, HEADS, 1, order=order, dw_kernel_size=0).eval()
    x = tokens(n=hw[0] * hw[1]).float()
    with torch.no_grad():
        out, _ = attn._mix(x, hw)
        q, k = attn._qk(x)
        v = values(attn, x)
        lin = q @ (k.transpose(-1, -2) @ v)
        quad = (q @ k.transpose(-1, -2)) @ v
    assert not torch.equal(lin, quad)
    assert torch.equal(out, lin if linear else quad)


@pytest.mark.parametrize('shape', [(6, 4), (4, 6)])
def test_iterative_pinv_of_a_rectangular_matrix(shape):
    """The iteration gives the Moore-Penrose pseudo-inverse of a
    rectangular (full-rank) A too: Z has A^T's shape and converges to
    torch.linalg.pinv(A)."""
    g = torch.Generator().manual_seed(1)
    A = torch.randn(2, *shape, generator=g, dtype=torch.float64)
    Z = iterative_pinv(A, 30)
    assert Z.shape == (2, shape[1], shape[0])
    torch.testing.assert_close(Z, torch.linalg.pinv(A))
