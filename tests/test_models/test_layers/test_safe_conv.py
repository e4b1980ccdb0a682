"""The CPU half-precision conv guard (issue 26: AMX's bf16 conv is wrong for
SOFT's sampler convs): this CPU's kernel, stand-in wrong / right kernels."""
import copy
import importlib
import warnings

import pytest
import torch
import torch.nn.functional as F

from mmsoft.models.backbones.soft import ConvPatchEmbed
from mmsoft.models.layers import BottleneckSampler, SafeConv2d, SOFTAttention

SAFE = importlib.import_module('mmsoft.models.layers.amp')
HALF, IDS, BF16 = (torch.bfloat16, torch.float16), ['bf16', 'fp16'], \
    torch.bfloat16
#: one rounding of the conv output (2^-9 / 2^-12) plus LayerNorm + GELU's
RTOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(autouse=True)
def fresh_verdicts():
    """Each test probes from scratch and leaves the cache as it was."""
    saved = SAFE._verdicts.copy()
    SAFE._verdicts.clear()
    yield
    SAFE._verdicts.clear()
    SAFE._verdicts.update(saved)


def round_params(module, dtype):
    """Parameters rounded to ``dtype`` (kept in float32)."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(p.to(dtype).float())


def sampler(channels, ratio):
    s, side = BottleneckSampler(channels, ratio), 4 * ratio
    q = randn(2, 3, side * side, channels, seed=channels * 10 + ratio)
    return s, s, q, (side, side)


def embed(stem, cin, cout, side):
    e = ConvPatchEmbed(cin, cout, stem)
    return e, e, randn(2, cin, side, side, seed=cin + cout)


def dw_conv(heads, channels, k):
    attn = SOFTAttention(channels, heads, sampling_ratio=2, dw_kernel_size=k)
    v = randn(2, 64, channels, seed=heads * 100 + k)
    return attn, attn.dw_conv_tokens, v, (8, 8)


@pytest.mark.parametrize('dtype', HALF, ids=IDS)
@pytest.mark.parametrize(
    'make, args', [(sampler, a)
                   for a in [(8, 8), (16, 4), (16, 8), (24, 4), (24, 8)]] +
    [(embed, (True, 3, 16, 32)), (embed, (False, 16, 24, 16)),
     (dw_conv, (2, 16, 3)), (dw_conv, (5, 40, 5))])
def test_convs_under_autocast_are_fp32_within_rounding(make, args, dtype):
    """Sampler / stem / dw convs under autocast: fp32 within rounding."""
    module, fn, x, *rest = make(*args)
    torch.manual_seed(0)
    round_params(module.eval(), dtype)
    x = x.to(dtype).float()
    with torch.no_grad():
        with torch.autocast('cpu', dtype=dtype):
            out = fn(x, *rest)
        ref = fn(x, *rest)
    out, ref = (out[0], ref[0]) if isinstance(out, tuple) else (out, ref)
    assert out.dtype in (dtype, torch.float32)
    assert rel_err(out, ref) < RTOL[dtype]


def _half(x):
    """The half type a conv of ``x`` computes in (input or autocast)."""
    return x.dtype if x.dtype in HALF else SAFE.autocast_dtype('cpu')


def broken_half_kernel(x, w, b, *args):
    """F.conv2d, but wrong in half precision (as the AMX bf16 kernel)."""
    out = F.conv2d(x, w, b, *args)
    return out.flip(-1) * 0.5 + 1.0 if _half(x) in HALF else out


def rounding_half_kernel(x, w, b, *args):
    """A correct half kernel: float32 accumulation, one output rounding."""
    dtype = _half(x)
    if dtype not in HALF:
        return F.conv2d(x, w, b, *args)
    with SAFE.autocast_off('cpu'):
        out = F.conv2d(
            *(None if t is None else t.to(dtype).float() for t in (x, w, b)),
            *args)
    return out.to(dtype)


@pytest.mark.parametrize('dtype', HALF, ids=IDS)
def test_broken_half_kernel_is_detected_and_bypassed(monkeypatch, dtype):
    """Probed once, float32 fallback; the warning's whole line."""
    monkeypatch.setattr(SAFE, '_raw_conv2d', broken_half_kernel)
    torch.manual_seed(0)
    conv = SafeConv2d(8, 8, 8, 8, bias=False)
    round_params(conv, dtype)
    x = torch.randn(2, 8, 32, 32).to(dtype).float()
    ref = F.conv2d(x, conv.weight, None, 8)
    with torch.autocast('cpu', dtype=dtype):
        with pytest.warns(SAFE.HalfConvWarning):
            out = conv(x)
        with warnings.catch_warnings():  # remembered: no second probe
            warnings.simplefilter('error')
            out2 = conv(x)
        bad = broken_half_kernel(x.to(dtype), conv.weight.to(dtype), None, 8)
    assert out.dtype == dtype  # what autocast promises the next layer
    assert rel_err(out, ref) < RTOL[dtype] and torch.equal(out, out2)
    assert list(SAFE._verdicts.values()) == [False]
    assert rel_err(bad, ref) > 0.5  # not vacuous
    monkeypatch.setattr(  # a half kernel all wrong: zeros
        SAFE, '_raw_conv2d', lambda x, w, b, *a: F.conv2d(
            x.float(), w.float(), None, *a).to(x.dtype) *
        (x.dtype not in HALF))
    x = torch.full((1, 1, 1, 1), 0.5, dtype=dtype)
    with pytest.warns(SAFE.HalfConvWarning) as record:
        SAFE.conv2d(x, x)
    assert str(record[0].message) == (
        f"mmsoft: this CPU's {str(dtype)[6:]} convolution is wrong for "
        'weight (1, 1, 1, 1), stride (1, 1), groups 1 on a (1, 1, 1) input '
        '(relative error 1 against float32, a known oneDNN bug on CPUs with '
        'AMX); mmsoft runs this convolution in float32 (correct, slower)')


