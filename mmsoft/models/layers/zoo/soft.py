"""Attention rows / matrices of :class:`SOFTAttention` (read-only helpers).

For query token i, the row of S^ = P A_n^+ P^T (A_n^+ = D^-1/2 A^+ D^-1/2
with ``attn_norm``, A^+ otherwise) is

    S^_i = P_i A_n^+ P^T                (1 x m) (m x m) (m x n)

which costs O(n m) and never forms the n x n matrix. The pieces are
computed exactly as :func:`mmsoft.models.layers.soft_attention` does
(same kernel, same Newton-Raphson pseudo-inverse and initialisation).
"""
from typing import Tuple

import torch

from ..gaussian_kernel import gaussian_kernel
from ..soft_attention import SOFTAttention, bottleneck_inverse
from .common import Index, query_index

__all__ = [
    'soft_landmarks', 'soft_bottleneck', 'soft_attention_row',
    'soft_attention_matrix'
]


def soft_landmarks(attn: SOFTAttention, x: torch.Tensor, hw: Tuple[int, int]):
    """Scaled queries q (B, h, n, d) and landmarks (B, h, m, d)."""
    q = attn._split(attn.q(x)) * attn.head_dims**-0.25
    return q, attn.sampler(q, hw)


def soft_bottleneck(attn: SOFTAttention, landmarks: torch.Tensor):
    """A (B, h, m, m) and the (normalised) pseudo-inverse A_n^+ used."""
    A = gaussian_kernel(landmarks, landmarks)
    return A, bottleneck_inverse(A, attn.attn_norm, attn.nr_iters,
                                 attn.nr_init, attn.nr_method)


@torch.no_grad()
def soft_attention_row(attn: SOFTAttention, x: torch.Tensor,
                       hw: Tuple[int, int], index: Index) -> torch.Tensor:
    """(B, h, n): row ``index`` of S^ = P A_n^+ P^T."""
    i = query_index(index, hw)
    q, lm = soft_landmarks(attn, x, hw)
    _, A_inv = soft_bottleneck(attn, lm)
    P = gaussian_kernel(q, lm)  # (B, h, n, m)
    return ((P[:, :, i:i + 1] @ A_inv) @ P.transpose(-1, -2)).squeeze(-2)


@torch.no_grad()
def soft_attention_matrix(attn: SOFTAttention, x: torch.Tensor,
                          hw: Tuple[int, int]) -> torch.Tensor:
    """(B, h, n, n): S^ itself (small inputs only)."""
    q, lm = soft_landmarks(attn, x, hw)
    _, A_inv = soft_bottleneck(attn, lm)
    P = gaussian_kernel(q, lm)
    return P @ A_inv @ P.transpose(-1, -2)
