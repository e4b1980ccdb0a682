"""SOFT's dropout, frozen_stages, norm_eval and nr_stats options against
their docstrings (issue 30)."""
import types

import pytest
import torch
from conftest import tiny_arch
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft.models import SOFT

pytestmark = pytest.mark.usefixtures('one_thread')

ARCH = tiny_arch(depths=(1, 2, 2, 1))


def _x(h=64, w=96, b=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 3, h, w, generator=g)


# ------------------------------------------------------- eval determinism
DROPOUTS = [
    dict(drop_rate=0.3),
    dict(attn_drop_rate=0.5),
    dict(drop_path_rate=0.5),
    dict(drop_path_rate=0.5, residual_drop='dropout'),
    dict(attn_cfg=dict(type='SOFTAttention', sampling='random')),
]


@pytest.mark.parametrize(
    'opts', DROPOUTS, ids=lambda o: '-'.join(f'{k}' for k in o))
@pytest.mark.parametrize('out_type', ['featmap', 'cls_token'])
def test_eval_is_bitwise_repeatable_with_dropouts(opts, out_type):
    torch.manual_seed(0)
    model = SOFT(ARCH, out_type=out_type, **opts)
    model.init_weights()
    x = _x()
    # the option is live: two training forwards differ
    model.train()
    with torch.no_grad():
        t1, t2 = model(x), model(x)
    assert any(not torch.equal(a, b) for a, b in zip(t1, t2)), opts
    model.eval()
    with torch.no_grad():
        torch.manual_seed(1)
        e1 = model(x)
        torch.manual_seed(2)
        e2 = model(x)
    for a, b in zip(e1, e2):
        assert torch.equal(a, b), opts
    # and equal to the model without the option (same weights)
    if 'attn_cfg' not in opts:
        plain = SOFT(ARCH, out_type=out_type).eval()
        plain.load_state_dict(model.state_dict())
        with torch.no_grad():
            for a, b in zip(plain(x), e1):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


# --------------------------------------------------------- frozen_stages
def documented_frozen(model, k):
    """The parameter names the ``frozen_stages`` docstring lists."""
    names = [n for n, _ in model.named_parameters()]
    if k == 0:
        return {
            n
            for n in names if n.startswith('stages.0.patch_embed.')
            or n == 'stages.0.pos_embed'
        }
    stages = tuple(f'stages.{i}.' for i in range(max(k, 0)))
    return {n for n in names if n.startswith(stages)}


@pytest.mark.parametrize('k', [-1, 0, 1, 2, 3, 4])
def test_frozen_stages_freezes_the_documented_parameters(k):
    model = SOFT(ARCH, frozen_stages=k, drop_rate=0.1).train()
    frozen = {n for n, p in model.named_parameters() if not p.requires_grad}
    assert frozen == documented_frozen(model, k)
    if k == 4:  # stage 4 includes its cls token and final norm
        assert {'stages.3.cls_token', 'stages.3.norm.weight'} <= frozen
    # frozen modules (all of a frozen stage) are in eval mode, others train
    assert [s.patch_embed.training for s in model.stages
            ] == [i >= k and not i == k == 0 for i in range(4)]
    for name, m in model.named_modules():
        params = [f'{name}.{n}' for n, _ in m.named_parameters(recurse=False)]
        if name.count('.') == 1 and name.startswith('stages.'):
            params = []
        if params:
            assert m.training != all(p in frozen for p in params), name
        if any(name.startswith(f'stages.{i}.') for i in range(max(k, 0))):
            assert not m.training, name
    # the frozen BatchNorms keep their statistics through training steps
    bns = {n: m for n, m in model.named_modules() if isinstance(m, _BatchNorm)}
    before = {n: m.running_mean.clone() for n, m in bns.items()}
    with torch.no_grad():
        model(_x())
    for n, m in bns.items():
        moved = not torch.equal(before[n], m.running_mean)
        assert moved == (f'{n}.weight' not in frozen), n
    # a frozen parameter gets no gradient, the others do
    if k < 4:
        sum(o.float().sum() for o in model(_x(b=1))).backward()
        for n, p in model.named_parameters():
            assert (p.grad is None) == (n in frozen), n


def test_frozen_stages_survive_train_calls():
    model = SOFT(ARCH, frozen_stages=2)
    for _ in range(2):
        model.train()
        model.eval()
        model.train()
    assert not model.stages[1].blocks[0].training
    assert not model.stages[1].patch_embed.proj[0].bn.training
    assert model.stages[2].blocks[0].training


