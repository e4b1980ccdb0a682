"""Device- and precision-agnostic SOFT: under autocast close to float32, the
kernel and NR inverse in float32; created tensors follow the input."""
import contextlib
import copy
import importlib
import os.path as osp

import pytest
import torch
from conftest import CONFIGS, random_model, tiny_arch
from mmengine.config import Config
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import projects.attention_zoo  # noqa: F401 (the zoo variants)
from mmsoft.models import SOFT
from mmsoft.models.layers import NRConfig, SOFTAttention
from mmsoft.models.layers.amp import autocast_dtype

pytestmark = pytest.mark.usefixtures('one_thread')

HALF, IDS = (torch.bfloat16, torch.float16), ['bfloat16', 'float16']
OUT_RTOL = {torch.bfloat16: 5e-2, torch.float16: 1e-2}
GRAD_RTOL = {torch.bfloat16: 0.3, torch.float16: 0.2}
SIZE, LOSS_SCALE = 64, 2.0**12
KERNEL = importlib.import_module('mmsoft.models.layers.soft_attention')
PINV = importlib.import_module('mmsoft.models.layers.nr')
LZ = importlib.import_module('mmsoft.models.layers.nr_spectral')


def backbone(**attn):
    """A tiny SOFT; ``attn``: its ``attn_cfg`` (default type SOFT)."""
    torch.manual_seed(0)
    model = SOFT(
        arch=tiny_arch(sampling_ratios=[4, 2, 2, 1]),
        attn_cfg=dict(dict(type='SOFTAttention'), **attn))
    model.init_weights()
    return model


