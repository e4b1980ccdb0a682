"""The Newton-Raphson convergence of SOFT's bottleneck (Fig. 4), computed
from the landmarks of each :class:`~mmsoft.models.layers.SOFTAttention`
(a forward hook on its sampler) in float64: nothing in mmsoft's model path."""
import logging
from functools import partial
from typing import Dict, Optional

import torch
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.registry import HOOKS

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import SOFTAttention, gaussian_kernel
from mmsoft.models.layers.nr import (newton_iterate, nr_init_alpha,
                                     nr_iteration_matrix)
from mmsoft.models.layers.nr_spectral import scalar_iterate


@torch.no_grad()
def nr_residual(A, iters=20, init='soft_norm_per_sample'):
    """From the eigenvalues l of A (one ``eigvalsh``) and v = v_T(l):
    ``'residual'`` ||A A_T A - A||_2 / ||A||_2 (Fig. 4), ``'unconverged'``
    the share of A's numerical rank with ``|1 - l v| > 0.5``."""
    lam = torch.linalg.eigvalsh(nr_iteration_matrix(A, init))
    v = scalar_iterate(lam, nr_init_alpha(A, init), iters)
    absl = lam.abs()
    lmax = absl.amax(-1, keepdim=True)
    residual = (lam * (lam * v - 1)).abs().amax(-1) / \
        lmax.squeeze(-1).clamp_min(torch.finfo(lam.dtype).tiny)
    rank = absl > lmax * (lam.shape[-1] * torch.finfo(lam.dtype).eps)
    far = ((1 - lam * v).abs() > 0.5) & rank
    return dict(
        residual=residual,
        unconverged=far.sum(-1).to(lam.dtype) /
        rank.sum(-1).clamp_min(1).to(lam.dtype))


@torch.no_grad()
def pinv_convergence(A, iters=20, init='soft_norm_per_sample'):
    """||A A_k A - A||_2 / ||A||_2 for k = 0..iters (Fig. 4), float64,
    (..., iters + 1); the symmetric 2-norms from eigenvalues."""
    A = A.double()
    Aw = nr_iteration_matrix(A, init)
    V = nr_init_alpha(A, init)[..., None, None] * Aw

    def norm2(M):
        return torch.linalg.eigvalsh(0.5 * (M + M.mT)).abs().amax(-1)

    out = [norm2(A @ V @ A - A)]
    for _ in range(iters):
        V = newton_iterate(Aw, V, 1)
        out.append(norm2(A @ V @ A - A))
    return torch.stack(out, -1) / norm2(A)[..., None]


class NRRecorder:
    """While entered, per stage of the SOFT backbones in ``model``, the
    largest :func:`nr_residual` values of the forwards (float):
    ``with NRRecorder(model) as rec: model(x)``, then ``rec.stats``."""

    def __init__(self, model: torch.nn.Module):
        self.attns = [(f'stage{i + 1}', m) for bb in model.modules()
                      if isinstance(bb, SOFT)
                      for i, stage in enumerate(bb.stages)
                      for m in stage.modules() if isinstance(m, SOFTAttention)]
        self.stats: Dict[str, Dict[str, float]] = {}
        self._handles = []

    def __enter__(self) -> 'NRRecorder':
        self.stats = {}
        self._handles = [
            attn.sampler.register_forward_hook(
                partial(self._record, stage, attn.nr))
            for stage, attn in self.attns
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _record(self, stage, nr, sampler, args, landmarks) -> None:
        lm = landmarks.detach().double()
        cur = self.stats.setdefault(stage, {})
        for k, v in nr_residual(gaussian_kernel(lm, lm), nr.iters,
                                nr.init).items():
            cur[k] = max(float(v.max()), cur.get(k, -1.0))


@HOOKS.register_module()
class NRResidualHook(Hook):
    """Every ``interval`` iterations, per SOFT stage, the largest
    ``nr_residual`` (||A A_T A - A|| / ||A||, paper Fig. 4) and
    ``nr_unconverged`` (fraction of A's rank where A_T is far from A^+) of
    that iteration's forward as ``train/nr_*_s<i>`` scalars and a table; a
    warning once per stage above ``warn_unconverged`` (None: never)."""

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) reads the hub

    def __init__(self,
                 interval: int = 50,
                 warn_unconverged: Optional[float] = 0.1):
        if interval < 1:
            raise ValueError(f'NRResidualHook: interval must be >= 1, got '
                             f'{interval}')
        self.interval, self.warn_unconverged = interval, warn_unconverged
        self._warned, self._recorder = set(), None

    def before_run(self, runner) -> None:
        self._recorder = NRRecorder(runner.model)
        if not self._recorder.attns:
            print_log(
                'NRResidualHook: the model has no SOFT backbone; '
                'nothing to log', 'current', logging.WARNING)

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        if self._recorder.attns and self.every_n_train_iters(
                runner, self.interval):
            self._recorder.__enter__()

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if not self._recorder._handles:
            return
        self._recorder.__exit__()
        stats = self._recorder.stats
        for stage, vals in stats.items():
            for k, v in vals.items():
                runner.message_hub.update_scalar(
                    f'train/nr_{k}_s{stage[len("stage"):]}', v)
            frac = vals['unconverged']
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
        if stats:
            print_log(
                'NR convergence (last forward): ' +
                ', '.join(f'{s} residual {v["residual"]:.2e} unconverged '
                          f'{v["unconverged"]:.1%}'
                          for s, v in stats.items()), 'current')

    def after_run(self, runner) -> None:
        if self._recorder is not None:
            self._recorder.__exit__()
