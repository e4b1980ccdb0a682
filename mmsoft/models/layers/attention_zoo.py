"""The token mixer of a SOFT stage from its ``attn_cfg``: ``dict(type=...,
**options)`` of :data:`mmsoft.registry.ATTENTIONS` (listed in
docs/en/advanced_guides/attention_zoo.md), built as ``cls(embed_dims,
num_heads, sampling_ratio, dw_kernel_size, qkv_bias, **options)``."""
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
    """Build the attention ``cfg`` with the stage's :data:`STAGE_ARGS`."""
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
    """``cfg`` with its :data:`NR_KEYS` folded into ``nr`` for a SOFT
    attention; other attentions keep them (and reject them by name)."""
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