@pytest.mark.parametrize('kwargs, compiling', [
    (dict(stride=4), False),
    (dict(dilation=(2, 1), groups=4, padding='same'), False),
    (dict(dilation=2, padding=[1, 2]), False),
    (dict(groups=4, padding=1), True),
    (dict(padding_mode='circular', padding=(1, 2)), False),
], ids=['stride', 'dilation-groups-same', 'list-padding', 'compiling',
        'circular'])  # yapf: disable
def test_safe_conv2d_equals_nn_conv2d(monkeypatch, kwargs, compiling):
    """Conv2d's state dict and function; no probe under torch.compile."""
    torch.manual_seed(0)
    plain = torch.nn.Conv2d(4, 4, 3, **kwargs)
    torch.nn.init.normal_(plain.bias)
    safe = SafeConv2d(4, 4, 3, **kwargs)
    safe.load_state_dict(plain.state_dict())
    assert set(safe.state_dict()) == set(plain.state_dict())
    x = torch.randn(2, 4, 9, 9)
    ref = plain(x)
    assert torch.equal(safe(x), ref)
    if 'padding_mode' in kwargs:  # nn.Conv2d's own padding and F.conv2d
        return
    monkeypatch.setattr(SAFE, '_raw_conv2d', broken_half_kernel)
    monkeypatch.setattr(SAFE, 'compiling', lambda: compiling)
    with torch.no_grad(), torch.autocast('cpu', dtype=BF16):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter('always')
            out = safe(x)
    assert [r.category
            for r in record] == [SAFE.HalfConvWarning] * (not compiling)
    assert list(SAFE._verdicts.values()) == ([] if compiling else [False])
    assert out.dtype == BF16 and rel_err(out, ref) < 2e-2


