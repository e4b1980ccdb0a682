"""Newton-Raphson Moore-Penrose inverse (Alg. 2, Eq. 10/16) and its init."""
import sys

import pytest
import torch
from conftest import smooth_kernel

from mmsoft.models.layers import gaussian_kernel
from mmsoft.models.layers.nr_config import NRConfig
from mmsoft.models.layers.nr_iteration import nr_init_alpha, pinv_convergence


def newton_inverse(A, *args, stats=None, **kwargs):
    """``NRConfig(*args, **kwargs).inverse(A, stats)``."""
    return NRConfig(*args, **kwargs).inverse(A, stats)


def newton_inverse_apply(A, W, *args, stats=None, **kwargs):
    """``NRConfig(*args, **kwargs).apply(A, W, stats)``."""
    return NRConfig(*args, **kwargs).apply(A, W, stats)


def kernel_matrix(*batch, m=49, d=32, scale=1.0, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, m, d, generator=g, dtype=torch.float64) * scale
    x = x / d**0.25
    return gaussian_kernel(x, x).to(dtype)


def test_matches_torch_pinv():
    A = kernel_matrix(2, 3)
    Y = newton_inverse(A, 20, 'soft_norm_per_matrix')
    ref = torch.linalg.pinv(A.double())
    rel = (Y.double() - ref).norm() / ref.norm()
    assert rel < 1e-4


def test_float64_close_to_pinv():
    A = kernel_matrix(4, dtype=torch.float64)
    Y = newton_inverse(A, 30, 'soft_norm_per_matrix')
    assert Y.dtype == torch.float64
    torch.testing.assert_close(Y, torch.linalg.pinv(A), rtol=1e-8, atol=1e-8)


def test_soft_init_inverts_shifted_matrix():
    """The NeurIPS variant iterates on A + 0.01 I (official soft_* weights)."""
    A = kernel_matrix(3, dtype=torch.float64)
    Y = newton_inverse(A, 40, 'soft')
    shifted = A + 0.01 * torch.eye(A.shape[-1], dtype=A.dtype)
    torch.testing.assert_close(
        Y, torch.linalg.inv(shifted), rtol=1e-6, atol=1e-6)


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
    alpha = nr_init_alpha(A, 'soft_norm_per_matrix')
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
    big = kernel_matrix(
        1, m=16, scale=0.05, seed=2)  # near all-ones: large norm
    alone = newton_inverse(small, 20)
    together = newton_inverse(torch.cat([small, big]), 20)[:1]
    torch.testing.assert_close(alone, together, rtol=0, atol=0)


@pytest.mark.parametrize('init', ['soft_norm_per_matrix', 'soft'])
def test_gradcheck_eq16(init):
    """The closed-form backward (Eq. 16) is the gradient of the inverse."""
    A = kernel_matrix(2, m=6, d=4, dtype=torch.float64, seed=3)
    A.requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda a: newton_inverse(a, 60, init), (A, ), eps=1e-6, atol=1e-5)


def test_no_autograd_graph_through_iterations():
    A = kernel_matrix(1, 2).requires_grad_(True)
    Y = newton_inverse(A, 20, backward='eq16')
    assert Y.grad_fn is not None
    assert type(Y.grad_fn).__name__.startswith('NewtonInverse')
    # the graph has a single node above A (no per-iteration nodes)
    assert all(
        fn is None or fn[0] is None or 'AccumulateGrad' in type(fn[0]).__name__
        for fn in Y.grad_fn.next_functions)


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
    with pytest.raises(ValueError, match='soft_norm_per_matrix'):
        newton_inverse(torch.eye(3), init='svd')


@pytest.mark.parametrize('init', ['soft_norm_per_matrix', 'soft'])
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
        lambda a: newton_inverse(
            (a + a.transpose(-1, -2)) / 2, 60, method='spectral'), (A, ),
        eps=1e-6,
        atol=1e-5)
    B = kernel_matrix(3, m=150)
    alone = newton_inverse(B[:1], 20, method='spectral')
    together = newton_inverse(B, 20, method='spectral')[:1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-6)


def test_auto_method_choice():
    from mmsoft.models.layers.nr_autograd import SPECTRAL_MIN_M, resolve_method
    small = torch.eye(8)
    big = torch.eye(SPECTRAL_MIN_M)
    assert resolve_method('auto', small) == 'iterative'
    assert resolve_method('auto', big) == 'spectral'
    assert resolve_method('iterative', big) == 'iterative'
    with pytest.raises(ValueError, match='spectral'):
        resolve_method('svd', big)


