"""One module per attention of the zoo (registered in ``attention_zoo``)."""
from .common import ZooAttention, query_index, reduce_map, spread_to_tokens
from .linformer import LinformerAttention
from .nystromformer import NystromformerAttention, iterative_pinv
from .performer import PerformerAttention, orthogonal_gaussian
from .sima import SimAAttention, l1_normalize_tokens, sima_order
from .soft import (soft_attention_matrix, soft_attention_row, soft_bottleneck,
                   soft_landmarks)
from .softmax import SoftmaxZooAttention

__all__ = [
    'ZooAttention', 'query_index', 'reduce_map', 'spread_to_tokens',
    'LinformerAttention', 'NystromformerAttention', 'iterative_pinv',
    'PerformerAttention', 'orthogonal_gaussian', 'SimAAttention',
    'l1_normalize_tokens', 'sima_order', 'soft_attention_matrix',
    'soft_attention_row', 'soft_bottleneck', 'soft_landmarks',
    'SoftmaxZooAttention'
]
