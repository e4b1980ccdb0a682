"""SOFT attention (Alg. 1, Eq. 5 / 25): the Gaussian kernel, the landmark
grid and samplers, the bottleneck, the module, its refusals."""
import dataclasses
import importlib
import math
import re

import pytest
import torch
import torch.nn.functional as F
from conftest import deadline

from mmsoft.models.backbones.soft import SOFTBlock, SoftmaxAttention
from mmsoft.models.layers import (AttentionBase, BottleneckSampler, NRConfig,
                                  SOFTAttention, amp, bottleneck_apply,
                                  gaussian_kernel, landmark_grid, reduce_map,
                                  soft_attention, with_nr)
from mmsoft.models.layers.soft_attention import (SAMPLING_MODES,
                                                 GaussianKernel,
                                                 bottleneck_inverse,
                                                 kernel_forward)

pytestmark = pytest.mark.usefixtures('one_thread')  # tiny ops
sa = importlib.import_module('mmsoft.models.layers.soft_attention')
F64, F32 = torch.float64, torch.float32
HALF = [torch.bfloat16, torch.float16]
BIG = 2**53 + 1  # the first int that a float64 cannot hold


def close(a, b, rtol=None, atol=None):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def randn(*shape, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=F64).to(dtype)


def ref_kernel(x, y):
    """exp(-||x_i - y_j||^2 / 2) in float64 (differentiable)."""
    x, y = x.double(), y.double()
    return torch.exp(-((x[..., :, None, :] - y[..., None, :, :])**2).sum(-1) /
                     2)


def tokens(norm, *shape, offset=True, seed=0):
    """Norm ~``norm``: an offset + unit spread, or random directions."""
    g = torch.Generator().manual_seed(seed)
    if offset:
        c = torch.randn(shape[-1], generator=g, dtype=F64)
        return c / c.norm() * norm + torch.randn(
            *shape, generator=g, dtype=F64)
    x = torch.randn(*shape, generator=g, dtype=F64)
    return x / x.norm(dim=-1, keepdim=True) * norm


def ijcv(A, W, nr):
    """D^-1/2 A_T D^-1/2 W (Eq. 25), D = diag(A 1)."""
    d = A.sum(-1, keepdim=True).rsqrt()
    return d * (nr.inverse(A) @ (d * W))


@pytest.fixture(params=['autograd', 'export'])
def path(request, monkeypatch):
    """The kernel's autograd Function, or the plain ops of an export."""
    if request.param == 'export':
        monkeypatch.setattr(amp, 'is_exporting', lambda: True)
    return request.param


@pytest.mark.parametrize('xs, ys, self_kernel, dx, dy, dtype, atol', [
    ((2, 4, 3), (2, 5, 3), False, F64, F64, F64, 1e-14),
    ((2, 5, 3), (2, 5, 3), True, F64, F64, F64, 1e-14),
    ((2, 4, 3), (2, 5, 3), False, F64, F32, F64, 1e-14),
    ((2, 4, 3), (2, 5, 3), False, F32, F64, F64, 1e-14),
] + [((1, 2, 5, 4), (1, 2, 6, 4), s, h, h, F32, 1e-6)
     for s, h in zip((False, True), HALF)])
def test_kernel_is_eq5_on_both_paths(path, xs, ys, self_kernel, dx, dy, dtype,
                                     atol):
    """In float64 if either side is, else float32 (half: rounded inputs)."""
    y = randn(*ys, seed=3, dtype=dy)
    x = y if self_kernel else randn(*xs, seed=4, dtype=dx)
    K = gaussian_kernel(x, y)
    assert K.shape == x.shape[:-1] + ys[-2:-1] and K.dtype == dtype
    close(K.double(), ref_kernel(x, y), 1e-12 if dtype == F64 else 0, atol)


