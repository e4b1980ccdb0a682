"""The architecture of an official SOFT checkpoint, read off its shapes.

* :func:`infer_official_arch` - the architecture of an official-layout state
  dict, from tensor shapes;
* :func:`official_shapes` - the complete official key -> shape table of an
  architecture (used to report unknown / missing keys and shape mismatches);
* :func:`arch_for_mmsoft`, :func:`match_arch_preset`, :func:`describe_arch`,
  :func:`official_model_name` - the same architecture as mmsoft's
  ``SOFT.arch_zoo`` preset / arch dict / official model name.

Whether a checkpoint is a ``soft_*`` (NeurIPS) or a ``soft_norm_*`` (IJCV)
model is NOT visible in its weights: both have exactly the same tensors.
Neither is the number of heads of stage 4 (standard softmax attention over
one fused ``kv`` projection); it is assumed to keep the head width of stage 3
(32 in every official model) unless given explicitly.
"""
from collections import Counter, OrderedDict
from typing import Dict, Mapping, Optional, Tuple

import torch

from mmsoft.utils.checkpoint_files import ConversionError
from ..arch_zoo import ARCH_DEFAULTS, ARCH_ZOO
from .official_keys import BN_KEYS, official_block

__all__ = [
    'infer_official_arch', 'official_shapes', 'match_arch_preset',
    'arch_for_mmsoft', 'describe_arch', 'official_model_name',
    'OFFICIAL_MODELS', 'OFFICIAL_PRESETS', 'OFFICIAL_STEM_CHANNELS',
    'OFFICIAL_FILES', 'OFFICIAL_PAGE'
]

#: hidden channels of the official three-conv stem
OFFICIAL_STEM_CHANNELS = 32
#: mmsoft's defaults for the optional arch entries
_DEFAULTS = ARCH_DEFAULTS
#: the official timm model functions (``soft_*``; ``soft_norm_*`` has the
#: same shapes) and the mmsoft preset with their architecture
OFFICIAL_PRESETS = {
    'tiny': 'tiny',
    'small': 'small-official',
    'medium': 'medium',
    'large': 'large',
    'huge': 'huge',
}
#: embed_dims, num_heads, depths of each official model function
OFFICIAL_MODELS = {
    name: tuple(ARCH_ZOO[preset][k]
                for k in ('embed_dims', 'num_heads', 'depths'))
    for name, preset in OFFICIAL_PRESETS.items()
}

#: where the authors publish their ImageNet-1k files (README, Main results)
OFFICIAL_PAGE = 'https://github.com/fudan-zvg/SOFT#main-results'
#: The authors' ImageNet-1k models, one source for the docs' table
#: (docs/gen_tables.py reads this literal), the paper configs' checkpoints
#: (tests/test_configs/test_official_files.py checks every entry against
#: the configs, the presets and a strict load) and the message of a missing
#: file. ``link``: the file's link text in the README, None where no file is
#: published; ``readme``: the README's parameter count; ``arch``: the preset
#: the paper configs load it into (``depths`` / ``params``, millions, with
#: the 1000-class head); ``code_arch``: the preset, depths and params of the
#: authors' model function where it differs (``soft_small`` /
#: ``soft_norm_small``: which of the two a released file holds is only known
#: from the file, and the loader names it);
#: ``configs``: the paper configs that expect this file.
# yapf: disable
OFFICIAL_FILES = {
    'soft_tiny': {
        'link': 'SOFT_Tiny', 'readme': '13M', 'arch': 'tiny',
        'depths': [1, 2, 3, 2], 'params': 13.1,
        'configs': ['soft_tiny_in1k']},
    'soft_small': {
        'link': None, 'readme': '24M', 'arch': 'small',
        'depths': [1, 3, 7, 4], 'params': 24.1,
        'code_arch': ['small-official', [1, 3, 20, 4], 38.9],
        'configs': ['soft_small_in1k']},
    'soft_medium': {
        'link': None, 'readme': '45M', 'arch': 'medium',
        'depths': [1, 3, 29, 5], 'params': 45.8,
        'configs': ['soft_medium_in1k']},
    'soft_large': {
        'link': None, 'readme': '64M', 'arch': 'large',
        'depths': [1, 3, 40, 5], 'params': 64.7,
        'configs': ['soft_large_in1k']},
    'soft_huge': {
        'link': None, 'readme': '87M', 'arch': 'huge',
        'depths': [1, 5, 49, 5], 'params': 87.1,
        'configs': ['soft_huge_in1k']},
    'soft_norm_tiny': {
        'link': 'SOFT_Tiny_norm', 'readme': '13M', 'arch': 'tiny',
        'depths': [1, 2, 3, 2], 'params': 13.1,
        'configs': ['soft_norm_tiny_in1k', 'retinanet_soft_tiny_1x',
                    'mask_rcnn_soft_tiny_1x']},
    'soft_norm_small': {
        'link': 'SOFT_Small_norm', 'readme': '24M', 'arch': 'small',
        'depths': [1, 3, 7, 4], 'params': 24.1,
        'code_arch': ['small-official', [1, 3, 20, 4], 38.9],
        'configs': ['soft_norm_small_in1k', 'retinanet_soft_small_1x',
                    'mask_rcnn_soft_small_1x', 'mask_rcnn_soft_small_3x_ms',
                    'cascade_mask_rcnn_soft_small_3x_ms',
                    'atss_soft_small_3x_ms', 'gfl_soft_small_3x_ms',
                    'sparse_rcnn_soft_small_3x_ms',
                    'upernet_soft_small_512x512_160k_ade20k']},
    'soft_norm_medium': {
        'link': 'SOFT_Medium_norm', 'readme': '45M', 'arch': 'medium',
        'depths': [1, 3, 29, 5], 'params': 45.8,
        'configs': ['soft_norm_medium_in1k', 'retinanet_soft_medium_1x',
                    'mask_rcnn_soft_medium_1x',
                    'upernet_soft_medium_512x512_160k_ade20k']},
    'soft_norm_large': {
        'link': 'SOFT_Large_norm', 'readme': '64M', 'arch': 'large',
        'depths': [1, 3, 40, 5], 'params': 64.7,
        'configs': ['soft_norm_large_in1k', 'retinanet_soft_large_1x',
                    'mask_rcnn_soft_large_1x']},
    'soft_norm_huge': {
        'link': None, 'readme': '87M', 'arch': 'huge',
        'depths': [1, 5, 49, 5], 'params': 87.1,
        'configs': ['soft_norm_huge_in1k']},
}
# yapf: enable


