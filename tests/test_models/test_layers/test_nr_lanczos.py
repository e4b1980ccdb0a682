"""The Lanczos evaluation of the official NR function
(``mmsoft/models/layers/nr_lanczos.py``): its Krylov dimension, guard, batch
independence, exact gradient, the default dispatch and gradient per
variant.

Its values and exact gradient against autograd through the official
iterations also: ``test_pinv.py::test_exact_backward_equals_autograd_
through_iterations`` and ``test_nr_faithful.py::
test_backbone_exact_gradient`` (both parametrised with ``'lanczos'``)."""
import functools
import importlib

import pytest
import torch
from conftest import smooth_kernel

from mmsoft.models.layers import NRConfig, SOFTAttention, gaussian_kernel
from mmsoft.models.layers.nr_iteration import (newton_iterate, nr_init_alpha,
                                               traced_alpha)

LZ = importlib.import_module('mmsoft.models.layers.nr_lanczos')
SOLVER = importlib.import_module('mmsoft.models.layers.nr_autograd')

#: a SOFT-like bottleneck kernel: ~15 eigenvalues above the transition
#: (2^T alpha)^-1/2 of f_T, as SOFT-Small-Norm's at 800 x 1216 (15-24 of
#: 950), the rest where f_T is linear
landmarks_kernel = functools.partial(
    smooth_kernel, m=200, d=16, dtype=torch.float32, freq=2, stretch=4)


def official(A, W, iters=20, G=None):
    """The official 20 steps in float64 (per-sample alpha); with ``G`` also
    the gradients of <G, out> in A and W by autograd through them, alpha
    differentiated as the official code does."""
    A = A.double().requires_grad_(G is not None)
    W = W.double().requires_grad_(G is not None)
    alpha = traced_alpha(A, nr_init_alpha(A.detach()), 'soft_norm_per_sample')
    out = newton_iterate(A, alpha[..., None, None] * A, iters) @ W
    if G is None:
        return out.detach()
    return (out.detach(), ) + torch.autograd.grad((out * G).sum(), (A, W))


def dims(basis):
    """The Krylov dimension each matrix stopped at."""
    return (basis.U.abs().sum(-2) > 0).sum(-1)


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def test_float32_values_match_the_official_function():
    """Unconverged float32 kernels (m = 200): within 5e-5 of the float64
    official iterations, the float32 floor on this kernel (its top
    eigenvalue ~90 times the transition of f_T): the iterations in
    float32 are 0.7e-5 off, the spectral method (the CPU default before)
    1.4e-4; each matrix stopped far below m dimensions. On SOFT-Small-Norm's
    layers: 1.5-7e-6 (tools/analysis/nr_accuracy.py)."""
    A = landmarks_kernel(2, 3)
    W = torch.randn(2, 3, 200, 8, generator=torch.Generator().manual_seed(1))
    ref = official(A, W)
    basis = LZ.krylov_basis(
        A.reshape(6, 200, 200), W.reshape(6, 200, 8),
        nr_init_alpha(A).reshape(6), 20)
    assert basis.converged.all()
    assert 16 <= int(dims(basis).min()) and int(dims(basis).max()) < 100
    got = NRConfig(method='lanczos').apply(A, W)
    assert got.dtype == torch.float32
    assert rel(got, ref) < 5e-5
    # the spectral method on the same input, as a yardstick
    assert rel(got, ref) < rel(NRConfig(method='spectral').apply(A, W), ref)