def rel_err(a, b):
    a, b = a.detach().double(), b.detach().double()
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def forward_backward(model, loss_fn, device, dtype=None):
    """(outputs, {name: grad}) under autocast (``dtype`` None: float32)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks in both runs
    with contextlib.nullcontext() if dtype is None else torch.autocast(
            device, dtype=dtype):
        outs, loss = loss_fn(model)
    scale = LOSS_SCALE if dtype == torch.float16 else 1.0
    (loss * scale).backward()
    return [o.detach() for o in outs], {
        n: p.grad.detach() / scale
        for n, p in model.named_parameters() if p.grad is not None
    }


def backbone_loss(model, device):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, SIZE, SIZE, generator=g).to(device)
    # a fixed random readout: every output element gets a gradient
    w = [torch.randn(2, c, SIZE // s, SIZE // s, generator=g).to(device)
         for c, s in zip(model.out_channels, (4, 8, 16, 32))]  # yapf: disable

    def loss_fn(m):
        outs = m(x)
        return outs, sum((o.float() * wi).mean() for o, wi in zip(outs, w))

    return loss_fn


def task_loss(model, device):
    if model.__class__.__name__ == 'RetinaNet':
        from mmdet.testing import demo_mm_inputs
        torch.manual_seed(0)
        data = demo_mm_inputs(
            batch_size=2,
            image_shapes=[(3, SIZE, SIZE)] * 2,
            num_items=[3, 3],
            num_classes=3)
    else:
        from analysis.common import random_batch
        data = random_batch('mmseg', 'upernet', SIZE, seg_classes=4)
    data = model.data_preprocessor(data, True)

    def loss_fn(m):  # the loss and each loss term
        loss, log_vars = m.parse_losses(m(**data, mode='loss'))
        terms = [loss] + [v for k, v in sorted(log_vars.items())
                          if 'loss' in k and k != 'loss']  # yapf: disable
        return [torch.as_tensor(float(t.detach())).reshape(1)
                for t in terms], loss  # yapf: disable

    return loss_fn


def assert_close_to_fp32(model, loss_fn, device, dtype):
    """Finite in train mode; close to float32 in eval mode."""
    model.train()
    for train in (True, False):
        model.train(train)
        outs, grads = forward_backward(model, loss_fn, device, dtype)
        assert outs and all(torch.isfinite(o).all() for o in outs)
        bad = [n for n, g in grads.items() if not torch.isfinite(g).all()]
        assert grads and not bad, f'non-finite gradients: {bad[:5]}'
    ref_outs, ref_grads = forward_backward(model, loss_fn, device)
    assert len(outs) == len(ref_outs) and grads.keys() == ref_grads.keys()
    for i, (o, r) in enumerate(zip(outs, ref_outs)):
        assert rel_err(o, r) <= OUT_RTOL[dtype], (i, rel_err(o, r))
    flat = torch.cat([grads[n].flatten().double() for n in ref_grads])
    ref = torch.cat([g.flatten().double() for g in ref_grads.values()])
    assert rel_err(flat, ref) <= GRAD_RTOL[dtype], rel_err(flat, ref)


@pytest.mark.parametrize('dtype', HALF, ids=IDS)
@pytest.mark.parametrize('attn_norm', [True, False])
def test_backbone_autocast_close_to_fp32(device, dtype, attn_norm):
    model = backbone(attn_norm=attn_norm).to(device)
    assert_close_to_fp32(model, backbone_loss(model, device), device, dtype)


@pytest.mark.parametrize(
    'name, dtype', [('retinanet', torch.bfloat16), ('upernet', torch.float16)],
    ids=['retinanet-bfloat16', 'upernet-float16'])
def test_detector_segmentor_autocast_close_to_fp32(device, dtype, name):
    """The loss (and each loss term) and all gradients."""
    cfg = Config.fromfile(osp.join(CONFIGS, 'demo', name + '_soft_demo.py'))
    if 'size' in cfg.model.data_preprocessor:
        cfg.model.data_preprocessor.size = (SIZE, SIZE)
    torch.manual_seed(0)
    model = random_model(cfg).to(device).train()
    assert_close_to_fp32(model, task_loss(model, device), device, dtype)


@pytest.fixture
def spy(monkeypatch):
    """[(what, input dtypes, output dtype, autocast on)] of each call."""
    calls = []

    def record(what, tensors, out):
        calls.append((what, [t.dtype for t in tensors], out.dtype,
                      autocast_dtype(tensors[0].device.type) is not None))

    def wrap(cls, what):
        forward = cls.forward

        def spied(ctx, *args):
            out = forward(ctx, *args)
            record(what, [a for a in args if isinstance(a, torch.Tensor)], out)
            return out

        monkeypatch.setattr(cls, 'forward', staticmethod(spied))

    wrap(KERNEL.GaussianKernel, 'kernel')  # A
    wrap(KERNEL.KernelAttention, 'kernel')  # P (training)
    wrap(PINV.NewtonInverse, 'pinv')
    wrap(LZ.LanczosApply, 'pinv')
    iterate = PINV.newton_iterate

    def spied_iterate(A, V, iters):  # the exact iterative path: autograd
        out = iterate(A, V, iters)
        if torch.is_grad_enabled():  # not inside NewtonInverse's forward
            record('pinv', [A, V], out)
        return out

    monkeypatch.setattr(PINV, 'newton_iterate', spied_iterate)
    return calls


@pytest.mark.parametrize('nr_method,nr_backward', [
    ('iterative', 'exact'), ('iterative', 'eq16'), ('spectral', 'exact'),
    ('lanczos', 'exact'), ('lanczos', 'eq16')])  # yapf: disable
def test_kernel_and_pinv_run_in_fp32_under_autocast(device, spy, nr_method,
                                                    nr_backward):
    model = backbone(nr_method=nr_method, nr_backward=nr_backward).to(device)
    x = torch.randn(2, 3, SIZE, SIZE, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        assert autocast_dtype(device) is not None
        sum(o.float().mean() for o in model(x)).backward()
    n_attn = sum(isinstance(m, SOFTAttention) for m in model.modules())
    kinds = [w for w, *_ in spy]
    # per SOFT attention (stages 1-3): the kernels P, A and one inverse
    assert kinds.count('pinv') == n_attn == 3
    assert kinds.count('kernel') == 2 * n_attn
    for what, ins, out, autocast_on in spy:
        assert not autocast_on, f'{what} ran with autocast enabled'
        assert ins and all(d == torch.float32 for d in ins), (what, ins)
        assert out == torch.float32, (what, out)


@pytest.mark.parametrize('dtype', HALF, ids=IDS)
@pytest.mark.parametrize('method', ['iterative', 'spectral'])
def test_pinv_alone_runs_in_fp32_under_autocast(device, spy, dtype, method):
    """The pseudo-inverse leaves autocast by itself (not only in SOFT)."""
    lm = torch.randn(2, 3, 12, 8, device=device) / 8**.25
    A = torch.exp(-torch.cdist(lm, lm)**2 / 2).to(dtype)
    W = torch.randn(2, 3, 12, 8, device=device, dtype=dtype)
    nr = NRConfig(method=method)
    with torch.autocast(device, dtype=dtype):
        Y, Z = nr.inverse(A), nr.apply(A, W)
    assert Y.dtype == Z.dtype == torch.float32
    assert torch.isfinite(Y).all() and torch.isfinite(Z).all()
    assert [(w, out, on) for w, _, out, on in spy] == \
        [('pinv', torch.float32, False)] * 2
    torch.testing.assert_close(Z, Y @ W.float(), rtol=1e-4, atol=1e-4)


def off_meta(t):
    return t.device.type != 'meta'


def not_float64(t):
    return t.is_floating_point() and t.dtype != torch.float64


class OpRecorder(TorchDispatchMode):
    """Records every op with a tensor result that fails ``bad(tensor)``."""

    def __init__(self, bad):
        super().__init__()
        self.bad, self.found, self.ops = bad, [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.found += [
            f'{func} -> {t.device} {t.dtype}' for t in tree_flatten(out)[0]
            if isinstance(t, torch.Tensor) and self.bad(t)
        ]
        return out


ATTN_VARIANTS = {
    'norm': dict(),  # = iterative, exact backward at this size
    'neurips': dict(attn_norm=False),
    'spectral': dict(nr_method='spectral', nr_backward='eq16'),
    'lanczos': dict(nr_method='lanczos'),
    'lanczos_eq16': dict(nr_method='lanczos', nr_backward='eq16'),
    'random': dict(sampling='random'),
    'avgpool_ml': dict(sampling='avgpool', max_landmarks=4),
    'exact_bw': dict(nr_method='spectral', nr_backward='exact'),
    **{z: dict(type=z) for z in  # the attention zoo in the same backbone
       ('softmax', 'linformer', 'performer', 'nystromformer', 'sima')},
}  # yapf: disable


def run_recorded(model, x, bad, train):
    """Forward + backward; (outputs, the ops that fail ``bad``)."""
    model.train(train)
    x.requires_grad_(True)
    with OpRecorder(bad) as rec:
        outs = model(x)
        sum(o.sum() for o in outs).backward()
    assert rec.ops > 100 and x.grad is not None  # the recorder saw it
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert not any(map(bad, [x.grad, *grads, *outs]))
    return rec.found


@pytest.mark.parametrize('name', ATTN_VARIANTS)
def test_created_tensors_follow_the_input(device, name):
    """meta (train / eval / attention_row) and float64 tensors only."""
    model = backbone(**ATTN_VARIANTS[name])
    if device == 'cpu' and name != 'exact_bw':
        meta = copy.deepcopy(model).to('meta')
        for train in (True, False) if name in ('norm', 'random') else (True, ):
            x = torch.empty(2, 3, SIZE, SIZE, device='meta')
            found = run_recorded(meta, x, off_meta, train)
            assert not found, found[:10]
        with OpRecorder(off_meta) as rec:
            row = meta.stages[0].blocks[0].attn.attention_row(
                torch.empty(2, SIZE**2 // 16, 16, device='meta'),
                (SIZE // 4, SIZE // 4), 5)
        assert not rec.found, rec.found[:10]
        assert row.device.type == 'meta' and row.shape == (2, 1, SIZE**2 // 16)
    x = torch.randn(2, 3, SIZE, SIZE, device=device, dtype=torch.float64)
    found = run_recorded(
        model.to(device, torch.float64), x, lambda t: not_float64(t) or
        (device != 'cpu' and t.device.type != device and t.dim() > 0), True)
    assert not found, found[:10]


def test_recorder_catches_a_foreign_tensor(monkeypatch):
    """The recorder catches foreign tensors; the device fixture's params."""
    x = torch.empty(3, device='meta')
    with OpRecorder(off_meta) as rec:
        x + torch.zeros(()) + x
    assert any('zeros' in f for f in rec.found)
    with OpRecorder(not_float64) as rec:
        torch.ones(3, dtype=torch.float64) * 0.5**torch.arange(3)
    assert any('pow' in f for f in rec.found)
    import conftest
    for env, want in (('', ['cpu'] + ['cuda'] * torch.cuda.is_available()),
                      ('cuda', ['cuda'])):  # yapf: disable
        monkeypatch.setenv('MMSOFT_TEST_DEVICE', env)
        assert conftest.device_types() == want
    monkeypatch.setenv('MMSOFT_TEST_DEVICE', 'tpu')
    with pytest.raises(ValueError) as info:
        conftest.device_types()
    assert str(info.value) == ("MMSOFT_TEST_DEVICE='tpu': use cpu or cuda (or "
                               'leave it unset for cpu and, if available, '
                               'cuda)')
