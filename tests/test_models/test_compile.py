"""``torch.compile`` of the SOFT backbone on CPU (torch >= 2.14): one graph,
with autograd too; inductor matches eager within 1e-5."""
import pytest
import torch
from conftest import needs_torch, tiny_arch

from mmsoft.models.backbones import SOFT

dynamo = pytest.importorskip('torch._dynamo')

one_graph = needs_torch(
    '2.14', 'one-graph torch.compile of the backbone (torch 2.1 / 2.4 '
    'split it into ~40 graphs)')


@pytest.fixture(autouse=True)
def fresh_dynamo():
    dynamo.reset()
    dynamo.utils.counters.clear()
    yield
    dynamo.reset()


def tiny(**kwargs):
    torch.manual_seed(0)
    return SOFT(arch=tiny_arch(), **kwargs).eval()


def counting_backend(calls, inner=None):
    """Records each graph; runs it with ``inner`` (a backend) or eagerly."""

    def backend(gm, example_inputs):
        calls.append(gm)
        return gm.forward if inner is None else inner(gm, example_inputs)

    return backend


def rel_err(got, ref):
    return max(
        ((g - r).abs().max() / r.abs().max()).item() for g, r in zip(got, ref))


# 2 NR steps and no pos-embedding resize: the same kernels, less lowering
@one_graph
def test_inductor_matches_eager_in_one_graph():
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx
    calls, backbone = [], tiny(
        pretrain_img_size=64, attn_cfg=dict(type='SOFTAttention', nr_iters=2))
    compiled = torch.compile(
        backbone, backend=counting_backend(calls, compile_fx))
    x = torch.randn(2, 3, 64, 64)
    # no worker pool (slow to start on a small machine)
    with torch.no_grad(), inductor_config.patch(compile_threads=1):
        got, ref = compiled(x), backbone(x)
    assert len(calls) == 1, 'a graph break: see torch._dynamo.explain'
    assert len(got) == len(ref) == 4
    assert [g.shape for g in got] == [r.shape for r in ref]
    assert rel_err(got, ref) < 1e-5


@one_graph
def test_training_forward_is_one_graph():
    """The custom autograd Functions traced (stage 1: every Function);
    gradients match."""
    calls, backbone = [], tiny(out_indices=(0, )).train()
    compiled = torch.compile(backbone, backend=counting_backend(calls))
    x = torch.randn(2, 3, 64, 64)
    sum(o.mean() for o in compiled(x)).backward()
    assert len(calls) == 1, f'{len(calls)} graphs: a graph break'
    got = {n: p.grad.clone() for n, p in backbone.named_parameters()
           if p.grad is not None}  # yapf: disable
    assert got and all(n.startswith('stages.0.') for n in got)
    backbone.zero_grad()
    sum(o.mean() for o in backbone(x)).backward()
    # rounding-noise gradients (biases before a BatchNorm): the model's scale
    floor = 1e-6 * max(g.abs().max() for g in got.values())
    for n, p in backbone.named_parameters():
        assert (p.grad is None) == (n not in got), n
        assert p.grad is None or (got[n] - p.grad).abs().max() / \
            p.grad.abs().max().clamp_min(floor) < 1e-5, n


@one_graph
def test_spectral_recurrence_is_one_opaque_op():
    """eigh + one nr_scalar_iterate op; dynamic batch: 2 graphs only."""
    attn_cfg = dict(type='SOFTAttention', nr_method='spectral')
    calls, sizes = [], []
    backbone = tiny(attn_cfg=attn_cfg, out_indices=(0, ))
    compiled = torch.compile(backbone, backend=counting_backend(calls))
    with torch.no_grad():
        for batch in (2, 3, 1, 1, 2, 3):
            x = torch.randn(batch, 3, 64, 64)
            dynamo.mark_dynamic(x, 0)
            got = compiled(x)
            sizes.append(len(calls))  # equal: the op runs the same code
            assert all(torch.equal(g, r) for g, r in zip(got, backbone(x)))
    assert sizes == [1, 1, 2, 2, 2, 2], sizes
    assert dynamo.utils.counters['stats']['unique_graphs'] == 2
    for gm in calls:
        targets = [n.target for n in gm.graph.nodes if n.op == 'call_function']
        assert targets.count(torch.linalg.eigh) == 1
        assert targets.count(torch.ops.mmsoft.nr_scalar_iterate.default) == 1


@needs_torch('2.4', "mmengine's compiled train_step (crashes on torch 2.1)")
def test_train_tool_compile_switch(tmp_path, capsys):
    """``compile.backend=eager``: the Runner compiles ``train_step``."""
    import os.path as osp

    from conftest import CONFIGS, tool_namespace

    import demo_synthetic as synthetic
    data = tmp_path / 'imagenet'
    synthetic.make_demo_data(
        str(tmp_path), tasks=['cls'], log=None,
        overrides=dict(cls=dict(num_train=4, num_val=2,
                                size=32)))  # yapf: disable
    cfg = tmp_path / 'cfg.py'
    cfg.write_text(
        f"_base_ = [{osp.join(CONFIGS, 'demo', 'soft_cls_demo.py')!r}]\n"
        f"data_root = {str(data) + '/'!r}\n"
        f"model = dict(backbone=dict(arch=dict(_delete_=True, "
        f"**{tiny_arch(sampling_ratios=[4, 2, 1, 1])!r}), "
        f"pretrain_img_size=32), head=dict(in_channels=64))\n"
        "train_dataloader = dict(batch_size=2, "
        "dataset=dict(data_root=data_root))\n"
        "val_dataloader = dict(batch_size=2, "
        "dataset=dict(data_root=data_root))\n"
        'test_dataloader = val_dataloader\n'
        'train_cfg = dict(max_epochs=1, val_interval=2)\n'
        'param_scheduler = []\n'
        "optim_wrapper = dict(optimizer=dict(_delete_=True, type='SGD', "
        'lr=0.01, weight_decay=1e-4))\n'
        'default_hooks = dict(logger=dict(interval=1), '
        'checkpoint=dict(interval=1))\n')
    work = tmp_path / 'work'
    tool_namespace('train')['main']([
        str(cfg), '--work-dir', str(work), '--cfg-options',
        'compile.backend=eager'])  # yapf: disable
    # dynamo traced (part of) train_step
    assert dynamo.utils.counters['stats']['unique_graphs'] >= 1
    assert (work / 'epoch_1.pth').is_file()
    text, = (p.read_text() for p in work.glob('*/*.log'))
    assert 'Model has been "compiled"' in text
    assert 'Epoch(train) [1][2/2]' in text
