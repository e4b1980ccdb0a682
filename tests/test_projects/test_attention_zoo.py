"""projects/attention_zoo (NeurIPS Table 1): each mixer against its formula."""
import math

import pytest
import torch
import torch.nn.functional as F

import projects.attention_zoo as zoo  # conftest: the checkout on sys.path
from mmsoft.models.backbones.soft import SOFTBlock
from mmsoft.models.layers import reduce_map
from mmsoft.registry import ATTENTIONS

mixers = zoo.mixers
pytestmark = pytest.mark.usefixtures('one_thread')  # tiny ops
HW, N, C, HEADS, D, F64 = (7, 5), 35, 16, 2, 8, torch.float64  # 7, 5: odd
TYPES = ('softmax', 'linformer', 'performer', 'nystromformer', 'sima')
ZOO = (zoo.SoftmaxZooAttention, zoo.LinformerAttention, zoo.PerformerAttention,
       zoo.NystromformerAttention, zoo.SimAAttention)
LIN, PERF, NYS, SIMA = ZOO[1:]


def tokens(B=2, n=N, c=C, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, n, c, generator=g, dtype=F64)


def build(t, ratio=2, dw_kernel_size=3, **options):
    """``t`` as a SOFT block builds it (``attn_cfg=dict(type=t, ...)``)."""
    torch.manual_seed(0)
    block = SOFTBlock(C, HEADS, ratio, dw_kernel_size,
                      attn_cfg=dict(type=t, **options))  # yapf: disable
    return block.attn.double().eval()


def split(attn, x, *names):
    return [attn._split(getattr(attn, n)(x)) for n in names]


def softmax_matrix(q, k):
    return (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)


def close(a, b, rtol=None, atol=None):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def pool(t, hw=HW):
    """(B, n, c) -> (B, m, c), or (B, h, n, d) per head: 2 x 2 cells."""
    lead, c = t.shape[:-2], t.shape[-1]
    t = F.avg_pool2d(t.reshape(-1, *hw, c).permute(0, 3, 1, 2), 2)
    return t.flatten(2).transpose(1, 2).reshape(*lead, -1, c)


def ref_linformer(attn, x):  # avgpool: softmax(Q (X_r W_k)^T) per cell / 4
    w = softmax_matrix(*split(attn, x, 'q'), attn._split(attn.k(pool(x))))
    cells = pool(torch.eye(N, dtype=F64)[None])[0]  # (m, n) per token / 4
    return w @ cells


def ref_performer(attn, x):  # eps = 0: D^-1 phi(Q') phi(K')^T, q' = q d^-1/4
    q, k = (t * D**-0.25 for t in split(attn, x, 'q', 'k'))
    K = torch.exp(q @ attn.features.t() - q.square().sum(-1, True) / 2) @ \
        torch.exp(k @ attn.features.t() - k.square().sum(-1, True) / 2).mT
    return K / K.sum(-1, keepdim=True)


def ref_nystromformer(attn, x):  # F A^+ B, A^+ by 3 iterations
    q, k = split(attn, x, 'q', 'k')
    A = mixers.iterative_pinv(softmax_matrix(pool(q), pool(k)), 3)
    return softmax_matrix(q, pool(k)) @ A @ softmax_matrix(pool(q), k)


def ref_sima(attn, x):  # Q^ K^^T, l1 norms over the tokens + eps
    q, k = (t / (t.abs().sum(-2, True) + 10) for t in split(attn, x, 'q', 'k'))
    return q @ k.transpose(-1, -2)


REF = dict(softmax=({}, lambda a, x: softmax_matrix(*split(a, x, 'q', 'k'))),
           linformer=(dict(sr_mode='avgpool'), ref_linformer),
           performer=(dict(num_features=12, eps=0), ref_performer),
           nystromformer=(dict(pinv_iters=3), ref_nystromformer),
           sima=(dict(eps=10.), ref_sima))  # yapf: disable


@pytest.mark.parametrize('attn_type', TYPES)
def test_forward_is_the_formula_matrix_times_v_plus_dw_conv(attn_type):
    """proj(M V + dwconv V) == forward, M the formula; rows; gradients."""
    options, ref = REF[attn_type]
    attn, x = build(attn_type, **options), tokens()
    with torch.no_grad():
        M = attn.attention_matrix(x, HW)
        close(M, ref(attn, x))
        v = attn.v(x)
        out = attn.proj((M @ attn._split(v)).transpose(1, 2).flatten(2) +
                        attn.dw_conv_tokens(v, HW))
        close(attn(x, HW), out, 1e-9, 1e-9)
    for index, i in [((3, 2), 17), (0, 0), (N - 1, N - 1)]:
        close(attn.attention_row(x, HW, index), M[:, :, i], 1e-9, 1e-12)
    x.requires_grad_()
    attn.train()(x, HW).square().sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters())
    assert build(attn_type, dw_kernel_size=0).dw_conv is None