def test_per_batch_matches_official_batch_rule():
    """Opt-in official rule: one alpha for the stack, all must pass."""
    A = torch.cat([
        kernel_matrix(1, m=16, dtype=torch.float64, seed=1),
        kernel_matrix(1, m=16, scale=0.05, dtype=torch.float64, seed=2)
    ])
    alpha = nr_init_alpha(A, 'soft_norm_per_batch')
    assert alpha[0] == alpha[1]
    eye = torch.eye(16, dtype=A.dtype)
    a = 2 / A.sum(-1).max()**2
    n = 0
    while max((eye - a * M @ M).abs().sum(-2).max() for M in A) > 1.01 \
            and n < 10:
        a, n = a * 0.5, n + 1
    torch.testing.assert_close(alpha[0], a)
    # differs from the per-matrix default, which does not couple samples
    assert not torch.equal(nr_init_alpha(A, 'soft_norm_per_matrix'), alpha)


def _alpha_by_explicit_residual(A, init):
    """The official rule with the m x m residual I - alpha A A formed."""
    norm1 = A.sum(-1).amax(-1)
    if init == 'soft_norm_per_batch':
        norm1 = norm1.amax().expand_as(norm1)
    alphas = (2 / norm1.square())[..., None] * 0.5**torch.arange(
        11, dtype=A.dtype)
    eye = torch.eye(A.shape[-1], dtype=A.dtype)
    AA = A @ A
    res = torch.stack([
        (eye - alphas[..., k, None, None] * AA).abs().sum(-2).amax(-1)
        for k in range(11)
    ], -1)
    if init == 'soft_norm_per_batch':
        res = res.reshape(-1, 11).amax(0).expand_as(res)
    passed = res <= 1.01
    passed[..., -1] = True
    return alphas.gather(-1, passed.byte().argmax(-1, keepdim=True))[..., 0]


@pytest.mark.parametrize('init',
                         ['soft_norm_per_matrix', 'soft_norm_per_batch'])
def test_alpha_residual_test_without_forming_AA(init):
    """The O(m^2) residual (A >= 0, symmetric) picks the official alpha."""
    A = torch.cat([
        kernel_matrix(3, m=m, scale=s, seed=k,
                      dtype=torch.float64)[:, :40, :40]
        for k, (m, s) in enumerate([(40, 0.1), (60, 0.5), (49, 1.0), (80,
                                                                      2.0)])
    ])
    alpha = nr_init_alpha(A, init)
    ref = _alpha_by_explicit_residual(A, init)
    torch.testing.assert_close(alpha, ref, rtol=0, atol=0)
    halvings = torch.log2(2 / A.sum(-1).amax(-1).square() / alpha).round()
    if init == 'soft_norm_per_matrix':  # the set exercises several halvings
        assert len(halvings.unique()) >= 3, halvings


@pytest.mark.parametrize('method', ['iterative', 'spectral'])
@pytest.mark.parametrize('init', ['soft_norm_per_matrix', 'soft'])
def test_apply_equals_inverse_times_w(method, init):
    """newton_inverse_apply(A, W) == newton_inverse(A) @ W, values and
    gradients (float64 tight, float32 within 1e-5 relative)."""
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        A = kernel_matrix(2, 3, m=150, seed=7, dtype=dtype)
        W = torch.randn(2, 3, 150, 16, dtype=dtype)
        G = torch.randn(2, 3, 150, 16, dtype=dtype)
        outs = []
        for fn in (lambda a, w: newton_inverse(a, 20, init, method) @ w,
                   lambda a, w: newton_inverse_apply(a, w, 20, init, method)):
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
    A = kernel_matrix(2, m=6, d=4, dtype=torch.float64, seed=8)
    W = torch.randn(2, 6, 3, dtype=torch.float64)
    A.requires_grad_(True)
    W.requires_grad_(True)
    # 60 iterations: converged, where Eq. (16) is the exact derivative
    assert torch.autograd.gradcheck(
        lambda a, w: newton_inverse_apply(
            (a + a.mT) / 2, w, 60, method=method), (A, W),
        eps=1e-6,
        atol=1e-5)
    B = kernel_matrix(3, m=150, seed=9)
    V = torch.randn(3, 150, 8)
    B[1:] = B[1:]**0.1  # very different co-samples
    alone = newton_inverse_apply(B[:1], V[:1], 20, method=method)
    together = newton_inverse_apply(B, V, 20, method=method)[:1]
    torch.testing.assert_close(alone, together, rtol=1e-5, atol=1e-6)


