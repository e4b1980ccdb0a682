"""Documented contracts of SOFT's Gaussian kernel (Eq. 5, its autograd
Function and its ONNX export path), the landmark grid's shrinking loop, the
Newton-Raphson alpha search (its default rule and its inclusive tolerance),
the NR Function's refusal of the exact iterative backward, and the q / v
biases of the official SOFT attention."""

import pytest
import torch
from conftest import deadline

from mmsoft.models.layers import amp, landmark_grid
from mmsoft.models.layers.nr_autograd import NewtonInverse
from mmsoft.models.layers.nr_config import NRConfig
from mmsoft.models.layers.nr_iteration import nr_init_alpha
from mmsoft.models.layers.soft_attention import (GaussianKernel, SOFTAttention,
                                                 gaussian_kernel,
                                                 kernel_forward)


def _ref(x, y):
    """exp(-||x_i - y_j||^2 / 2) in float64 (differentiable)."""
    x, y = x.double(), y.double()
    return torch.exp(-((x[..., :, None, :] - y[..., None, :, :])**2).sum(-1) /
                     2)


def _randn(*shape, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).to(dtype)


@pytest.fixture(params=['autograd', 'export'])
def path(request, monkeypatch):
    """The kernel's two paths: the autograd Function, and the plain ops run
    while a model is exported (``amp.is_exporting()``)."""
    if request.param == 'export':
        monkeypatch.setattr(amp, 'is_exporting', lambda: True)
    return request.param


# ------------------------------------------------------------ the kernel
def test_feature_size_mismatch_names_both_sizes(path):
    """x (..., n, d) and y (..., m, d) with different d: a ValueError that
    names both feature sizes, x's first (not n, m or a batch dim)."""
    x, y = _randn(2, 5, 3), _randn(2, 6, 4)
    with pytest.raises(
            ValueError,
            match=r'^gaussian_kernel: feature sizes differ \(3 vs 4\)$'):
        gaussian_kernel(x, y)


@pytest.mark.parametrize('x_dtype, y_dtype', [(torch.float64, torch.float32),
                                              (torch.float32, torch.float64)])
