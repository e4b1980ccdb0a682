"""Log how far the Newton-Raphson iterations are from converged (issue 14).

SOFT's pseudo-inverse runs a fixed number of Newton-Raphson iterations
(20). At 224 x 224 (m = 49 bottleneck tokens) they converge; at detection /
segmentation resolutions (m ~ 950 at 800 x 1216) they do not converge on
the small eigenvalues of the bottleneck matrix A, so the forward computes a
different function from A^+ and the papers' Eq. (16) backward is only an
approximation of its gradient (see ``nr_backward='exact'``).

:class:`NRResidualHook` switches on the backbone's ``nr_diagnostics`` and
logs, per SOFT stage (largest value over the stage's blocks, samples and
heads, from the eigenvalues the spectral method already has; one
``eigvalsh`` per matrix with the iterative method):

* ``nr_residual_s<i>``: ||A A_T A - A||_2 / ||A||_2, the paper's metric
  (Fig. 4; ~1e-7 when converged in float32);
* ``nr_unconverged_s<i>``: the fraction of A's numerical rank on which
  |1 - l v_T(l)| > 0.5, i.e. where A_T is far from A^+.

The values go to the message hub as ``train/nr_*`` scalars (shown in the
training log line and in every visualisation backend) and, every
``interval`` iterations, to the log as a table; a warning is logged once
when a stage's ``unconverged`` exceeds ``warn_unconverged``::

    custom_hooks = [dict(type='NRResidualHook', interval=50)]

in a config (or one that inherits yours with ``_base_``). The attention
option ``attn_cfg=dict(type='SOFTAttention', nr_diagnostics=True)`` and
:meth:`mmsoft.models.backbones.SOFT.nr_stats` give the same numbers
outside a Runner.
"""
from typing import Dict, List, Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

__all__ = ['NRResidualHook']


def soft_backbones(model) -> List:
    """The modules of ``model`` with NR diagnostics (SOFT backbones)."""
    if is_model_wrapper(model):
        model = model.module
    return [
        m for m in model.modules()
        if hasattr(m, 'set_nr_diagnostics') and hasattr(m, 'nr_stats')
    ]


@HOOKS.register_module()
class NRResidualHook(Hook):
    """Log the per-stage NR convergence of the last forward.

    Args:
        interval: log a table every ``interval`` training iterations (the
            message-hub scalars are updated every iteration).
        warn_unconverged: warn (once per stage) when the unconverged
            fraction of a stage exceeds this value; None disables it.
    """

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) reads the hub

    def __init__(self,
                 interval: int = 50,
                 warn_unconverged: Optional[float] = 0.1):
        if interval < 1:
            raise ValueError(f'NRResidualHook: interval must be >= 1, got '
                             f'{interval}')
        self.interval = interval
        self.warn_unconverged = warn_unconverged
        self._warned = set()
        self._backbones: List = []

    def before_run(self, runner) -> None:
        self._backbones = soft_backbones(runner.model)
        if not self._backbones:
            print_log(
                'NRResidualHook: the model has no SOFT backbone; '
                'nothing to log',
                logger='current',
                level=30)
        for bb in self._backbones:
            bb.set_nr_diagnostics(True)

    def collect(self) -> Dict[str, Dict[str, float]]:
        """Per stage, the largest value over all SOFT backbones."""
        out: Dict[str, Dict[str, float]] = {}
        for bb in self._backbones:
            for stage, stats in bb.nr_stats().items():
                cur = out.setdefault(stage, {})
                for k, v in stats.items():
                    cur[k] = max(v, cur.get(k, v))
        return out

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        stats = self.collect()
        if not stats:
            return
        hub = runner.message_hub
        for stage, vals in stats.items():
            s = stage[len('stage'):]
            for k, v in vals.items():
                hub.update_scalar(f'train/nr_{k}_s{s}', v)
            frac = vals.get('unconverged', 0.0)
            if self.warn_unconverged is not None and \
                    frac > self.warn_unconverged and stage not in self._warned:
                self._warned.add(stage)
                print_log(
                    f'NRResidualHook: in {stage} the Newton-Raphson '
                    f'iterations have not converged on {frac:.0%} of the '
                    f'bottleneck matrix\'s numerical rank '
                    f'(residual {vals["residual"]:.2e}); the forward differs '
                    f'from A^+ there and Eq. 16 is not its gradient. '
                    f"Consider model.backbone.attn_cfg.nr_backward='exact', "
                    f'more nr_iters or max_landmarks.',
                    logger='current',
                    level=30)
        if self.every_n_train_iters(runner, self.interval):
            print_log(
                'NR convergence (last forward): ' + ', '.join(
                    f'{stage} residual {v.get("residual", float("nan")):.2e} '
                    f'unconverged {v.get("unconverged", float("nan")):.1%}'
                    for stage, v in stats.items()),
                logger='current')

    def after_run(self, runner) -> None:
        for bb in self._backbones:
            bb.set_nr_diagnostics(False)