def test_apply_fp32_under_autocast_and_errors():
    A = kernel_matrix(2, m=130)
    W = torch.randn(2, 130, 8)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        Z = newton_inverse_apply(A.bfloat16(), W.bfloat16(), 20)
    assert Z.dtype == torch.float32 and torch.isfinite(Z).all()
    with pytest.raises(ValueError, match=r'W of shape \(2, 129, 8\)'):
        newton_inverse_apply(A, torch.randn(2, 129, 8))


def test_per_sample_shared_alpha():
    """'soft_norm_per_sample': the official rule within a sample (one alpha for
    its heads), independent of the other samples of the batch."""
    A = torch.cat([
        kernel_matrix(1, 4, m=40, scale=s, seed=k, dtype=torch.float64)
        for k, s in enumerate([0.1, 0.5, 2.0])
    ])  # (3, 4, m, m)
    a = nr_init_alpha(A, 'soft_norm_per_sample')
    assert (a == a[:, :1]).all()  # shared by the heads of a sample
    for b in range(3):
        torch.testing.assert_close(
            a[b],
            nr_init_alpha(A[b:b + 1], 'soft_norm_per_batch')[0],
            rtol=0,
            atol=0)
        torch.testing.assert_close(
            a[b:b + 1],
            nr_init_alpha(A[b:b + 1], 'soft_norm_per_sample'),
            rtol=0,
            atol=0)
    # it differs from the per-matrix choice (the heads' alphas differ)
    assert not torch.equal(a, nr_init_alpha(A, 'soft_norm_per_matrix'))


# ------------------------------------------------- names of the alpha rules
def test_init_names_before_0_3_are_refused():
    """The old alpha-rule names (renamed in 0.3) were removed with the
    compatibility layers: a ValueError naming the rules to choose."""
    from mmsoft.models.layers.nr_iteration import INIT_MODES, canonical_init
    for mode in INIT_MODES:
        assert canonical_init(mode) == mode
    for old in ('soft_norm_sample', 'soft_norm_global', 'soft_norm',
                'per_sample'):
        with pytest.raises(ValueError, match='soft_norm_per_sample'):
            canonical_init(old)
        with pytest.raises(ValueError, match=repr(old)):
            nr_init_alpha(torch.eye(3), old)


def test_default_init_is_official_rule_per_sample():
    from mmsoft.models.layers.nr_config import default_init
    from mmsoft.models.layers.soft_attention import SOFTAttention
    assert default_init(True) == 'soft_norm_per_sample'
    assert default_init(False) == 'soft'
    assert SOFTAttention(16, 2, 2).nr_init == 'soft_norm_per_sample'
    assert SOFTAttention(16, 2, 2, attn_norm=False).nr_init == 'soft'
    A = kernel_matrix(2, 4, m=30, dtype=torch.float64)
    torch.testing.assert_close(
        newton_inverse(A, 20),
        newton_inverse(A, 20, 'soft_norm_per_sample'),
        rtol=0,
        atol=0)


# ------------------------------------------------------ exact NR gradient
def matrix_with_spectrum(lam, seed=0):
    """Q diag(lam) Q^T with a random orthogonal Q (float64, symmetric)."""
    g = torch.Generator().manual_seed(seed)
    Q, _ = torch.linalg.qr(
        torch.randn(len(lam), len(lam), generator=g, dtype=torch.float64))
    A = (Q * lam) @ Q.T
    return (A + A.T) / 2


def autograd_through_iterations(A, W, G, iters, init, attn_norm=False):
    """Reference: grad_A (and grad_W) by autograd through the explicit
    iterations of Eq. (10), alpha differentiated as the official code does
    (2 0.5^n / ||A||_1^2, the halvings n fixed)."""
    from mmsoft.models.layers.nr_iteration import _SOFT_SHIFT
    a = A.clone().requires_grad_()
    w = W.clone().requires_grad_()
    alpha = nr_init_alpha(a, init)
    Aw = a + _SOFT_SHIFT * torch.eye(a.shape[-1], dtype=a.dtype) \
        if init == 'soft' else a
    V = alpha[..., None, None] * Aw
    for _ in range(iters):
        V = 2 * V - V @ Aw @ V
    if attn_norm:
        d = a.sum(-1, keepdim=True).rsqrt()
        Z = d * (V @ (d * w))
    else:
        Z = V @ w
    return torch.autograd.grad((Z * G).sum(), (a, w))


