"""projects/nr_diagnostics (Fig. 4): statistics, recorder, hook."""
import logging
import types

import pytest
import torch
from conftest import current_log, smooth_kernel, tiny_arch
from mmengine.logging import MessageHub
from mmengine.registry import HOOKS

import projects.nr_diagnostics as nd  # conftest: the checkout on sys.path
import projects.nr_diagnostics.diagnostics as D
from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import gaussian_kernel

pytestmark = pytest.mark.usefixtures('one_thread')  # tiny ops
F64 = torch.float64


# 1 - l v: 0, 0.5 (not > 0.5), 0, 1 (4 eps: outside the rank); rank 1
@pytest.mark.parametrize('lam, v, residual, unconverged', [
    ([4 * 2**-52, .25, .5, 1.], [0., 4., 1., 1.], .25, 0.),
    ([4 * 2**-52, .25, .5, 1.], [0., 4., 0., 1.], .5, 1 / 3),
    ([0., 0., 2.], [9., 9., 0.], 1., 1.)
])
def test_nr_residual_on_known_spectra(monkeypatch, lam, v, residual,
                                      unconverged):
    """max |l (l v - 1)| / max |l|; the share of the rank, strict bounds."""
    monkeypatch.setattr(D, 'scalar_iterate',
                        lambda *a: torch.tensor(v, dtype=F64).expand(2, -1))
    A = torch.diag(torch.tensor(lam, dtype=F64)).expand(2, -1, -1)
    got = nd.nr_residual(A, 20, 'soft_norm_per_matrix')
    assert sorted(got) == ['residual', 'unconverged']
    for key, want in (('residual', residual), ('unconverged', unconverged)):
        assert torch.equal(got[key], torch.full((2, ), want, dtype=F64))


def test_pinv_convergence_is_the_residual_curve():
    """Decreasing (Prop. 2) to nr_residual's; a converged A: none."""
    A = smooth_kernel(2, m=60)
    curve = nd.pinv_convergence(A, 20)
    assert curve.shape == (2, 21) and curve.dtype == F64
    assert ((curve[:, 1:] - curve[:, :-1]) <= 1e-12).all()
    assert curve[:, 0].min() > 0.5
    stats, few = nd.nr_residual(A, 20), nd.nr_residual(A, 3)
    torch.testing.assert_close(
        stats['residual'], curve[:, -1], rtol=1e-6, atol=1e-15)
    assert (few['residual'] > stats['residual']).all()
    assert (few['unconverged'] > stats['unconverged']).all()
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(0))
    A = gaussian_kernel(x / 32**.25, x / 32**.25).double()
    assert nd.pinv_convergence(A, 40)[:, -1].max() < 1e-6
    assert (nd.nr_residual(A, 40)['unconverged'] == 0).all()
    soft = nd.nr_residual(A + 0.01 * torch.eye(12, dtype=F64), 40, 'soft')
    assert (soft['unconverged'] == 0).all()


def tiny_soft():
    torch.manual_seed(0)
    return SOFT(tiny_arch((16, 32, 32, 64), (2, 2, 2, 2), (2, 2, 1, 1)))


def image():
    return torch.randn(
        2, 3, 64, 96, generator=torch.Generator().manual_seed(0))


