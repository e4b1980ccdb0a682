"""Token-mixing attentions that can replace SOFT attention in stages 1-3.

The SOFT backbone takes ``attn_type``; the rest of the architecture (post-norm
blocks, FFN, patch embeddings, the softmax stage 4) stays the same, as in the
comparisons of Table 1 of the NeurIPS paper. Every entry of
:data:`ATTENTIONS` is a module class constructed as::

    cls(embed_dims, num_heads, sampling_ratio, dw_kernel_size=...,
        qkv_bias=..., **extra)

with ``forward(x, hw) -> x`` for tokens x of shape (B, H*W, C).

The zoo (:data:`ATTENTION_TYPES`; one module each in
:mod:`mmsoft.models.layers.zoo`):

==================  ==========================================================
``soft``            SOFT, P A^+ P^T (NeurIPS 2021); ``attn_norm`` selects
``soft_norm``       the normalised P D^-1/2 A^+ D^-1/2 P^T (IJCV 2024)
``softmax``         full softmax attention (``scaled_dot_product_attention``)
``linformer``       softmax over spatially reduced keys / values (PVT
                    spatial reduction, ratio = SOFT's sampling ratio)
``performer``       FAVOR+ positive orthogonal random features
``nystromformer``   softmax Nystrom approximation, 2D average-pooled
                    landmarks (ratio = SOFT's), iterative pseudo-inverse
``sima``            SimA: l1-normalised Q and K per channel across tokens,
                    no softmax, multiplication order from n vs d
==================  ==========================================================

All keep SOFT's per-head depthwise convolution on V (``dw_kernel_size``) and
output projection. :func:`attention_row` / :func:`attention_matrix` give
the mixing weights of any of them (for visualisation and tests).
"""
import inspect
from typing import Dict, Tuple, Type

import torch
import torch.nn as nn

from .soft_attention import SOFTAttention
from .zoo import (LinformerAttention, NystromformerAttention,
                  PerformerAttention, SimAAttention, SoftmaxZooAttention,
                  soft_attention_matrix, soft_attention_row)
from .zoo.common import Index

__all__ = [
    'ATTENTIONS', 'ATTENTION_TYPES', 'register_attention', 'build_attention',
    'attention_row', 'attention_matrix'
]

ATTENTIONS: Dict[str, Type[nn.Module]] = {'soft': SOFTAttention}


def register_attention(name: str):
    """Class decorator adding an attention to :data:`ATTENTIONS`."""

    def wrap(cls):
        ATTENTIONS[name] = cls
        return cls

    return wrap


register_attention('softmax')(SoftmaxZooAttention)
register_attention('linformer')(LinformerAttention)
register_attention('performer')(PerformerAttention)
register_attention('nystromformer')(NystromformerAttention)
register_attention('sima')(SimAAttention)

#: every accepted ``attn_type`` (``soft_norm`` is ``soft`` + attn_norm)
ATTENTION_TYPES: Tuple[str,
                       ...] = ('soft', 'soft_norm', 'softmax', 'linformer',
                               'performer', 'nystromformer', 'sima')

_SOFT_ONLY = ('sampling', 'attn_norm', 'nr_iters', 'nr_init', 'nr_method',
              'max_landmarks', 'nr_backward', 'nr_diagnostics')


def _accepted(cls, key: str) -> bool:
    params = inspect.signature(cls.__init__).parameters
    return key in params or any(p.kind == p.VAR_KEYWORD
                                for p in params.values())


def build_attention(attn_type: str, embed_dims: int, num_heads: int,
                    sampling_ratio: int, **kwargs) -> nn.Module:
    """Build ``attn_type``; ``'soft_norm'`` is ``'soft'`` with attn_norm.

    For the other attentions the SOFT-only keys (``sampling``,
    ``attn_norm``, ``nr_*``) are dropped; ``max_landmarks`` is passed on to
    the attentions with a reduced token set (linformer, nystromformer).
    """
    if attn_type == 'soft_norm':
        attn_type, kwargs = 'soft', dict(kwargs, attn_norm=True)
    if attn_type not in ATTENTIONS:
        raise ValueError(f'unknown attn_type {attn_type!r}; choose one of '
                         f'{sorted(ATTENTIONS) + ["soft_norm"]}')
    cls = ATTENTIONS[attn_type]
    if cls is not SOFTAttention:
        for key in _SOFT_ONLY:
            if key in kwargs and (key != 'max_landmarks'
                                  or not _accepted(cls, key)):
                kwargs.pop(key)
    return cls(embed_dims, num_heads, sampling_ratio, **kwargs)


def attention_row(attn: nn.Module, x: torch.Tensor, hw: Tuple[int, int],
                  index: Index) -> torch.Tensor:
    """(B, h, n) weights with which query ``index`` (flat or (row, col))
    mixes the n = H*W value tokens in the attention module ``attn``.

    ``x`` are the (B, n, C) tokens entering the module. The depthwise
    convolution branch and the projections are not part of the row. Linear
    cost in n for every zoo entry (no n x n matrix is formed).
    """
    if isinstance(attn, SOFTAttention):
        return soft_attention_row(attn, x, hw, index)
    if hasattr(attn, 'attention_row'):
        return attn.attention_row(x, hw, index)
    raise TypeError(f'{type(attn).__name__} has no attention_row')


def attention_matrix(attn: nn.Module, x: torch.Tensor,
                     hw: Tuple[int, int]) -> torch.Tensor:
    """(B, h, n, n) mixing matrix of ``attn`` (small inputs only)."""
    if isinstance(attn, SOFTAttention):
        return soft_attention_matrix(attn, x, hw)
    if hasattr(attn, 'attention_matrix'):
        return attn.attention_matrix(x, hw)
    raise TypeError(f'{type(attn).__name__} has no attention_matrix')