# -------------------------------------------------------------- norm_eval
@pytest.mark.parametrize('norm_eval', [False, True])
def test_norm_eval(norm_eval):
    model = SOFT(ARCH, norm_eval=norm_eval).train()
    bns = [m for m in model.modules() if isinstance(m, _BatchNorm)]
    assert len(bns) >= 6  # stem 3 + one per later patch embedding
    assert all(m.training != norm_eval for m in bns)
    # every other module trains (LayerNorms, dropouts, attention)
    others = [
        n for n, m in model.named_modules()
        if not isinstance(m, _BatchNorm) and not m.training
    ]
    assert not others, others
    stats = [m.running_var.clone() for m in bns]
    with torch.no_grad():
        model(_x())
    moved = [not torch.equal(s, m.running_var) for s, m in zip(stats, bns)]
    assert all(m != norm_eval for m in moved)
    # model.eval() still puts everything in eval
    assert not any(m.training for m in model.eval().modules())


# ------------------------------------------------------- NR diagnostics
def _nr_model(forward=False):
    torch.manual_seed(0)
    arch = tiny_arch(
        embed_dims=(16, 32, 32, 64),
        num_heads=(2, 2, 2, 2),
        depths=(2, 2, 1, 1))
    model = SOFT(arch, attn_cfg=dict(type='SOFTAttention', nr_iters=3))
    model.init_weights()
    if forward:
        model.eval().set_nr_diagnostics(True)
        with torch.no_grad():
            model(_x(64, 96, b=2))
    return model.eval()


def _soft_attns(stage):
    return [m for m in stage.modules() if hasattr(m, 'last_nr_stats')]


def test_nr_stats_per_matrix_and_their_maximum():
    """``last_nr_stats``: one value per matrix; ``nr_stats``: stage max."""
    model = _nr_model(forward=True)
    stats = model.nr_stats()
    assert sorted(stats) == ['stage1', 'stage2', 'stage3']
    for i in range(3):
        per = [m.last_nr_stats for m in _soft_attns(model.stages[i])]
        for key in ('residual', 'unconverged'):
            vals = torch.stack([p[key] for p in per])
            assert vals.shape == (len(per), 2, 2)  # blocks, B, heads
            assert stats[f'stage{i + 1}'][key] == float(vals.max())
        res = torch.stack([p['residual'] for p in per])
        assert len(set(res.flatten().tolist())) > 1  # matrices differ


def test_nr_stats_reduce_over_every_matrix():
    """Crafted maxima in another sample / head / block in every stage."""
    model = _nr_model(forward=True)
    where = {0: (1, 0, 1), 1: (0, 1, 1), 2: (0, 1, 0)}  # block, sample, head
    for i, (blk, b, h) in where.items():
        attns = _soft_attns(model.stages[i])
        for j, m in enumerate(attns):
            res = torch.full((2, 2), 0.01 * (i + 1))
            unc = torch.zeros(2, 2)
            if j == blk % len(attns):
                res[b, h] = 0.1 * (i + 1)
                unc[b, h] = 0.25 * (i + 1)
            m.last_nr_stats = dict(residual=res, unconverged=unc)
    stats = model.nr_stats()
    for i in range(3):
        assert stats[f'stage{i + 1}']['residual'] == pytest.approx(0.1 *
                                                                   (i + 1))
        assert stats[f'stage{i + 1}']['unconverged'] == pytest.approx(0.25 *
                                                                      (i + 1))

    # the hook: per stage, the largest over the backbones
    from mmengine.logging import MessageHub

    from mmsoft.engine.hooks import NRResidualHook
    other = _nr_model()
    other.set_nr_diagnostics(True)
    for i in range(3):
        for m in _soft_attns(other.stages[i]):
            m.last_nr_stats = dict(
                residual=torch.full((2, 2), 0.05 if i != 1 else 0.9),
                unconverged=torch.zeros(2, 2))
    hook = NRResidualHook(interval=1, warn_unconverged=None)
    hub = MessageHub.get_instance('test_option_contracts_nr_hook')
    net = torch.nn.Module()
    net.a, net.b = model, other
    runner = types.SimpleNamespace(model=net, message_hub=hub, iter=0)
    hook._backbones = [model, other]
    hook.after_train_iter(runner, 0)
    got = {
        s: hub.get_scalar(f'train/nr_residual_s{s}').current()
        for s in '123'
    }
    assert got == pytest.approx({'1': 0.1, '2': 0.9, '3': 0.3})
    assert hub.get_scalar('train/nr_unconverged_s3').current() == \
        pytest.approx(0.75)


def test_set_nr_diagnostics_switches_on_by_default_and_off_clears():
    """On by default, on again keeps the stats, off drops them."""
    model = _nr_model()
    model.set_nr_diagnostics()
    attns = _soft_attns(model)
    assert attns and all(m.nr_diagnostics for m in attns)
    with torch.no_grad():
        model(_x(64, 96, b=1))
    stats = model.nr_stats()
    assert sorted(stats) == ['stage1', 'stage2', 'stage3']
    model.set_nr_diagnostics(True)
    assert model.nr_stats() == stats
    model.set_nr_diagnostics(False)
    assert not any(m.nr_diagnostics for m in attns)
    assert all(m.last_nr_stats is None for m in attns)
    assert model.nr_stats() == {}
