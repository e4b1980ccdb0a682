"""Contracts of the bottleneck grid, SOFT attention and the NR backward:
zero padding of small maps, the IJCV defaults, the
float32 computation, the NR stats and the transposes of Eq. (16)."""
import pytest
import torch

from mmsoft.models.layers import (BottleneckSampler, NRConfig, gaussian_kernel,
                                  reduce_map, soft_attention)
from mmsoft.models.layers.nr_iteration import nr_residual
from mmsoft.models.layers.soft_attention import bottleneck_apply


def zero_padded_cells(x, r):
    """The r x r cells with stride r anchored at the top-left corner, the
    map zero-padded at the bottom / right up to at least r x r, averaged."""
    N, C, H, W = x.shape
    Hp, Wp = max(H, r), max(W, r)
    xp = x.new_zeros(N, C, Hp, Wp)
    xp[..., :H, :W] = x
    gh, gw = Hp // r, Wp // r
    cells = xp[..., :gh * r, :gw * r].reshape(N, C, gh, r, gw, r)
    return cells.mean((3, 5))


@pytest.mark.parametrize('hw', [(1, 4), (4, 1), (1, 3), (3, 1), (1, 1)])
def test_reduce_map_small_side_is_zero_padded_bottom_right(hw):
    """A map with a side below r is zero-padded to r at the bottom / right
    (cells stay anchored at the top-left token, as the official stride-r
    conv's): the grid is ``max(1, H // r) x max(1, W // r)``
    (landmark_grid), each cell the mean of its r x r zero-padded window."""
    r = 2
    x = torch.arange(1., 1 + hw[0] * hw[1]).reshape(1, 1, *hw)
    out = reduce_map(x, r)
    assert tuple(out.shape[-2:]) == (max(1, hw[0] // r), max(1, hw[1] // r))
    torch.testing.assert_close(out, zero_padded_cells(x, r))


def test_reduce_map_small_side_conv_sees_unshifted_map():
    """With ``conv`` (an r x r stride-r conv) a map with a side below r is
    the conv of the map zero-padded at the bottom / right only."""
    r = 2
    conv = torch.nn.Conv2d(1, 1, r, r, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([[[[1., 2.], [3., 4.]]]]))
    for hw in ((1, 4), (4, 1)):
        x = torch.arange(1., 5.).reshape(1, 1, *hw)
        pads = (0, r - min(hw[1], r), 0, r - min(hw[0], r))
        padded = torch.nn.functional.pad(x, pads)
        torch.testing.assert_close(reduce_map(x, r, conv=conv), conv(padded))


def test_sampler_map_error_names_the_map():
    """n tokens that are not H x W: ``'<n> tokens do not form a HxW map'``
    with the given H and W."""
    s = BottleneckSampler(2, 2, 'avgpool')
    with pytest.raises(ValueError, match=r'^16 tokens do not form a 3x5 map$'):
        s(torch.zeros(1, 1, 16, 2), (3, 5))


def test_random_sampler_in_eval_is_evenly_spaced_first_to_last():
    """``'random'`` in eval: m tokens evenly spaced over all n, from the
    first token to the last (gaps (n-1)/(m-1), rounded)."""
    s = BottleneckSampler(1, 2, 'random').eval()
    n = 16  # a 4 x 4 map, r = 2: m = 4
    q = torch.arange(float(n)).reshape(1, 1, n, 1)  # token i holds i
    picked = s(q, (4, 4)).flatten().tolist()
    assert picked == [0., 5., 10., 15.]


def _kernel(m=5, batch=(1, 2), seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lm = torch.randn(*batch, m, 4, generator=g, dtype=dtype) * 0.7
    return gaussian_kernel(lm, lm)


def _ijcv(A, W, nr):
    """D^-1/2 A_T D^-1/2 W (Eq. 25), D = diag(A 1)."""
    d = A.sum(-1, keepdim=True).rsqrt()
    return d * (nr.inverse(A) @ (d * W))


@pytest.mark.parametrize('nr', [None, dict(iters=3)])
def test_bottleneck_apply_defaults_are_ijcv(nr):
    """``attn_norm`` defaults to True (IJCV Eq. 25, D^-1/2 A^+ D^-1/2) and
    an ``nr`` without ``init`` takes the IJCV rule
    ``'soft_norm_per_sample'`` (default_init(True))."""
    A = _kernel()
    W = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    iters = 20 if nr is None else nr['iters']
    want = _ijcv(A, W, NRConfig(iters, 'soft_norm_per_sample'))
    torch.testing.assert_close(bottleneck_apply(A, W, nr=nr), want)
    # the NeurIPS model and the NeurIPS alpha differ from it
    assert not torch.allclose(
        bottleneck_apply(A, W, False, nr), want, rtol=1e-3)
    assert not torch.allclose(
        _ijcv(A, W, NRConfig(iters, 'soft')), want, rtol=1e-3)


@pytest.mark.parametrize('attn_norm', [True, False])
def test_bottleneck_apply_fills_nr_stats(attn_norm):
    """A ``nr_stats`` dict is filled with the NR convergence of A
    (``'residual'``, ``'unconverged'`` per matrix, as nr_residual) for
    both variants."""
    A = _kernel()
    W = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    init = 'soft_norm_per_sample' if attn_norm else 'soft'
    nr = NRConfig(iters=4, init=init)
    stats = {}
    bottleneck_apply(A, W, attn_norm, nr, stats)
    want = nr_residual(A, 4, nr.init)
    assert set(stats) == {'residual', 'unconverged'}
    for key in want:
        torch.testing.assert_close(stats[key], want[key])


@pytest.mark.parametrize('half', [torch.float16, torch.bfloat16])
def test_bottleneck_apply_half_inputs_compute_in_float32(half):
    """Half-precision A, W: D, A^+ and the products are float32 — the
    result is float32 and equals the float32 computation on the same
    values (no half-precision rounding of D = diag(A 1))."""
    A = _kernel(dtype=torch.float32).to(half)
    W = torch.randn(1, 2, 5, 3).to(half)
    out = bottleneck_apply(A, W)
    assert out.dtype == torch.float32
    torch.testing.assert_close(
        out, bottleneck_apply(A.float(), W.float()), rtol=1e-6, atol=1e-6)


def test_bottleneck_apply_takes_w_in_the_dtype_of_a():
    """The computation dtype is that of A (float32 unless A is float64,
    as NRConfig.apply): a float64 W with a float32 A gives exactly the
    result of W cast to float32 first."""
    A = _kernel(dtype=torch.float32)
    W = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    out = bottleneck_apply(A, W)
    assert out.dtype == torch.float32
    torch.testing.assert_close(
        out, bottleneck_apply(A, W.float()), rtol=0, atol=0)


def test_soft_attention_default_is_ijcv():
    """``soft_attention`` defaults to attn_norm=True: out = P (A^+_n (P^T
    V)) with A^+_n = D^-1/2 A^+ D^-1/2 and the per-sample alpha."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 16, 4, generator=g, dtype=torch.float64) * 0.6
    lm = q[:, :, ::4]
    v = torch.randn(1, 2, 16, 4, generator=g, dtype=torch.float64)
    P, A = gaussian_kernel(q, lm), gaussian_kernel(lm, lm)
    nr = NRConfig(3)
    want = P @ _ijcv(A, P.transpose(-1, -2) @ v, nr)
    torch.testing.assert_close(soft_attention(q, lm, v, nr=nr), want)
    assert not torch.allclose(
        soft_attention(q, lm, v, False, nr), want, rtol=1e-3)


@pytest.mark.parametrize('batch', [(), (1, )])
@pytest.mark.parametrize('inverse', [True, False])
def test_eq16_backward_uses_transposes(batch, inverse):
    """``'eq16'``: grad_A = -Y^T grad_Y Y^T (Eq. 16), for W: grad_W = Y^T
    grad_Z, grad_A = -grad_W Z^T — the gradient of A^{-1} (W), which the
    NR iterate equals here; a non-symmetric A tells Y^T from Y."""
    g = torch.Generator().manual_seed(0)
    noise = torch.rand(4, 4, generator=g, dtype=torch.float64)
    A0 = torch.eye(4, dtype=torch.float64) + 0.3 * noise
    A0 = A0.expand(*batch, 4, 4).clone()
    W0 = torch.randn(*batch, 4, 3, generator=g, dtype=torch.float64)
    nr = NRConfig(30, method='iterative', backward='eq16')
    Y = nr.inverse(A0)
    torch.testing.assert_close(Y, torch.linalg.inv(A0))
    assert not torch.allclose(Y, Y.mT)
    A = A0.clone().requires_grad_()
    Ar = A0.clone().requires_grad_()
    if inverse:
        out, ref = nr.inverse(A), torch.linalg.inv(Ar)
        grads, ref_grads = (A, ), (Ar, )
    else:
        W, Wr = W0.clone().requires_grad_(), W0.clone().requires_grad_()
        out, ref = nr.apply(A, W), torch.linalg.inv(Ar) @ Wr
        grads, ref_grads = (A, W), (Ar, Wr)
    gout = torch.randn(out.shape, generator=g, dtype=torch.float64)
    got = torch.autograd.grad(out, grads, gout)
    want = torch.autograd.grad(ref, ref_grads, gout)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
