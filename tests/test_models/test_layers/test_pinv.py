"""The Newton-Raphson pseudo-inverse (Alg. 2, Eq. 10 / 16): NRConfig, the
alpha rules, the methods, both gradients, export; against the official
rules written out independently."""
import importlib
import re
from functools import partial as P

import numpy as np
import pytest
import torch
from conftest import load_tool, smooth_kernel, tiny_arch

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import (NRConfig, amp, bottleneck_apply,
                                  gaussian_kernel)
from mmsoft.models.layers.nr import (INIT_MODES, SPECTRAL_MIN_M, NewtonInverse,
                                     nr_init_alpha, resolve_method)
from mmsoft.models.layers.nr_spectral import (divided_differences, eigh,
                                              filter_and_slope, scalar_iterate)

pytestmark = pytest.mark.usefixtures('one_thread')  # tiny ops
F64, F32 = torch.float64, torch.float32
NR = importlib.import_module('mmsoft.models.layers.nr')
LZ = importlib.import_module('mmsoft.models.layers.nr_spectral')


def inverse(A, *args, **kwargs):
    return NRConfig(*args, **kwargs).inverse(A)


def apply(A, W, *args, **kwargs):
    return NRConfig(*args, **kwargs).apply(A, W)


def kernel_matrix(*batch, m=49, d=32, scale=1.0, seed=0, dtype=F32):
    x = randn(*batch, m, d, seed=seed) * scale / d**0.25
    return gaussian_kernel(x, x).to(dtype)


