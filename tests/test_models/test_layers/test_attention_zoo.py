"""The attention zoo of Table 1: each entry's defining property.

Tiny dimensions, float64 where exactness is asserted.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import (SOFTAttention, attention_types,
                                  build_attention, landmark_grid, query_index,
                                  reduce_map)
from mmsoft.models.layers.gaussian_kernel import gaussian_kernel
from mmsoft.models.layers.nr_config import NRConfig
from mmsoft.models.layers.zoo import (LinformerAttention,
                                      NystromformerAttention,
                                      PerformerAttention, SimAAttention,
                                      SoftmaxZooAttention, iterative_pinv,
                                      l1_normalize_tokens, sima_order,
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
    """``t`` as a SOFT stage builds it (``attn_cfg=dict(type=t, ...)``)."""
    torch.manual_seed(0)
    return build_attention(
        dict(type=t, **options),
        embed_dims=C,
        num_heads=HEADS,
        sampling_ratio=ratio,
        dw_kernel_size=dw_kernel_size,
        qkv_bias=True).double().eval()


def values(attn, x):
    return attn._split(attn.v(x))


def merge(t):
    B, h, n, d = t.shape
    return t.transpose(1, 2).reshape(B, n, h * d)


# ---------------------------------------------------------------- registry
def test_registry_lists_the_zoo_under_class_names_and_aliases():
    types = attention_types()
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
    # the stage fixes the geometry
    with pytest.raises(ValueError, match='embed_dims'):
        build_attention(
            dict(type='soft', embed_dims=8),
            embed_dims=C,
            num_heads=HEADS,
            sampling_ratio=2,
            dw_kernel_size=3,
            qkv_bias=True)
    with pytest.raises(TypeError, match="'type'"):
        build_attention(
            'soft',
            embed_dims=C,
            num_heads=HEADS,
            sampling_ratio=2,
            dw_kernel_size=3,
            qkv_bias=True)


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


def test_spread_to_tokens_is_the_transpose_of_pooling():
    w = torch.rand(3, 6, dtype=torch.float64)
    z = torch.randn(6, 4, dtype=torch.float64)  # a 6 x 4 map, r = 2
    spread = spread_to_tokens(w, (6, 4), 2)
    pooled = F.avg_pool2d(z[None, None], 2).flatten()
    torch.testing.assert_close(spread @ z.flatten(), w @ pooled)
    torch.testing.assert_close(spread.sum(-1), w.sum(-1))


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
    from mmsoft.models.layers import SOFTBlock
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


@pytest.mark.parametrize('kw, m', [(dict(max_landmarks=6), 4),
                                   (dict(landmark_hw=(1, 3)), 3)])
def test_spread_to_tokens_follows_the_landmark_cap(kw, m):
    """With ``max_landmarks`` / ``landmark_hw`` the reduced grid is the
    capped one (``reduce_map``): its transpose still, and weights of
    another length are one line."""
    w = torch.rand(2, m, dtype=torch.float64)
    z = torch.randn(6, 8, dtype=torch.float64)
    spread = spread_to_tokens(w, (6, 8), 2, **kw)
    pooled = reduce_map(z[None, None], 2, **kw).flatten()
    assert pooled.numel() == m
    torch.testing.assert_close(spread @ z.flatten(), w @ pooled)
    with pytest.raises(ValueError) as info:
        spread_to_tokens(torch.rand(2, m + 1), (6, 8), 2, **kw)
    assert str(info.value) == f'{m + 1} weights for {m} reduced tokens'