@pytest.mark.parametrize('init', ['soft_norm_per_sample', 'soft'])
@pytest.mark.parametrize('method', ['spectral', 'iterative', 'lanczos'])
def test_exact_backward_equals_autograd_through_iterations(init, method):
    """Not converged (smooth landmarks, m = 60): Eq. (16) is off, 'exact'
    is the gradient of the 20 iterations (alpha included), also through
    the normalisation D^-1/2 of the apply path ('lanczos' forms the
    inverse itself as 'auto')."""
    from mmsoft.models.layers.soft_attention import bottleneck_apply
    A = smooth_kernel(2, 3)
    W = torch.randn(2, 3, 60, 5, dtype=torch.float64)
    G = torch.randn(2, 3, 60, 5, dtype=torch.float64)
    for attn_norm in (False, True):
        ref = autograd_through_iterations(A, W, G, 20, init, attn_norm)
        got = {}
        for bwd in ('exact', 'eq16'):
            a = A.clone().requires_grad_()
            w = W.clone().requires_grad_()
            if attn_norm:
                z = bottleneck_apply(a, w, True,
                                     NRConfig(20, init, method, bwd))
            else:
                z = newton_inverse_apply(a, w, 20, init, method, bwd)
            got[bwd] = torch.autograd.grad((z * G).sum(), (a, w))
        tol = 1e-7 if method == 'lanczos' else 1e-9  # its stopping rule: 1e-6
        for r, e in zip(ref, got['exact']):
            assert ((e - r).norm() / r.norm()) < tol
        torch.testing.assert_close(got['eq16'][1], ref[1])  # grad_W exact
        if init != 'soft':  # A + 0.01 I is well conditioned: converged
            assert ((got['eq16'][0] - ref[0]).norm() / ref[0].norm()) > 1e-3
        # the full-inverse path
        a = A.clone().requires_grad_()
        y = newton_inverse(a, 20, init, method, 'exact')
        g = torch.autograd.grad(((y @ W) * G).sum(), a)[0]
        if not attn_norm:
            assert ((g - ref[0]).norm() / ref[0].norm()) < 1e-9


def _fixed_alpha(monkeypatch, value):
    import mmsoft.models.layers.nr_autograd as solver
    import mmsoft.models.layers.nr_iteration as pinv
    for module in (pinv, solver):
        monkeypatch.setattr(
            module,
            'nr_init_alpha',
            lambda A, init='': torch.full(A.shape[:-2], value, dtype=A.dtype))


@pytest.mark.parametrize('spectrum', ['distinct', 'repeated', 'near_equal'])
def test_exact_backward_gradcheck(monkeypatch, spectrum):
    """gradcheck (finite differences of the forward itself, alpha a
    function of A as in the official code) with distinct, repeated and
    near-equal eigenvalues, unconverged ones included (10 iterations)."""
    lam = {
        'distinct': [3.0, 1.5, 0.7, 0.2, 0.03, 0.004],
        'repeated': [2.0, 2.0, 0.5, 0.05, 0.05, 0.05],
        'near_equal':
        [2.0, 2.0 + 1e-9, 0.5, 0.05, 0.05 * (1 + 1e-7), 0.05 * (1 - 1e-8)]
    }[spectrum]
    A = matrix_with_spectrum(torch.tensor(lam, dtype=torch.float64))
    W = torch.randn(6, 3, dtype=torch.float64)
    sym = lambda a: (a + a.mT) / 2  # noqa: E731  (eigh reads one triangle)
    for method in ('spectral', 'iterative'):
        assert torch.autograd.gradcheck(
            lambda a, w: newton_inverse_apply(
                sym(a), w, 10, 'soft', method, 'exact'),
            (A.clone().requires_grad_(), W.clone().requires_grad_()),
            eps=1e-6,
            atol=1e-6)
        assert torch.autograd.gradcheck(
            lambda a: newton_inverse(
                sym(a), 10, 'soft_norm_per_sample', method, 'exact'),
            (A.clone().requires_grad_(), ),
            eps=1e-6,
            atol=1e-6)