def _shape(sd: Mapping[str, torch.Tensor], key: str) -> Tuple[int, ...]:
    if key not in sd:
        raise ConversionError(
            f'cannot infer the architecture: key {key!r} is missing')
    return tuple(sd[key].shape)


def _ratio(hidden: int, dims: int):
    r = hidden / dims
    return int(r) if float(r).is_integer() else r


def _typical_block(sd: Mapping[str, torch.Tensor], stage: int,
                   depth: int) -> str:
    """Key prefix of the block whose shape-defining tensors are the most
    common in the stage (block 0 on ties), so that one corrupted block is
    reported as the odd one out rather than redefining the stage."""
    names = ('mha.attn.Qlandmark_op.weight', 'mha.attn.conv.weight',
             'ff1.weight')
    sig = []
    for j in range(depth):
        pre = f'block{stage + 1}.{j}.att.'
        sig.append(
            tuple(
                tuple(sd[pre + n].shape) if pre + n in sd else None
                for n in names))
    counts = Counter(s for s in sig if None not in s)
    if not counts:
        return f'block{stage + 1}.0.att.'
    best = max(counts.values())
    j = next(j for j, s in enumerate(sig) if counts.get(s) == best)
    return f'block{stage + 1}.{j}.att.'


def infer_official_arch(sd: Mapping[str, torch.Tensor],
                        stage4_heads: Optional[int] = None) -> Dict:
    """Architecture of an official-layout state dict, from tensor shapes.

    Returns a dict with ``embed_dims``, ``num_heads``, ``depths``,
    ``sampling_ratios``, ``mlp_ratios``, ``dw_kernel_sizes`` (mmsoft's arch
    dict entries), ``in_channels``, ``num_classes`` (0 without a head),
    ``pretrain_img_size`` and ``stage4_heads_given`` (stage 4's heads are
    not in the weights: False means they were assumed from stage 3's head
    width).

    Read from: ``pos_embed{i}`` (widths, image size), block indices (depths),
    ``att.mha.attn.conv.weight`` (heads, depthwise kernel),
    ``att.mha.attn.Qlandmark_op.weight`` (head width, sampling ratio),
    ``att.ff1`` / ``mlp.fc1`` (MLP ratios), ``patch_embed1.proj.0`` (input
    channels), ``head`` (classes).
    """
    embed_dims, depths = [], []
    for i in range(4):
        shp = _shape(sd, f'pos_embed{i + 1}')
        if len(shp) != 3:
            raise ConversionError(
                f'cannot infer the architecture: pos_embed{i + 1} should be '
                f'(1, N, C), found {shp}')
        embed_dims.append(shp[-1])
        idx = set()
        for k in sd:
            stage_block = official_block(k)
            if stage_block and stage_block[0] == i + 1:
                idx.add(stage_block[1])
        if not idx:
            raise ConversionError(
                f'cannot infer the architecture: no block{i + 1}.* keys')
        depths.append(max(idx) + 1)

    num_heads, sampling_ratios, dw_kernel_sizes, mlp_ratios = [], [], [], []
    head_dims = None
    for i in range(3):
        pre = _typical_block(sd, i, depths[i])
        lm = _shape(sd, pre + 'mha.attn.Qlandmark_op.weight')
        dw = _shape(sd, pre + 'mha.attn.conv.weight')
        if len(lm) != 4 or len(dw) != 4:
            raise ConversionError(
                f'cannot infer the architecture: {pre}mha.attn.'
                f'Qlandmark_op.weight should be (d, d, r, r) and '
                f'{pre}mha.attn.conv.weight (heads, 1, k, k); found {lm} and '
                f'{dw} (linear landmark ops, sr_ratio 1, are not supported)')
        head_dims = lm[0]
        heads = dw[0]
        if heads * head_dims != embed_dims[i]:
            raise ConversionError(
                f'inconsistent stage {i + 1}: {heads} heads (from '
                f'{pre}mha.attn.conv.weight {dw}) x head width {head_dims} '
                f'(from {pre}mha.attn.Qlandmark_op.weight {lm}) != '
                f'embed dim {embed_dims[i]} (from pos_embed{i + 1})')
        num_heads.append(heads)
        sampling_ratios.append(lm[-1])
        dw_kernel_sizes.append(dw[-1])
        mlp_ratios.append(
            _ratio(_shape(sd, pre + 'ff1.weight')[0], embed_dims[i]))
    stage4_given = stage4_heads is not None
    if stage4_given and (isinstance(stage4_heads, bool)
                         or not isinstance(stage4_heads, int)
                         or stage4_heads < 1):
        raise ConversionError(f'stage-4 heads must be a positive integer, '
                              f'got {stage4_heads!r}')
    if stage4_heads is None:
        if embed_dims[3] % head_dims:
            raise ConversionError(
                f'cannot guess the heads of stage 4: embed dim '
                f'{embed_dims[3]} is not a multiple of the head width '
                f'{head_dims} of stage 3; give them explicitly')
        stage4_heads = embed_dims[3] // head_dims
    elif embed_dims[3] % stage4_heads:
        raise ConversionError(f'stage-4 heads {stage4_heads} do not divide '
                              f'its embed dim {embed_dims[3]}')
    num_heads.append(stage4_heads)
    sampling_ratios.append(1)
    dw_kernel_sizes.append(None)  # stage 4 has no depthwise conv
    hidden = Counter(sd[k].shape[0] for k in (f'block4.{j}.mlp.fc1.weight'
                                              for j in range(depths[3]))
                     if k in sd)
    if not hidden:
        _shape(sd, 'block4.0.mlp.fc1.weight')  # raises: missing
    mlp_ratios.append(_ratio(hidden.most_common(1)[0][0], embed_dims[3]))

    in_channels = _shape(sd, 'patch_embed1.proj.0.weight')[1]
    num_classes = _shape(sd, 'head.weight')[0] if 'head.weight' in sd else 0
    # position-embedding grids g, g/2, g/4, g/8 (+ cls token in stage 4)
    n1 = _shape(sd, 'pos_embed1')[1]
    g = int(round(n1**0.5))
    if g * g != n1:
        raise ConversionError(f'pos_embed1 has {n1} tokens, not a square '
                              f'grid')
    return dict(
        embed_dims=embed_dims,
        num_heads=num_heads,
        depths=depths,
        sampling_ratios=sampling_ratios,
        mlp_ratios=mlp_ratios,
        dw_kernel_sizes=dw_kernel_sizes,
        in_channels=in_channels,
        num_classes=num_classes,
        pretrain_img_size=4 * g,
        stage4_heads_given=stage4_given)


