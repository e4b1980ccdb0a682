"""Token-mixing attentions that can replace SOFT attention in stages 1-3.

The SOFT backbone takes ``attn_type``; the rest of the architecture (post-norm
blocks, FFN, patch embeddings, the softmax stage 4) stays the same, as in the
comparisons of Table 1 of the NeurIPS paper. Every entry of
:data:`ATTENTIONS` is a module class constructed as::

    cls(embed_dims, num_heads, sampling_ratio, dw_kernel_size=...,
        qkv_bias=..., **extra)

with ``forward(x, hw) -> x`` for tokens x of shape (B, H*W, C).
"""
from typing import Dict, Type

import torch.nn as nn

from .soft_attention import SOFTAttention

__all__ = ['ATTENTIONS', 'register_attention', 'build_attention']

ATTENTIONS: Dict[str, Type[nn.Module]] = {'soft': SOFTAttention}


def register_attention(name: str):
    """Class decorator adding an attention to :data:`ATTENTIONS`."""

    def wrap(cls):
        ATTENTIONS[name] = cls
        return cls

    return wrap


def build_attention(attn_type: str, embed_dims: int, num_heads: int,
                    sampling_ratio: int, **kwargs) -> nn.Module:
    """Build ``attn_type``; ``'soft_norm'`` is ``'soft'`` with attn_norm."""
    if attn_type == 'soft_norm':
        attn_type, kwargs = 'soft', dict(kwargs, attn_norm=True)
    if attn_type not in ATTENTIONS:
        raise ValueError(f'unknown attn_type {attn_type!r}; choose one of '
                         f'{sorted(ATTENTIONS) + ["soft_norm"]}')
    cls = ATTENTIONS[attn_type]
    if cls is not SOFTAttention:
        for key in ('sampling', 'attn_norm', 'nr_iters', 'nr_init',
                    'nr_method', 'max_landmarks'):
            kwargs.pop(key, None)
    return cls(embed_dims, num_heads, sampling_ratio, **kwargs)
