"""The Chebyshev evaluation of the official NR function
(``mmsoft/models/layers/nr_chebyshev.py``): its interval, degree, guard,
batch independence, the default dispatch and gradient per variant.

Its values and exact gradient against autograd through the official
iterations: ``test_pinv.py::test_exact_backward_equals_autograd_through_
iterations`` and ``test_nr_faithful.py::test_backbone_exact_gradient``
(both parametrised with ``'chebyshev'``)."""
import importlib

import pytest
import torch
from conftest import smooth_kernel

from mmsoft.models.layers import NRConfig, SOFTAttention, gaussian_kernel
from mmsoft.models.layers.nr_iteration import newton_iterate, nr_init_alpha

CH = importlib.import_module('mmsoft.models.layers.nr_chebyshev')
SOLVER = importlib.import_module('mmsoft.models.layers.nr_autograd')


def landmarks_kernel(*batch, m=200, d=16, seed=0, dtype=torch.float32):
    """A SOFT-like bottleneck kernel, faster-varying than test_pinv's."""
    return smooth_kernel(
        *batch, m=m, d=d, seed=seed, dtype=dtype, freq=6, stretch=8)


def official(A, W, iters=20):
    """The official 20 steps in float64 (per-sample alpha)."""
    A, W = A.double(), W.double()
    alpha = nr_init_alpha(A)
    return newton_iterate(A, alpha[..., None, None] * A, iters) @ W


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def test_spectrum_bound_is_tight_and_safe():
    """Above the largest eigenvalue (Collatz-Wielandt), at most ||A||_1,
    and close to the eigenvalue (SOFT kernels: ||A||_1 is ~2x it)."""
    A = landmarks_kernel(3, 2, dtype=torch.float64)
    lmax = torch.linalg.eigvalsh(A)[..., -1]
    b = CH.spectrum_bound(A)
    norm1 = A.sum(-1).amax(-1)
    assert b.shape == lmax.shape
    assert (b >= lmax).all() and (b <= norm1).all()
    assert ((b - lmax) / lmax).max() < 0.05
    assert (b < norm1).all()  # tighter than ||A||_1


def test_float32_values_match_the_official_function():
    """Unconverged float32 kernels (m = 200): within 1e-5 of the float64
    official iterations, with a degree far below 2^T; a smaller tail
    tolerance only adds terms."""
    A = landmarks_kernel(2, 3)
    W = torch.randn(2, 3, 200, 8, generator=torch.Generator().manual_seed(1))
    ref = official(A, W)
    plan = CH.chebyshev_plan(A, nr_init_alpha(A), 20)
    K = plan[0].shape[-1]
    assert 20 < K <= CH.MAX_DEGREE
    got = NRConfig(method='chebyshev').apply(A, W)
    assert got.dtype == torch.float32
    assert rel(got, ref) < 1e-5
    # the iterative method on the same input, as a yardstick
    assert rel(NRConfig(method='iterative').apply(A, W), ref) < 1e-5


def test_guard_falls_back_where_the_expansion_is_too_long(monkeypatch):
    """alpha ||A||^2 near 2 (the NeurIPS rule 0.9 * 2 / ||A||_1^2 on a
    nearly rank-one kernel): f_T changes sign within a sliver of the
    spectrum, the plan is None and the result is the spectral one."""
    x = 0.01 * torch.randn(
        2, 64, 4, generator=torch.Generator().manual_seed(0))
    A = gaussian_kernel(x, x).double()
    alpha = nr_init_alpha(A, 'soft')
    Aw = A + 0.01 * torch.eye(64, dtype=A.dtype)
    assert CH.chebyshev_plan(Aw, alpha, 20) is None
    W = torch.randn(2, 64, 3, dtype=A.dtype)
    got = NRConfig(init='soft', method='chebyshev').apply(A, W)
    want = NRConfig(init='soft', method='spectral').apply(A, W)
    torch.testing.assert_close(got, want)
    # and a too-long expansion is refused by the degree, not the nodes
    monkeypatch.setattr(CH, 'MAX_DEGREE', 10)
    assert CH.chebyshev_plan(
        landmarks_kernel(1), nr_init_alpha(landmarks_kernel(1)), 20) is None


