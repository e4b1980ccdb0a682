"""The SOFT architectures (NeurIPS 2021 Table 2, IJCV 2024 Table 2) and the
authors' checkpoint key map (data for the backbone and the converters)."""

#: levels of the pyramid
NUM_STAGES = 4


def _arch(c3, depths):
    """Widths 64, 128, ``c3``, 512 and 32 channels per head."""
    dims = [64, 128, c3, 512]
    return dict(embed_dims=dims, num_heads=[c // 32 for c in dims],
                depths=depths)  # yapf: disable


#: presets and aliases, as Swin's; ``'small-official'``: the authors' code
ARCH_ZOO = {
    **dict.fromkeys(['tiny', 't'], _arch(320, [1, 2, 3, 2])),
    **dict.fromkeys(['small', 's'], _arch(320, [1, 3, 7, 4])),
    **dict.fromkeys(['medium', 'm'], _arch(288, [1, 3, 29, 5])),
    **dict.fromkeys(['large', 'l'], _arch(320, [1, 3, 40, 5])),
    **dict.fromkeys(['huge', 'h'], _arch(352, [1, 5, 49, 5])),
    'small-official': _arch(320, [1, 3, 20, 4]),
}  # yapf: disable

#: the optional entries of an arch dict and their defaults
ARCH_DEFAULTS = dict(sampling_ratios=[8, 4, 2, 1], mlp_ratios=[4, 4, 4, 4],
                     dw_kernel_sizes=[9, 5, 3, None])  # yapf: disable

#: where the authors publish their ImageNet-1k files (README, Main results)
OFFICIAL_PAGE = 'https://github.com/fudan-zvg/SOFT#main-results'
#: The authors' ImageNet-1k models (a literal: docs/gen_tables.py reads it)
# yapf: disable
OFFICIAL_FILES = {
    'soft_tiny': {'link': 'SOFT_Tiny', 'more_links': ['SOFT_Tiny_cuda'],
                  'readme': '13M', 'arch': 'tiny', 'depths': [1, 2, 3, 2],
                  'params': 13.1, 'configs': ['soft_tiny_in1k']},
    'soft_small': {'link': None, 'readme': '24M', 'arch': 'small',
                   'depths': [1, 3, 7, 4], 'params': 24.1,
                   'code_arch': ['small-official', [1, 3, 20, 4], 38.9],
                   'configs': ['soft_small_in1k']},
    'soft_medium': {'link': None, 'readme': '45M', 'arch': 'medium',
                    'depths': [1, 3, 29, 5], 'params': 45.8,
                    'configs': ['soft_medium_in1k']},
    'soft_large': {'link': None, 'readme': '64M', 'arch': 'large',
                   'depths': [1, 3, 40, 5], 'params': 64.7,
                   'configs': ['soft_large_in1k']},
    'soft_huge': {'link': None, 'readme': '87M', 'arch': 'huge',
                  'depths': [1, 5, 49, 5], 'params': 87.1,
                  'configs': ['soft_huge_in1k']},
    'soft_norm_tiny': {
        'link': 'SOFT_Tiny_norm', 'readme': '13M', 'arch': 'tiny',
        'depths': [1, 2, 3, 2], 'params': 13.1, 'configs': [
            'soft_norm_tiny_in1k', 'retinanet_soft_tiny_1x',
            'mask_rcnn_soft_tiny_1x']},
    'soft_norm_small': {
        'link': 'SOFT_Small_norm', 'readme': '24M', 'arch': 'small',
        'depths': [1, 3, 7, 4], 'params': 24.1,
        'code_arch': ['small-official', [1, 3, 20, 4], 38.9], 'configs': [
            'soft_norm_small_in1k', 'retinanet_soft_small_1x',
            'mask_rcnn_soft_small_1x', 'mask_rcnn_soft_small_3x_ms',
            'cascade_mask_rcnn_soft_small_3x_ms', 'atss_soft_small_3x_ms',
            'gfl_soft_small_3x_ms', 'sparse_rcnn_soft_small_3x_ms',
            'upernet_soft_small_512x512_160k_ade20k']},
    'soft_norm_medium': {
        'link': 'SOFT_Medium_norm', 'readme': '45M', 'arch': 'medium',
        'depths': [1, 3, 29, 5], 'params': 45.8, 'configs': [
            'soft_norm_medium_in1k', 'retinanet_soft_medium_1x',
            'mask_rcnn_soft_medium_1x',
            'upernet_soft_medium_512x512_160k_ade20k']},
    'soft_norm_large': {
        'link': 'SOFT_Large_norm', 'readme': '64M', 'arch': 'large',
        'depths': [1, 3, 40, 5], 'params': 64.7, 'configs': [
            'soft_norm_large_in1k', 'retinanet_soft_large_1x',
            'mask_rcnn_soft_large_1x']},
    'soft_norm_huge': {'link': None, 'readme': '87M', 'arch': 'huge',
                       'depths': [1, 5, 49, 5], 'params': 87.1,
                       'configs': ['soft_norm_huge_in1k']},
}
# yapf: enable

#: the official model sizes and their mmsoft presets
OFFICIAL_PRESETS = dict(tiny='tiny', small='small-official', medium='medium',
                        large='large', huge='huge')  # yapf: disable

#: official -> mmsoft key prefix in a block of stages 1-3 (fudan-zvg/SOFT)
OFFICIAL_SOFT_BLOCK = (
    ('att.mha.W_q.', 'attn.q.'), ('att.mha.W_v.', 'attn.v.'),
    ('att.mha.attn.Qlandmark_op.', 'attn.sampler.conv.'),
    ('att.mha.attn.Qnorm_act.0.', 'attn.sampler.norm.'),
    ('att.mha.attn.conv.', 'attn.dw_conv.'), ('att.mha.ff.', 'attn.proj.'),
    ('att.norm1.', 'norm1.'), ('att.ff1.', 'ffn.layers.0.0.'),  # mmcv FFN
    ('att.ff2.', 'ffn.layers.1.'), ('att.norm2.', 'norm2.'),
)  # yapf: disable
#: a block of stage 4 (timm's pre-norm softmax attention block)
OFFICIAL_SOFTMAX_BLOCK = tuple(
    (k, k)
    for k in ('norm1.', 'attn.q.', 'attn.kv.', 'attn.proj.', 'norm2.')) + (
        ('mlp.fc1.', 'ffn.layers.0.0.'), ('mlp.fc2.', 'ffn.layers.1.'))

#: (stage, conv) of the official (conv, BN, ReLU) patch embeddings
OFFICIAL_STEM = ((0, 0), (0, 1), (0, 2), (1, 0), (2, 0), (3, 0))

#: official -> mmsoft key template (``{j}``: block; '.': + tensor name)
KEY_MAP = [(f'pos_embed{s + 1}', f'stages.{s}.pos_embed')
           for s in range(NUM_STAGES)] + [
    ('cls_token', 'stages.3.cls_token'), ('norm.', 'stages.3.norm.'),
    ('head.', 'head.fc.')] + [
    (f'patch_embed{s + 1}.proj.{3 * n + i}.',
     f'stages.{s}.patch_embed.proj.{n}.{("conv", "bn")[i]}.')
    for s, n in OFFICIAL_STEM for i in (0, 1)] + [
    (f'block{s + 1}.{{j}}.{o}', f'stages.{s}.blocks.{{j}}.{m}')
    for s in range(NUM_STAGES)
    for o, m in (OFFICIAL_SOFT_BLOCK if s < 3 else OFFICIAL_SOFTMAX_BLOCK)
]  # yapf: disable
