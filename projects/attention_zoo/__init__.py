"""The attention zoo of NeurIPS Table 1 as an mmsoft project: importing it
registers its token mixers into ``mmsoft.registry.ATTENTIONS`` (configs:
``custom_imports=dict(imports=['projects.attention_zoo'])``)."""
from .mixers import (LinformerAttention, NystromformerAttention,
                     PerformerAttention, ReducedGridAttention, SimAAttention,
                     SoftmaxZooAttention, ZooAttention)

__all__ = [
    'ZooAttention', 'ReducedGridAttention', 'SoftmaxZooAttention',
    'LinformerAttention', 'PerformerAttention', 'NystromformerAttention',
    'SimAAttention'
]
