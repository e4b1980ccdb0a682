"""Newton-Raphson Moore-Penrose inverse (Alg. 2, Eq. 10/16) and its init."""
import pytest
import torch

from mmsoft.models.layers.gaussian_kernel import gaussian_kernel
from mmsoft.models.layers.pinv import (newton_inverse, nr_init_alpha,
                                       pinv_convergence)


def kernel_matrix(*batch, m=49, d=32, scale=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, m, d, generator=g, dtype=torch.float64) * scale
    x = x / d**0.25
    return gaussian_kernel(x, x).to(dtype)


def test_matches_torch_pinv():
    A = kernel_matrix(2, 3)
    Y = newton_inverse(A, 20, 'soft_norm')
    ref = torch.linalg.pinv(A.double())
    rel = (Y.double() - ref).norm() / ref.norm()
    assert rel < 1e-4


def test_float64_close_to_pinv():
    A = kernel_matrix(4, dtype=torch.float64)
    Y = newton_inverse(A, 30, 'soft_norm')
    assert Y.dtype == torch.float64
    torch.testing.assert_close(Y, torch.linalg.pinv(A), rtol=1e-8, atol=1e-8)


def test_soft_init_inverts_shifted_matrix():
    """The NeurIPS variant iterates on A + 0.01 I (official soft_* weights)."""
    A = kernel_matrix(3, dtype=torch.float64)
    Y = newton_inverse(A, 40, 'soft')
    shifted = A + 0.01 * torch.eye(A.shape[-1], dtype=A.dtype)
    torch.testing.assert_close(Y, torch.linalg.inv(shifted), rtol=1e-6,
                               atol=1e-6)


def test_convergence_metric_decreases():
    """||A A_k A - A||_2 / ||A||_2 decreases towards 0 (Prop. 2, Fig. 4)."""
    A = kernel_matrix(2, 2)
    curve = torch.stack(pinv_convergence(A, 20))  # (21, 2, 2)
    diffs = curve[1:] - curve[:-1]
    assert (diffs <= 1e-12).all()
    assert curve[0].min() > 0.5
    assert curve[-1].max() < 1e-6


def test_norm_alpha_follows_official_halving_rule():
    """alpha = 2 * 0.5^n / ||A||_1^2 with n the first passing the test."""
    A = kernel_matrix(5, dtype=torch.float64, scale=0.3)  # dense, large norm
    alpha = nr_init_alpha(A, 'soft_norm')
    eye = torch.eye(A.shape[-1], dtype=A.dtype)
    for b in range(A.shape[0]):
        a = 2 / A[b].sum(-1).max()**2
        n = 0
        while (eye - a * A[b] @ A[b]).abs().sum(-2).max() > 1.01 and n < 10:
            a, n = a * 0.5, n + 1
        torch.testing.assert_close(alpha[b], a)


def test_soft_alpha():
    A = kernel_matrix(3, dtype=torch.float64)
    expect = 0.9 * 2 / A.sum(-1).amax(-1)**2
    torch.testing.assert_close(nr_init_alpha(A, 'soft'), expect)


def test_alpha_is_chosen_per_matrix():
    """A matrix's inverse must not depend on the other matrices of a batch."""
    small = kernel_matrix(1, m=16, seed=1)
    big = kernel_matrix(1, m=16, scale=0.05, seed=2)  # near all-ones: large norm
    alone = newton_inverse(small, 20)
    together = newton_inverse(torch.cat([small, big]), 20)[:1]
    torch.testing.assert_close(alone, together, rtol=0, atol=0)


@pytest.mark.parametrize('init', ['soft_norm', 'soft'])
def test_gradcheck_eq16(init):
    """The closed-form backward (Eq. 16) is the gradient of the inverse."""
    A = kernel_matrix(2, m=6, d=4, dtype=torch.float64, seed=3)
    A.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda a: newton_inverse(a, 60, init),
                                    (A, ), eps=1e-6, atol=1e-5)


def test_no_autograd_graph_through_iterations():
    A = kernel_matrix(1, 2).requires_grad_(True)
    Y = newton_inverse(A, 20)
    assert Y.grad_fn is not None
    assert type(Y.grad_fn).__name__.startswith('NewtonInverse')
    # the graph has a single node above A (no per-iteration nodes)
    assert all(fn is None or fn[0] is None or 'AccumulateGrad' in
               type(fn[0]).__name__ for fn in Y.grad_fn.next_functions)


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_runs_in_fp32_under_autocast(dtype):
    A = kernel_matrix(2, 2)
    with torch.autocast('cpu', dtype=dtype):
        Y = newton_inverse(A.to(dtype), 20)
    assert Y.dtype == torch.float32
    assert torch.isfinite(Y).all()