def test_kernel_function_defaults_and_gradcheck():
    """Gradcheck (y broadcast, y = x); a half gradient rounded once."""
    x, y = randn(2, 4, 3, seed=10), randn(2, 6, 3, seed=11)
    for fn in (kernel_forward, GaussianKernel.apply):  # the cross kernel
        close(fn(x, y), ref_kernel(x, y), 1e-12, 1e-14)
    off = 50 * randn(4, seed=1)
    x, y, y1 = [(off + randn(*s, seed=k)).requires_grad_()
                for k, s in enumerate([(2, 9, 4), (2, 5, 4), (5, 4)], 2)]
    f = lambda a, b: gaussian_kernel(0.3 * a, 0.3 * b)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y))
    assert torch.autograd.gradcheck(f, (x, y1))
    assert torch.autograd.gradcheck(lambda a: gaussian_kernel(a, a), (y, ))
    y = randn(2, 2, 16, 8, seed=18, dtype=torch.bfloat16).requires_grad_()
    w = randn(2, 2, 16, 16, seed=19, dtype=F32)
    (gaussian_kernel(y, y) * w).sum().backward()
    y32 = y.detach().float().requires_grad_()
    (gaussian_kernel(y32, y32) * w).sum().backward()
    assert y.grad.dtype == torch.bfloat16
    assert torch.equal(y.grad, y32.grad.to(torch.bfloat16))


@pytest.mark.parametrize('norm, offset', [(3, None), (1e4, True),
                                          (1e4, False)])
def test_self_kernel_diagonal_is_exactly_one_fp32(path, norm, offset):
    """Diagonal exactly 1, the rest float64's; cross kernels per sample."""
    y = (randn(2, 3, 16, 8, seed=5) * norm if offset is None else tokens(
        norm, 2, 3, 16, 8, offset=offset)).float()
    A = gaussian_kernel(y, y)
    assert A.dtype == F32 and torch.isfinite(A).all()
    assert torch.equal(A.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, 16))
    close(A.double(), ref_kernel(y, y), 0, 2e-5)
    if offset is None:
        return
    q = tokens(norm, 3, 2, 64, 8, offset=offset).float()
    lm = q[:, :, ::8]
    P = gaussian_kernel(q, lm)
    assert torch.isfinite(P).all() and (P >= 0).all() and (P <= 1).all()
    if not offset:  # random directions: bounded
        return
    close(P[:, :, ::8].diagonal(dim1=-2, dim2=-1), torch.ones(3, 2, 8), 0,
          1e-5)
    close(P.double(), ref_kernel(q, lm), 0, 2e-5)
    for b in range(3):
        assert torch.equal(P[b:b + 1], gaussian_kernel(q[b:b + 1],
                                                       lm[b:b + 1]))


@pytest.mark.parametrize('needs', [(True, False), (False, True)])
def test_gradients_fp32_with_large_per_sample_offsets(needs):
    """Opposite offsets (a global mean near 0); frozen x or y: no grad."""
    u = randn(4, seed=12)
    off = torch.stack([u / u.norm() * 1e4, -u / u.norm() * 1e4])[:, None, :]
    xy = (off + randn(2, 5, 4, seed=13)).float(), (
        off + 0.5 * randn(2, 3, 4, seed=14)).float()
    w = randn(2, 5, 3, seed=15)
    got = [t.clone().requires_grad_(n) for t, n in zip(xy, needs)]
    want = [t.double().requires_grad_(n) for t, n in zip(xy, needs)]
    (gaussian_kernel(*got).double() * w).sum().backward()
    (ref_kernel(*want) * w).sum().backward()
    for a, b, need in zip(got, want, needs):
        if need:
            assert b.grad.abs().max() > 0.1  # the gradients are not ~0
            close(a.grad.double(), b.grad, 0, 1e-6)
        else:
            assert a.grad is None


@pytest.mark.parametrize('norm, spread', [(0.0, 4.0), (1e3, 0.05)])
def test_kernel_product_without_the_kernel(norm, spread, monkeypatch):
    """Fused K w as accurate as the formed fp32 kernel, per sample."""
    off = norm * torch.ones(8, dtype=F64) / 8**0.5
    x = off + spread * randn(2, 3, 300, 8, seed=5)
    y = x[:, :, ::10] + 0.01 * randn(2, 3, 30, 8, seed=6)
    w = randn(2, 3, 30, 5, seed=7)
    c = y.float().mean(-2, keepdim=True)
    xc, yc = x.float() - c, y.float() - c
    got = sa.kernel_product(xc, yc, w.float())
    want = ref_kernel(x.float(), y.float()) @ w
    formed = gaussian_kernel(x.float(), y.float()).double() @ w
    assert got.shape == want.shape and got.dtype == F32
    bound = 2 * (formed - want).abs().max() + 1e-6 * want.abs().max()
    assert (got.double() - want).abs().max() <= bound
    assert torch.equal(got[1:], sa.kernel_product(xc[1:], yc[1:],
                                                  w[1:].float()))
    x, y, w = randn(2, 40, 2, seed=8), randn(2, 6, 2, seed=9), randn(2, 6, 7)
    got = sa.kernel_product(x.float(), y.float(), w.float())
    close(got.double(), ref_kernel(x, y) @ w, 0, 1e-5)
    if norm:  # fused above FUSED_MIN_ENTRIES without grad: P never formed
        return
    attn_norm = True
    q = tokens(1e2, 2, 2, 64, 8).float() * 0.3
    lm = q[:, :, ::8] + 0.1
    v = randn(2, 2, 64, 8, seed=1, dtype=F32)
    with torch.no_grad():
        formed = soft_attention(q, lm, v, attn_norm)
        monkeypatch.setattr(sa, 'FUSED_MIN_ENTRIES', 64 * 8)
        shapes, kernel = [], sa.gaussian_kernel
        monkeypatch.setattr(
            sa, 'gaussian_kernel',
            lambda a, b: shapes.append(tuple(a.shape)) or kernel(a, b))
        fused = soft_attention(q, lm, v, attn_norm)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            half = soft_attention(q, lm, v.bfloat16(), attn_norm)
    assert shapes == [(2, 2, 8, 8)] * 2  # A, twice: no (64, 8) kernel P
    close(fused, formed, 1e-5, 2e-6)
    assert half.dtype == torch.bfloat16
    close(half.float(), formed, 2e-2, 2e-2)


