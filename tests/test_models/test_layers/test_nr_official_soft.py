"""The non-normalised ``soft`` variant (NeurIPS ``soft_*`` models,
``attn_norm=False``) against the official rule, written out here.

The official ``soft_*`` pseudo-inverse (fudan-zvg/SOFT,
``SOFT/kernel/inverse.py``: ``newton_inv``), re-derived independently for
one m x m bottleneck matrix A at a time: alpha = 0.9 * 2 / s^2 with s the
largest row sum of A itself, P = A + 0.01 I, V_0 = alpha P, then 20
iterations V <- 2 V - V P V; the attention applies V (no D^-1/2
normalisation). This is the counterpart of ``test_nr_faithful.py``
(``attn_norm=True``) and does not use the constants of
``mmsoft.models.layers.nr_iteration``.
"""
import importlib

import pytest
import torch
from conftest import tiny_arch

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import NRConfig, bottleneck_apply
from mmsoft.models.layers.nr_autograd import SPECTRAL_MIN_M

sa = importlib.import_module('mmsoft.models.layers.soft_attention')


def newton_inverse(A, *args, stats=None, **kwargs):
    """``NRConfig(*args, **kwargs).inverse(A, stats)``."""
    return NRConfig(*args, **kwargs).inverse(A, stats)


pytestmark = pytest.mark.usefixtures('one_thread')


def official_soft_inverse(A, iters=20, shift=0.01, scale=0.9):
    """The official ``soft_*`` iteration, matrix by matrix (``shift`` /
    ``scale`` only to show below that the data depends on them)."""
    flat = A.reshape(-1, *A.shape[-2:])
    out = []
    for M in flat:
        s = max(float(row.sum()) for row in M)
        P = M + shift * torch.eye(M.shape[-1], dtype=M.dtype)
        V = (scale * 2 / s**2) * P
        for _ in range(iters):
            V = 2 * V - V @ P @ V
        out.append(V)
    return torch.stack(out).reshape(A.shape)


def gram(batch, heads, m, d=8, spread=0.4, seed=0):
    """Gaussian-kernel bottleneck matrices exp(-|x_i - x_j|^2 / 2) of
    clustered landmarks: nearly singular, so the shift, the scale and the
    20 iterations all matter."""
    g = torch.Generator().manual_seed(seed)
    x = spread * torch.randn(
        batch, heads, m, d, generator=g, dtype=torch.float64)
    sq = torch.cdist(x, x).square()
    return torch.exp(-sq / 2)


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize('m', [12, 100])
@pytest.mark.parametrize('method', ['iterative', 'spectral', 'auto'])
def test_soft_rule_matches_official(m, method):
    """float64: ``init='soft'`` == the official function (1e-9) for both
    evaluation methods ('auto' is spectral for m >= SPECTRAL_MIN_M on the
    CPU), after the official 20 iterations and after 4 (far from
    converged), and the data is such that another shift, scale or number
    of iterations would be caught."""
    A = gram(2, 3, m)
    A[1, 2] = gram(1, 1, m, spread=1.5, seed=1)[0, 0]  # row sums differ
    for iters in (20, 4):
        official = official_soft_inverse(A, iters)
        mine = newton_inverse(A, iters, init='soft', method=method)
        assert rel(mine, official) < 1e-9
    # the guards: each constant changes the result on this data
    official = official_soft_inverse(A)
    assert rel(official_soft_inverse(A, shift=0.0), official) > 1e-3
    assert rel(official_soft_inverse(A, shift=0.02), official) > 1e-3
    short = official_soft_inverse(A, 4)
    assert rel(official_soft_inverse(A, 3), short) > 1e-3
    assert rel(official_soft_inverse(A, 4, scale=1.0), short) > 1e-3


def test_bottleneck_apply_default_is_official_soft():
    """``attn_norm=False`` with the default settings applies the official
    inverse to W (no D^-1/2), at both sides of SPECTRAL_MIN_M."""
    g = torch.Generator().manual_seed(2)
    for m in (SPECTRAL_MIN_M - 1, SPECTRAL_MIN_M + 20):
        A = gram(2, 2, m, seed=m)
        W = torch.randn(2, 2, m, 8, generator=g, dtype=torch.float64)
        expected = official_soft_inverse(A) @ W
        assert rel(bottleneck_apply(A, W, attn_norm=False), expected) < 1e-9


CALLS = []


def official_soft_bottleneck_apply(A,
                                   W,
                                   attn_norm=True,
                                   nr=None,
                                   nr_stats=None):
    assert not attn_norm and nr.init == 'soft' and nr.iters == 20
    CALLS.append(A.shape)
    return official_soft_inverse(A) @ W


def test_backbone_soft_variant_is_official(monkeypatch):
    """The whole backbone with ``attn_norm=False`` (float64) equals the
    same backbone with its pseudo-inverse replaced by the official rule,
    at 320 x 320: m = 100 landmarks in the three SOFT stages, the spectral
    path of nr_method='auto' on the CPU."""
    arch = tiny_arch([16, 32, 32, 32], [2, 4, 4, 4], [1, 1, 1, 1])
    torch.manual_seed(0)
    model = SOFT(
        arch,
        attn_cfg=dict(type='SOFTAttention', attn_norm=False),
        out_indices=(2, ))
    model.init_weights()
    model = model.double().eval()
    g = torch.Generator().manual_seed(3)
    low = torch.randn(1, 3, 5, 5, generator=g, dtype=torch.float64)
    x = torch.nn.functional.interpolate(
        low, size=(320, 320), mode='bicubic', align_corners=False)
    assert 100 >= SPECTRAL_MIN_M
    CALLS.clear()
    with torch.no_grad():
        mine = model(x)[0]
        monkeypatch.setattr(sa, 'bottleneck_apply',
                            official_soft_bottleneck_apply)
        official = model(x)[0]
    # the official inverse replaced mmsoft's in the three SOFT stages
    assert [shape[-1] for shape in CALLS] == [100, 100, 100]
    assert rel(mine, official) < 1e-9