@pytest.mark.parametrize('dtype', HALF, ids=IDS)
def test_half_model_input_is_guarded_or_kept_bit_for_bit(monkeypatch, dtype):
    """Half models guarded; right kernels bit for bit; fp32 not probed."""
    monkeypatch.setattr(SAFE, '_raw_conv2d', broken_half_kernel)
    torch.manual_seed(0)
    conv, x = SafeConv2d(16, 16, 4, 4, bias=True), torch.randn(2, 16, 16, 16)
    ref = conv(x)
    copy.deepcopy(conv).double()(x.double())
    meta = SafeConv2d(4, 4, 2, 2).to('meta').to(dtype)
    meta(torch.empty(1, 4, 8, 8, device='meta', dtype=dtype))
    assert not SAFE._verdicts
    with pytest.warns(SAFE.HalfConvWarning):
        out = conv.to(dtype)(x.to(dtype))
    assert out.dtype == dtype and rel_err(out, ref) < 3 * RTOL[dtype]
    SAFE._verdicts.clear()
    calls, conv = [], conv.float()
    monkeypatch.setattr(
        SAFE, '_raw_conv2d',
        lambda x, *a: calls.append(x.dtype) or rounding_half_kernel(x, *a))
    for _ in range(2):
        calls.clear()
        with torch.autocast('cpu', dtype=dtype), warnings.catch_warnings():
            warnings.simplefilter('error')
            out = conv(x)
    expect = rounding_half_kernel(
        x.to(dtype), conv.weight.to(dtype), conv.bias.to(dtype), (4, 4),
        (0, 0), (1, 1), 1)
    assert torch.equal(out, expect) and calls == [torch.float32]
    assert list(SAFE._verdicts.values()) == [True]


def test_cpu_amp_wrapper_guards_every_conv_of_the_model(monkeypatch):
    """--amp on the CPU guards the neck / head convs, classes kept."""
    from mmsoft.engine.optimizers import CPUAmpOptimWrapper
    monkeypatch.setattr(SAFE, '_raw_conv2d', broken_half_kernel)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(8, 4, 1))
    round_params(model, BF16)
    x = torch.randn(2, 8, 16, 16).to(BF16).float()
    ref, state = model(x), copy.deepcopy(model.state_dict())
    wrapper = CPUAmpOptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.warns(SAFE.HalfConvWarning), wrapper.optim_context(model):
        out = model(x)
    assert [type(m).__name__ for m in model] == ['Conv2d', 'ReLU', 'Conv2d']
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())
    assert out.dtype == BF16 and rel_err(out, ref) < RTOL[BF16]


@pytest.mark.parametrize('dtype', HALF)
def test_probe_runs_seeded_unit_scale_inputs(monkeypatch, dtype):
    """Unit-variance inputs, weights of variance 1 / fan_in, repeatable."""
    seen = []
    monkeypatch.setattr(
        SAFE, '_raw_conv2d', lambda x, w, *a: seen.append(
            (x.clone(), w.clone())) or F.conv2d(x, w, *a))
    in_shape, w_shape = (64, 10, 12), (32, 64, 3, 2)  # fan_in 64 * 3 * 2
    key = (dtype, in_shape, w_shape, (1, 1), (1, 1), (1, 1), 1)
    assert SAFE._probe(key) is True  # F.conv2d: correct
    SAFE._probe(key)
    assert [(x.dtype, w.dtype) for x, w in seen] == \
        [(dtype, dtype), (torch.float32, torch.float32)] * 2
    (x, w), (x32, w32) = seen[:2]
    assert x.shape == (1, ) + in_shape and w.shape == w_shape
    assert torch.equal(x32, x.float()) and torch.equal(w32, w.float())
    for a, b in zip(seen[:2], seen[2:]):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert abs(x.float().std().item() - 1) < 0.05
    assert abs(w.float().std().item() * (64 * 3 * 2)**0.5 - 1) < 0.05


@pytest.mark.parametrize('native', [True, False])
def test_autocast_dtype(native):
    """native=False: torch < 2.4 without ``torch.get_autocast_dtype``; the
    CUDA flag is set without a CUDA device."""
    if not native and not hasattr(torch, 'get_autocast_cpu_dtype'):
        pytest.skip('this torch has only the >= 2.4 functions')

    def ask(device):
        with pytest.MonkeyPatch.context() as mp, warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            warnings.simplefilter('ignore', FutureWarning)
            if not native:
                mp.delattr(torch, 'get_autocast_dtype', raising=False)
            return SAFE.autocast_dtype(device)

    assert ask('cpu') is None and ask('cuda') is None
    with torch.autocast('cpu', dtype=BF16):
        assert ask('cpu') == BF16 and ask('cuda') is None
    try:
        torch.set_autocast_enabled('cuda', True)
        off = ('cuda', False)
    except TypeError:  # torch < 2.4: the flag of CUDA takes no device
        torch.set_autocast_enabled(True)
        off = (False, )
    try:
        assert ask('cuda') == torch.float16 and ask('cpu') is None
    finally:
        torch.set_autocast_enabled(*off)