def test_bad_input_errors():
    with pytest.raises(ValueError, match='m, m'):
        newton_inverse(torch.ones(3, 4))
    with pytest.raises(ValueError, match='soft_norm'):
        newton_inverse(torch.eye(3), init='svd')


@pytest.mark.parametrize('init', ['soft_norm', 'soft'])
@pytest.mark.parametrize('m', [49, 200])
def test_spectral_equals_iterative(init, m):
    """Same T iterations evaluated on eigenvalues (float64 and float32)."""
    A64 = kernel_matrix(3, m=m, dtype=torch.float64, seed=4)
    it = newton_inverse(A64, 20, init, method='iterative')
    sp = newton_inverse(A64, 20, init, method='spectral')
    assert ((sp - it).norm() / it.norm()) < 1e-9
    A32 = A64.float()
    sp32 = newton_inverse(A32, 20, init, method='spectral')
    it32 = newton_inverse(A32, 20, init, method='iterative')
    assert ((sp32.double() - it).norm() / it.norm()) < 1e-4
    assert ((it32.double() - it).norm() / it.norm()) < 1e-4


def test_spectral_gradcheck_and_batch_independence():
    # eigh reads one triangle: check along symmetric directions, which is
    # where the Gram matrix A lives
    A = kernel_matrix(2, m=6, d=4, dtype=torch.float64, seed=5)
    A.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a: newton_inverse((a + a.transpose(-1, -2)) / 2, 60,
                                 method='spectral'), (A, ),
        eps=1e-6, atol=1e-5)
    B = kernel_matrix(3, m=150)
    alone = newton_inverse(B[:1], 20, method='spectral')
    together = newton_inverse(B, 20, method='spectral')[:1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-6)


def test_auto_method_choice():
    from mmsoft.models.layers.pinv import SPECTRAL_MIN_M, resolve_method
    small = torch.eye(8)
    big = torch.eye(SPECTRAL_MIN_M)
    assert resolve_method('auto', small) == 'iterative'
    assert resolve_method('auto', big) == 'spectral'
    assert resolve_method('iterative', big) == 'iterative'
    with pytest.raises(ValueError, match='spectral'):
        resolve_method('svd', big)


def test_soft_norm_global_matches_official_batch_rule():
    """Opt-in official rule: one alpha for the stack, all must pass."""
    A = torch.cat([kernel_matrix(1, m=16, dtype=torch.float64, seed=1),
                   kernel_matrix(1, m=16, scale=0.05, dtype=torch.float64,
                                 seed=2)])
    alpha = nr_init_alpha(A, 'soft_norm_global')
    assert alpha[0] == alpha[1]
    eye = torch.eye(16, dtype=A.dtype)
    a = 2 / A.sum(-1).max()**2
    n = 0
    while max((eye - a * M @ M).abs().sum(-2).max() for M in A) > 1.01 \
            and n < 10:
        a, n = a * 0.5, n + 1
    torch.testing.assert_close(alpha[0], a)
    # differs from the per-matrix default, which does not couple samples
    assert not torch.equal(nr_init_alpha(A, 'soft_norm'), alpha)


def _alpha_by_explicit_residual(A, init):
    """The official rule with the m x m residual I - alpha A A formed."""
    norm1 = A.sum(-1).amax(-1)
    if init == 'soft_norm_global':
        norm1 = norm1.amax().expand_as(norm1)
    alphas = (2 / norm1.square())[..., None] * 0.5**torch.arange(
        11, dtype=A.dtype)
    eye = torch.eye(A.shape[-1], dtype=A.dtype)
    AA = A @ A
    res = torch.stack([(eye - alphas[..., k, None, None] * AA).abs().sum(
        -2).amax(-1) for k in range(11)], -1)
    if init == 'soft_norm_global':
        res = res.reshape(-1, 11).amax(0).expand_as(res)
    passed = res <= 1.01
    passed[..., -1] = True
    return alphas.gather(-1, passed.byte().argmax(-1, keepdim=True))[..., 0]


