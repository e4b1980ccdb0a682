"""Contracts of the argument checks around the NR pseudo-inverse and the
token mixers: the exact messages of the token-shape check and of
:class:`NRConfig`, ``iters`` stored as an int, the NR stats of the exact
iterative backward and when the export path is taken."""
import re

import numpy as np
import pytest
import torch

from mmsoft.models.layers import AttentionBase, NRConfig, amp
from mmsoft.models.layers.nr_iteration import nr_residual


def exact(message):
    """A ``match`` pattern for exactly ``message``."""
    return '^' + re.escape(message) + '$'


# ------------------------------------------------------- token-shape check
def test_check_message_names_both_sides_and_the_shape():
    """A (B, n, C) input whose n is not H * W is refused with ``expected
    (B, H*W, C) tokens, got shape <shape>`` (H and W as given)."""
    with pytest.raises(
            ValueError,
            match=exact('expected (B, 2*3, C) tokens, got shape (1, 5, 4)')):
        AttentionBase._check(torch.zeros(1, 5, 4), (2, 3))


@pytest.mark.parametrize('key, value, message', [
    ('embed_dims', 0, 'embed_dims must be an int >= 1, got 0 (int)'),
    ('num_heads', 0, 'num_heads must be an int >= 1, got 0 (int)'),
    ('sampling_ratio', 0, 'sampling_ratio must be an int >= 1, got 0 (int)'),
    ('dw_kernel_size', 2, 'dw_kernel_size must be an odd positive int (or 0 '
     'to disable the conv), got 2: an even kernel changes the token map '
     'size'),
])
def test_attention_arguments_are_refused_by_name(key, value, message):
    """Every mixer's common arguments are checked up front, the error
    naming the argument as the config spells it."""
    args = dict(embed_dims=8, num_heads=2, sampling_ratio=2)
    args[key] = value
    with pytest.raises(ValueError, match=exact(message)):
        AttentionBase(**args)


@pytest.mark.parametrize('shape', [(1, 6), (1, 6, 2, 2)])
def test_check_refuses_other_ranks_with_the_right_token_count(shape):
    """Only 3-D (B, n, C) tokens pass: a 2-D or 4-D input is refused even
    when its dim 1 is H * W."""
    with pytest.raises(ValueError, match='expected'):
        AttentionBase._check(torch.zeros(shape), (2, 3))


def test_check_refuses_3d_tokens_with_the_wrong_count():
    """3-D tokens pass only when n == H * W."""
    AttentionBase._check(torch.zeros(1, 6, 4), (2, 3))
    with pytest.raises(ValueError, match='expected'):
        AttentionBase._check(torch.zeros(1, 7, 4), (2, 3))


# ------------------------------------------------------------- exporting
@pytest.mark.filterwarnings('ignore:`torch.jit.trace` is deprecated')
def test_is_exporting_under_jit_trace_alone():
    """``is_exporting`` is True inside ``torch.jit.trace`` (no ONNX export
    running) and False outside."""
    seen = []

    def f(x):
        seen.append(amp.is_exporting())
        return x + 1

    assert not amp.is_exporting()
    torch.jit.trace(f, torch.zeros(2), check_trace=False)
    assert seen == [True]


def test_is_exporting_under_onnx_export_alone(monkeypatch):
    """``is_exporting`` is True while ``torch.onnx.export`` runs, without
    jit tracing."""
    monkeypatch.setattr(torch.onnx, 'is_in_onnx_export', lambda: True)
    monkeypatch.setattr(torch.jit, 'is_tracing', lambda: False)
    assert amp.is_exporting()


# ------------------------------------------------------------- NR stats
def test_exact_iterative_backward_fills_stats():
    """``stats`` gets ``'residual'`` and ``'unconverged'`` on every path,
    the exact iterative backward (autograd through the iterations)
    included: the values of :func:`nr_residual`."""
    g = torch.Generator().manual_seed(0)
    X = torch.rand(2, 6, 3, generator=g, dtype=torch.float64)
    A = X @ X.mT
    nr = NRConfig(iters=4, method='iterative', backward='exact')
    stats = {}
    nr.inverse(A, stats)
    assert set(stats) == {'residual', 'unconverged'}
    want = nr_residual(A, 4, nr.init)
    for key in want:
        torch.testing.assert_close(stats[key], want[key])


# ------------------------------------------------------------- NRConfig
def test_iters_is_stored_as_the_checked_int():
    """``iters`` accepts any integral number and is stored as an ``int``."""
    cfg = NRConfig(iters=np.int64(3))
    assert cfg.iters == 3 and type(cfg.iters) is int


@pytest.mark.parametrize('field, value, message', [
    ('iters', 0,
     'Newton-Raphson iters (nr_iters) must be an int >= 1, got 0 (int)'),
    ('method', 'svd', "unknown pseudo-inverse method (nr_method) 'svd'; "
     "choose one of ('auto', 'iterative', 'spectral', 'lanczos')"),
    ('backward', 'fd', "unknown Newton-Raphson backward (nr_backward) "
     "'fd'; choose one of ('eq16', 'exact')"),
])
def test_bad_settings_name_the_attn_cfg_key(field, value, message):
    """A bad setting raises one ``ValueError`` naming the setting and its
    ``attn_cfg`` key ``nr_<field>``, the value and what is accepted."""
    with pytest.raises(ValueError, match=exact(message)):
        NRConfig(**{field: value})


def test_of_refuses_other_types():
    """``NRConfig.of`` takes an NRConfig, a dict of its fields or None;
    anything else is a ``TypeError`` listing the fields."""
    with pytest.raises(
            TypeError,
            match=exact("nr must be an NRConfig, a dict of its fields "
                        "('iters', 'init', 'method', 'backward') or None, "
                        "got 3")):
        NRConfig.of(3, True)