@pytest.mark.parametrize('attn_norm', [True, False])
def test_soft_attention_equals_dense_formula_default_ijcv(attn_norm):
    """P A_n^+ P^T V formed; by default attn_norm=True: P (D^-1/2 A^+
    D^-1/2 (P^T V)) with the per-sample alpha; fp32 float64-accurate at a
    large norm (under autocast: test_device_amp.py)."""
    q = randn(2, 2, 64, 8) / 8**.25
    lm, v = q[:, :, ::8], randn(2, 2, 64, 8, seed=1)
    P, A = ref_kernel(q, lm), ref_kernel(lm, lm)
    if attn_norm:
        d = A.sum(-1).rsqrt()
        A_inv = d[..., :, None] * torch.linalg.pinv(A) * d[..., None, :]
        init = 'soft_norm_per_sample'
    else:
        A_inv = torch.linalg.inv(A + 0.01 * torch.eye(A.shape[-1], dtype=F64))
        init = 'soft'
    out = soft_attention(q, lm, v, attn_norm, NRConfig(40, init))
    close(out, P @ A_inv @ P.transpose(-1, -2) @ v, 1e-6, 1e-6)
    q = randn(1, 2, 16, 4, seed=1) * 0.6
    lm, v = q[:, :, ::4], randn(1, 2, 16, 4, seed=2)
    P, A, nr = gaussian_kernel(q, lm), gaussian_kernel(lm, lm), NRConfig(3)
    want = P @ ijcv(A, P.transpose(-1, -2) @ v, nr)
    close(soft_attention(q, lm, v, nr=nr), want)
    assert not torch.allclose(
        soft_attention(q, lm, v, False, nr), want, rtol=1e-3)
    q = tokens(1e4, 2, 2, 64, 8).float()
    lm, v = q[:, :, ::8] + 0.1, randn(2, 2, 64, 8, seed=1, dtype=F32)
    out = soft_attention(q, lm, v, attn_norm)
    assert torch.isfinite(out).all()
    ref = soft_attention(q.double(), lm.double(), v.double(), attn_norm)
    close(out.double(), ref, 1e-3, 1e-3)


@pytest.mark.parametrize('attn_norm, landmarks, heads',
                         [(True, 'strided', True),
                          (False, 'the queries', True),
                          (True, 'strided', False)])
def test_training_path_gradients_equal_autograds(attn_norm, landmarks, heads):
    """float64, m = n too; (B, n, d) tokens with V without a gradient."""
    shape = (2, 1, 12, 3) if heads else (2, 12, 3)
    q = (randn(*shape) / 2).requires_grad_()
    v = randn(*shape, seed=1).requires_grad_(heads)
    G, inputs = randn(*shape, seed=2), (q, v) if heads else (q, )

    def lm_of(q):
        return q if landmarks == 'the queries' else q[..., ::3, :] * 1.1

    P, A = gaussian_kernel(q, lm_of(q)), gaussian_kernel(lm_of(q), lm_of(q))
    ref = P @ bottleneck_apply(A, P.transpose(-1, -2) @ v, attn_norm)
    out = soft_attention(q, lm_of(q), v, attn_norm)
    assert out.grad_fn.name() == 'KernelAttentionBackward'
    close(out, ref, 1e-12, 1e-12)
    for a, b in zip(
            torch.autograd.grad(out, inputs, G),
            torch.autograd.grad(ref, inputs, G)):
        close(a, b, 1e-10, 1e-12)
    if attn_norm and heads:  # (the self-kernel: test_pinv's gradchecks)
        assert torch.autograd.gradcheck(
            lambda q, v: soft_attention(q, lm_of(q), v, attn_norm), (q, v))