def official_shapes(
    arch: Mapping,
    in_channels: int = 3,
    num_classes: int = 1000,
    pretrain_img_size: int = 224,
) -> 'OrderedDict[str, Tuple[int, ...]]':
    """Every key of an official model of ``arch`` with its shape.

    ``arch`` is an mmsoft arch dict (``embed_dims``, ``num_heads``,
    ``depths`` and optionally ``sampling_ratios``, ``mlp_ratios``,
    ``dw_kernel_sizes``). ``num_classes=0``: no ``head.*`` keys.
    """
    a = dict(_DEFAULTS)
    a.update({
        k: v
        for k, v in arch.items()
        if k in ('embed_dims', 'num_heads', 'depths', *_DEFAULTS)
    })
    C, H, D = a['embed_dims'], a['num_heads'], a['depths']
    out = OrderedDict()
    for i in range(4):
        g = pretrain_img_size // (4 * 2**i)
        out[f'pos_embed{i + 1}'] = (1, g * g + (1 if i == 3 else 0), C[i])
    out['cls_token'] = (1, 1, C[3])

    def bn(pre, c):
        for n in BN_KEYS:
            out[pre + n] = () if n == 'num_batches_tracked' else (c, )

    stem = [(in_channels, OFFICIAL_STEM_CHANNELS),
            (OFFICIAL_STEM_CHANNELS, OFFICIAL_STEM_CHANNELS),
            (OFFICIAL_STEM_CHANNELS, C[0])]
    for j, (ci, co) in enumerate(stem):
        out[f'patch_embed1.proj.{3 * j}.weight'] = (co, ci, 3, 3)
        out[f'patch_embed1.proj.{3 * j}.bias'] = (co, )
        bn(f'patch_embed1.proj.{3 * j + 1}.', co)
    for i in range(1, 4):
        out[f'patch_embed{i + 1}.proj.0.weight'] = (C[i], C[i - 1], 3, 3)
        out[f'patch_embed{i + 1}.proj.0.bias'] = (C[i], )
        bn(f'patch_embed{i + 1}.proj.1.', C[i])

    def linear(pre, cin, cout, bias=True):
        out[pre + 'weight'] = (cout, cin)
        if bias:
            out[pre + 'bias'] = (cout, )

    def ln(pre, c):
        out[pre + 'weight'] = (c, )
        out[pre + 'bias'] = (c, )

    for i in range(3):
        c, h = C[i], H[i]
        d = c // h
        r, k = a['sampling_ratios'][i], a['dw_kernel_sizes'][i]
        hid = int(c * a['mlp_ratios'][i])
        for j in range(D[i]):
            p = f'block{i + 1}.{j}.att.'
            linear(p + 'mha.W_q.', c, c)
            linear(p + 'mha.W_v.', c, c)
            out[p + 'mha.attn.Qlandmark_op.weight'] = (d, d, r, r)
            ln(p + 'mha.attn.Qnorm_act.0.', d)
            out[p + 'mha.attn.conv.weight'] = (h, 1, k, k)
            linear(p + 'mha.ff.', c, c)
            ln(p + 'norm1.', c)
            linear(p + 'ff1.', c, hid)
            linear(p + 'ff2.', hid, c)
            ln(p + 'norm2.', c)
    c = C[3]
    hid = int(c * a['mlp_ratios'][3])
    # timm's pre-norm Block: (name, in, out); in None: a LayerNorm
    softmax_block = [
        ('norm1.', None, c),
        ('attn.q.', c, c),
        ('attn.kv.', c, 2 * c),
        ('attn.proj.', c, c),
        ('norm2.', None, c),
        ('mlp.fc1.', c, hid),
        ('mlp.fc2.', hid, c),
    ]
    for j in range(D[3]):
        for name, cin, cout in softmax_block:
            if cin is None:
                ln(f'block4.{j}.{name}', cout)
            else:
                linear(f'block4.{j}.{name}', cin, cout)
    ln('norm.', c)
    if num_classes:
        linear('head.', c, num_classes)
    return out