def test_a_sample_does_not_depend_on_its_batch():
    """One degree per sample (its coefficients past it are zero): a
    sample alone and beside a sample that needs more terms give the same
    values, the same gradient."""
    A = torch.cat(
        [landmarks_kernel(1, 2, seed=0),
         landmarks_kernel(1, 2, seed=5, d=4)])
    W = torch.randn(2, 2, 200, 4, generator=torch.Generator().manual_seed(2))
    plan = CH.chebyshev_plan(A, nr_init_alpha(A), 20)
    degrees = (plan[0] != 0).sum(-1)
    assert degrees[0].max() != degrees[1].max()  # the samples differ
    nr = NRConfig(method='chebyshev')

    def run(a, w):
        a = a.clone().requires_grad_()
        z = nr.apply(a, w)
        return z.detach(), torch.autograd.grad(z.square().sum(), a)[0]

    both = run(A, W)
    for i in range(2):
        alone = run(A[i:i + 1], W[i:i + 1])
        assert torch.equal(alone[0][0], both[0][i])  # the values: bitwise
        assert rel(alone[1][0], both[1][i]) < 2e-5  # float32 rounding


def test_eq16_backward_with_the_expansion():
    """nr_backward='eq16' with the Chebyshev forward: the same gradients
    as Eq. 16 on the spectral forward."""
    A = landmarks_kernel(2, m=120, dtype=torch.float64)
    W = torch.randn(2, 120, 3, dtype=torch.float64)
    G = torch.randn(2, 120, 3, dtype=torch.float64)
    grads = {}
    for method in ('chebyshev', 'spectral'):
        a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
        z = NRConfig(method=method, backward='eq16').apply(a, w)
        grads[method] = torch.autograd.grad((z * G).sum(), (a, w))
    for x, y in zip(grads['chebyshev'], grads['spectral']):
        assert rel(x, y) < 1e-6


def test_default_backward_is_the_official_one_per_variant():
    """The Norm variants train with the gradient of the iterations (the
    official Norm code's autograd), the NeurIPS one with Eq. 16 (its CUDA
    kernel); either can be chosen."""
    assert NRConfig().backward == 'exact'
    assert NRConfig(init='soft').backward == 'eq16'
    assert NRConfig(init='soft', backward='exact').backward == 'exact'
    assert SOFTAttention(16, 2, 2).nr_backward == 'exact'
    assert SOFTAttention(16, 2, 2, attn_norm=False).nr_backward == 'eq16'
    assert SOFTAttention(
        16, 2, 2, nr=dict(backward='eq16')).nr_backward == 'eq16'


def test_auto_dispatch_by_size_and_device():
    """'auto': the expansion for A_T W from CHEBYSHEV_MIN_M of the device
    on (CUDA), never for the inverse itself nor on the CPU (spectral from
    SPECTRAL_MIN_M); below it, as before."""
    rule = SOLVER.resolve_method
    cpu = torch.empty(2000, 2000, device='meta')
    cpu = type('A', (), dict(shape=cpu.shape, device=torch.device('cpu')))
    assert rule('auto', cpu) == 'spectral'
    assert rule('chebyshev', cpu) == 'chebyshev'  # opt-in
    for device, m_min in SOLVER.CHEBYSHEV_MIN_M.items():
        big = torch.empty(m_min, m_min, device='meta')
        small = torch.empty(m_min - 1, m_min - 1, device='meta')
        fake = type('A', (),
                    dict(shape=big.shape, device=torch.device(device)))
        fake_small = type('A', (),
                          dict(shape=small.shape, device=torch.device(device)))
        assert rule('auto', fake) == 'chebyshev'
        assert rule('auto', fake_small) != 'chebyshev'
        assert rule('auto', fake, apply=False) != 'chebyshev'
        assert rule(
            'chebyshev', fake, apply=False) == rule(
                'auto', fake, apply=False)
    with pytest.raises(ValueError, match="'svd'"):
        rule('svd', torch.empty(3, 3))


@pytest.mark.parametrize('user_tf32', [False, True])
def test_tf32_off_inside_the_inverse_only(user_tf32):
    """On CUDA the inverse's products run in full float32 even where the
    user turned TF32 on; the user's setting is back afterwards (also after
    an error); other devices leave it alone."""
    from mmsoft.models.layers.amp import tf32_off
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    flags.allow_tf32 = user_tf32
    try:
        with tf32_off('cuda'):
            assert flags.allow_tf32 is False
        assert flags.allow_tf32 is user_tf32
        with pytest.raises(RuntimeError):
            with tf32_off('cuda'):
                raise RuntimeError
        assert flags.allow_tf32 is user_tf32
        with tf32_off('cpu'):
            assert flags.allow_tf32 is user_tf32
    finally:
        flags.allow_tf32 = before