def test_divided_differences_close_eigenvalues():
    """The Daleckii-Krein kernel for (near-)equal eigenvalues: the
    recurrence form agrees with the quotient where that is accurate, and
    with the derivative f'(l) at l_i = l_j (float64 autograd)."""
    from mmsoft.models.layers.nr_autograd import _divided_differences
    from mmsoft.models.layers.nr_iteration import _scalar_iterate_impl
    from mmsoft.models.layers.nr_iteration import \
        scalar_iterate as _scalar_iterate
    lam = torch.tensor([1e-3, 1e-3 * (1 + 1e-12), 0.3, 0.3, 0.31, 1.7],
                       dtype=torch.float64)
    alpha = torch.tensor(0.3, dtype=torch.float64)
    v = _scalar_iterate(lam, alpha, 20)
    F = _divided_differences(lam, v, alpha, 20)
    lg = lam.clone().requires_grad_()
    fprime = torch.autograd.grad(
        _scalar_iterate_impl(lg, alpha, 20).sum(), lg)[0]
    torch.testing.assert_close(F.diagonal(), fprime, rtol=1e-12, atol=0)
    torch.testing.assert_close(F[0, 1], fprime[0], rtol=1e-9, atol=0)
    torch.testing.assert_close(F[2, 3], fprime[2], rtol=1e-12, atol=0)
    quotient = (v[2] - v[4]) / (lam[2] - lam[4])  # well separated pair
    torch.testing.assert_close(F[2, 4], quotient, rtol=1e-12, atol=0)
    torch.testing.assert_close(F, F.T, rtol=1e-12, atol=0)


def test_exact_backward_float32_close_to_float64():
    A = smooth_kernel(2, 2, m=120)
    W = torch.randn(2, 2, 120, 4, dtype=torch.float64)
    G = torch.randn(2, 2, 120, 4, dtype=torch.float64)
    grads = []
    for dt in (torch.float64, torch.float32):
        a = A.to(dt).requires_grad_()
        z = newton_inverse_apply(
            a, W.to(dt), 20, method='spectral', backward='exact')
        grads.append(torch.autograd.grad((z * G.to(dt)).sum(), a)[0])
    rel = (grads[1].double() - grads[0]).norm() / grads[0].norm()
    assert rel < 1e-3, rel


def test_backward_bad_name():
    with pytest.raises(ValueError, match="'eq16', 'exact'"):
        newton_inverse(torch.eye(4), backward='autograd')


# ------------------------------------------------------- convergence stats
@pytest.mark.parametrize('method', ['spectral', 'iterative', 'lanczos'])
def test_stats_report_convergence(method, monkeypatch):
    """'residual' is the paper's ||A A_T A - A||_2 / ||A||_2 (as
    pinv_convergence) and 'unconverged' grows when the iterations are cut
    short, for every method; the spectral one takes them from its own
    eigenvalues (one eigendecomposition per call, not two)."""
    from mmsoft.models.layers.nr_iteration import nr_residual
    A = smooth_kernel(2, m=60)
    W = torch.randn(2, 60, 3, dtype=torch.float64)
    stats, calls = {}, []

    def of_A(M):  # not Lanczos' T = Q^T A Q, nor its Gram matrices
        frame, callers = sys._getframe(2), []  # through nr_iteration.eigh
        for _ in range(4):  # and nr_iteration.lapack to their caller
            if frame is None:
                break
            callers.append(frame.f_globals['__name__'])
            frame = frame.f_back
        return M.shape == A.shape and not any(
            c.endswith('nr_lanczos') for c in callers)

    for name in ('eigh', 'eigvalsh'):
        fn = getattr(torch.linalg, name)
        monkeypatch.setattr(
            torch.linalg,
            name,
            lambda M, *a, fn=fn, **k:
            (of_A(M) and calls.append(1)) or fn(M, *a, **k))
    newton_inverse_apply(A, W, 20, method=method, stats=stats)
    assert len(calls) == 1  # the diagnostics' or the spectral method's
    monkeypatch.undo()
    ref = pinv_convergence(A, 20)[-1]
    torch.testing.assert_close(stats['residual'], ref, rtol=1e-6, atol=1e-15)
    for k, v in nr_residual(A, 20).items():
        torch.testing.assert_close(stats[k], v)
    few = nr_residual(A, 3)
    assert (few['residual'] > stats['residual']).all()
    assert (few['unconverged'] > stats['unconverged']).all()
    converged = nr_residual(kernel_matrix(2, m=12, dtype=torch.float64), 40)
    assert (converged['unconverged'] == 0).all()