def test_exact_gradient_of_the_official_function():
    """grad A (alpha's share included) within 1e-5 of
    float64 autograd through the 20 official steps, in float32 (the
    values: the float32 floor, as above)."""
    A = landmarks_kernel(2, 2)
    g = torch.Generator().manual_seed(3)
    W = torch.randn(2, 2, 200, 4, generator=g)
    G = torch.randn(2, 2, 200, 4, generator=g)
    ref, ref_A, ref_W = official(A, W, G=G.double())
    a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
    out = NRConfig(method='lanczos').apply(a, w)
    grad_A, grad_W = torch.autograd.grad((out * G).sum(), (a, w))
    assert rel(out, ref) < 5e-5
    assert rel(grad_A, ref_A) < 1e-5
    assert rel(grad_W, ref_W) < 5e-5  # f_T(A) G: the floor of the values
    # without grad: the same values
    with torch.no_grad():
        assert torch.equal(NRConfig(method='lanczos').apply(A, W), out)


def test_guard_falls_back_where_the_steps_run_out(monkeypatch):
    """A matrix not converged within MAX_DIM dimensions is computed by
    the spectral method (on the CPU), each matrix on its own: in a batch
    the others keep Lanczos' values."""
    A = torch.cat([
        landmarks_kernel(1, seed=0),  # 33 dimensions (d = 3)
        landmarks_kernel(1, seed=5, freq=3, stretch=8)  # 57
    ])
    W = torch.randn(2, 200, 3, generator=torch.Generator().manual_seed(0))
    alpha = nr_init_alpha(A)
    assert LZ.krylov_basis(A, W, alpha, 20).converged.all()
    lanczos = NRConfig(method='lanczos').apply(A, W)
    spectral = NRConfig(method='spectral').apply(A, W)
    assert rel(lanczos, spectral) > 1e-7  # different roundings: visible
    monkeypatch.setattr(LZ, 'MAX_DIM', 45)
    assert LZ.krylov_basis(A, W, alpha, 20).converged.tolist() == [True, False]
    got = NRConfig(method='lanczos').apply(A, W)
    assert torch.equal(got[0], lanczos[0])
    assert torch.equal(got[1], spectral[1])
    monkeypatch.setattr(LZ, 'MAX_DIM', 9)
    torch.testing.assert_close(
        NRConfig(method='lanczos').apply(A, W), spectral)


def test_an_invariant_subspace_ends_a_column_exactly():
    """A nearly rank-one kernel (the NeurIPS rule, alpha ||A||^2 near 2):
    Lanczos breaks down on a tiny invariant subspace and is exact there."""
    x = 0.01 * torch.randn(
        2, 64, 4, generator=torch.Generator().manual_seed(0))
    A = gaussian_kernel(x, x).double()
    W = torch.randn(2, 64, 3, dtype=A.dtype)
    got = NRConfig(init='soft', method='lanczos').apply(A, W)
    want = NRConfig(init='soft', method='iterative').apply(A, W)
    assert torch.isfinite(got).all()
    assert rel(got, want) < 1e-6


def test_a_sample_does_not_depend_on_its_batch():
    """Each matrix stops at its own dimension: a sample alone and beside a
    sample that needs more dimensions give the same values and
    gradient."""
    A = torch.cat([
        landmarks_kernel(1, 2, seed=0),
        landmarks_kernel(1, 2, seed=5, freq=3, stretch=8)
    ])
    W = torch.randn(2, 2, 200, 4, generator=torch.Generator().manual_seed(2))
    basis = LZ.krylov_basis(
        A.reshape(4, 200, 200), W.reshape(4, 200, 4),
        nr_init_alpha(A).reshape(4), 20)
    used = dims(basis).reshape(2, -1)
    assert used[0].max() != used[1].max()  # the samples differ
    nr = NRConfig(method='lanczos')

    def run(a, w):
        a = a.clone().requires_grad_()
        z = nr.apply(a, w)
        return z.detach(), torch.autograd.grad(z.square().sum(), a)[0]

    both = run(A, W)
    for i in range(2):
        alone = run(A[i:i + 1], W[i:i + 1])
        assert rel(alone[0][0], both[0][i]) < 1e-6  # float32 rounding
        assert rel(alone[1][0], both[1][i]) < 2e-5


