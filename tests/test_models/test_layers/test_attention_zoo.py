"""The attention zoo of Table 1: each entry's defining property (tiny
dimensions, float64 where exactness is asserted)."""
import math

import pytest
import torch
import torch.nn.functional as F

from mmsoft.models.backbones import SOFT
from mmsoft.models.backbones.soft import SOFTBlock
from mmsoft.models.layers import (SOFTAttention, gaussian_kernel,
                                  landmark_grid, query_index, reduce_map)
from mmsoft.models.layers.nr_config import NRConfig
from mmsoft.models.layers.zoo import (LinformerAttention,
                                      NystromformerAttention,
                                      PerformerAttention, SimAAttention,
                                      SoftmaxZooAttention, favor_features,
                                      iterative_pinv, l1_normalize_tokens,
                                      orthogonal_gaussian, sima_order,
                                      spread_to_tokens)
from mmsoft.registry import ATTENTIONS

pytestmark = pytest.mark.usefixtures('one_thread')  # tiny ops
HW = (7, 5)  # not a multiple of the ratio on purpose
N = HW[0] * HW[1]
C, HEADS = 16, 2
D = C // HEADS
F64 = torch.float64
ATTENTION_TYPES = ('soft', 'softmax', 'linformer', 'performer',
                   'nystromformer', 'sima')
ZOO = (SoftmaxZooAttention, LinformerAttention, PerformerAttention,
       NystromformerAttention, SimAAttention)


def tokens(B=2, n=N, c=C, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, c, generator=g, dtype=F64)


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


def split(attn, x, *names):
    return [attn._split(getattr(attn, n)(x)) for n in names]


def merge(t):
    B, h, n, d = t.shape
    return t.transpose(1, 2).reshape(B, n, h * d)


def softmax_matrix(q, k):
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)


def close(a, b, rtol=None, atol=None):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def ones(M):
    return torch.ones_like(M[..., 0])


# ---------------------------------------------------------- every entry
def test_registry_and_attn_cfg_errors():
    """Class names and aliases registered; a wrong option or type names
    the problem (no silent dropping)."""
    ATTENTIONS.import_from_location()
    types = sorted(ATTENTIONS.module_dict)
    for t in ATTENTION_TYPES:
        cls = ATTENTIONS.get(t)
        assert cls is not None and t in types and cls.__name__ in types
        assert ATTENTIONS.get(cls.__name__) is cls  # registered at the class
    assert set(types) == set(ATTENTION_TYPES) | {
        ATTENTIONS.get(t).__name__
        for t in ATTENTION_TYPES
    }
    for exc, match, make in [
        (KeyError, 'nope', lambda: build('nope')),
        (TypeError, 'nr_iters', lambda: build('linformer', nr_iters=10)),
        (TypeError, 'sr_mode', lambda: build('soft', sr_mode='conv')),
        (TypeError, 'not a mapping',
         lambda: SOFTBlock(C, HEADS, 2, attn_cfg='soft')),
        (TypeError, 'max_landmarks', lambda: SOFTBlock(
            C, HEADS, 1, attn_cfg=dict(type='softmax', max_landmarks=4))),
    ]:
        with pytest.raises(exc, match=match):
            make()
    for t in ('linformer', 'nystromformer'):
        blk = SOFTBlock(C, HEADS, 1, attn_cfg=dict(type=t, max_landmarks=4))
        assert blk.attn.max_landmarks == 4
    for t, cls in (('softmax', SoftmaxZooAttention), ('sima', SimAAttention),
                   ('nystromformer', NystromformerAttention)):
        assert isinstance(build(t), cls)


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_every_entry_forward_backward_dw_conv_matrix_and_rows(attn_type):
    """Gradients, SOFT's dw conv, proj(M V + dwconv V) == forward, rows."""
    attn = build(attn_type).train()
    x = tokens().requires_grad_()
    out = attn(x, HW)
    assert out.shape == x.shape
    out.square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    for name, p in attn.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    attn = build(attn_type, dw_kernel_size=5)
    soft = SOFTAttention(C, HEADS, 2, dw_kernel_size=5).double()
    assert attn.dw_conv.weight.shape == soft.dw_conv.weight.shape
    assert build(attn_type, dw_kernel_size=0).dw_conv is None
    with torch.no_grad():
        soft.dw_conv.weight.copy_(attn.dw_conv.weight)
        v = merge(torch.randn(2, HEADS, N, D, dtype=F64))
        close(attn.dw_conv_tokens(v, HW), soft.dw_conv_tokens(v, HW))
    kw = dict(sr_mode='avgpool') if attn_type == 'linformer' else {}
    attn, x = build(attn_type, **kw), tokens()
    with torch.no_grad():
        M = attn.attention_matrix(x, HW)
        v, = split(attn, x, 'v')
        ref = attn.proj(merge(M @ v) + attn.dw_conv_tokens(merge(v), HW))
        close(attn(x, HW), ref, 1e-9, 1e-9)
    assert M.shape == (2, HEADS, N, N)
    attn = build(attn_type)
    M = attn.attention_matrix(x, HW)
    for index, i in [((3, 2), 17), (0, 0), (N - 1, N - 1)]:
        close(attn.attention_row(x, HW, index), M[:, :, i], 1e-9, 1e-12)
    with pytest.raises(IndexError):
        attn.attention_row(x, HW, (7, 0))