@pytest.mark.parametrize('init', ['soft_norm', 'soft_norm_global'])
def test_alpha_residual_test_without_forming_AA(init):
    """The O(m^2) residual (A >= 0, symmetric) picks the official alpha."""
    A = torch.cat([kernel_matrix(3, m=m, scale=s, seed=k,
                                 dtype=torch.float64)[:, :40, :40]
                   for k, (m, s) in enumerate([(40, 0.1), (60, 0.5),
                                               (49, 1.0), (80, 2.0)])])
    alpha = nr_init_alpha(A, init)
    ref = _alpha_by_explicit_residual(A, init)
    torch.testing.assert_close(alpha, ref, rtol=0, atol=0)
    halvings = torch.log2(2 / A.sum(-1).amax(-1).square() / alpha).round()
    if init == 'soft_norm':  # the test set exercises several halvings
        assert len(halvings.unique()) >= 3, halvings


@pytest.mark.parametrize('method', ['iterative', 'spectral'])
@pytest.mark.parametrize('init', ['soft_norm', 'soft'])
def test_apply_equals_inverse_times_w(method, init):
    """newton_inverse_apply(A, W) == newton_inverse(A) @ W, values and
    gradients (float64 tight, float32 within 1e-5 relative)."""
    from mmsoft.models.layers.pinv import newton_inverse_apply
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        A = kernel_matrix(2, 3, m=150, seed=7, dtype=dtype)
        W = torch.randn(2, 3, 150, 16, dtype=dtype)
        G = torch.randn(2, 3, 150, 16, dtype=dtype)
        outs = []
        for fn in (lambda a, w: newton_inverse(a, 20, init, method) @ w,
                   lambda a, w: newton_inverse_apply(a, w, 20, init,
                                                     method)):
            a = A.clone().requires_grad_()
            w = W.clone().requires_grad_()
            z = fn(a, w)
            outs.append((z, *torch.autograd.grad((z * G).sum(), (a, w))))
        for ref, got in zip(*outs):
            assert got.dtype == dtype
            rel = (got - ref).abs().max() / ref.abs().max()
            assert rel < tol, (dtype, rel)


@pytest.mark.parametrize('method', ['iterative', 'spectral'])
def test_apply_gradcheck_and_batch_independence(method):
    from mmsoft.models.layers.pinv import newton_inverse_apply
    A = kernel_matrix(2, m=6, d=4, dtype=torch.float64, seed=8)
    W = torch.randn(2, 6, 3, dtype=torch.float64)
    A.requires_grad_(True)
    W.requires_grad_(True)
    # 60 iterations: converged, where Eq. (16) is the exact derivative
    assert torch.autograd.gradcheck(
        lambda a, w: newton_inverse_apply((a + a.mT) / 2, w, 60,
                                          method=method), (A, W),
        eps=1e-6, atol=1e-5)
    B = kernel_matrix(3, m=150, seed=9)
    V = torch.randn(3, 150, 8)
    B[1:] = B[1:] ** 0.1  # very different co-samples
    alone = newton_inverse_apply(B[:1], V[:1], 20, method=method)
    together = newton_inverse_apply(B, V, 20, method=method)[:1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-6)


def test_apply_fp32_under_autocast_and_errors():
    from mmsoft.models.layers.pinv import newton_inverse_apply
    A = kernel_matrix(2, m=130)
    W = torch.randn(2, 130, 8)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        Z = newton_inverse_apply(A.bfloat16(), W.bfloat16(), 20)
    assert Z.dtype == torch.float32 and torch.isfinite(Z).all()
    with pytest.raises(ValueError, match=r'W of shape \(2, 129, 8\)'):
        newton_inverse_apply(A, torch.randn(2, 129, 8))


def test_sample_shared_alpha():
    """'soft_norm_sample': the official rule within a sample (one alpha for
    its heads), independent of the other samples of the batch."""
    A = torch.cat([kernel_matrix(1, 4, m=40, scale=s, seed=k,
                                 dtype=torch.float64)
                   for k, s in enumerate([0.1, 0.5, 2.0])])  # (3, 4, m, m)
    a = nr_init_alpha(A, 'soft_norm_sample')
    assert (a == a[:, :1]).all()  # shared by the heads of a sample
    for b in range(3):
        torch.testing.assert_close(
            a[b], nr_init_alpha(A[b:b + 1], 'soft_norm_global')[0],
            rtol=0, atol=0)
        torch.testing.assert_close(
            a[b:b + 1], nr_init_alpha(A[b:b + 1], 'soft_norm_sample'),
            rtol=0, atol=0)
    # it differs from the per-matrix choice (the heads' alphas differ)
    assert not torch.equal(a, nr_init_alpha(A, 'soft_norm'))