def test_eq16_backward_with_lanczos():
    """nr_backward='eq16' with the Lanczos forward: the same gradients as
    Eq. 16 on the spectral forward."""
    A = landmarks_kernel(2, m=120, dtype=torch.float64)
    W = torch.randn(2, 120, 3, dtype=torch.float64)
    G = torch.randn(2, 120, 3, dtype=torch.float64)
    grads = {}
    for method in ('lanczos', 'spectral'):
        a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
        z = NRConfig(method=method, backward='eq16').apply(a, w)
        grads[method] = torch.autograd.grad((z * G).sum(), (a, w))
    for x, y in zip(grads['lanczos'], grads['spectral']):
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
    """'auto': Lanczos for A_T W from LANCZOS_MIN_M of the device on, with
    or without a gradient, never for the inverse itself; below it, as
    before (spectral from SPECTRAL_MIN_M on the CPU)."""
    rule = SOLVER.resolve_method
    assert set(SOLVER.LANCZOS_MIN_M) == {'cpu', 'cuda'}
    for device, m_min in SOLVER.LANCZOS_MIN_M.items():
        big = torch.empty(m_min, m_min, device='meta')
        small = torch.empty(m_min - 1, m_min - 1, device='meta')
        fake = type('A', (),
                    dict(shape=big.shape, device=torch.device(device)))
        fake_small = type('A', (),
                          dict(shape=small.shape, device=torch.device(device)))
        assert rule('auto', fake) == 'lanczos'
        assert rule('auto', fake_small) != 'lanczos'
        assert rule('auto', fake, apply=False) != 'lanczos'
        assert rule('lanczos', fake_small) == 'lanczos'  # opt-in
        assert rule(
            'lanczos', fake, apply=False) == rule(
                'auto', fake, apply=False)
    with pytest.raises(ValueError, match="'svd'"):
        rule('svd', torch.empty(3, 3))
    # the solver: inference and a training step by Lanczos (CPU)
    m = SOLVER.LANCZOS_MIN_M['cpu']
    A = landmarks_kernel(1, m=m)
    W = torch.randn(1, m, 3, generator=torch.Generator().manual_seed(0))
    seen = []
    real = SOLVER.resolve_method
    try:
        SOLVER.resolve_method = lambda *a: seen.append(real(*a)) or seen[-1]
        with torch.no_grad():
            NRConfig().apply(A, W)
        NRConfig().apply(A.requires_grad_(), W)
    finally:
        SOLVER.resolve_method = real
    assert seen == ['lanczos', 'lanczos']


def test_eigh_takes_one_thread_and_gives_the_count_back(monkeypatch):
    """``nr_iteration.eigh``: torch.linalg.eigh with one intra-op thread on
    the CPU (shared cores made the threaded one 5x slower), the caller's
    count restored after, also when it raises; the same values."""
    from mmsoft.models.layers.nr_iteration import eigh
    real, seen = torch.linalg.eigh, []

    def spy(M):
        seen.append(torch.get_num_threads())
        if M.isnan().any():
            raise RuntimeError('eigh failed')
        return real(M)

    before = torch.get_num_threads()
    X = torch.randn(3, 6, 6, generator=torch.Generator().manual_seed(0))
    X = X + X.mT
    try:
        torch.set_num_threads(2)
        monkeypatch.setattr(torch.linalg, 'eigh', spy)
        got = eigh(X)
        assert seen == [1] and torch.get_num_threads() == 2
        with pytest.raises(RuntimeError, match='eigh failed'):
            eigh(torch.full_like(X, float('nan')))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    for a, b in zip(got, real(X)):
        assert torch.equal(a, b)


