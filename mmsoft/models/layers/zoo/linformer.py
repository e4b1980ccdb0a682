"""Linformer-style attention with spatially reduced keys / values.

As in Table 1 of the NeurIPS paper, the reduction is the spatial-reduction
module of PVT (a special case of Linformer's low-rank projection of keys
and values along the token axis) with the reduction ratio set to SOFT's
sampling ratio r::

    X_r = LN(Conv_{r x r, stride r}(X))          (m = n / r^2 tokens)
    out = softmax(Q (X_r W_k)^T / sqrt(d)) (X_r W_v)

``sr_mode='avgpool'`` replaces the convolution (and its LayerNorm) by r x r
average pooling; then the reduced values are exactly the pooled values
(``v(avgpool(X)) = avgpool(v(X))``) and the mixer is an n x n linear map of
V: ``softmax(Q K_r^T / sqrt d) Pool``.

The depthwise convolution of SOFT's block is applied to the full-resolution
values ``X W_v`` (same ``v`` projection), so the architecture matches SOFT.
The grid of reduced tokens follows SOFT's rule (:func:`landmark_grid`); a
fixed grid (``landmark_hw``) or a cap (``max_landmarks``) can be set, as for
SOFT's bottleneck.
"""
from typing import Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.registry import ATTENTIONS
from ..attention_base import Index, query_index
from ..checks import check_choice
from ..safe_conv import SafeConv2d
from .common import ReducedGridAttention, spread_to_tokens

__all__ = ['LinformerAttention']

SR_MODES = ('conv', 'avgpool')


@ATTENTIONS.register_module(name=['LinformerAttention', 'linformer'])
class LinformerAttention(ReducedGridAttention):
    """Softmax attention over m spatially reduced keys / values.

    ``*args, **kwargs``: see :class:`ReducedGridAttention` (the stage
    arguments, the grid's ``max_landmarks`` and ``landmark_hw``).

    Args:
        sr_mode (str): ``'conv'`` (PVT spatial reduction) or
            ``'avgpool'`` (parameter-free). Default: 'conv'.
    """

    def __init__(self, *args, sr_mode: str = 'conv', **kwargs):
        super().__init__(*args, **kwargs)
        self.sr_mode = check_choice('sr_mode', sr_mode, SR_MODES)
        r, C = self.sampling_ratio, self.embed_dims
        if sr_mode == 'conv' and r > 1:
            self.sr = SafeConv2d(C, C, r, r)
            self.norm = nn.LayerNorm(C)
        else:
            self.sr = self.norm = None

    def _reduce(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """(B, n, C) -> (B, m, C) reduced tokens."""
        B, N, C = x.shape
        xm = x.transpose(1, 2).reshape(B, C, *hw)
        xr = self._reduce_map(xm, conv=self.sr)
        xr = xr.flatten(2).transpose(1, 2)
        return self.norm(xr) if self.norm is not None else xr

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        xr = self._reduce(x, hw)
        q = self._split(self.q(x))
        k, vr = self._split(self.k(xr)), self._split(self.v(xr))
        out = F.scaled_dot_product_attention(q, k, vr)
        return out, (self.v(x) if self.dw_conv is not None else None)

    @torch.no_grad()
    def reduced_attention_row(self, x: torch.Tensor, hw: Tuple[int, int],
                              index: Index) -> torch.Tensor:
        """(B, h, m) softmax weights of query ``index`` over the m keys."""
        self._check(x, hw)
        i = query_index(index, hw)
        q = self._split(self.q(x[:, i:i + 1]))
        k = self._split(self.k(self._reduce(x, hw)))
        return ((q @ k.transpose(-1, -2)).squeeze(-2) * self.scale).softmax(-1)

    def _row(self, x: torch.Tensor, hw: Tuple[int, int],
             i: int) -> torch.Tensor:
        """The reduced row spread over the r x r cells of its keys (exact
        mixing weights of V for ``sr_mode='avgpool'``)."""
        return spread_to_tokens(
            self.reduced_attention_row(x, hw, i), hw, self.sampling_ratio,
            self.max_landmarks, self.landmark_hw)

    def extra_repr(self) -> str:
        return super().extra_repr() + f', sr_mode={self.sr_mode}'
