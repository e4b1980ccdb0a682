"""The attention zoo: the token mixers SOFT is compared with in Table 1 of
the NeurIPS paper, one module each, registered in
:data:`mmsoft.registry.ATTENTIONS` (a SOFT stage builds them from its
``attn_cfg``)."""
from .common import ReducedGridAttention, ZooAttention, spread_to_tokens
from .linformer import LinformerAttention
from .nystromformer import NystromformerAttention, iterative_pinv
from .performer import PerformerAttention, orthogonal_gaussian
from .sima import SimAAttention, l1_normalize_tokens, sima_order
from .softmax import SoftmaxZooAttention

__all__ = [
    'ZooAttention', 'ReducedGridAttention', 'spread_to_tokens',
    'LinformerAttention', 'NystromformerAttention', 'iterative_pinv',
    'PerformerAttention', 'orthogonal_gaussian', 'SimAAttention',
    'l1_normalize_tokens', 'sima_order', 'SoftmaxZooAttention'
]
