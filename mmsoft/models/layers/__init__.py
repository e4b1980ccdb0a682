from .attention_zoo import ATTENTIONS, build_attention, register_attention
from .blocks import (FFN, ConvPatchEmbed, DropPath, SOFTBlock,
                     SoftmaxAttention, SoftmaxBlock)
from .gaussian_kernel import gaussian_kernel
from .pinv import (newton_inverse, newton_inverse_apply, nr_init_alpha,
                   pinv_convergence)
from .soft_attention import (SAMPLING_MODES, BottleneckSampler, SOFTAttention,
                             bottleneck_apply, bottleneck_inverse,
                             landmark_grid, soft_attention)

__all__ = [
    'ConvPatchEmbed', 'DropPath', 'FFN', 'SoftmaxAttention', 'SoftmaxBlock',
    'SOFTBlock', 'gaussian_kernel', 'newton_inverse', 'newton_inverse_apply',
    'nr_init_alpha', 'bottleneck_apply', 'bottleneck_inverse',
    'pinv_convergence', 'SAMPLING_MODES', 'BottleneckSampler', 'SOFTAttention',
    'landmark_grid', 'soft_attention', 'ATTENTIONS', 'build_attention',
    'register_attention'
]