def kernel_of(*batch, m=5, seed=0, dtype=F64, scale=0.7, d=4):
    lm = randn(*batch, m, d, seed=seed, dtype=dtype) * scale
    return gaussian_kernel(lm, lm)


@pytest.mark.parametrize('attn_norm', [True, False])
@pytest.mark.parametrize('method', ['iterative', 'spectral'])
def test_bottleneck_apply_equals_inverse_product(attn_norm, method):
    """A_n^+ W without forming A_n^+: values and gradients."""
    A = kernel_of(2, 2, m=140, d=16, seed=3, scale=0.5).requires_grad_()
    W = randn(2, 2, 140, 16, seed=4)
    nr = NRConfig.of(dict(method=method), attn_norm)
    ref = bottleneck_inverse(A, attn_norm, nr) @ W
    got = bottleneck_apply(A, W, attn_norm, nr)
    close(got, ref, 1e-10, 1e-12)
    close(
        torch.autograd.grad(got.square().sum(), A)[0],
        torch.autograd.grad(ref.square().sum(), A)[0], 1e-9, 1e-12)


@pytest.mark.parametrize('batch, nr, d', [((), None, 0),
                                          ((2, 2), dict(iters=3), 3)])
def test_bottleneck_defaults_are_eq25_per_sample(batch, nr, d):
    """D^-1/2 A^+ D^-1/2 W per sample (Eq. 25); attn_norm=False: A^+."""
    A = kernel_of(*batch, m=12, d=8, seed=5, scale=0.5)
    W = randn(*batch, 12, d, seed=1) if d else None
    iters = 20 if nr is None else nr['iters']
    want = ijcv(A,
                torch.eye(12, dtype=F64) if W is None else W,
                NRConfig(iters, 'soft_norm_per_sample'))
    got = bottleneck_apply(A, W, nr=nr)
    assert got.shape == want.shape
    close(got, want, 1e-12, 1e-14)
    if W is None:
        assert torch.equal(bottleneck_inverse(A), got)
    neurips = bottleneck_apply(A, W, False, nr)
    soft = NRConfig(iters, 'soft')
    close(neurips, soft.inverse(A) if W is None else soft.apply(A, W), 0, 0)
    assert not torch.allclose(neurips, want, rtol=1e-3)
    if batch:  # half inputs: D not rounded, float32 (float64 W too)
        return
    half = torch.float16
    A = kernel_of(1, 2, dtype=F32)
    W = randn(1, 2, 5, 3, seed=1, dtype=F32)
    out = bottleneck_apply(A.to(half), W.to(half))
    assert out.dtype == F32
    close(out, bottleneck_apply(A.to(half).float(),
                                W.to(half).float()), 1e-6, 1e-6)
    out = bottleneck_apply(A, W.double())
    assert out.dtype == F32
    close(out, bottleneck_apply(A, W), 0, 0)
    A = kernel_of(2, m=16, d=8, seed=6, dtype=F32, scale=0.5).to(half)
    got = bottleneck_inverse(A)  # A^+ and D^-1/2 in float32 too
    assert got.dtype == F32
    close(got, bottleneck_inverse(A.float()), 1e-6, 1e-7)


# yapf: disable
@pytest.mark.parametrize('hw, r, cap, want', [
    ((13, 40), 4, None, (3, 10)), ((3, 2), 4, None, (1, 1)),
    ((8, 8), 2, 16, (4, 4)), ((BIG, 1), 1, BIG, (BIG, 1)),
    ((4, 4), 1, 4, (2, 2)), ((12, 8), 1, 24, (6, 4)),
    ((100, 100), 4, 49, (7, 7)), ((17, 17), 1, 36, (6, 6)),
    ((68, 68), 4, 9, (3, 3)), ((30, 20), 1, 10, (3, 2)),
    ((8, 1), 1, 4, (4, 1)), ((1, 8), 1, 4, (1, 4)), ((64, 4), 4, 4, (4, 1)),
    ((4, 64), 4, 4, (1, 4)), ((1, 100), 1, 5, (1, 5)),
    ((100, 1), 1, 5, (5, 1))])