@pytest.mark.parametrize('attn_type', ATTENTION_TYPES)
def test_zoo_in_the_backbone(attn_type):
    arch = dict(
        embed_dims=[8, 16, 16, 32], num_heads=[1, 2, 2, 2], depths=[1] * 4)
    ref = SOFT(arch).eval()
    model = SOFT(arch, attn_cfg=dict(type=attn_type)).eval()
    x = torch.randn(1, 3, 72, 40)
    outs = model(x)
    assert [o.shape for o in outs] == [o.shape for o in ref(x)]
    assert all(torch.isfinite(o).all() for o in outs)
    # stage 4 (softmax + cls token) and the convs are shared architecture
    same = [k for k in ref.state_dict() if '.attn.' not in k]
    assert set(same) <= set(model.state_dict())


def test_zoo_qkv_biases_repr_and_choices():
    """``qkv_bias`` (default True) gives q / k / v their biases; the repr
    line names each mixer's settings; a bad choice is one line."""
    for cls in ZOO:
        on, off = cls(C, HEADS, 2), cls(C, HEADS, 2, qkv_bias=False)
        assert all(f.bias is not None for f in (on.q, on.k, on.v)), cls
        assert all(f.bias is None for f in (off.q, off.k, off.v)), cls
    kws = [{},
           dict(sr_mode='avgpool'),
           dict(num_features=5),
           dict(pinv_iters=3),
           dict(order='linear')]
    assert [cls(16, 2, 2, **kw).extra_repr() for cls, kw in zip(ZOO, kws)] == [
        'heads=2, ratio=2', 'heads=2, ratio=2, sr_mode=avgpool',
        'heads=2, ratio=2, num_features=5',
        'heads=2, ratio=2, pinv=iterative, pinv_iters=3',
        'heads=2, ratio=2, order=linear'
    ]
    orders = "('auto', 'quadratic', 'linear')"
    for make, msg in [
        (lambda: LinformerAttention(C, HEADS, 2, sr_mode='pool'),
         "unknown sr_mode 'pool'; choose one of ('conv', 'avgpool')"),
        (lambda: NystromformerAttention(C, HEADS, 2, pinv='svd'),
         "unknown pinv 'svd'; choose one of ('iterative', 'exact')"),
        (lambda: SimAAttention(C, HEADS, 2, order='cubic'),
         f"unknown order 'cubic'; choose one of {orders}"),
        (lambda: sima_order(4, 4, 'cubic'),
         f"unknown order 'cubic'; choose one of {orders}"),
        (lambda: PerformerAttention(C, HEADS, 2, num_features=0),
         'num_features must be an int >= 1, got 0 (int)')
    ]:
        with pytest.raises(ValueError) as info:
            make()
        assert str(info.value) == msg


