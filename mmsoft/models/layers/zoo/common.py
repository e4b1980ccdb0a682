"""Shared frame of the attention zoo (Table 1 of the NeurIPS paper).

Every zoo attention keeps SOFT's block details (:class:`AttentionBase`: the
per-head depthwise conv of V and the output projection) so that only the
token mixer changes between rows of Table 1. :class:`ZooAttention` adds the
three projections q / k / v all of them use; subclasses implement ``_mix``
and ``attention_row`` (see :mod:`mmsoft.models.layers.attention_base`).
:class:`ReducedGridAttention` adds the reduced token grid (SOFT's
bottleneck rule) of the attentions that attend to fewer tokens.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from ..attention_base import AttentionBase
from ..grid import reduce_map

__all__ = ['ZooAttention', 'ReducedGridAttention', 'spread_to_tokens']


def spread_to_tokens(w: torch.Tensor,
                     hw: Tuple[int, int],
                     ratio: int,
                     max_landmarks: Optional[int] = None,
                     landmark_hw: Optional[Tuple[int,
                                                 int]] = None) -> torch.Tensor:
    """Spread weights over m reduced tokens back onto the n = H*W tokens.

    ``w`` (..., m) -> (..., n): the transpose of the average-pooling operator
    of :func:`reduce_map`, so each token receives ``w_j / |cell j|`` and the
    total weight is preserved (tokens outside every cell get 0).
    """
    lead = w.shape[:-1]
    H, W = hw
    z = torch.zeros(
        1, 1, H, W, dtype=w.dtype, device=w.device, requires_grad=True)
    with torch.enable_grad():
        y = reduce_map(z, ratio, max_landmarks, landmark_hw)
        m = y.shape[-2] * y.shape[-1]
        if w.shape[-1] != m:
            raise ValueError(f'{w.shape[-1]} weights for {m} reduced tokens')
        wf = w.detach().reshape(-1, m)
        # one vector-Jacobian product per row of weights
        outs = [
            torch.autograd.grad(y.flatten() @ row, z,
                                retain_graph=True)[0].flatten() for row in wf
        ]
    return torch.stack(outs).reshape(*lead, H * W)


class ZooAttention(AttentionBase):
    """Base class of the zoo: q / k / v projections (biases:
    ``qkv_bias``), SOFT's per-head depthwise conv on V and ``proj``.

    The other arguments are those of
    :class:`~mmsoft.models.layers.AttentionBase`. Subclasses
    take these (set by the SOFT stage) as ``*args, **kwargs`` and their own
    options as keyword arguments.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3,
                 qkv_bias: bool = True):
        super().__init__(embed_dims, num_heads, sampling_ratio, dw_kernel_size)
        self.scale = self.head_dims**-0.5
        self._build_output_layers()
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.k = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.v = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)


class ReducedGridAttention(ZooAttention):
    """A zoo attention over m reduced tokens on SOFT's bottleneck grid
    (:func:`mmsoft.models.layers.grid.reduce_map`: r x r cells, r = the
    stage's sampling ratio).

    The stage arguments (``*args, **kwargs``) are those of
    :class:`ZooAttention`.

    Args:
        max_landmarks (int | None): cap on m (adaptive pooling of the
            reduced grid). Default: None.
        landmark_hw (tuple[int, int] | None): a fixed reduced grid (gh, gw)
            wherever the strided grid is that large (a larger side is
            clamped to the strided grid's). Default: None.
    """

    def __init__(self,
                 *args,
                 max_landmarks: Optional[int] = None,
                 landmark_hw: Optional[Tuple[int, int]] = None,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.max_landmarks = max_landmarks
        self.landmark_hw = landmark_hw

    def _reduce_map(self,
                    t: torch.Tensor,
                    conv: Optional[nn.Module] = None) -> torch.Tensor:
        """:func:`reduce_map` on this grid."""
        return reduce_map(t, self.sampling_ratio, self.max_landmarks,
                          self.landmark_hw, conv)