def randn(*shape, seed=0, dtype=F64):
    return torch.randn(
        *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def close(a, b, rtol=None, atol=None):
    torch.testing.assert_close(a, b, rtol=rtol, atol=atol)


def rel(a, b):
    return float((a.detach().double() - b).abs().max() / b.abs().max())


def rel2(a, b):
    return float((a.double() - b).norm() / b.norm())


def sym(a):  # eigh reads one triangle
    return (a + a.mT) / 2


def exact(message):
    return '^' + re.escape(message) + '$'


def grads(fn, G, *xs):
    """fn(*xs) and the gradients of <G, fn(*xs)> in xs."""
    xs = [x.detach().clone().requires_grad_() for x in xs]
    z = fn(*xs)
    return (z.detach(), ) + torch.autograd.grad((z * G).sum(), xs)


def test_matches_pinv_the_shifted_inverse_and_converges():
    A = kernel_matrix(2, 3)
    Y = inverse(A, 20, 'soft_norm_per_matrix')
    assert rel2(Y, torch.linalg.pinv(A.double())) < 1e-4
    A = kernel_matrix(4, dtype=F64)
    Y = inverse(A, 30, 'soft_norm_per_matrix')
    assert Y.dtype == F64
    close(Y, torch.linalg.pinv(A), 1e-8, 1e-8)
    A = kernel_matrix(3, dtype=F64)  # NeurIPS: A + 0.01 I
    close(
        inverse(A, 40, 'soft'), torch.linalg.inv(A + 0.01 * torch.eye(49)),
        1e-6, 1e-6)


def test_defaults_and_errors_name_the_problem():
    """The defaults per variant; one row per message template."""
    cfg = NRConfig(iters=np.int64(3))
    assert cfg.iters == 3 and type(cfg.iters) is int
    nr = NRConfig(iters=2, method='iterative', backward='exact')
    modes = "('auto', 'iterative', 'spectral', 'lanczos')"
    for exc, match, call in [
        (ValueError, 'm, m', P(inverse, torch.ones(3, 4))),
        (ValueError, r'W of shape \(2, 129, 8\)',
         P(apply, kernel_matrix(2, m=130), torch.randn(2, 129, 8))),
        (ValueError, f"^unknown pseudo-inverse method 'svd'; choose one of "
         f'{re.escape(modes)}$', P(resolve_method, 'svd', torch.eye(3))),
        (AssertionError, exact('exact iterative backward uses autograd'),
         P(NewtonInverse.apply, kernel_matrix(4, m=3), None, torch.ones(()),
           nr)),
        (TypeError,
         exact("nr must be an NRConfig, a dict of its fields ('iters', "
               "'init', 'method', 'backward') or None, got 3"),
         P(NRConfig.of, 3, True)),
        (ValueError,
         exact('Newton-Raphson iters (nr_iters) must be an int >= 1, got 0 '
               '(int)'), P(NRConfig, iters=0)),
        (ValueError,
         exact("unknown pseudo-inverse method (nr_method) 'svd'; choose one "
               f'of {modes}'), P(NRConfig, method='svd')),
        (ValueError, "backward \\(nr_backward\\) 'autograd'; .*'eq16', "
         "'exact'", P(inverse, torch.eye(4), backward='autograd')),
        (ValueError,
         exact("unknown Newton-Raphson init (nr_init) 'soft_norm_sample'; "
               f'choose one of {INIT_MODES}'),
         P(nr_init_alpha, torch.eye(3), 'soft_norm_sample')),
        (ValueError, "'per_sample'.*soft_norm_per_sample",
         P(SOFT, tiny_arch(), attn_cfg=dict(type='soft',
                                            nr_init='per_sample'))),
    ]:
        with pytest.raises(exc, match=match):
            call()
    # Norm: per sample, exact; NeurIPS: 'soft', Eq. 16; a given one kept
    assert NRConfig() == NRConfig.of(None, True) == NRConfig(
        20, 'soft_norm_per_sample', 'auto', 'exact')
    assert NRConfig.of({}, False) == NRConfig(init='soft') == NRConfig(
        20, 'soft', 'auto', 'eq16')
    assert NRConfig(init='soft', backward='exact').backward == 'exact'


def official_alpha(A):
    """2 0.5^n / ||A||_1^2, n the first (<= 10) with max_j sum_i |I - alpha
    A A|_ij <= 1.01, one alpha for all matrices of A."""
    eye, AA = torch.eye(A.shape[-1], dtype=A.dtype), A @ A
    a, n = 2 / A.sum(-1).max()**2, 0
    while (eye - a * AA).abs().sum(-2).max() > 1.01 and n < 10:
        a, n = a * 0.5, n + 1
    return a


def test_alpha_rules_follow_the_official_halving():
    """Each alpha rule picks the official alpha (tolerance inclusive)."""
    A = torch.stack([
        kernel_matrix(3, m=m, scale=s, seed=k, dtype=F64)[:, :40, :40]
        for k, (m, s) in enumerate([(40, .1), (60, .5), (49, 1.), (80, 2.)])
    ])  # (4 samples, 3 heads, 40, 40)
    per_matrix = nr_init_alpha(A, 'soft_norm_per_matrix')
    assert torch.equal(
        per_matrix,
        torch.stack([torch.stack(list(map(official_alpha, S))) for S in A]))
    halvings = torch.log2(2 / A.sum(-1).amax(-1).square() / per_matrix)
    assert len(halvings.round().unique()) >= 3, halvings  # several used
    assert torch.equal(
        nr_init_alpha(A, 'soft_norm_per_batch'),
        official_alpha(A).expand(4, 3))
    assert torch.equal(
        nr_init_alpha(A, 'soft_norm_per_sample'),
        torch.stack([official_alpha(S).expand(3) for S in A]))
    assert len({nr_init_alpha(A, i).sum().item() for i in INIT_MODES}) == 4
    assert torch.equal(nr_init_alpha(A), nr_init_alpha(A, INIT_MODES[0]))
    close(nr_init_alpha(A, 'soft'), 0.9 * 2 / A.sum(-1).amax(-1)**2)
    # ||A||_1 = 1; this q's residual at n = 0 is exactly 1.01: alpha_0 = 2
    t = 1 / 32
    for q, alpha in ((0.005578077527412351, 2.0), (0.0056, 1.0)):
        A = torch.tensor([[1 - q, q], [q, t - q]], dtype=F64)
        assert A.sum(-1).tolist() == [1.0, t]
        assert nr_init_alpha(A, 'soft_norm_per_matrix').item() == alpha


def test_auto_dispatch_by_size_and_device(monkeypatch):
    """'auto': Lanczos for A_T W from LANCZOS_MIN_M, else spectral / NR."""
    big = torch.eye(SPECTRAL_MIN_M)
    assert resolve_method('auto', torch.eye(8)) == 'iterative'
    assert resolve_method('auto', big) == 'spectral'
    assert resolve_method('iterative', big) == 'iterative'
    assert set(NR.LANCZOS_MIN_M) == {'cpu', 'cuda'}
    for device, m_min in NR.LANCZOS_MIN_M.items():
        fake, fake_small = (
            type('A', (),
                 dict(shape=torch.Size([m, m]), device=torch.device(device)))
            for m in (m_min, m_min - 1))
        assert resolve_method('auto', fake) == 'lanczos'
        assert resolve_method('auto', fake_small) != 'lanczos'
        assert resolve_method('auto', fake, apply=False) != 'lanczos'
        assert resolve_method('lanczos', fake_small) == 'lanczos'  # opt-in
        assert resolve_method('lanczos', fake, apply=False) == \
            resolve_method('auto', fake, apply=False)
    m = NR.LANCZOS_MIN_M['cpu']  # inference and a training step
    A, W = landmarks_kernel(1, m=m), randn(1, m, 3, dtype=F32)
    seen, real = [], NR.resolve_method
    monkeypatch.setattr(NR, 'resolve_method',
                        lambda *a: seen.append(real(*a)) or seen[-1])
    with torch.no_grad():
        NRConfig().apply(A, W)
    NRConfig().apply(A.requires_grad_(), W)
    assert seen == ['lanczos', 'lanczos']


@pytest.mark.parametrize('batch, inverse_only', [((), True), ((1, ), False)])
def test_eq16_backward_uses_transposes(batch, inverse_only):
    """A non-symmetric A tells Y^T from Y (Eq. 16: -Y^T grad_Y Y^T)."""
    g = torch.Generator().manual_seed(0)
    A = torch.eye(4, dtype=F64) + 0.3 * torch.rand(
        4, 4, generator=g, dtype=F64)  # yapf: disable
    A = A.expand(*batch, 4, 4).clone()
    W = torch.randn(*batch, 4, 3, generator=g, dtype=F64)
    nr = NRConfig(30, method='iterative', backward='eq16')
    Y = nr.inverse(A)
    close(Y, torch.linalg.inv(A))
    assert not torch.allclose(Y, Y.mT)
    G = torch.randn(
        Y.shape if inverse_only else W.shape, generator=g, dtype=F64)
    if inverse_only:
        got, ref = grads(nr.inverse, G, A), grads(torch.linalg.inv, G, A)
        # one node above A (the Function's), none per iteration
        assert type(nr.inverse(
            A.requires_grad_()).grad_fn).__name__ == 'NewtonInverseBackward'
    else:
        got = grads(nr.apply, G, A, W)
        ref = grads(lambda a, w: torch.linalg.inv(a) @ w, G, A, W)
    for a, b in zip(got, ref):
        close(a, b)


def through_iterations(a, w, iters, init, attn_norm=False, shift=0.01):
    """The explicit Eq. (10) (NeurIPS 'soft': on A + 0.01 I), alpha
    differentiated (the halvings fixed)."""
    Aw = a + shift * torch.eye(
        a.shape[-1], dtype=a.dtype) if init == 'soft' else a
    V = nr_init_alpha(a, init)[..., None, None] * Aw
    for _ in range(iters):
        V = 2 * V - V @ Aw @ V
    if attn_norm:
        d = a.sum(-1, keepdim=True).rsqrt()
        return d * (V @ (d * w))
    return V @ w


@pytest.mark.parametrize('init', ['soft_norm_per_sample', 'soft'])
@pytest.mark.parametrize('method', ['spectral', 'iterative', 'lanczos'])
def test_methods_are_the_iterations_and_their_gradients(init, method):
    """Unconverged (m = 60): each method is the T iterations (float32 to
    1e-4), 'exact' their gradient, 'eq16' Eq. 16 (grad_W exact)."""
    A = smooth_kernel(2, 3)
    W, G = randn(2, 2, 3, 60, 5, seed=1)
    tol = 1e-7 if method == 'lanczos' else 1e-9  # its stopping rule
    for norm in (True, False):  # the last: A_T W
        ref = grads(
            P(through_iterations, iters=20, init=init, attn_norm=norm), G, A,
            W)
        got = {}
        for bwd in ('exact', 'eq16'):
            nr = NRConfig(20, init, method, bwd)
            got[bwd] = grads(
                P(bottleneck_apply, attn_norm=True, nr=nr)
                if norm else nr.apply, G, A, W)
        for r, e in zip(ref, got['exact']):
            assert rel2(e, r) < tol
        close(got['eq16'][2], ref[2])
        if init != 'soft':  # A + 0.01 I is well conditioned: converged
            assert rel2(got['eq16'][1], ref[1]) > 1e-3
    Y = through_iterations(A, torch.eye(60, dtype=F64), 20, init)
    eq16 = -(Y.mT @ G) @ (Y @ W).mT  # -Y^T grad_Y Y^T
    assert rel2(got['eq16'][1], eq16) < tol
    for bwd, want in (('exact', ref[1]), ('eq16', eq16)):  # full inverse
        g = grads(lambda a: inverse(a, 20, init, method, bwd) @ W, G, A)[1]
        assert rel2(g, want) < 1e-9
    assert rel2(nr.apply(A.float(), W.float()), ref[0]) < 1e-4
    if init == 'soft':  # the data tells the shift
        assert rel2(through_iterations(A, W, 20, init, shift=0.02),
                    ref[0]) > 1e-3


def test_divided_differences_close_eigenvalues():
    """The quotient where accurate, else f'(l) (float64 autograd)."""
    lam = torch.tensor([1e-3, 1e-3 * (1 + 1e-12), 0.3, 0.3, 0.31, 1.7],
                       dtype=F64)
    alpha = torch.tensor(0.3, dtype=F64)
    v = scalar_iterate(lam, alpha, 20)
    F = divided_differences(lam, lam, alpha, 20)
    lg = lam.clone().requires_grad_()
    fp = torch.autograd.grad(filter_and_slope(lg, alpha, 20, False).sum(),
                             lg)[0]
    close(F.diagonal(), fp, 1e-12, 0)
    close(F[0, 1], fp[0], 1e-9, 0)
    close(F[2, 3], fp[2], 1e-12, 0)
    close(F[2, 4], (v[2] - v[4]) / (lam[2] - lam[4]), 1e-12, 0)
    close(F, F.T, 1e-12, 0)


def matrix_with_spectrum(lam, seed=0):
    """Q diag(lam) Q^T, Q random orthogonal (float64, symmetric)."""
    lam = torch.tensor(lam, dtype=F64)
    Q, _ = torch.linalg.qr(randn(len(lam), len(lam), seed=seed))
    return sym((Q * lam) @ Q.T)


def test_exact_backward_stack_equals_each_matrix_and_float32(monkeypatch):
    """A stack's gradients are each matrix's alone; float32 ~ float64."""
    A = smooth_kernel(2, 2, m=120)
    W, G = randn(2, 2, 2, 120, 4)
    g64, g32 = (
        grads(
            P(apply, iters=20, method='spectral', backward='exact'), G.to(dt),
            A.to(dt), W.to(dt))[1] for dt in (F64, F32))
    assert rel2(g32, g64) < 1e-3
    monkeypatch.setattr(
        NR,
        'nr_init_alpha',
        lambda A, init='': torch.full(A.shape[:-2], 0.2, dtype=A.dtype))
    A = torch.stack([matrix_with_spectrum(lam, seed=k) for k, lam in enumerate(
        [[2.0, 2.0, 0.5, 0.05, 0.05, 0.01], [3.0, 1.5, 0.7, 0.2, 0.2, 0.004],
         [1.0, 0.9, 0.9, 0.3, 0.03, 0.03]])])  # yapf: disable
    W, G = randn(3, 6, 2, seed=1), randn(3, 6, 2, seed=2)
    fn = P(apply, iters=10, init='soft', method='spectral', backward='exact')
    stacked = grads(fn, G, A, W)[1]
    for b in range(3):
        close(stacked[b], grads(fn, G[b], A[b], W[b])[1], 1e-10, 1e-12)


@pytest.mark.filterwarnings('ignore:`torch.jit.trace` is deprecated')
def test_export_takes_auto_and_refuses_eigh_and_lanczos(monkeypatch):
    """Exporting: 'auto' the eager values; eigh / Lanczos refused."""
    seen = []
    torch.jit.trace(
        lambda x: seen.append(amp.is_exporting()) or x + 1,
        torch.zeros(2),
        check_trace=False)
    assert seen == [True] and not amp.is_exporting()
    x = randn(2, 6, 4, seed=1, dtype=F32)
    A, W = gaussian_kernel(x, x), randn(2, 6, 3, seed=2, dtype=F32)
    nr = NRConfig(iters=6)
    want = nr.apply(A, W), nr.inverse(A)
    monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
    monkeypatch.setattr(torch.jit, 'is_tracing', lambda: False)
    assert amp.is_exporting()
    for method, why in [('spectral', 'torch.linalg.eigh has no ONNX operator'),
                        ('lanczos', 'its steps are chosen from the data at '
                         'run time')]:
        with pytest.raises(
                amp.ExportError,
                match=exact(
                    f"nr_method='{method}' cannot be exported ({why})"
                    "; set model.backbone.attn_cfg.nr_method='auto' "
                    "or 'iterative' (same function) before exporting")):
            nr.replace(method=method).apply(A, W)
    got = nr.apply(A, W), nr.inverse(A)
    assert got[0].shape == (2, 6, 3) and got[1].shape == (2, 6, 6)
    for a, b in zip(got, want):
        close(a, b, 1e-4, 1e-5)


def landmarks_kernel(*batch, **kw):
    """~15 eigenvalues above f_T's transition (as SOFT-Small-Norm's)."""
    kw = dict(dict(m=200, d=16, dtype=F32, freq=2, stretch=4), **kw)
    return smooth_kernel(*batch, **kw)


def official_norm(A, W, G):
    """The official 20 steps in float64, the gradients through them."""
    return grads(
        P(through_iterations, iters=20, init=INIT_MODES[0]), G.double(),
        A.double(), W.double())


def krylov_dims(A, W, **kw):
    """Whether each matrix converged, and the Krylov dimension it used."""
    m, k = A.shape[-1], W.shape[-1]
    basis = LZ.krylov_basis(
        A.reshape(-1, m, m), W.reshape(-1, m, k),
        nr_init_alpha(A).reshape(-1), 20, **kw)
    return basis.converged.tolist(), (basis.U.abs().sum(-2) > 0).sum(-1)


def lanczos(a, w):
    return NRConfig(method='lanczos').apply(a, w)


def spectral(a, w):
    return NRConfig(method='spectral').apply(a, w)


def test_lanczos_is_the_official_function_and_its_exact_gradient():
    """m = 200 float32: values and exact gradient at the float32 floor;
    rank-one W and G (zero rows of T made LAPACK's eigh fail) too."""
    A = landmarks_kernel(2, 3)
    W, G = randn(2, 2, 3, 200, 8, seed=1, dtype=F32)
    ref, ref_A, ref_W = official_norm(A, W, G)
    converged, used = krylov_dims(A, W)
    assert all(converged) and 16 <= int(used.min()) and int(used.max()) < 100
    out, grad_A, grad_W = grads(lanczos, G, A, W)
    assert out.dtype == F32 and rel(out, ref) < 5e-5
    assert rel(out, ref) < rel(spectral(A, W), ref)
    assert rel(grad_A, ref_A) < 1e-5
    assert rel(grad_W, ref_W) < 5e-5  # f_T(A) G: the floor of the values
    with torch.no_grad():
        assert torch.equal(lanczos(A, W), out)
    x = 0.01 * randn(2, 64, 4, dtype=F32)
    A, W = gaussian_kernel(x, x).double(), torch.randn(2, 64, 3, dtype=F64)
    got = NRConfig(init='soft', method='lanczos').apply(A, W)
    assert torch.isfinite(got).all()
    assert rel(got, NRConfig(init='soft', method='iterative').apply(A, W)) \
        < 1e-6
    A, G = landmarks_kernel(1, 2), torch.ones(1, 2, 200, 4)
    W = randn(1, 2, 200, 1, seed=2, dtype=F32).expand(-1, -1, -1, 4)
    refs = official_norm(A, W, G)
    for lz, sp, ref in zip(
            grads(lanczos, G, A, W), grads(spectral, G, A, W), refs):
        assert rel(lz, ref) < min(1e-4, rel(sp, ref))


def test_guard_takes_the_spectral_method_where_the_steps_run_out(monkeypatch):
    """Not converged within MAX_DIM (either pass): spectral, per matrix."""
    A = torch.cat([
        landmarks_kernel(1, seed=0),  # 33 dimensions (d = 3)
        landmarks_kernel(1, seed=5, freq=3, stretch=8)  # 57
    ])
    W, G = randn(2, 2, 200, 3, dtype=F32)
    assert krylov_dims(A, W)[0] == [True, True]
    assert krylov_dims(A, G, max_dim=44)[0] == [True, False]
    lz, sp = grads(lanczos, G, A, W), grads(spectral, G, A, W)
    assert rel(lz[0], sp[0]) > 1e-7  # different roundings: visible
    assert rel(lz[1][1], sp[1][1].double()) > 1e-7
    monkeypatch.setattr(LZ, 'MAX_DIM', 45)
    assert krylov_dims(A, W)[0] == [True, False]
    got = lanczos(A, W)
    assert torch.equal(got[0], lz[0][0]) and torch.equal(got[1], sp[0][1])
    monkeypatch.setattr(LZ, 'MAX_DIM', 9)
    close(lanczos(A, W), sp[0])
    monkeypatch.undo()

    def limited(a, w):  # the forward converged: limit the backward's space
        out = lanczos(a, w)
        monkeypatch.setattr(LZ, 'MAX_DIM', 22)  # 2 x 22 = 44 dimensions
        return out

    got = grads(limited, G, A, W)[1:]
    for i, (full, lzg, spg) in enumerate(zip(got, lz[1:], sp[1:])):
        assert torch.equal(full[0], lzg[0]), i
        close(full[1], spg[1], 1e-5, 1e-6)


@pytest.mark.parametrize('method', ['spectral', 'iterative', 'lanczos'])
def test_a_sample_does_not_depend_on_its_batch(method):
    """Per-sample alpha; Lanczos: each matrix at its own Krylov dimension."""
    A = torch.cat([
        landmarks_kernel(1, 2, seed=0),
        landmarks_kernel(1, 2, seed=5, freq=3, stretch=8)
    ])
    W, G = randn(2, 2, 2, 200, 4, seed=2, dtype=F32)
    used = krylov_dims(A, W)[1].reshape(2, -1)
    assert used[0].max() != used[1].max()
    fn = NRConfig(method=method).apply
    both = grads(fn, G, A, W)
    for i in range(2):
        alone = grads(fn, G[i:i + 1], A[i:i + 1], W[i:i + 1])
        assert rel(alone[0][0], both[0][i]) < 1e-6  # float32 rounding
        assert rel(alone[1][0], both[1][i]) < 2e-5


def test_lapack_calls_take_one_thread_and_give_the_count_back(monkeypatch):
    """LAPACK calls on one thread, count kept; TF32 off inside only."""
    real_eigh, seen, threads = torch.linalg.eigh, [], [None]
    X, Z = sym(randn(3, 6, 6, dtype=F32)), randn(3, 40, 8, seed=2, dtype=F32)
    for name in ('eigh', 'cholesky_ex', 'solve_triangular'):
        real = getattr(torch.linalg, name)

        def spy(M, *a, _real=real, _name=name, **k):
            seen.append((_name, threads[-1]))
            assert not M.isnan().any(), 'eigh failed'
            return _real(M, *a, **k)

        monkeypatch.setattr(torch.linalg, name, spy)
    monkeypatch.setattr(torch, 'get_num_threads', lambda: 2)  # the caller's
    monkeypatch.setattr(torch, 'set_num_threads', threads.append)
    got = eigh(X)
    assert seen == [('eigh', 1)] and threads == [None, 1, 2]
    with pytest.raises(AssertionError, match='eigh failed'):
        eigh(torch.full_like(X, float('nan')))
    assert threads == [None] + [1, 2] * 2
    seen.clear()
    Q = LZ._orthonormal(Z, torch.full((3, 1), 1e-6, dtype=F64))
    assert seen == [('cholesky_ex', 1), ('solve_triangular', 1)] * 2
    assert threads == [None] + [1, 2] * 6
    for a, b in zip(got, real_eigh(X)):
        assert torch.equal(a, b)
    close(Q.mT @ Q, torch.eye(8).expand(3, 8, 8), 0, 1e-6)
    close(Q @ (Q.mT @ Z), Z, 1e-5, 1e-5)
    # CUDA: TF32 off inside, the user's setting back after (an error too)
    flags = torch.backends.cuda.matmul
    before = flags.allow_tf32
    try:
        for user_tf32 in (False, True):
            flags.allow_tf32 = user_tf32
            with pytest.raises(RuntimeError), amp.tf32_off('cuda'):
                assert flags.allow_tf32 is False
                raise RuntimeError
            with amp.tf32_off('cpu'):
                assert flags.allow_tf32 is user_tf32
    finally:
        flags.allow_tf32 = before


def test_nr_backward_compare_tool(capsys):
    """tools/analysis/nr_backward_compare.py (tiny preset, small image)."""
    mod = load_tool('analysis/nr_backward_compare.py', 'nr_backward_compare')
    x = mod.natural_image(40, 56)
    assert x.shape == (1, 3, 40, 56) and x.std() > 0.3
    mod.main(
        ['--arch', 'tiny', '--sizes', '64x96', '--repeats', '1', '--parity'])
    out = capsys.readouterr().out
    assert 'backbone  rel. error' in out and 'ratio' in out
    assert 'soft_norm_per_sample (float64)' in out
    assert float(
        out.split('soft_norm_per_sample (float64) ')[1].split()[0]) < 1e-10