def test_query_index_of_a_pair_or_a_flat_index():
    """(row, col) -> row * W + col; nothing outside the H x W map."""
    hw = (3, 4)
    assert [
        query_index(i, hw)
        for i in [(0, 0), (0, 3), (2, 0), (2, 3), [1, 2], 0, 11,
                  torch.tensor(5)]
    ] == [0, 3, 8, 11, 6, 0, 11, 5]
    for bad, msg in [((3, 0), 'query (3, 0)'), ((0, 4), 'query (0, 4)'),
                     ((-1, 0), 'query (-1, 0)'), ((0, -1), 'query (0, -1)'),
                     (12, 'query index 12'), (-1, 'query index -1')]:
        with pytest.raises(IndexError) as info:
            query_index(bad, hw)
        assert str(info.value) == msg + ' outside the 3x4 map'


# ---------------------------------------------------------------- softmax
def test_softmax_rows_are_a_distribution_and_match_the_formula():
    attn, x = build('softmax', dw_kernel_size=0), tokens()
    M = attn.attention_matrix(x, HW)
    assert (M > 0).all()
    close(M.sum(-1), ones(M))
    q, k, v = split(attn, x, 'q', 'k', 'v')
    S = softmax_matrix(q, k)
    close(M, S)
    with torch.no_grad():
        close(attn._mix(x, HW)[0], S @ v)


# ---------------------------------------------------------------- linformer
@pytest.mark.parametrize('sr_mode', ['conv', 'avgpool'])
def test_linformer_attends_softmax_over_m_reduced_tokens(sr_mode):
    attn, x = build('linformer', ratio=2, sr_mode=sr_mode), tokens()
    w = attn.reduced_attention_row(x, HW, 11)
    assert w.shape == (2, HEADS, math.prod(landmark_grid(HW, 2)))
    assert (w > 0).all()
    close(w.sum(-1), ones(w))
    # spread over the map: total weight 1; the last row (7 mod 2) and
    # column (5 mod 2) are outside every reduced cell
    row = attn.attention_row(x, HW, 11).reshape(2, HEADS, *HW)
    close(row.sum((-2, -1)), w.sum(-1))
    assert row[..., -1, :].abs().max() == 0
    assert row[..., :, -1].abs().max() == 0


def test_linformer_conv_mode_and_no_reduction():
    """'conv': X_r = LN(Conv_{r x r, stride r}(X)), keys X_r W_k; no
    reduction parameters with avgpool or r = 1, where it is softmax."""
    attn, x = build('linformer', ratio=2, sr_mode='conv'), tokens()
    assert {'sr.weight', 'norm.weight'} <= set(attn.state_dict())
    xr = F.conv2d(
        x.transpose(1, 2).reshape(2, C, *HW),
        attn.sr.weight,
        attn.sr.bias,
        stride=2).flatten(2).transpose(1, 2)
    xr = F.layer_norm(xr, (C, ), attn.norm.weight, attn.norm.bias,
                      attn.norm.eps)
    with torch.no_grad():
        ref = softmax_matrix(*split(attn, x, 'q'), attn._split(attn.k(xr)))
        close(attn.reduced_attention_row(x, HW, 11), ref[:, :, 11])
    lin = build('linformer', ratio=1)
    for a in (build('linformer', ratio=2, sr_mode='avgpool'), lin):
        assert a.sr is None and a.norm is None
    soft = build('softmax', ratio=1)
    soft.load_state_dict(lin.state_dict())  # same parameters at r = 1
    with torch.no_grad():
        close(lin(x, HW), soft(x, HW))


@pytest.mark.parametrize('kw, m', [(dict(landmark_hw=(2, 3)), 6),
                                   (dict(max_landmarks=4), 2)])
