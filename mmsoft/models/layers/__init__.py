from .amp import CheckedConvs, SafeConv2d
from .nr import NRConfig, nr_init_alpha
from .soft_attention import (SAMPLING_MODES, AttentionBase, BottleneckSampler,
                             SOFTAttention, bottleneck_apply,
                             bottleneck_inverse, gaussian_kernel,
                             landmark_grid, query_index, reduce_map,
                             soft_attention, with_nr)

__all__ = [
    'AttentionBase', 'query_index', 'gaussian_kernel', 'NRConfig',
    'nr_init_alpha', 'bottleneck_apply', 'bottleneck_inverse',
    'SAMPLING_MODES', 'BottleneckSampler', 'SOFTAttention', 'landmark_grid',
    'reduce_map', 'soft_attention', 'SafeConv2d', 'CheckedConvs', 'with_nr'
]
