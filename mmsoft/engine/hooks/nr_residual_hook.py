"""SOFT's Newton-Raphson convergence in the training log
(docs/en/advanced_guides/soft_attention.md)."""
import logging
from math import nan
from typing import Dict, Optional

from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS


@HOOKS.register_module()
class NRResidualHook(Hook):
    """Per SOFT stage, the largest ``nr_residual`` (||A A_T A - A|| / ||A||,
    paper Fig. 4) and ``nr_unconverged`` (fraction of A's rank where A_T is
    far from A^+) of the last forward as ``train/nr_*_s<i>`` scalars, a
    table every ``interval`` iterations, a warning once per stage above
    ``warn_unconverged`` (None: never)."""

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) reads the hub

    def __init__(self,
                 interval: int = 50,
                 warn_unconverged: Optional[float] = 0.1):
        if interval < 1:
            raise ValueError(f'NRResidualHook: interval must be >= 1, got '
                             f'{interval}')
        self.interval, self.warn_unconverged = interval, warn_unconverged
        self._warned, self._backbones = set(), []

    def before_run(self, runner) -> None:
        self._backbones = [
            m for m in runner.model.modules()
            if hasattr(m, 'set_nr_diagnostics')
        ]
        if not self._backbones:
            print_log(
                'NRResidualHook: the model has no SOFT backbone; '
                'nothing to log', 'current', logging.WARNING)
        for bb in self._backbones:
            bb.set_nr_diagnostics(True)

    def collect(self) -> Dict[str, Dict[str, float]]:
        """Per stage, the largest value of all SOFT backbones."""
        out = {}
        for bb in self._backbones:
            for stage, stats in bb.nr_stats().items():
                cur = out.setdefault(stage, {})
                for k, v in stats.items():
                    cur[k] = max(v, cur.get(k, v))
        return out

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        stats = self.collect()
        for stage, vals in stats.items():
            for k, v in vals.items():
                runner.message_hub.update_scalar(
                    f'train/nr_{k}_s{stage[len("stage"):]}', v)
            frac = vals.get('unconverged', 0.0)
            if self.warn_unconverged is not None and stage not in \
                    self._warned and frac > self.warn_unconverged:
                self._warned.add(stage)
                print_log(
                    f'NRResidualHook: in {stage} the Newton-Raphson '
                    f'iterations have not converged on {frac:.0%} of the '
                    f'bottleneck matrix\'s numerical rank (residual '
                    f'{vals["residual"]:.2e}): the forward differs from A^+ '
                    f"there. Consider model.backbone.attn_cfg.nr_backward="
                    f"'exact', more nr_iters or max_landmarks.", 'current',
                    logging.WARNING)
        if stats and self.every_n_train_iters(runner, self.interval):
            print_log(
                'NR convergence (last forward): ' + ', '.join(
                    f'{s} residual {v.get("residual", nan):.2e} unconverged '
                    f'{v.get("unconverged", nan):.1%}'
                    for s, v in stats.items()), 'current')

    def after_run(self, runner) -> None:
        for bb in self._backbones:
            bb.set_nr_diagnostics(False)
