"""Newton-Raphson convergence diagnostics of a backbone's SOFT attentions.

:class:`NRDiagnosticsMixin` gives a backbone with ``stages`` (a
``ModuleList``) :meth:`~NRDiagnosticsMixin.set_nr_diagnostics` and
:meth:`~NRDiagnosticsMixin.nr_stats`, which ``NRResidualHook`` and the NR
analysis tools call. Every module with ``last_nr_stats`` (a SOFT attention,
:class:`~mmsoft.models.layers.SOFTAttention`) takes part.
"""
from typing import Dict, List

import torch

__all__ = ['NRDiagnosticsMixin']


class NRDiagnosticsMixin:
    """``set_nr_diagnostics`` / ``nr_stats`` for a module with ``stages``."""

    def set_nr_diagnostics(self, enabled: bool = True) -> None:
        """Switch the NR convergence recording of every SOFT attention."""
        for m in self.modules():
            if hasattr(m, 'last_nr_stats'):
                m.nr_diagnostics = enabled
                if not enabled:
                    m.last_nr_stats = None

    @torch.no_grad()
    def nr_stats(self) -> Dict[str, Dict[str, float]]:
        """NR convergence of the last forward, per SOFT stage.

        ``{'stage1': {'residual': ..., 'unconverged': ...}, ...}``: the
        largest ||A A_T A - A||_2 / ||A||_2 (paper Fig. 4) and the largest
        fraction of A's numerical rank with ``|1 - l v_T(l)| > 0.5`` over the
        matrices (samples, heads, blocks) of the stage. Empty unless
        ``nr_diagnostics`` is on (see :meth:`set_nr_diagnostics`).
        """
        out: Dict[str, Dict[str, float]] = {}
        for i, stage in enumerate(self.stages):
            per_key: Dict[str, List[torch.Tensor]] = {}
            for m in stage.modules():
                stats = getattr(m, 'last_nr_stats', None)
                for k, v in (stats or {}).items():
                    per_key.setdefault(k, []).append(v.amax())
            if per_key:
                out[f'stage{i + 1}'] = {
                    k: float(torch.stack(v).amax())
                    for k, v in per_key.items()
                }
        return out