def test_orthonormalisation_runs_lapack_with_one_thread(monkeypatch):
    """The Cholesky QR of every Krylov block: the factorisation and the
    triangular inverse with one intra-op thread (a loaded CPU made the
    batched 32 x 32 solve 126 ms), an orthonormal basis of the block."""
    lz = importlib.import_module('mmsoft.models.layers.nr_lanczos')
    seen = []
    for name in ('cholesky_ex', 'solve_triangular'):
        real = getattr(torch.linalg, name)
        monkeypatch.setattr(
            torch.linalg,
            name,
            lambda *a, _real=real, _name=name, **k: seen.append(
                (_name, torch.get_num_threads())) or _real(*a, **k))
    before = torch.get_num_threads()
    Z = torch.randn(3, 40, 8, generator=torch.Generator().manual_seed(2))
    try:
        torch.set_num_threads(2)
        X = lz._orthonormal(Z, torch.full((3, 1), 1e-6, dtype=torch.float64))
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen == [('cholesky_ex', 1), ('solve_triangular', 1)] * 2
    torch.testing.assert_close(
        X.mT @ X, torch.eye(8).expand(3, 8, 8), atol=1e-6, rtol=0)
    proj = X @ (X.mT @ Z)  # the same column space
    torch.testing.assert_close(proj, Z, atol=1e-5, rtol=1e-5)


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


def test_unconverged_gradient_space_takes_the_spectral_gradient(monkeypatch):
    """The backward's Krylov space of the incoming gradient gets twice the
    forward's dimensions: a matrix not converged there takes the spectral
    method's gradient (the same function, exact), each matrix on its own:
    the other keeps Lanczos' gradient bitwise."""
    A = torch.cat([
        landmarks_kernel(1, seed=0),
        landmarks_kernel(1, seed=5, freq=3, stretch=8)
    ])
    g = torch.Generator().manual_seed(0)
    W, G = torch.randn(2, 2, 200, 3, generator=g)

    def grads(method, max_dim=None):
        a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
        out = NRConfig(method=method).apply(a, w)
        if max_dim:  # the forward converged: limit the backward's space
            monkeypatch.setattr(LZ, 'MAX_DIM', max_dim)
        return torch.autograd.grad((out * G).sum(), (a, w))

    alpha = nr_init_alpha(A)
    assert LZ.krylov_basis(
        A, G, alpha, 20, max_dim=44).converged.tolist() == [True, False]
    lanczos, spectral = grads('lanczos'), grads('spectral')
    assert rel(lanczos[0][1], spectral[0][1].double()) > 1e-7  # visible
    got = grads('lanczos', max_dim=22)  # 2 x 22 = 44 dimensions
    for i, (full, lz, sp) in enumerate(zip(got, lanczos, spectral)):
        assert torch.equal(full[0], lz[0]), i
        torch.testing.assert_close(full[1], sp[1], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('which', ['W', 'G', 'both'])
def test_rank_one_inputs_and_gradients(which):
    """A constant feature (W of rank one) or a loss summing the outputs (an
    incoming gradient of rank one): a block adds one direction, the rest are
    dropped; T then has zero rows whose repeated eigenvalue made LAPACK's
    eigh fail to converge. Values and gradients stay the official ones."""
    A = landmarks_kernel(1, 2)
    g = torch.Generator().manual_seed(2)
    W, G = torch.randn(2, 1, 2, 200, 4, generator=g)
    if which in ('W', 'both'):
        W = torch.randn(1, 2, 200, 1, generator=g).expand(-1, -1, -1, 4)
    if which in ('G', 'both'):
        G = torch.ones_like(G)
    refs = official(A, W, G=G.double())

    def errors(method):
        a, w = A.clone().requires_grad_(), W.clone().requires_grad_()
        out = NRConfig(method=method).apply(a, w)
        got = (out.detach(), ) + torch.autograd.grad((out * G).sum(), (a, w))
        return [rel(x, ref) for x, ref in zip(got, refs)]

    # out, grad A, grad W: within 1e-4 (float32: 0.1-5e-5) and below the
    # spectral method's errors (1.2-3.4e-4, 3e-6-3e-5, 2e-5-3.4e-4)
    for lanczos, spectral in zip(errors('lanczos'), errors('spectral')):
        assert lanczos < min(1e-4, spectral)