def test_linformer_rows_follow_the_landmark_cap(kw, m):
    """With a capped grid the rows are still the real mixing weights."""
    attn = build('linformer', sr_mode='avgpool', **kw)
    hw, x = (6, 4), tokens(n=24)  # a 3 x 2 grid before the cap
    with torch.no_grad():
        M = attn.attention_matrix(x, hw)
        v, = split(attn, x, 'v')
        ref = attn.proj(merge(M @ v) + attn.dw_conv_tokens(merge(v), hw))
        close(attn(x, hw), ref, 1e-9, 1e-9)
    lin = LinformerAttention(C, HEADS, 1, **kw).double()  # r = 1 on HW
    assert lin.reduced_attention_row(tokens(), HW, 0).shape[-1] == m
    lin = LinformerAttention(
        C, HEADS, 1, sr_mode='avgpool', max_landmarks=8).double()
    assert lin.reduced_attention_row(tokens(), HW, 0).shape[-1] <= 8


@pytest.mark.parametrize('kw, m', [({}, 12), (dict(max_landmarks=6), 4),
                                   (dict(landmark_hw=(1, 3)), 3)])
def test_spread_to_tokens_is_the_transpose_of_pooling(kw, m):
    """The transpose of the r x r (capped) pooling; bad lengths: one line."""
    w, z = torch.rand(3, m, dtype=F64), torch.randn(6, 8, dtype=F64)
    spread = spread_to_tokens(w, (6, 8), 2, **kw)
    pooled = reduce_map(z[None, None], 2, **kw).flatten()
    assert pooled.numel() == m
    close(spread @ z.flatten(), w @ pooled)
    if not kw:
        pooled = F.avg_pool2d(z[None, None], 2).flatten()
        close(spread @ z.flatten(), w @ pooled)
        close(spread.sum(-1), w.sum(-1))
    for bad in (torch.rand(m + 1), torch.rand(3, 4, m - 1)):  # any dims
        with pytest.raises(ValueError) as info:
            spread_to_tokens(bad, (6, 8), 2, **kw)
        assert str(info.value) == f'{bad.shape[-1]} weights for {m} ' \
            'reduced tokens'


# ---------------------------------------------------------------- performer
def test_performer_approximates_softmax_as_features_grow():
    x = tokens(1, 24, seed=1) * 0.5
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
            S = softmax_matrix(*split(attn, x, 'q', 'k'))
            A = attn.attention_matrix(x, (4, 6))
            e.append(((A - S).norm() / S.norm()).item())
        errs[M] = sum(e) / len(e)
    # Monte-Carlo error ~ 1 / sqrt(M): about 0.6, 0.29, 0.10 here
    assert errs[1024] < errs[64] < errs[4]
    assert errs[1024] < 0.15 and errs[4] > 4 * errs[1024]