def test_registry_options_repr_and_refusals():
    """Class names and aliases registered; options by name; one line each."""
    for t, cls in zip(TYPES, ZOO):
        assert ATTENTIONS.get(t) is ATTENTIONS.get(cls.__name__) is cls
        on, off = cls(C, HEADS, 2), cls(C, HEADS, 2, qkv_bias=False)
        assert all(f.bias is not None for f in (on.q, on.k, on.v)), cls
        assert all(f.bias is None for f in (off.q, off.k, off.v)), cls
    for t, key in (('linformer', 'nr_iters'), ('softmax', 'max_landmarks')):
        with pytest.raises(TypeError, match=key):
            build(t, **{key: 4})
    kws = [{}, dict(sr_mode='avgpool'), dict(num_features=5),
           dict(pinv_iters=3), dict(order='linear')]  # yapf: disable
    reprs = ('', ', sr_mode=avgpool', ', num_features=5',
             ', pinv=iterative, pinv_iters=3', ', order=linear')
    assert [cls(16, 2, 2, **kw).extra_repr() for cls, kw in zip(ZOO, kws)
            ] == ['heads=2, ratio=2' + e for e in reprs]
    for cls, kw, msg in [
        (LIN, dict(sr_mode='pool'),
         "unknown sr_mode 'pool'; choose one of ('conv', 'avgpool')"),
        (NYS, dict(pinv='svd'),
         "unknown pinv 'svd'; choose one of ('iterative', 'exact')"),
        (SIMA, dict(order='cubic'), "unknown order 'cubic'; choose "
         "one of ('auto', 'quadratic', 'linear')"),
        (PERF, dict(num_features=0),
         'num_features must be an int >= 1, got 0 (int)')]:  # yapf: disable
        with pytest.raises(ValueError) as info:
            cls(C, HEADS, 2, **kw)
        assert str(info.value) == msg


def test_linformer_conv_reduction_and_ratio_1():
    """X_r = LN(Conv_{r x r, stride r}(X)); r = 1: softmax, no reduction."""
    attn, x = build('linformer'), tokens()
    n, xr = attn.norm, x.transpose(1, 2).reshape(2, C, *HW)
    xr = F.conv2d(xr, attn.sr.weight, attn.sr.bias, 2).flatten(2).mT
    xr = F.layer_norm(xr, (C, ), n.weight, n.bias, n.eps)
    with torch.no_grad():
        w = softmax_matrix(*split(attn, x, 'q'), attn._split(attn.k(xr)))
    close(attn.reduced_attention_row(x, HW, 11), w[:, :, 11])
    lin, soft = build('linformer', ratio=1), build('softmax', ratio=1)
    assert lin.sr is None and lin.norm is None
    soft.load_state_dict(lin.state_dict())  # the same parameters
    with torch.no_grad():
        close(lin(x, HW), soft(x, HW))


@pytest.mark.parametrize('kw, m', [({}, 12), (dict(max_landmarks=6), 4),
                                   (dict(landmark_hw=(1, 3)), 3)])
def test_spread_to_tokens_and_capped_linformer_rows(kw, m):
    """The transpose of the (capped) pooling; bad lengths: one line."""
    w, z = torch.rand(3, m, dtype=F64), torch.randn(6, 8, dtype=F64)
    spread = mixers.spread_to_tokens(w, (6, 8), 2, **kw)
    pooled = reduce_map(z[None, None], 2, **kw).flatten()
    close(spread @ z.flatten(), w @ pooled)
    for bad in (torch.rand(m + 1), torch.rand(3, 4, m - 1)):  # any dims
        with pytest.raises(ValueError) as info:
            mixers.spread_to_tokens(bad, (6, 8), 2, **kw)
        assert str(info.value) == f'{bad.shape[-1]} weights for {m} ' \
            'reduced tokens'
    attn, x = build('linformer', sr_mode='avgpool', **kw), tokens(n=48)
    assert attn.reduced_attention_row(x, (6, 8), 0).shape[-1] == m
    with torch.no_grad():
        M, v = attn.attention_matrix(x, (6, 8)), attn.v(x)
        close(attn._mix(x, (6, 8))[0], M @ attn._split(v))


def test_performer_approximates_softmax_as_features_grow():
    x, errs = tokens(1, 24, seed=1) * 0.5, {}
    for M in (4, 64, 1024):
        e = []
        for seed in range(4):
            attn = PERF(C, HEADS, 1, num_features=M).double().eval()
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


