"""Shared frame of the attention zoo (Table 1 of the NeurIPS paper).

Every zoo attention keeps SOFT's block details so that only the token mixer
changes between rows of Table 1: multi-head q / k / v projections, the
per-head depthwise k x k convolution of V added to the mixer's output (one
filter per head, shared by the head's channels; ``dw_kernel_size=0``
disables it) and the output projection ``proj``.

Subclasses implement

* ``_mix(x, hw) -> (out, v)``: the token mixing of tokens x (B, n, C) of an
  H x W map; ``out`` (B, h, n, d) and the full-resolution value tokens
  ``v`` = x W_v (B, n, C) that the depthwise convolution takes (None
  when it is disabled and the mixer does not need them);
* ``attention_row(x, hw, index) -> (B, h, n)``: the weights with which query
  token ``index`` mixes the n tokens (for :mod:`tools.analysis
  .visualize_attention`), without forming the n x n matrix.

:meth:`ZooAttention.attention_matrix` stacks the rows (small inputs only).
"""
from typing import Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..checks import check_kernel_size
from ..soft_attention import SOFTAttention, landmark_grid

__all__ = [
    'ZooAttention', 'reduce_map', 'spread_to_tokens', 'query_index',
    'reduced_grid'
]

Index = Union[int, Sequence[int]]


def query_index(index: Index, hw: Tuple[int, int]) -> int:
    """A flat token index from an int or a (row, col) pair."""
    H, W = hw
    if isinstance(index, (tuple, list)):
        r, c = index
        if not (0 <= r < H and 0 <= c < W):
            raise IndexError(f'query {tuple(index)} outside the {H}x{W} map')
        return int(r) * W + int(c)
    i = int(index)
    if not 0 <= i < H * W:
        raise IndexError(f'query index {i} outside the {H}x{W} map')
    return i


def reduced_grid(hw: Tuple[int, int],
                 ratio: int,
                 max_landmarks: Optional[int] = None,
                 landmark_hw: Optional[Tuple[int,
                                             int]] = None) -> Tuple[int, int]:
    """The landmark / reduced-token grid (same rule as SOFT's sampler)."""
    if landmark_hw is not None:
        return tuple(landmark_hw)
    return landmark_grid(hw, ratio, max_landmarks)


def reduce_map(x: torch.Tensor,
               ratio: int,
               max_landmarks: Optional[int] = None,
               landmark_hw: Optional[Tuple[int, int]] = None,
               conv: Optional[nn.Module] = None) -> torch.Tensor:
    """r x r, stride-r reduction of a (N, C, H, W) map (SOFT's geometry).

    A side shorter than r is zero-padded to r; the last ``H mod r`` rows /
    ``W mod r`` columns are not covered (as in the strided convolution of
    SOFT's sampler). ``conv`` (an r x r stride-r convolution) replaces the
    average pooling. The grid is then adaptively average-pooled down to
    ``landmark_hw`` or to at most ``max_landmarks`` cells, if given.
    """
    H, W = x.shape[-2:]
    r = ratio
    if H < r or W < r:
        x = F.pad(x, (0, max(0, r - W), 0, max(0, r - H)))
    if conv is not None:
        x = conv(x)
    elif r > 1:
        x = F.avg_pool2d(x, r, r)
    if landmark_hw is not None:
        target = tuple(landmark_hw)
    else:
        target = landmark_grid(x.shape[-2:], 1, max_landmarks)
    if tuple(x.shape[-2:]) != target:
        x = F.adaptive_avg_pool2d(x, target)
    return x


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


class ZooAttention(nn.Module):
    """Base class: projections, per-head depthwise conv on V, ``proj``.

    Args:
        embed_dims: token channels.
        num_heads: heads; must divide ``embed_dims``.
        sampling_ratio: r of SOFT's bottleneck at this stage (used by the
            attentions with a reduced token set).
        dw_kernel_size: k of the per-head depthwise conv on V (0: none).
        qkv_bias: biases of the q / k / v projections.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3,
                 qkv_bias: bool = True):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'num_heads ({num_heads}) must divide '
                             f'embed_dims ({embed_dims})')
        if sampling_ratio < 1:
            raise ValueError(f'sampling ratio must be >= 1, got '
                             f'{sampling_ratio}')
        check_kernel_size('dw_kernel_size', dw_kernel_size)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.sampling_ratio = sampling_ratio
        self.scale = self.head_dims**-0.5
        self.dw_conv = nn.Conv2d(
            num_heads,
            num_heads,
            dw_kernel_size,
            padding=dw_kernel_size // 2,
            groups=num_heads,
            bias=False) if dw_kernel_size else None
        self.proj = nn.Linear(embed_dims, embed_dims)

    # ------------------------------------------------------------ helpers
    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        return x.view(B, N, self.num_heads, -1).transpose(1, 2)

    def _to_map(self, t: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """(B, h, n, d) -> (B*h, d, H, W)."""
        B, h, n, d = t.shape
        return t.reshape(B * h, *hw, d).permute(0, 3, 1, 2)

    def _from_map(self, t: torch.Tensor, B: int) -> torch.Tensor:
        """(B*h, d, gh, gw) -> (B, h, gh*gw, d)."""
        d = t.shape[1]
        return t.flatten(2).transpose(1, 2).reshape(B, self.num_heads, -1, d)

    # the per-head depthwise conv on V, shared with SOFT attention (one
    # channels-last conv, head g's filter repeated for its d channels)
    _dw_conv_tokens = SOFTAttention._dw_conv_tokens
    _dw_conv_v = SOFTAttention._dw_conv_v

    @staticmethod
    def _check(x: torch.Tensor, hw: Tuple[int, int]):
        if x.dim() != 3 or x.shape[1] != hw[0] * hw[1]:
            raise ValueError(f'expected (B, {hw[0]}*{hw[1]}, C) tokens, got '
                             f'shape {tuple(x.shape)}')

    # ------------------------------------------------------------ api
    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        raise NotImplementedError

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: (B, N, C) tokens of an H x W map -> (B, N, C)."""
        self._check(x, hw)
        B, N, C = x.shape
        out, v_tokens = self._mix(x, hw)
        out = out.transpose(1, 2).reshape(B, N, C)
        if self.dw_conv is not None:
            out = out + self._dw_conv_tokens(v_tokens, hw)
        return self.proj(out)

    def attention_row(self, x: torch.Tensor, hw: Tuple[int, int],
                      index: Index) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor,
                         hw: Tuple[int, int]) -> torch.Tensor:
        """The (B, h, n, n) token-mixing matrix, row by row (small n)."""
        n = hw[0] * hw[1]
        return torch.stack([self.attention_row(x, hw, i) for i in range(n)],
                           dim=-2)

    def extra_repr(self) -> str:
        return f'heads={self.num_heads}, ratio={self.sampling_ratio}'
