"""NRResidualHook's contract (docs/en/advanced_guides/soft_attention.md)
with stand-in backbones reporting fixed NR statistics (on a real SOFT:
test_backbones/test_soft.py)."""
import logging
import types

import pytest
import torch
from conftest import current_log
from mmengine.logging import MessageHub

from mmsoft.engine.hooks import NRResidualHook


class _Backbone(torch.nn.Module):
    """Reports ``stats`` as :meth:`SOFT.nr_stats`; records the switch."""

    def __init__(self, stats):
        super().__init__()
        self.stats, self.switched = stats, []

    def set_nr_diagnostics(self, enabled=True):
        self.switched.append(enabled)

    def nr_stats(self):
        return self.stats


def _runner(*backbones, it=0):
    model = torch.nn.Sequential(torch.nn.Linear(1, 1), *backbones)
    hub = MessageHub.get_instance(f'nr_hook_{id(model)}')
    return types.SimpleNamespace(model=model, message_hub=hub, iter=it)


def _logged(hook, runner, *iters, before_run=False):
    """(level, message) of what ``hook`` logs in those iterations."""
    with current_log() as records:
        if before_run:
            hook.before_run(runner)
        for it in iters:
            hook.after_train_iter(runner, it)
    return [(r.levelno, r.getMessage()) for r in records]


def test_defaults_switch_and_no_soft_backbone():
    hook = NRResidualHook()
    assert (hook.interval, hook.warn_unconverged) == (50, 0.1)
    assert hook.collect() == {}  # no backbone before the run
    with pytest.raises(ValueError) as info:
        NRResidualHook(interval=0)
    assert str(info.value) == 'NRResidualHook: interval must be >= 1, got 0'
    a, b = _Backbone({}), _Backbone({})
    runner = _runner(a, b)
    runner.model = torch.nn.DataParallel(runner.model)  # a model wrapper
    assert _logged(hook, runner, before_run=True) == []
    assert a.switched == b.switched == [True]
    hook.after_run(runner)
    assert a.switched == b.switched == [True, False]
    hook = NRResidualHook(interval=1)  # nothing in an iteration either
    assert _logged(
        hook, _runner(), 0, before_run=True) == [
            (logging.WARNING,
             'NRResidualHook: the model has no SOFT backbone; nothing to log')
        ]


def test_scalars_are_the_largest_per_stage_and_the_table_every_interval():
    a = _Backbone({
        'stage1': dict(residual=1e-3, unconverged=0.0),
        'stage2': dict(residual=2e-7),
        'stage3': dict(residual=2e-5, unconverged=0.05)
    })
    b = _Backbone({
        'stage1': dict(residual=4e-3, unconverged=0.0),
        'stage4': dict(unconverged=0.0)
    })
    hook = NRResidualHook(interval=3)
    want = [(logging.INFO, 'NR convergence (last forward): stage1 residual '
             '4.00e-03 unconverged 0.0%, stage2 residual 2.00e-07 unconverged'
             ' nan%, stage3 residual 2.00e-05 unconverged 5.0%, stage4 '
             'residual nan unconverged 0.0%')]
    for it, logged in [(1, False), (2, True), (5, True)]:
        runner = _runner(a, b, it=it)
        hook.before_run(runner)
        assert _logged(hook, runner, it) == (want if logged else []), it
    assert {
        k: v.current()
        for k, v in runner.message_hub.log_scalars.items()
    } == {
        'train/nr_residual_s1': 4e-3,
        'train/nr_unconverged_s1': 0.0,
        'train/nr_residual_s2': 2e-7,
        'train/nr_residual_s3': 2e-5,
        'train/nr_unconverged_s3': 0.05,
        'train/nr_unconverged_s4': 0.0
    }


@pytest.mark.parametrize('frac, warned', [(0.1, False), (0.25, True)])
def test_unconverged_stage_warns_once(frac, warned):
    """Above warn_unconverged (not at it): one WARNING per stage."""
    runner = _runner(
        _Backbone({
            'stage2': dict(residual=3e-2, unconverged=frac),
            'stage3': dict(residual=1e-6)  # no fraction: converged
        }))
    hook = NRResidualHook(interval=1000)
    hook.before_run(runner)
    want = (logging.WARNING,
            'NRResidualHook: in stage2 the Newton-Raphson iterations have '
            "not converged on 25% of the bottleneck matrix's numerical rank "
            '(residual 3.00e-02): the forward differs from A^+ there. '
            "Consider model.backbone.attn_cfg.nr_backward='exact', more "
            'nr_iters or max_landmarks.')
    assert _logged(hook, runner, 0, 1) == ([want] if warned else [])
    quiet = NRResidualHook(interval=1000, warn_unconverged=None)
    quiet.before_run(runner)
    assert _logged(quiet, runner, 0) == []
