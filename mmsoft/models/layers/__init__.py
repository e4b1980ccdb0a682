from .attention_base import AttentionBase, query_index
from .blocks import (RESIDUAL_DROPS, ConvPatchEmbed, SOFTBlock,
                     SoftmaxAttention, SoftmaxBlock, attention_types,
                     build_attention, residual_drop_cfg)
from .gaussian_kernel import gaussian_kernel
from .grid import landmark_grid, reduce_map
from .nr_config import NRConfig
from .nr_diagnostics import pinv_convergence
from .nr_iteration import nr_init_alpha
from .safe_conv import SafeConv2d
from .soft_attention import (SAMPLING_MODES, BottleneckSampler, SOFTAttention,
                             bottleneck_apply, bottleneck_inverse,
                             soft_attention, with_nr)
from .zoo import (LinformerAttention, NystromformerAttention,
                  PerformerAttention, SimAAttention, SoftmaxZooAttention)

__all__ = [
    'AttentionBase', 'query_index', 'ConvPatchEmbed', 'RESIDUAL_DROPS',
    'residual_drop_cfg', 'SoftmaxAttention', 'SoftmaxBlock', 'SOFTBlock',
    'gaussian_kernel', 'NRConfig', 'nr_init_alpha', 'bottleneck_apply',
    'bottleneck_inverse', 'pinv_convergence', 'SAMPLING_MODES',
    'BottleneckSampler', 'SOFTAttention', 'landmark_grid', 'reduce_map',
    'soft_attention', 'attention_types', 'build_attention',
    'LinformerAttention', 'NystromformerAttention', 'PerformerAttention',
    'SimAAttention', 'SoftmaxZooAttention', 'SafeConv2d', 'with_nr'
]