# yapf: enable
def test_landmark_grid_documented_sizes(hw, r, cap, want):
    """max(1, H // r) x max(1, W // r), shrunk (aspect kept) under the cap:
    exact (BIG: a float trip loses 1), s = 1/2 or gh s whole exactly on
    the cap, 1-wide maps (the long side shrinks, the loop ends)."""
    with deadline():
        got = landmark_grid(hw, r, cap)
    assert got == want
    if cap is not None:
        assert got[0] * got[1] <= cap


@pytest.mark.parametrize('hw, r, fixed, want, cap', [
    ((28, 28), 4, (7, 5), (7, 5), 49), ((13, 40), 4, (7, 5), (3, 5), 7),
    ((6, 6), 4, (7, 5), (1, 1), 1), ((16, 16), 1, (24, 24), (16, 16), 10)
])  # yapf: disable
def test_landmark_hw_fixes_the_grid_and_max_landmarks_caps_it(
        hw, r, fixed, want, cap):
    """A fixed grid is never up-sampled (issue 27); the cap caps m."""
    assert landmark_grid(hw, r, landmark_hw=fixed) == want
    q = randn(1, 2, hw[0] * hw[1], 8, dtype=F32)
    gh, gw = landmark_grid(hw, r)
    for mode in SAMPLING_MODES:
        s = BottleneckSampler(8, r, mode, landmark_hw=fixed).eval()
        assert s(q, hw).shape == (1, 2, want[0] * want[1], 8)
        s = BottleneckSampler(8, r, mode, max_landmarks=cap).eval()
        m = s(q, hw).shape[2]
        assert m <= cap and m == math.prod(landmark_grid(hw, r, cap))
        assert m == gh * gw if gh * gw <= cap else m >= cap // 4
    grid = BottleneckSampler(8, r, 'avgpool')(q, hw)
    pooled = F.adaptive_avg_pool2d(
        grid.reshape(2, gh, gw, 8).permute(0, 3, 1, 2), want)
    close(
        BottleneckSampler(8, r, 'avgpool', landmark_hw=list(fixed))(q, hw),
        pooled.flatten(2).transpose(1, 2)[None])


def test_samplers_layout_tokens_and_repr():
    """conv layout, avgpool means, biased first m, random spacing."""
    s = BottleneckSampler(32, 8, 'conv')
    assert tuple(s.conv.weight.shape) == (32, 32, 8, 8)
    assert s.conv.bias is None and s.conv.stride == (8, 8)
    assert isinstance(s.norm, torch.nn.LayerNorm)
    q = torch.randn(1, 2, 16, 4)
    lm = BottleneckSampler(4, 2, 'avgpool')(q, (4, 4))
    close(lm[0, 0, 0], q[0, 0].reshape(4, 4, 4)[:2, :2].mean((0, 1)))
    close(BottleneckSampler(4, 2, 'biased')(q, (4, 4)), q[:, :, :4])
    s = BottleneckSampler(4, 2, 'random')
    q = torch.arange(64.).reshape(1, 1, 64, 1).expand(1, 1, 64, 4)
    torch.manual_seed(0)
    assert len({tuple(s(q, (8, 8))[0, 0, :, 0].tolist())
                for _ in range(5)}) > 1
    s = BottleneckSampler(1, 2, 'random').eval()
    assert s(torch.arange(16.).reshape(1, 1, 16, 1),
             (4, 4)).flatten().tolist() == [0., 5., 10., 15.]
    for r, m, kw, want in [
        (4, 'conv', {}, 'mode=conv, ratio=4'),
        (2, 'avgpool', dict(max_landmarks=49),
         'mode=avgpool, ratio=2, max_landmarks=49'),
        (4, 'biased', dict(landmark_hw=(3, 5)),
         'mode=biased, ratio=4, landmark_hw=(3, 5)')]:  # yapf: disable
        assert BottleneckSampler(8, r, m, **kw).extra_repr() == want


def zero_padded_cells(x, r):
    """Means of the r x r cells, the map zero-padded (bottom / right)."""
    N, C, H, W = x.shape
    xp = x.new_zeros(N, C, max(H, r), max(W, r))
    xp[..., :H, :W] = x
    gh, gw = xp.shape[-2] // r, xp.shape[-1] // r
    return xp[..., :gh * r, :gw * r].reshape(N, C, gh, r, gw, r).mean((3, 5))


