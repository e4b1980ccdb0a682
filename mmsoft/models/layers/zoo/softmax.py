"""Full softmax attention (the "Transformer" row of Table 1).

    out = softmax(Q K^T / sqrt(d)) V

computed by :func:`torch.nn.functional.scaled_dot_product_attention`, so
the backend (math, flash, memory-efficient) is torch's choice; wrap calls in
``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` to materialise the
n x n matrix as the paper's Transformer did (``memory_vs_length.py`` has a
``softmax:math`` entry for that).
"""
from typing import Tuple

import torch
import torch.nn.functional as F

from mmsoft.registry import ATTENTIONS
from .common import ZooAttention

__all__ = ['SoftmaxZooAttention']


@ATTENTIONS.register_module(name=['SoftmaxZooAttention', 'softmax'])
class SoftmaxZooAttention(ZooAttention):
    """Multi-head softmax attention with SOFT's block details.

    Args: those of :class:`ZooAttention` (``sampling_ratio`` is unused).
    """

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        vt = self.v(x)
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), \
            self._split(vt)
        return F.scaled_dot_product_attention(q, k, v), vt

    def _row(self, x: torch.Tensor, hw: Tuple[int, int],
             i: int) -> torch.Tensor:
        q = self._split(self.q(x[:, i:i + 1]))
        k = self._split(self.k(x))
        logits = (q @ k.transpose(-1, -2)).squeeze(-2) * self.scale
        return logits.softmax(-1)