def test_float64_on_either_side_computes_in_float64(path, x_dtype, y_dtype):
    """float32, or float64 if either input is (``compute_dtype(x, y)``): the
    float64 side is not rounded to float32."""
    x = _randn(2, 4, 3, seed=1).to(x_dtype)
    y = _randn(2, 5, 3, seed=2).to(y_dtype)
    K = gaussian_kernel(x, y)
    assert K.dtype == torch.float64
    torch.testing.assert_close(K, _ref(x, y), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize('self_kernel', [False, True])
def test_export_path_is_the_kernel(path, self_kernel):
    """Both paths give Eq. 5, K_ij = exp(-||x_i - y_j||^2 / 2), for the
    cross kernel P = K(x, y) and the self-kernel A = K(y, y)."""
    y = _randn(2, 5, 3, seed=3)
    x = y if self_kernel else _randn(2, 4, 3, seed=4)
    K = gaussian_kernel(x, y)
    assert K.shape == (2, x.shape[-2], 5)
    torch.testing.assert_close(K, _ref(x, y), rtol=1e-12, atol=1e-14)


def test_self_kernel_diagonal_is_exactly_one(path):
    """``gaussian_kernel(y, y)``: the self-kernel's diagonal is exactly 1 on
    both paths (float32 rounding of ||y_i||^2 - 2 y_i.y_i + ||y_i||^2 may
    not cancel to 0)."""
    y = _randn(2, 3, 16, 8, seed=5, dtype=torch.float32) * 3
    A = gaussian_kernel(y, y)
    assert A.dtype == torch.float32
    assert torch.equal(A.diagonal(dim1=-2, dim2=-1), torch.ones(2, 3, 16))
    torch.testing.assert_close(A.double(), _ref(y, y), rtol=0, atol=2e-5)


@pytest.mark.parametrize('self_kernel', [False, True])
@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_half_inputs_are_computed_in_float32(path, dtype, self_kernel):
    """Half-precision tokens: the kernel is computed in float32 from the
    (rounded) inputs, on both paths."""
    y = _randn(1, 2, 6, 4, seed=6, dtype=dtype)
    x = y if self_kernel else _randn(1, 2, 5, 4, seed=7, dtype=dtype)
    K = gaussian_kernel(x, y)
    assert K.dtype == torch.float32
    torch.testing.assert_close(K.double(), _ref(x, y), rtol=0, atol=1e-6)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_half_self_kernel_gradient_is_rounded_once(dtype):
    """Half-precision y, ``gaussian_kernel(y, y)``: the gradient is computed
    in float32 (both uses of y, as x and as y, summed there) and rounded to
    y's dtype once, as for a float32 y rounded afterwards."""
    y = _randn(2, 2, 16, 8, seed=18, dtype=dtype).requires_grad_()
    w = _randn(2, 2, 16, 16, seed=19, dtype=torch.float32)
    (gaussian_kernel(y, y) * w).sum().backward()
    y32 = y.detach().float().requires_grad_()
    (gaussian_kernel(y32, y32) * w).sum().backward()
    assert y.grad.dtype == dtype
    assert torch.equal(y.grad, y32.grad.to(dtype))


def test_kernel_forward_default_is_the_cross_kernel():
    """``kernel_forward(x, y)`` (no self_kernel): K(x, y) of shape (n, m)."""
    x, y = _randn(2, 4, 3, seed=8), _randn(2, 6, 3, seed=9)
    K = kernel_forward(x, y)
    assert K.shape == (2, 4, 6)
    torch.testing.assert_close(K, _ref(x, y), rtol=1e-12, atol=1e-14)


def test_function_default_is_the_cross_kernel():
    """``GaussianKernel.apply(x, y)`` (no self_kernel): K(x, y) and its
    gradients, as torch.autograd.gradcheck checks them in float64."""
    x = _randn(2, 4, 3, seed=10).requires_grad_()
    y = _randn(2, 6, 3, seed=11).requires_grad_()
    K = GaussianKernel.apply(x, y)
    assert K.shape == (2, 4, 6)
    torch.testing.assert_close(K, _ref(x, y), rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(GaussianKernel.apply, (x, y))


def test_gradients_with_large_per_sample_offsets_fp32():
    """The backward works on tokens translated by the mean landmark c *per
    sample and head*: samples with large, opposite offsets (a global mean
    near 0) keep float32 gradients at float32 accuracy, against the float64
    autograd gradient of Eq. 5 on the same (rounded) tokens."""
    u = _randn(4, seed=12)
    u = u / u.norm()
    off = torch.stack([u * 1e4, -u * 1e4])[:, None, :]  # (2, 1, 4)
    x = (off + _randn(2, 5, 4, seed=13)).float()
    y = (off + 0.5 * _randn(2, 3, 4, seed=14)).float()
    w = _randn(2, 5, 3, seed=15)

    def grads(f, x, y):
        x, y = x.clone().requires_grad_(), y.clone().requires_grad_()
        (f(x, y).double() * w).sum().backward()
        return x.grad.double(), y.grad.double()

    got = grads(gaussian_kernel, x, y)
    ref = grads(_ref, x.double(), y.double())
    for g, r in zip(got, ref):
        assert r.abs().max() > 0.1  # the gradients are not ~0
        torch.testing.assert_close(g, r, rtol=0, atol=1e-6)


# ------------------------------------------------------- landmark grid
@pytest.mark.parametrize('hw, want', [((1, 100), (1, 5)), ((100, 1), (5, 1))])
def test_landmark_grid_one_wide_map_shrinks_to_the_cap(hw, want):
    """A 1-wide 1 x 100 map (r = 1) capped at 5 landmarks: the short side
    is clamped to 1 (floor(1 * s) = 0), the long side, floor(100 s) = 22,
    shrinks to the largest size within the cap, 5, and the loop ends."""
    with deadline():
        assert landmark_grid(hw, 1, max_landmarks=5) == want


# -------------------------------------------------- NR alpha search
def test_nr_init_alpha_default_is_the_per_sample_search():
    """``nr_init_alpha(A)``: the default rule is 'soft_norm_per_sample'
    (one alpha per sample, shared by its heads), as NRConfig's default."""
    y = _randn(
        2, 3, 6, 4, seed=16) * torch.tensor([0.3, 1.0, 3.0])[:, None, None]
    A = _ref(y, y)
    alpha = nr_init_alpha(A)
    assert alpha.shape == (2, 3)
    torch.testing.assert_close(alpha, nr_init_alpha(A, 'soft_norm_per_sample'))
    # per sample, not per matrix: the heads of a sample share one alpha
    assert not torch.equal(alpha, nr_init_alpha(A, 'soft_norm_per_matrix'))
    assert torch.equal(alpha, alpha[:, :1].expand(2, 3))


@pytest.mark.parametrize('q, alpha', [(0.005578077527412351, 2.0),
                                      (0.0056, 1.0)])
def test_nr_init_alpha_tolerance_is_inclusive(q, alpha):
    """The search takes the first alpha_n = 2 * 0.5^n / ||A||_1^2 with
    ``max_j sum_i |I - alpha A A|_ij <= 1.01``. A = [[1 - q, q], [q, t - q]],
    t = 1/32 (row sums 1 and t: ||A||_1 = 1): at n = 0 column 2 gives
    1 + 2q + 6qt - 8q^2 - 2t^2, which is 1.01 at q = 0.0055780775...; this
    q's float64 residual is exactly 1.01 (every sum and product inside the
    reductions is exact, so on every platform), equal to the tolerance: it
    passes, alpha_0 = 2. A larger q is over it and takes alpha_1 = 1 (its
    n = 1 residual, ~1.005, passes)."""
    t = 1 / 32
    A = torch.tensor([[1 - q, q], [q, t - q]], dtype=torch.float64)
    assert A.sum(-1).tolist() == [1.0, t]
    assert nr_init_alpha(A, 'soft_norm_per_matrix').item() == alpha


# ------------------------------------------------------------ NR Function
def test_newton_inverse_refuses_the_exact_iterative_backward():
    """``backward='exact'`` with the iterative method is autograd through
    the iterations (``solve``), never the NewtonInverse Function: applied
    directly, the Function refuses it with its message."""
    y = _randn(4, 3, seed=17)
    A = _ref(y, y)
    nr = NRConfig(iters=2, method='iterative', backward='exact')
    with pytest.raises(
            AssertionError, match=r'^exact iterative backward uses autograd$'):
        NewtonInverse.apply(A, None, torch.ones(()), nr)


# ------------------------------------------------------- SOFT attention
def test_soft_attention_has_qkv_biases_by_default():
    """As the official SOFT model (``qkv_bias=True``, also the SOFT
    backbone's default): q and v have biases unless turned off."""
    attn = SOFTAttention(8, 2, 2)
    assert attn.q.bias is not None and attn.v.bias is not None
    off = SOFTAttention(8, 2, 2, qkv_bias=False)
    assert off.q.bias is None and off.v.bias is None
