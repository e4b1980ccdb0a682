"""Issue 13: the Gaussian kernel keeps its unit diagonal for large-norm
tokens (no ||x||^2 + ||y||^2 - 2 x.y cancellation), in fp32 and under
bf16 / fp16 autocast, and SOFT attention stays finite and accurate."""
import importlib

import pytest
import torch

from mmsoft.models.layers import gaussian_kernel, soft_attention

sa_module = importlib.import_module('mmsoft.models.layers.soft_attention')

NORMS = [1e2, 1e3, 3e3, 1e4]


def _tokens(norm, *shape, offset=True, seed=0):
    """Tokens of norm ~``norm``: a common offset + unit spread (offset=True)
    or random directions (offset=False)."""
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    if offset:
        c = torch.randn(d, generator=g, dtype=torch.float64)
        return c / c.norm() * norm + torch.randn(
            *shape, generator=g, dtype=torch.float64)
    x = torch.randn(*shape, generator=g, dtype=torch.float64)
    return x / x.norm(dim=-1, keepdim=True) * norm


def _ref(x, y):
    x, y = x.double(), y.double()
    return torch.exp(-((x[..., :, None, :] - y[..., None, :, :])**2).sum(-1) /
                     2)


@pytest.mark.parametrize('offset', [True, False])
@pytest.mark.parametrize('norm', NORMS)
def test_self_kernel_diagonal_is_one_fp32(norm, offset):
    y = _tokens(norm, 2, 3, 16, 8, offset=offset).float()
    A = gaussian_kernel(y, y)
    assert A.dtype == torch.float32
    torch.testing.assert_close(
        A.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, 16))
    assert torch.isfinite(A).all()
    # off-diagonal entries: the float64 kernel of the same fp32 tokens
    torch.testing.assert_close(A.double(), _ref(y, y), atol=2e-5, rtol=0)


@pytest.mark.parametrize('norm', NORMS)
def test_cross_kernel_large_offset_fp32(norm):
    """P = K(q, landmarks) with tokens sharing a large offset: the
    self-similarity of a token that is also a landmark is 1. The reference
    vector is per sample and head: a sample's kernel does not depend on
    the other samples of its batch."""
    q = _tokens(norm, 3, 2, 64, 8).float()
    lm = q[:, :, ::8]
    P = gaussian_kernel(q, lm)
    torch.testing.assert_close(
        P[:, :, ::8].diagonal(dim1=-2, dim2=-1),
        torch.ones(3, 2, 8),
        atol=1e-5,
        rtol=0)
    torch.testing.assert_close(P.double(), _ref(q, lm), atol=2e-5, rtol=0)
    for b in range(3):
        assert torch.equal(P[b:b + 1], gaussian_kernel(q[b:b + 1],
                                                       lm[b:b + 1]))