def test_performer_weights_positive_normalised_saved_and_stable():
    attn = build('performer')
    M = attn.attention_matrix(tokens(), HW)
    assert (M > 0).all()  # positive features: no negative weights
    close(M.sum(-1), ones(M), 0, 1e-4)  # eps in D
    assert 'features' in attn.state_dict()
    before = attn.features.clone()
    attn.redraw()
    assert not torch.equal(before, attn.features)
    gram = attn.features[:D] @ attn.features[:D].t()  # orthogonal block
    close(gram - torch.diag(torch.diagonal(gram)), 0 * gram, 0, 1e-5)
    attn = PerformerAttention(C, HEADS, 1, dw_kernel_size=0).eval()
    with torch.no_grad():
        assert torch.isfinite(attn(torch.randn(2, N, C) * 30, HW)).all()
    for embed_dims, heads, m in [(16, 4, 16), (16, 2, 17), (128, 2, 266)]:
        attn = PerformerAttention(embed_dims, heads, 1)  # max(16, d ln d)
        assert attn.num_features == m
        assert attn.features.shape == (m, embed_dims // heads)


def test_favor_features_are_exp_features_up_to_a_cancelling_factor():
    """exp(W x - |x|^2 / 2) / sqrt(M) up to a factor cancelling in D^-1."""
    M, d = 12, 4
    w = orthogonal_gaussian(M, d, torch.Generator().manual_seed(1))
    x = torch.randn(
        2, 2, 6, d, generator=torch.Generator().manual_seed(0), dtype=F64)
    x[0, 0, 0] *= 40  # a query of a very large norm
    x[1] = x[1] / x[1].norm(dim=-1, keepdim=True) * 40  # keys of norm 40

    def log_phi(t):
        return (t @ w.double().t() - t.square().sum(-1, keepdim=True) / 2 -
                math.log(M) / 2)

    pq, pk = favor_features(x, w, True), favor_features(x, w, False)
    assert pq.dtype == pk.dtype == F64 and pq.shape == pk.shape == (2, 2, 6, M)
    r = pq.log() - log_phi(x)
    close(r, r[..., :1].expand_as(r))
    close(pq.amax(-1), torch.full((2, 2, 6), M**-0.5, dtype=F64))
    xk = x.clone()
    xk[0, 0, 0] /= 40  # keys well scaled per head
    pk = favor_features(xk, w, False)
    r = pk.log() - log_phi(xk)
    close(r, r[..., :1, :1].expand_as(r))
    close(pk.amax((-2, -1)), torch.full((2, 2), M**-0.5, dtype=F64))


def test_performer_matrix_is_the_favor_formula_for_any_query_norm():
    """eps = 0: A = D^-1 phi(Q') phi(K')^T, q' = q / d^(1/4); a query of a
    large norm only sharpens its row (a distribution, none underflows)."""
    attn = PerformerAttention(
        C, HEADS, 1, num_features=12, dw_kernel_size=0, eps=0).double().eval()
    x, w = tokens(), attn.features

    def phi(t):
        t = t * D**-0.25
        return torch.exp(t @ w.t() - t.square().sum(-1, keepdim=True) / 2)

    with torch.no_grad():
        q, k, v = split(attn, x, 'q', 'k', 'v')
        K = phi(q) @ phi(k).transpose(-1, -2)
        ref = K / K.sum(-1, keepdim=True)
        close(attn.attention_matrix(x, HW), ref)
        close(attn._mix(x, HW)[0], ref @ v)
        attn.k.weight.mul_(0.01)  # moderate keys
    s = torch.ones(2, 12, 1, dtype=F64)
    s[:, ::3] = 30  # every third query large
    x = tokens(n=12) * s
    M = attn.attention_matrix(x, (3, 4))
    assert torch.isfinite(M).all() and (M >= 0).all()
    close(M.sum(-1), ones(M))
    with torch.no_grad():
        assert torch.isfinite(attn(x, (3, 4))).all()


@pytest.mark.parametrize('interval, redraws', [(1, [1, 1, 1, 1]),
                                               (2, [1, 0, 1, 0, 1]),
                                               (3, [1, 0, 0, 1, 0, 0, 1]),
                                               (0, [0, 0, 0])])
def test_performer_redraws_every_interval_training_forwards(interval, redraws):
    """k > 0: new features on training forwards 1, k + 1, 2k + 1, ...;
    never with k = 0 or in eval mode."""
    torch.manual_seed(0)
    attn = PerformerAttention(
        C, HEADS, 1, redraw_interval=interval).double().train()
    x, seen = tokens(), []
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


def test_orthogonal_gaussian_reproducible_dtype_orthogonal_and_lean(
        monkeypatch):
    """Seeded, float64 cast to dtype, orthogonal blocks, ceil(M / d) QRs."""
    M, d = 10, 4

    def draw(dtype=torch.float32, global_seed=0):
        torch.manual_seed(global_seed)
        return orthogonal_gaussian(
            M, d, torch.Generator().manual_seed(3), dtype=dtype)

    a = orthogonal_gaussian(M, d, torch.Generator().manual_seed(3))
    assert a.dtype == torch.float32 and a.shape == (M, d)
    assert torch.equal(a, draw(global_seed=1))
    assert torch.equal(a, draw(global_seed=2))
    w = draw(F64)
    assert w.dtype == F64 and torch.equal(w.to(torch.float32), a)
    n = w.norm(dim=1, keepdim=True)
    u = w / n
    for b in range(0, M, d):
        blk = u[b:b + d]
        close(blk @ blk.t(), torch.eye(len(blk), dtype=F64), 0, 1e-12)
    assert ((n - n.float().double()).abs() / n > 1e-13).all()  # float64 norms
    calls, qr = [], torch.linalg.qr
    monkeypatch.setattr(torch.linalg, 'qr',
                        lambda a: calls.append(tuple(a.shape)) or qr(a))
    for M, d in [(10, 4), (4, 4), (3, 8)]:
        calls.clear()
        assert orthogonal_gaussian(M, d).shape == (M, d)
        assert calls == [(d, d)] * math.ceil(M / d)


# ---------------------------------------------------------------- nystrom
def test_nystromformer_softmax_with_all_tokens_rows_and_pinv_iters():
    """m = n (r = 1), exact inverse: F A^+ B = S S^+ S = S; with landmarks
    (A invertible) F A^-1 B 1 = F A^-1 1 = F 1 = 1."""
    attn, x = build(
        'nystromformer', ratio=1, pinv='exact', dw_kernel_size=0), tokens()
    S = softmax_matrix(*split(attn, x, 'q', 'k'))
    close(attn.attention_matrix(x, HW), S, 1e-6, 1e-8)
    attn = build('nystromformer', ratio=2, pinv='exact')
    M = attn.attention_matrix(x, HW)
    close(M.sum(-1), ones(M))
    F_, _, _ = attn._kernels(x, HW)
    assert F_.shape[-1] == math.prod(landmark_grid(HW, 2))
    assert NystromformerAttention(C, HEADS, 2).pinv_iters == 6
    for iters in (1, 3):  # A^+ by pinv_iters steps
        attn = build('nystromformer', pinv_iters=iters)
        with torch.no_grad():
            ql, kl = (
                reduce_map(
                    t.reshape(2 * HEADS, *HW, D).permute(0, 3, 1, 2),
                    2).flatten(2).transpose(1, 2).reshape(2, HEADS, -1, D)
                for t in split(attn, x, 'q', 'k'))
            _, A_inv, _ = attn._kernels(x, HW)
        close(A_inv, iterative_pinv(softmax_matrix(ql, kl), iters))


def test_iterative_pinv_start_step_default_precision_and_convergence():
    """Z_0, one step, 6 by default, float32 for half A, converges."""
    g = torch.Generator().manual_seed(0)
    A = torch.randn(3, 5, 5, generator=g, dtype=F64)
    A[1] *= 10  # matrices of different norms in one batch
    n1 = torch.linalg.matrix_norm(A, 1)
    ninf = torch.linalg.matrix_norm(A, float('inf'))
    Z0 = A.transpose(-1, -2) / (n1 * ninf)[..., None, None]
    close(iterative_pinv(A, 0), Z0)
    eye, AZ = torch.eye(5, dtype=F64), A @ Z0
    close(
        iterative_pinv(A, 1),
        Z0 @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ))) / 4)
    close(iterative_pinv(A, 3), torch.stack([iterative_pinv(a, 3) for a in A]))
    assert torch.equal(iterative_pinv(A), iterative_pinv(A, 6))
    S = A.softmax(-1)
    for dtype in (torch.bfloat16, torch.float16):
        Z = iterative_pinv(S.to(dtype))
        assert Z.dtype == torch.float32
        close(Z, iterative_pinv(S.to(dtype).float()))
    A = torch.randn(3, 10, 10, generator=g, dtype=F64).softmax(-1)
    exact = torch.linalg.pinv(A)
    e2 = (iterative_pinv(A, 2) - exact).norm() / exact.norm()
    assert (iterative_pinv(A, 20) - exact).norm() / exact.norm() < 1e-8 < e2
    for shape in [(6, 4), (4, 6)]:
        A = torch.randn(2, *shape, generator=g, dtype=F64)
        Z = iterative_pinv(A, 30)
        assert Z.shape == (2, shape[1], shape[0])
        close(Z, torch.linalg.pinv(A))