def test_performer_features_scaled_per_query_row_and_key_head():
    """Maximum M^-1/2 per query / per head of keys: a large query norm only
    sharpens its row; M = max(16, round(d ln d)) by default."""
    attn, x = build('performer', num_features=12, eps=0), tokens()
    with torch.no_grad():
        pq, pk = attn._phi(x)
        close(pq.amax(-1), torch.full((2, 2, N), 12**-0.5, dtype=F64))
        close(pk.amax((-2, -1)), torch.full((2, 2), 12**-0.5, dtype=F64))
        attn.k.weight.mul_(0.01)  # moderate keys
    s = torch.ones(2, 12, 1, dtype=F64)
    s[:, ::3] = 30  # every third query large
    M = attn.attention_matrix(tokens(n=12) * s, (3, 4))
    assert torch.isfinite(M).all() and (M >= 0).all()
    close(M.sum(-1), torch.ones(2, 2, 12, dtype=F64))
    for embed_dims, heads, m in [(16, 4, 16), (16, 2, 17), (128, 2, 266)]:
        attn = PERF(embed_dims, heads, 1)
        assert attn.features.shape == (m, embed_dims // heads)


@pytest.mark.parametrize('interval, redraws',
                         [(1, [1, 1]), (2, [1, 0, 1, 0, 1]), (0, [0, 0])])
def test_performer_redraws_every_interval_training_forwards(interval, redraws):
    """k > 0: new features on training forwards 1, k + 1, ...; not in eval."""
    attn, x, seen = PERF(C, HEADS, 1, redraw_interval=interval), tokens(), []
    for _ in redraws + [0]:
        before = attn.features.clone()
        attn.train(len(seen) < len(redraws))(x.float(), HW)
        seen.append(int(not torch.equal(before, attn.features)))
    assert seen == redraws + [0]


def test_orthogonal_gaussian_seeded_orthogonal_float64_norms(monkeypatch):
    """Blocks of d orthonormal rows times chi(d) norms, ceil(M / d) QRs."""
    g = [torch.Generator().manual_seed(3) for _ in range(2)]
    a = mixers.orthogonal_gaussian(10, 4, g[0])
    torch.manual_seed(1)  # not the global RNG
    w = mixers.orthogonal_gaussian(10, 4, g[1], F64)
    assert a.dtype == torch.float32 and torch.equal(w.float(), a)
    n = w.norm(dim=1, keepdim=True)
    for b in range(0, 10, 4):
        u = (w / n)[b:b + 4]
        close(u @ u.t(), torch.eye(len(u), dtype=F64), 0, 1e-12)
    assert ((n - n.float().double()).abs() / n > 1e-13).all()
    calls, qr = [], torch.linalg.qr
    monkeypatch.setattr(torch.linalg, 'qr', lambda a: calls.append(1) or qr(a))
    w = mixers.orthogonal_gaussian(9, 4)
    assert w.shape == (9, 4) and calls == [1] * 3


def test_iterative_pinv_start_step_convergence_and_exact_limit():
    """Z_0 = A^T / (||A||_1 ||A||_inf) per matrix, one step, to A^+; r = 1,
    exact inverse: F A^+ B = S S^+ S = S; 6 iterations by default."""
    attn, x = build('nystromformer', ratio=1, pinv='exact'), tokens()
    S = softmax_matrix(*split(attn, x, 'q', 'k'))
    close(attn.attention_matrix(x, HW), S, 1e-6, 1e-8)
    assert NYS(C, HEADS, 2).pinv_iters == 6
    A = tokens(3, 5, 5, seed=0) * torch.tensor([1., 10., 1.])[:, None, None]
    norms = A.abs().sum(-2).amax(-1) * A.abs().sum(-1).amax(-1)
    Z0, eye = A.transpose(-1, -2) / norms[:, None, None], torch.eye(5)
    close(mixers.iterative_pinv(A, 0), Z0)
    AZ = A @ Z0
    step = Z0 @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ))) / 4
    close(mixers.iterative_pinv(A, 1), step)
    for shape in [(10, 10), (6, 4), (4, 6)]:
        A = torch.rand(2, *shape, dtype=F64).softmax(-1)
        close(mixers.iterative_pinv(A, 30), torch.linalg.pinv(A))


@pytest.mark.parametrize('pinv', ['iterative', 'exact'])
def test_nystromformer_in_bfloat16_inverts_in_float32(pinv):
    attn = NYS(C, HEADS, 2, pinv=pinv).to(torch.bfloat16)  # A^+ in float32
    x = tokens().to(torch.bfloat16)
    with torch.no_grad():
        assert attn._kernels(x, HW)[1].dtype == torch.float32
        out = attn(x, HW)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert attn.attention_row(x, HW, 5).dtype == torch.float32


@pytest.mark.parametrize('order', ['linear', 'quadratic', 'auto'])
def test_sima_multiplies_in_the_chosen_order(order):
    """'linear': Q(K^T V); 'quadratic': (Q K^T)V; 'auto': linear iff n > d."""
    want = ['quadratic', 'linear'] if order == 'auto' else [order] * 2
    assert [mixers.sima_order(n, 8, order) for n in (8, 9)] == want
    attn, x = build('sima', 1, 0, order=order).float(), tokens().float()
    with torch.no_grad():
        (out, _), (q, k), (v, ) = attn._mix(x, HW), attn._qk(x), split(
            attn, x, 'v')  # yapf: disable
        lin, quad = q @ (k.mT @ v), (q @ k.mT) @ v
    assert not torch.equal(lin, quad)
    assert torch.equal(out, quad if order == 'quadratic' else lin)