@pytest.mark.parametrize('attn_norm', [True, False])
@pytest.mark.parametrize('norm', NORMS)
def test_soft_attention_large_norm_fp32(norm, attn_norm):
    q = _tokens(norm, 2, 2, 64, 8).float()
    lm = q[:, :, ::8] + 0.1
    v = torch.randn(2, 2, 64, 8)
    out = soft_attention(q, lm, v, attn_norm)  # 20 iterations
    assert torch.isfinite(out).all()
    ref = soft_attention(q.double(), lm.double(), v.double(), attn_norm)
    torch.testing.assert_close(out.double(), ref, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
@pytest.mark.parametrize('norm', NORMS)
def test_kernel_and_attention_under_autocast(norm, dtype):
    """Half-precision inputs under CPU autocast: the kernel is computed in
    fp32 from the (rounded) inputs; diagonal 1, outputs finite."""
    q = _tokens(norm, 1, 2, 64, 8).to(dtype)
    lm = q[:, :, ::8]
    v = torch.randn(1, 2, 64, 8).to(dtype)
    with torch.autocast('cpu', dtype=dtype):
        A = gaussian_kernel(lm, lm)
        P = gaussian_kernel(q, lm)
        out = soft_attention(q, lm, v, True)
    assert A.dtype == P.dtype == torch.float32
    torch.testing.assert_close(
        A.diagonal(dim1=-2, dim2=-1), torch.ones(1, 2, 8))
    torch.testing.assert_close(P.double(), _ref(q, lm), atol=2e-5, rtol=0)
    assert out.dtype == dtype and torch.isfinite(out).all()


def test_gradcheck_with_offset_and_broadcast():
    """The analytic backward of the translated kernel (float64)."""
    g = torch.Generator().manual_seed(1)
    off = 50 * torch.randn(4, generator=g, dtype=torch.float64)
    x = (off + torch.randn(2, 9, 4, generator=g,
                           dtype=torch.float64)).requires_grad_()
    y = (off + torch.randn(2, 5, 4, generator=g,
                           dtype=torch.float64)).requires_grad_()
    y1 = (
        off +
        torch.randn(5, 4, generator=g, dtype=torch.float64)).requires_grad_()
    scale = 0.3  # keep the kernel values away from 0
    f = lambda a, b: gaussian_kernel(scale * a, scale * b)  # noqa: E731
    assert torch.autograd.gradcheck(f, (x, y))
    assert torch.autograd.gradcheck(f, (x, y1))  # y broadcast over batch
    assert torch.autograd.gradcheck(lambda a: gaussian_kernel(a, a), (y, ))


@pytest.mark.parametrize('needs', [(True, False), (False, True)])
def test_gradient_of_one_side_only(needs):
    """Only the operand that requires grad gets one (a frozen x or frozen
    landmarks y), equal to autograd through the plain formula."""
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(2, 5, 4, generator=g, dtype=torch.float64)
    y0 = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    x, y = x0.clone().requires_grad_(needs[0]), \
        y0.clone().requires_grad_(needs[1])
    w = torch.randn(2, 5, 3, generator=g, dtype=torch.float64)
    (gaussian_kernel(x, y) * w).sum().backward()
    xr, yr = x0.clone().requires_grad_(needs[0]), \
        y0.clone().requires_grad_(needs[1])
    ref = torch.exp(-0.5 *
                    ((xr[..., :, None, :] - yr[..., None, :, :])**2).sum(-1))
    (ref * w).sum().backward()
    for got, want, need in [(x.grad, xr.grad, needs[0]),
                            (y.grad, yr.grad, needs[1])]:
        if need:
            torch.testing.assert_close(got, want)
        else:
            assert got is None


@pytest.mark.parametrize('spread', [0.05, 1.0, 4.0])
@pytest.mark.parametrize('norm', [0.0, 1e3])
def test_kernel_product_without_the_kernel(norm, spread):
    """K w by the fused softmax attention is as accurate as the formed
    fp32 kernel times w, against the float64 kernel (tokens nearly equal,
    unit spread, and far apart where most entries underflow); a sample's
    rows do not depend on the other samples."""
    g = torch.Generator().manual_seed(5)
    off = norm * torch.ones(8, dtype=torch.float64) / 8**0.5
    x = off + spread * torch.randn(
        2, 3, 300, 8, generator=g, dtype=torch.float64)
    y = x[:, :, ::10] + 0.01 * torch.randn(
        2, 3, 30, 8, generator=g, dtype=torch.float64)
    w = torch.randn(2, 3, 30, 5, generator=g, dtype=torch.float64)
    c = y.float().mean(-2, keepdim=True)
    xc, yc = x.float() - c, y.float() - c
    got = sa_module.kernel_product(xc, yc, w.float())
    want = _ref(x.float(), y.float()) @ w
    formed = gaussian_kernel(x.float(), y.float()).double() @ w
    assert got.shape == want.shape and got.dtype == torch.float32
    bound = 2 * (formed - want).abs().max() + 1e-6 * want.abs().max()
    assert (got.double() - want).abs().max() <= bound
    assert torch.equal(got[1:],
                       sa_module.kernel_product(xc[1:], yc[1:], w[1:].float()))


@pytest.mark.parametrize('attn_norm', [True, False])
def test_fused_products_equal_the_formed_kernel(monkeypatch, attn_norm):
    """Without a gradient and above FUSED_MIN_ENTRIES, P is never formed
    (no (n, m) buffer: gaussian_kernel is called for A only); the output
    equals the formed path's, in fp32 and under bf16 autocast."""
    q = _tokens(1e2, 2, 2, 64, 8).float() * 0.3
    lm = q[:, :, ::8] + 0.1
    v = torch.randn(2, 2, 64, 8)
    with torch.no_grad():
        formed = soft_attention(q, lm, v, attn_norm)
        monkeypatch.setattr(sa_module, 'FUSED_MIN_ENTRIES', 64 * 8)
        shapes = []
        kernel = sa_module.gaussian_kernel
        monkeypatch.setattr(
            sa_module, 'gaussian_kernel',
            lambda a, b: shapes.append(tuple(a.shape)) or kernel(a, b))
        fused = soft_attention(q, lm, v, attn_norm)
        with torch.autocast('cpu', dtype=torch.bfloat16):
            half = soft_attention(q, lm, v.bfloat16(), attn_norm)
    assert shapes == [(2, 2, 8, 8)] * 2  # A, twice: no (64, 8) kernel P
    torch.testing.assert_close(fused, formed, atol=2e-6, rtol=1e-5)
    assert half.dtype == torch.bfloat16
    torch.testing.assert_close(half.float(), formed, atol=2e-2, rtol=2e-2)