@pytest.mark.parametrize('hw, kw', [((1, 4), {}),
                                    ((4, 1), dict(max_landmarks=12)),
                                    ((1, 3), dict(landmark_hw=(9, 9)))])
def test_reduce_map_cells_and_small_sides(hw, kw):
    """Cell means; small sides zero-padded; a grid map bit for bit."""
    x = torch.arange(1., 1 + hw[0] * hw[1]).reshape(1, 1, *hw)
    out = reduce_map(x, 2)
    assert tuple(out.shape[-2:]) == (max(1, hw[0] // 2), max(1, hw[1] // 2))
    close(out, zero_padded_cells(x, 2))
    if hw == (1, 3):  # two values and two zeros, the partial cell dropped
        assert out.item() == (1. + 2.) / 4
    if 4 in hw:  # conv: the map zero-padded at the bottom / right only
        conv = torch.nn.Conv2d(1, 1, 2, 2, bias=False)
        with torch.no_grad():
            conv.weight.copy_(torch.tensor([[[[1., 2.], [3., 4.]]]]))
        padded = F.pad(x, (0, 2 - min(hw[1], 2), 0, 2 - min(hw[0], 2)))
        close(reduce_map(x, 2, conv=conv), conv(padded))
    x = torch.tensor([[-0., 1.5, -2.], [3., -0., 0.25], [-1., 2., -0.]])
    x = x.expand(2, 1, 3, 3)
    out = reduce_map(x, 1, **kw)
    assert torch.equal(out, x) and torch.equal(out.signbit(), x.signbit())
    x = randn(2, 3, 4, 6)
    close(reduce_map(x, 2), x.reshape(2, 3, 2, 2, 3, 2).mean((3, 5)))
    x = randn(1, 2, 8, 8)  # 4 x 4 grid, capped to 2 x 2
    close(
        reduce_map(x, 2, max_landmarks=4),
        x.reshape(1, 2, 2, 4, 2, 4).mean((3, 5)))


FIXED = ('the Newton-Raphson settings of SOFTAttention are fixed at '
         'construction: build the attention with the settings (nr=NRConfig('
         '...), or the attn_cfg keys nr_*), or copy a model with other ones '
         '(mmsoft.models.layers.with_nr)')
ATTN = dict(embed_dims=8, num_heads=2, sampling_ratio=2)
# yapf: disable
REFUSALS = [
    (ValueError, 'gaussian_kernel: feature sizes differ (3 vs 4)',
     lambda: gaussian_kernel(randn(2, 5, 3), randn(2, 6, 4))),
    (ValueError, f"unknown sampling 'nearest'; choose one of "
     f'{SAMPLING_MODES}', lambda: BottleneckSampler(8, 2, 'nearest')),
    (ValueError, 'sampling ratio must be an int >= 1, got 0 (int)',
     lambda: BottleneckSampler(4, 0)),
    (ValueError, 'max_landmarks must be an int >= 1 or None, got 0 (int)',
     lambda: BottleneckSampler(4, 2, max_landmarks=0)),
    (ValueError, 'set either max_landmarks or landmark_hw (a fixed grid), '
     'not both',
     lambda: BottleneckSampler(4, 2, max_landmarks=4, landmark_hw=(2, 2))),
    *[(ValueError, f'landmark_hw must be a pair (gh, gw) of ints >= 1, got '
       f'{bad!r}', lambda bad=bad: BottleneckSampler(8, 4, landmark_hw=bad))
      for bad in (7, (7, ))],
    *[(ValueError, f'landmark_hw[{i}] must be an int >= 1, got {v!r} '
       f'({type(v).__name__})',
       lambda bad=bad: BottleneckSampler(8, 4, landmark_hw=bad))
      for bad, i, v in (((7, 0), 1, 0), ((7.0, 7), 0, 7.0))],
    (ValueError, '10 tokens do not form a 3x3 map',
     lambda: BottleneckSampler(8, 2)(torch.randn(1, 1, 10, 8), (3, 3))),
    *[(ValueError, f'expected (B, 2*3, C) tokens, got shape {shape}',
       lambda shape=shape: AttentionBase._check(torch.zeros(shape), (2, 3)))
      for shape in ((1, 5, 4), (1, 7, 4), (1, 6), (1, 6, 2, 2))],
    (ValueError, 'num_heads (3) must divide embed_dims (8)',
     lambda: SoftmaxAttention(8, 3)),
    (ValueError, 'num_heads (3) must divide embed_dims (64)',
     lambda: SOFTAttention(64, 3, 4)),
    *[(ValueError, message, lambda kw=kw: AttentionBase(**dict(ATTN, **kw)))
      for kw, message in [
          (dict(embed_dims=0), 'embed_dims must be an int >= 1, got 0 (int)'),
          (dict(num_heads=0), 'num_heads must be an int >= 1, got 0 (int)'),
          (dict(sampling_ratio=0),
           'sampling_ratio must be an int >= 1, got 0 (int)'),
          (dict(dw_kernel_size=2), 'dw_kernel_size must be an odd positive '
           'int (or 0 to disable the conv), got 2: an even kernel changes '
           'the token map size')]],
    *[(IndexError, f'{msg} outside the 3x4 map',
       lambda bad=bad: sa.query_index(bad, (3, 4)))
      for bad, msg in [((3, 0), 'query (3, 0)'), ((0, 4), 'query (0, 4)'),
                       ((-1, 0), 'query (-1, 0)'), ((0, -1), 'query (0, -1)'),
                       (12, 'query index 12'), (-1, 'query index -1')]],
    *[(AttributeError, FIXED,
       lambda name=name: setattr(SOFTAttention(16, 2, 2), name, None))
      for name in ('nr', 'nr_method', 'nr_iters', 'nr_init', 'nr_backward')],
    (ValueError, "SOFTAttention got both nr and ['nr_iters']; give the "
     'Newton-Raphson settings once (the nr_* keys, or nr=dict(...))',
     lambda: SOFTBlock(16, 2, 2, attn_cfg=dict(
         type='SOFTAttention', nr_iters=7, nr=dict(iters=7)))),
]
# yapf: enable


@pytest.mark.parametrize(
    'exc, message, make', REFUSALS, ids=[m for _, m, _ in REFUSALS])
def test_refusal_names_the_argument(exc, message, make):
    with pytest.raises(exc, match='^' + re.escape(message) + '$'):
        make()


def test_attention_module_options_shapes_and_dw_conv():
    """Grid options reach the sampler, the repr; q / v biases follow
    qkv_bias (default True, as the official model); the per-head dw filter
    on V, as the official (B*d, h, H, W) grouped conv."""
    s = SOFTAttention(32, 1, 4, landmark_hw=(7, 7)).sampler
    assert (s.landmark_hw, s.max_landmarks) == ((7, 7), None)
    s = SOFTAttention(32, 1, 4, max_landmarks=49).sampler
    assert (s.landmark_hw, s.max_landmarks) == (None, 49)
    assert SOFTAttention(
        32, 2, 4, attn_norm=False).extra_repr() == (
            'heads=2, attn_norm=False, nr_iters=20, nr_init=soft, '
            'nr_backward=eq16')
    for kw, bias in ((dict(), True), (dict(qkv_bias=False), False)):
        attn = SOFTAttention(8, 2, 2, **kw)
        assert (attn.q.bias is not None, attn.v.bias
                is not None) == (bias, ) * 2
    attn = SOFTAttention(64, 4, 4, dw_kernel_size=5)
    assert tuple(attn.dw_conv.weight.shape) == (4, 1, 5, 5)
    B, (H, W) = 2, (6, 10)
    x = torch.randn(2, H * W, 64)
    assert attn(x, (H, W)).shape == x.shape
    v = torch.randn(B, 4, H * W, 16)
    ref = attn.dw_conv(v.permute(0, 3, 1, 2).reshape(B * 16, 4, H, W))
    ref = ref.reshape(B, 16, 4, H * W).permute(0, 2, 3, 1)
    got = attn.dw_conv_tokens(v.transpose(1, 2).reshape(B, H * W, 64),
                              (H, W)).view(B, H * W, 4, 16)
    close(got.transpose(1, 2), ref)


def test_nr_settings_built_once_and_frozen(monkeypatch):
    """Checked once, passed down, frozen; with_nr copies with others."""
    checks, post_init = [], NRConfig.__post_init__
    monkeypatch.setattr(NRConfig, '__post_init__',
                        lambda self: checks.append(1) or post_init(self))
    attn = SOFTAttention(16, 2, 2, nr=dict(iters=7, method='iterative'))
    assert attn.nr == NRConfig(7, 'soft_norm_per_sample', 'iterative', 'exact')
    checks.clear()
    attn(torch.randn(2, 16, 16), (4, 4))
    attn.attention_row(torch.randn(1, 16, 16), (4, 4), 0)
    assert checks == []
    assert SOFTAttention(16, 2, 2, nr=attn.nr).nr is attn.nr
    cfg = dict(type='SOFTAttention', nr_iters=7, nr_method='iterative')
    assert SOFTBlock(16, 2, 2, attn_cfg=cfg).attn.nr == attn.nr
    with pytest.raises(dataclasses.FrozenInstanceError):
        attn.nr.iters = 3
    assert (attn.nr_iters, attn.nr_method) == (7, 'iterative')
    # (a bad field: test_pinv.py::test_defaults_and_errors_name_the_problem)
    with pytest.raises(TypeError, match='unknown Newton-Raphson settings'):
        SOFTAttention(16, 2, 2, nr=dict(iter=3))
    assert SOFTAttention(16, 2, 2, nr_iters=3, nr_init='soft').nr == \
        NRConfig(3, 'soft')
    assert SOFTAttention(
        16, 2, 2, attn_norm=False, nr=dict(iters=5)).nr == NRConfig(5, 'soft')
    # with_nr: a copy (weights, mode, requires_grad; model and RNG kept)
    own = NRConfig(7, 'soft_norm_per_matrix', 'iterative', 'exact')
    model = torch.nn.Sequential(
        SOFTAttention(16, 2, 2, nr=own),
        SOFTAttention(16, 2, 2, attn_norm=False,
                      nr=dict(iters=4))).double().eval()
    model[0].q.weight.requires_grad_(False)
    state = torch.random.get_rng_state()
    copy = with_nr(model, method='spectral', iters=30)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert model[0].nr == own
    assert copy[0].nr == own.replace(method='spectral', iters=30)
    assert copy[1].nr == NRConfig(30, 'soft', 'spectral')
    assert copy[0] is not model[0] and not copy.training
    assert copy[0].q.weight.dtype == F64
    assert not copy[0].q.weight.requires_grad
    for k, v in model.state_dict().items():
        assert torch.equal(copy.state_dict()[k], v), k
    same = with_nr(model)
    assert same[0].nr == own and same[1].nr == NRConfig(4, 'soft')
    by_dict = with_nr(model, nr=dict(iters=5))
    assert by_dict[0].nr == NRConfig(5, 'soft_norm_per_sample')
    assert by_dict[1].nr == NRConfig(5, 'soft')
    cfg = NRConfig(3, 'soft_norm_per_batch', 'spectral')
    given = with_nr(model, nr=cfg)
    assert given[0].nr is cfg and given[1].nr is cfg


@pytest.mark.parametrize('attn_norm', [True, False])
def test_rows_and_matrix_are_p_ainv_pt_and_give_the_forward(attn_norm):
    """S^ = P A^+_n P^T (symmetric), its rows; forward = proj(S^ V + dw)."""
    assert [
        sa.query_index(i, (3, 4))
        for i in [(0, 0), (0, 3), (2, 0), (2, 3), [1, 2], 0, 11,
                  torch.tensor(5)]
    ] == [0, 3, 8, 11, 6, 0, 11, 5]
    kw = dict(attn_norm=attn_norm, sampling='avgpool')
    attn = SOFTAttention(16, 2, 2, 3 * attn_norm, **kw).double().eval()
    x, hw = randn(2, 35, 16), (7, 5)
    q = attn._split(attn.q(x)) * 8**-0.25
    lm = F.avg_pool2d(q.reshape(4, *hw, 8).permute(0, 3, 1, 2), 2)
    lm = lm.flatten(2).transpose(1, 2).reshape(2, 2, -1, 8)
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    A_inv = NRConfig(
        20, 'soft_norm_per_sample' if attn_norm else 'soft').inverse(A)
    if attn_norm:
        d = A.sum(-1).rsqrt()
        A_inv = d[..., :, None] * A_inv * d[..., None, :]
    S = P @ A_inv @ P.mT
    close(attn.attention_row(x, hw, (2, 3)), S[:, :, 13], 1e-7, 1e-9)
    M = torch.stack([attn.attention_row(x, hw, i) for i in range(35)], -2)
    close(M, S, 1e-7, 1e-9)
    assert S.mT.allclose(S)  # symmetric, unlike softmax
    with torch.no_grad():
        v = attn.v(x)
        ref = (M @ attn._split(v)).transpose(1, 2).flatten(2)
        if attn_norm:
            ref = ref + attn.dw_conv_tokens(v, hw)
        close(attn(x, hw), attn.proj(ref), 1e-9, 1e-9)