def test_close_pairs_match_the_mask():
    """The binary-search pairs are exactly |l_i - l_j| <= r max(|l_i|,
    |l_j|) over a batch of sorted spectra with clusters, zeros and signs."""
    from mmsoft.models.layers.nr_autograd import _DD_RTOL, _close_pairs
    g = torch.Generator().manual_seed(0)
    lam = torch.cat([
        torch.randn(2, 3, 20, generator=g, dtype=torch.float64) * 1e-6,
        torch.rand(2, 3, 20, generator=g, dtype=torch.float64).exp(),
        torch.full((2, 3, 3), 0.5, dtype=torch.float64),
        torch.zeros(2, 3, 2, dtype=torch.float64)
    ], -1)
    lam = lam.sort(-1).values
    li, lj = lam.unsqueeze(-1), lam.unsqueeze(-2)
    mask = (li - lj).abs() <= _DD_RTOL * torch.maximum(li.abs(), lj.abs())
    got = torch.zeros_like(mask)
    got[_close_pairs(lam)] = True
    assert torch.equal(got, mask)
    assert mask.sum() > mask[0, 0].diagonal().numel() * 6 + 6 * 8


@pytest.mark.parametrize('method', ['spectral', 'iterative'])
def test_inverse_fills_stats(method):
    """NRConfig.inverse(A, stats) fills ``stats`` as NRConfig.apply does
    (``'residual'``, ``'unconverged'``, as nr_residual)."""
    from mmsoft.models.layers.nr_iteration import nr_residual
    A = smooth_kernel(2, m=30)
    stats = {}
    newton_inverse(A, 5, method=method, stats=stats)
    assert sorted(stats) == ['residual', 'unconverged']
    for k, v in nr_residual(A, 5).items():
        torch.testing.assert_close(stats[k], v)


def test_exact_backward_stack_equals_each_matrix(monkeypatch):
    """'exact' on a (b, m, m) stack: the gradient of each matrix as if it
    were alone (m, m), also with repeated eigenvalues (close pairs)."""
    from mmsoft.models.layers.nr_autograd import _DD_RTOL, _close_pairs
    _fixed_alpha(monkeypatch, 0.2)
    A = torch.stack([
        matrix_with_spectrum(torch.tensor(lam, dtype=torch.float64), seed=k)
        for k, lam in enumerate([[2.0, 2.0, 0.5, 0.05, 0.05, 0.01],
                                 [3.0, 1.5, 0.7, 0.2, 0.2, 0.004],
                                 [1.0, 0.9, 0.9, 0.3, 0.03, 0.03]])
    ])
    W = torch.randn(
        3,
        6,
        2,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(1))
    G = torch.randn(
        3,
        6,
        2,
        dtype=torch.float64,
        generator=torch.Generator().manual_seed(2))

    def grad(a, w, g):
        a = a.clone().requires_grad_()
        z = newton_inverse_apply(a, w, 10, 'soft', 'spectral', 'exact')
        return torch.autograd.grad((z * g).sum(), a)[0]

    stacked = grad(A, W, G)
    for b in range(3):
        torch.testing.assert_close(
            stacked[b], grad(A[b], W[b], G[b]), rtol=1e-10, atol=1e-12)
    # the close pairs of a 2-D (b, m) batch of spectra
    lam = torch.linalg.eigvalsh(A)
    li, lj = lam.unsqueeze(-1), lam.unsqueeze(-2)
    mask = (li - lj).abs() <= _DD_RTOL * torch.maximum(li.abs(), lj.abs())
    got = torch.zeros_like(mask)
    got[_close_pairs(lam)] = True
    assert torch.equal(got, mask)


def test_close_pairs_on_the_device_of_lam():
    """The pair indices are built on lam's device, whatever the default
    device (``torch.device`` context / set_default_device): the same
    indices, usable on lam, under a 'meta' default."""
    from mmsoft.models.layers.nr_autograd import _close_pairs
    lam = torch.tensor([[0.01, 0.0101, 0.5, 0.5, 2.0],
                        [0.1, 0.2, 0.2, 0.2, 1.0]],
                       dtype=torch.float64)
    ref = _close_pairs(lam)
    with torch.device('meta'):
        got = _close_pairs(lam)
    assert len(got) == len(ref) == 3
    for g, r in zip(got, ref):
        assert g.device == lam.device
        assert torch.equal(g, r)
    assert got[0].tolist() == [0] * 9 + [1] * 11  # 0.01 ~ 0.0101, 0.2 x 3
