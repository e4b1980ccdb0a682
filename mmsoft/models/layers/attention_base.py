"""The frame of every token mixer (SOFT and the zoo). Subclasses build
their projections, call :meth:`_build_output_layers` and implement
``_mix(x, hw) -> (out (B, h, n, d), v_tokens (B, n, C) | None)`` and
``_row(x, hw, i) -> (B, h, n)``, query ``i``'s weights over V."""
from typing import Optional, Tuple

import torch
import torch.nn as nn

from .checks import check_int, check_kernel_size
from .safe_conv import conv2d

__all__ = ['AttentionBase', 'query_index']


def query_index(index, hw: Tuple[int, int]) -> int:
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


class AttentionBase(nn.Module):
    """Multi-head token mixer (C = ``embed_dims``, h = ``num_heads``) with
    SOFT's per-head depthwise conv on V (odd ``dw_kernel_size``, 0: none)
    and ``proj``; ``sampling_ratio`` r: the stage's bottleneck ratio."""
    #: the attributes ``extra_repr`` shows after the heads and ratio
    repr_keys: Tuple[str, ...] = ()

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3):
        super().__init__()
        check_int('embed_dims', embed_dims)
        check_int('num_heads', num_heads)
        if embed_dims % num_heads != 0:
            raise ValueError(f'num_heads ({num_heads}) must divide '
                             f'embed_dims ({embed_dims})')
        check_int('sampling_ratio', sampling_ratio)
        check_kernel_size('dw_kernel_size', dw_kernel_size)
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.head_dims = embed_dims // num_heads
        self.sampling_ratio = sampling_ratio
        self.dw_kernel_size = dw_kernel_size

    def _build_output_layers(self) -> None:
        """``dw_conv`` (h filters of k x k, or None) and ``proj``."""
        k, h = self.dw_kernel_size, self.num_heads
        self.dw_conv: Optional[nn.Conv2d] = nn.Conv2d(
            h, h, k, padding=k // 2, groups=h, bias=False) if k else None
        self.proj = nn.Linear(self.embed_dims, self.embed_dims)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, C) -> (B, h, n, d)."""
        B, N, _ = x.shape
        return x.view(B, N, self.num_heads, self.head_dims).transpose(1, 2)

    def dw_conv_tokens(self, v: torch.Tensor, hw: Tuple[int, int]):
        """Per-head k x k conv of the (B, n, C) value tokens: one depthwise
        conv, head g's filter repeated for its d channels (the official
        (B*d, h, H, W) grouped conv without its permuted copies)."""
        B, N, C = v.shape
        x = v.transpose(1, 2).reshape(B, C, *hw)  # a channels-last view
        w = self.dw_conv.weight.repeat_interleave(self.head_dims, 0)
        x = conv2d(x, w, None, 1, self.dw_conv.padding, 1, C)
        return x.flatten(2).transpose(1, 2)

    @staticmethod
    def _check(x: torch.Tensor, hw: Tuple[int, int]) -> None:
        if x.dim() != 3 or x.shape[1] != hw[0] * hw[1]:
            raise ValueError(f'expected (B, {hw[0]}*{hw[1]}, C) tokens, got '
                             f'shape {tuple(x.shape)}')

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: (B, n, C) tokens of an H x W map -> (B, n, C)."""
        self._check(x, hw)
        B, N, C = x.shape
        out, v_tokens = self._mix(x, hw)
        out = out.transpose(1, 2).reshape(B, N, C)
        if self.dw_conv is not None:
            out = out + self.dw_conv_tokens(v_tokens, hw)
        return self.proj(out)

    @torch.no_grad()
    def attention_row(self, x, hw, index) -> torch.Tensor:
        """(B, h, n) weights of query ``index`` (flat or (row, col)) over
        the value tokens, for the (B, n, C) input ``x`` (without the dw conv
        branch and the projections)."""
        self._check(x, hw)
        return self._row(x, hw, query_index(index, hw))

    def _row(self, x, hw, i) -> torch.Tensor:
        """:meth:`attention_row` for the flat query index ``i``."""
        raise NotImplementedError

    @torch.no_grad()
    def attention_matrix(self, x, hw) -> torch.Tensor:
        """The (B, h, n, n) token-mixing matrix, row by row (small n)."""
        n = hw[0] * hw[1]
        return torch.stack([self.attention_row(x, hw, i) for i in range(n)],
                           dim=-2)

    def extra_repr(self) -> str:
        extra = ''.join(f', {k}={getattr(self, k)}' for k in self.repr_keys)
        return f'heads={self.num_heads}, ratio={self.sampling_ratio}{extra}'