def arch_for_mmsoft(arch: Mapping) -> Dict:
    """The minimal mmsoft arch dict: ``embed_dims``, ``num_heads``,
    ``depths`` plus the optional entries that differ from mmsoft's
    defaults."""
    out = {k: list(arch[k]) for k in ('embed_dims', 'num_heads', 'depths')}
    for k, v in _DEFAULTS.items():
        if k in arch and list(arch[k]) != v:
            out[k] = list(arch[k])
    return out


def match_arch_preset(arch: Mapping) -> Optional[str]:
    """Name of the mmsoft ``SOFT.arch_zoo`` preset equal to ``arch``, or
    None."""
    want = arch_for_mmsoft(arch)
    for name, preset in ARCH_ZOO.items():
        full = dict(_DEFAULTS)
        full.update(preset)
        if arch_for_mmsoft(full) == want:
            return name
    return None


def describe_arch(arch: Mapping) -> str:
    """``arch='tiny'`` or ``arch=dict(...)`` for a config file."""
    name = match_arch_preset(arch)
    if name is not None:
        return f"arch='{name}'"
    items = ', '.join(f'{k}={v}' for k, v in arch_for_mmsoft(arch).items())
    return f'arch=dict({items})'


def official_model_name(arch: Mapping,
                        attn_norm: Optional[bool] = None) -> Optional[str]:
    """``soft_tiny`` / ``soft_norm_tiny`` ... for an arch with the official
    defaults, else None. ``attn_norm=None`` gives ``soft[_norm]_tiny``."""
    if arch_for_mmsoft(arch) != {
            k: list(arch[k])
            for k in ('embed_dims', 'num_heads', 'depths')
    }:
        return None
    want = (list(arch['embed_dims']), list(arch['num_heads']),
            list(arch['depths']))
    for size, spec in OFFICIAL_MODELS.items():
        if tuple(spec) == want:
            infix = {None: '[_norm]', True: '_norm', False: ''}[attn_norm]
            return f'soft{infix}_{size}'
    return None