@pytest.mark.parametrize('pinv', ['iterative', 'exact'])
def test_nystromformer_in_bfloat16_inverts_in_float32(pinv):
    """A^+ in float32, the output in bfloat16, the rows in float32."""
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


# ---------------------------------------------------------------- sima
def test_l1_normalize_tokens_formula_over_the_token_axis():
    """t / (||t_{:,c}||_1 + eps) over axis -2, any leading dims; eps
    defaults to 1e-6 (eps = 0: unit l1 norms)."""
    g = torch.Generator().manual_seed(0)
    for shape in [(6, 3), (2, 6, 3), (2, 2, 6, 3)]:
        t = torch.randn(*shape, generator=g, dtype=F64)
        t[..., 0] *= 1e-8  # a channel with an l1 norm below eps
        for kw, eps in [({}, 1e-6), (dict(eps=0.5), 0.5)]:
            close(
                l1_normalize_tokens(t, **kw),
                t / (t.abs().sum(-2, keepdim=True) + eps))
    t = torch.randn(2, 3, 40, 5, dtype=F64)
    close(
        l1_normalize_tokens(t, eps=0).abs().sum(-2),
        torch.ones(2, 3, 5, dtype=F64))


def test_sima_no_softmax_eps_and_channel_scale():
    """Negative weights exist, bounded by d (SimA Sec. 3); ``eps`` is used;
    a dominating (scaled) q / k channel is normalised away."""
    attn, x = build('sima'), tokens()
    M = attn.attention_matrix(x, HW)
    assert (M < 0).any() and M.abs().max() <= D
    attn = build('sima', eps=10.0)
    with torch.no_grad():
        q, k = (l1_normalize_tokens(t, 10.0) for t in split(attn, x, 'q', 'k'))
    close(attn.attention_row(x, HW, 4), (q @ k.transpose(-1, -2))[:, :, 4])
    attn = build('sima')
    with torch.no_grad():
        ref = attn(x, HW)
        attn.q.weight[3] *= 50
        attn.q.bias[3] *= 50
        attn.k.weight[:4] *= 0.01
        attn.k.bias[:4] *= 0.01
        close(attn(x, HW), ref, 1e-4, 1e-6)


