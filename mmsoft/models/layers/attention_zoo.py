"""Building the token mixer of a SOFT stage from its ``attn_cfg``.

Stages 1-3 of the SOFT backbone take ``attn_cfg=dict(type=..., **options)``,
resolved through the registry :data:`mmsoft.registry.ATTENTIONS`; the rest
of the architecture (post-norm blocks, FFN, patch embeddings, the softmax
stage 4) stays the same, as in the comparisons of Table 1 of the NeurIPS
paper. Every registered attention is constructed as::

    cls(embed_dims, num_heads, sampling_ratio, dw_kernel_size, qkv_bias,
        **options)

(the first five are fixed by the stage) with ``forward(x, hw) -> x`` for
tokens x of shape (B, H*W, C), ``attention_row`` and ``attention_matrix``
(see :class:`~mmsoft.models.layers.attention_base.AttentionBase`).

==============================  =============================================
type (class name / alias)       token mixer
==============================  =============================================
``SOFTAttention`` / ``soft``    SOFT, P A^+ P^T (NeurIPS 2021); with
                                ``attn_norm=True`` (default) the normalised
                                P D^-1/2 A^+ D^-1/2 P^T (IJCV 2024)
``SoftmaxZooAttention`` /       full softmax attention
``softmax``                     (``scaled_dot_product_attention``)
``LinformerAttention`` /        softmax over spatially reduced keys / values
``linformer``                   (PVT spatial reduction, ratio = SOFT's)
``PerformerAttention`` /        FAVOR+ positive orthogonal random features
``performer``
``NystromformerAttention`` /    softmax Nystrom approximation, 2D average-
``nystromformer``               pooled landmarks (ratio = SOFT's)
``SimAAttention`` / ``sima``    SimA: l1-normalised Q and K per channel
                                across tokens, no softmax
==============================  =============================================

Options that the chosen type does not take are errors (the class's
constructor names the option).

The Newton-Raphson settings of SOFT attention are one argument,
``nr=NRConfig(...)`` (or a dict of its fields); in an ``attn_cfg`` they are
written as the keys ``nr_iters``, ``nr_init``, ``nr_method`` and
``nr_backward``, which :func:`build_attention` (and only it) folds into
``nr``. The settings are fixed at construction (see
:class:`~mmsoft.models.layers.nr_config.NRConfig`).
"""
from typing import List

import torch.nn as nn

from mmsoft.registry import ATTENTIONS
from .nr_config import NR_FIELDS
from .soft_attention import SOFTAttention

__all__ = ['build_attention', 'attention_types', 'STAGE_ARGS', 'NR_KEYS']

#: the arguments a SOFT stage passes to every attention (not attn_cfg keys)
STAGE_ARGS = ('embed_dims', 'num_heads', 'sampling_ratio', 'dw_kernel_size',
              'qkv_bias')
#: the attn_cfg keys of the NR settings of SOFT attention -> NRConfig field
NR_KEYS = {f'nr_{field}': field for field in NR_FIELDS}


def build_attention(cfg: dict, **stage_args) -> nn.Module:
    """Build the attention ``cfg`` (``dict(type=..., **options)``) with the
    stage's :data:`STAGE_ARGS` (``embed_dims``, ``num_heads``,
    ``sampling_ratio``, ``dw_kernel_size``, ``qkv_bias``)."""
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise TypeError(f"attn_cfg must be a dict with a 'type' (one of "
                        f'{attention_types()}), got {cfg!r}')
    fixed = sorted(set(cfg) & set(STAGE_ARGS))
    if fixed:
        raise ValueError(
            f'attn_cfg sets {fixed}, which the SOFT stage fixes (from arch '
            f'and qkv_bias); remove them from attn_cfg')
    # in mmsoft's scope: the ATTENTIONS registry has no mmdet / mmseg /
    # mmpretrain child, and mmengine warns when the default scope is theirs
    return ATTENTIONS.build(
        dict(fold_nr_keys(cfg), _scope_='mmsoft'), default_args=stage_args)


def fold_nr_keys(cfg: dict) -> dict:
    """``cfg`` with its keys :data:`NR_KEYS` (``nr_iters``, ``nr_init``,
    ``nr_method``, ``nr_backward``) folded into the ``nr`` argument of a
    SOFT attention: the one place where the config spelling becomes
    :class:`~mmsoft.models.layers.nr_config.NRConfig`'s (which checks the
    values). Other attentions keep the keys and reject them by name."""
    flat = {k: cfg[k] for k in NR_KEYS if k in cfg}
    cls = cfg['type']
    cls = cls if isinstance(cls, type) else ATTENTIONS.get(cls)
    if not flat or not (isinstance(cls, type)
                        and issubclass(cls, SOFTAttention)):
        return cfg
    if cfg.get('nr') is not None:
        raise ValueError(
            f'attn_cfg sets both nr and {sorted(flat)}; give the Newton-'
            f'Raphson settings once (the nr_* keys, or nr=dict(...))')
    out = {k: v for k, v in cfg.items() if k not in flat}
    out['nr'] = {NR_KEYS[k]: v for k, v in flat.items()}
    return out


def attention_types() -> List[str]:
    """Every registered attention type (class names and aliases)."""
    ATTENTIONS.import_from_location()
    return sorted(ATTENTIONS.module_dict)