def test_recorder_takes_each_stages_largest_and_leaves_the_model_alone():
    """Per stage the max; outputs, gradients and RNG unchanged."""
    model, x = tiny_soft().train(), image()
    landmarks = {}
    for i, stage in enumerate(model.stages[:3]):
        for blk in stage.blocks:
            blk.attn.sampler.register_forward_hook(
                lambda m, a, out, i=i: landmarks.setdefault(i, []).append(
                    out.detach().double()))
    torch.manual_seed(1)
    plain = model(x)
    grads = torch.autograd.grad(
        sum(o.sum() for o in plain), model.parameters())
    landmarks.clear()
    rec = nd.NRRecorder(torch.nn.DataParallel(model))  # a model wrapper
    torch.manual_seed(1)
    with rec:
        seen = model(x)
        rng = torch.get_rng_state()
    torch.manual_seed(1)
    model(x)
    assert torch.equal(torch.get_rng_state(), rng)
    again = torch.autograd.grad(sum(o.sum() for o in seen), model.parameters())
    assert all(map(torch.equal, [*seen, *again], [*plain, *grads]))
    assert sorted(rec.stats) == ['stage1', 'stage2', 'stage3']
    for i, lms in landmarks.items():
        per = [nd.nr_residual(gaussian_kernel(lm, lm)) for lm in lms]
        for key in ('unconverged', 'residual'):  # residual: the last
            vals = torch.stack([p[key] for p in per])
            assert vals.shape == (len(lms), 2, 2)  # blocks, B, heads
            assert rec.stats[f'stage{i + 1}'][key] == float(vals.max())
    assert len(set(vals.flatten().tolist())) > 1  # matrices differ
    assert {
        len(blk.attn.sampler._forward_hooks)
        for s in model.stages[:3]
        for blk in s.blocks
    } == {1}  # the recorder's removed


def run(hook, model, iters):
    """(level, message) ``hook`` logs over ``iters`` iterations; runner."""
    hub = MessageHub.get_instance(f'nr_hook_{id(hook)}')
    runner = types.SimpleNamespace(model=model, message_hub=hub, iter=0)
    with current_log() as records:
        hook.before_run(runner)
        for it in range(iters):
            runner.iter = it
            hook.before_train_iter(runner, it)
            with torch.no_grad():
                model(image())
            hook.after_train_iter(runner, it)
        hook.after_run(runner)
    return [(r.levelno, r.getMessage()) for r in records], runner


def test_hook_logs_every_interval_and_warns_once_per_stage():
    """At iterations 2 and 5 only; a warning above warn_unconverged."""
    model = tiny_soft().eval()
    assert HOOKS.get('NRResidualHook') is nd.NRResidualHook
    with pytest.raises(ValueError) as info:
        nd.NRResidualHook(interval=0)
    assert str(info.value) == 'NRResidualHook: interval must be >= 1, got 0'
    with torch.no_grad(), nd.NRRecorder(model) as want:
        model(image())
    want = want.stats
    frac = {s: v['unconverged'] for s, v in want.items()}
    assert frac['stage1'] > 0 and len(set(frac.values())) == 3
    at = sorted(frac, key=frac.get)[1]  # warned above, not at its fraction
    hook = nd.NRResidualHook(interval=3, warn_unconverged=frac[at])
    default = nd.NRResidualHook()
    assert (default.interval, default.warn_unconverged) == (50, 0.1)
    logged, runner = run(hook, model, 6)
    table = [(logging.INFO, 'NR convergence (last forward): ' +
              ', '.join(f'{s} residual {v["residual"]:.2e} unconverged '
                        f'{v["unconverged"]:.1%}' for s, v in want.items()))]
    warned = [(logging.WARNING,
               f'NRResidualHook: in {s} the Newton-Raphson iterations have '
               f"not converged on {v['unconverged']:.0%} of the bottleneck "
               f"matrix's numerical rank (residual {v['residual']:.2e}): the "
               'forward differs from A^+ there. Consider model.backbone.'
               "attn_cfg.nr_backward='exact', more nr_iters or max_landmarks.")
              for s, v in want.items() if v['unconverged'] > frac[at]]
    assert len(warned) == 1 and logged == warned + table * 2  # it 2, 5
    scalars = runner.message_hub.log_scalars.items()  # updated twice
    assert {k: (v.current(), len(v.data[0])) for k, v in scalars} == {
        f'train/nr_{k}_s{s[-1]}': (v[k], 2) for s, v in want.items() for k in v
    }  # yapf: disable
    quiet = nd.NRResidualHook(interval=1, warn_unconverged=None)
    assert [lvl for lvl, _ in run(quiet, model, 2)[0]] == [logging.INFO] * 2
    assert run(quiet, torch.nn.Sequential(), 1)[0] == [
        (logging.WARNING,
         'NRResidualHook: the model has no SOFT backbone; nothing to log')
    ]