@pytest.mark.parametrize('order, hw, linear', [('linear', (7, 5), True),
                                               ('linear', (2, 2), True),
                                               ('quadratic', (7, 5), False),
                                               ('auto', (7, 5), True),
                                               ('auto', (2, 2), False),
                                               ('auto', (2, 4), False),
                                               ('auto', (3, 3), True),
                                               ('auto', (10, 10), True),
                                               ('auto', (4, 4), False)])
def test_sima_multiplies_in_the_chosen_order(order, hw, linear):
    """'linear': Q (K^T V); 'quadratic': (Q K^T) V; 'auto': by n > d."""
    want = 'linear' if linear else 'quadratic'
    if hw in ((10, 10), (4, 4)):  # d = 32, the default order
        assert sima_order(hw[0] * hw[1], 32) == want
        return
    assert sima_order(hw[0] * hw[1], D, order) == want
    if hw == HW:  # float64: the quadratic form in any order
        attn, x = build('sima', order=order, dw_kernel_size=0), tokens()
        q, k = (l1_normalize_tokens(t) for t in split(attn, x, 'q', 'k'))
        with torch.no_grad():
            close(
                attn._mix(x, HW)[0],
                (q @ k.transpose(-1, -2)) @ split(attn, x, 'v')[0])
    torch.manual_seed(0)
    attn = SimAAttention(C, HEADS, 1, order=order, dw_kernel_size=0).eval()
    x = tokens(n=hw[0] * hw[1]).float()
    with torch.no_grad():
        out, _ = attn._mix(x, hw)
        q, k = attn._qk(x)
        v, = split(attn, x, 'v')
        lin, quad = q @ (k.transpose(-1, -2) @ v), (
            q @ k.transpose(-1, -2)) @ v
    assert not torch.equal(lin, quad)
    assert torch.equal(out, lin if linear else quad)


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
    A_inv = NRConfig(
        20, 'soft_norm_per_sample' if attn_norm else 'soft').inverse(A)
    if attn_norm:
        d = A.sum(-1).rsqrt()
        A_inv = d[..., :, None] * A_inv * d[..., None, :]
    S = P @ A_inv @ P.transpose(-1, -2)
    close(attn.attention_row(x, HW, (2, 3)), S[:, :, 13], 1e-7, 1e-9)
    assert S.transpose(-1, -2).allclose(S)  # symmetric, unlike softmax
