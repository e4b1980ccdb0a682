"""Key mapping between the official SOFT checkpoints and mmsoft.

The official repository (fudan-zvg/SOFT, ``models/softmax_free_*.py``) trains
timm models whose state dicts use names such as ``patch_embed1.proj.0.weight``
or ``block2.1.att.mha.W_q.weight``. mmsoft's :class:`~mmsoft.models.SOFT`
backbone names the same tensors ``stages.0.patch_embed.proj.0.conv.weight``
and ``stages.1.blocks.1.attn.q.weight``; inside an mmpretrain
``ImageClassifier`` they get the prefix ``backbone.`` and the official
``head`` becomes ``head.fc``.

This module holds everything both converter scripts
(``tools/model_converters/soft2mmsoft.py`` and ``mmsoft2soft.py``) share:

* :func:`official_to_mmsoft_key` / :func:`mmsoft_to_official_key` - the
  one-to-one renaming of single keys (no tensor is reshaped);
* :func:`infer_official_arch` - the architecture read off tensor shapes;
* :func:`official_shapes` - the complete official key -> shape table of an
  architecture (used to report unknown / missing keys and shape mismatches);
* :func:`convert_official_to_mmpretrain` and
  :func:`convert_mmpretrain_to_official` - whole-checkpoint conversion with
  validation; problems raise :class:`ConversionError` naming the keys;
* :func:`extract_state_dict`, :func:`save_checkpoint_atomic` - checkpoint
  layouts and atomic writing.

Whether a checkpoint is a ``soft_*`` (NeurIPS) or a ``soft_norm_*`` (IJCV)
model is NOT visible in its weights: both have exactly the same tensors.
Neither is the number of heads of stage 4 (standard softmax attention over
one fused ``kv`` projection); it is assumed to keep the head width of stage 3
(32 in every official model) unless given explicitly.
"""
import os
import re
from collections import Counter, OrderedDict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from mmsoft.models.backbones.soft import SOFT

__all__ = [
    'ConversionError', 'official_to_mmsoft_key', 'mmsoft_to_official_key',
    'infer_official_arch', 'official_shapes', 'match_arch_preset',
    'arch_for_mmsoft', 'convert_official_to_mmpretrain',
    'convert_mmpretrain_to_official', 'extract_state_dict',
    'strip_module_prefix', 'save_checkpoint_atomic', 'describe_arch',
    'official_model_name', 'load_checkpoint_file', 'check_output_path',
    'positive_int', 'OFFICIAL_MODELS', 'OFFICIAL_PRESETS',
    'OFFICIAL_STEM_CHANNELS'
]

#: hidden channels of the official three-conv stem
OFFICIAL_STEM_CHANNELS = 32
#: mmsoft's defaults for the optional arch entries
_DEFAULTS = SOFT.arch_defaults
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
    name:
    tuple(SOFT.arch_zoo[preset][k]
          for k in ('embed_dims', 'num_heads', 'depths'))
    for name, preset in OFFICIAL_PRESETS.items()
}
_BN_KEYS = ('weight', 'bias', 'running_mean', 'running_var',
            'num_batches_tracked')

# (official suffix, mmsoft suffix) inside one block, stages 1-3
_SOFT_BLOCK_RULES = (
    ('att.mha.W_q.', 'attn.q.'),
    ('att.mha.W_v.', 'attn.v.'),
    ('att.mha.attn.Qlandmark_op.', 'attn.sampler.conv.'),
    ('att.mha.attn.Qnorm_act.0.', 'attn.sampler.norm.'),
    ('att.mha.attn.conv.', 'attn.dw_conv.'),
    ('att.mha.ff.', 'attn.proj.'),
    ('att.norm1.', 'norm1.'),
    ('att.norm2.', 'norm2.'),
    ('att.ff1.', 'ffn.fc1.'),
    ('att.ff2.', 'ffn.fc2.'),
)
# stage 4 (softmax attention, pre-norm ViT block)
_SOFTMAX_BLOCK_RULES = (
    ('norm1.', 'norm1.'),
    ('norm2.', 'norm2.'),
    ('attn.q.', 'attn.q.'),
    ('attn.kv.', 'attn.kv.'),
    ('attn.proj.', 'attn.proj.'),
    ('mlp.fc1.', 'ffn.fc1.'),
    ('mlp.fc2.', 'ffn.fc2.'),
)

_RE_POS = re.compile(r'^pos_embed([1-4])$')
_RE_PATCH = re.compile(r'^patch_embed([1-4])\.proj\.(\d+)\.(\w+)$')
_RE_BLOCK = re.compile(r'^block([1-4])\.(\d+)\.(.+)$')
_RE_HEAD = re.compile(r'^head\.(weight|bias)$')
_RE_NORM = re.compile(r'^norm\.(weight|bias)$')

_RE_M_POS = re.compile(r'^stages\.([0-3])\.pos_embed$')
_RE_M_PATCH = re.compile(
    r'^stages\.([0-3])\.patch_embed\.proj\.(\d+)\.(conv|bn)\.(\w+)$')
_RE_M_BLOCK = re.compile(r'^stages\.([0-3])\.blocks\.(\d+)\.(.+)$')
_RE_M_LAST = re.compile(r'^stages\.3\.(cls_token|norm\.(?:weight|bias))$')


class ConversionError(ValueError):
    """A checkpoint does not match the expected layout.

    ``problems`` lists one human-readable line per offending key.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()):
        self.problems = list(problems)
        if self.problems:
            message = message + '\n  ' + '\n  '.join(self.problems)
        super().__init__(message)


# --------------------------------------------------------------- key renaming
def official_to_mmsoft_key(key: str) -> Optional[str]:
    """Backbone key of mmsoft's SOFT for one official key.

    ``head.weight`` / ``head.bias`` map to the classifier keys
    ``head.fc.weight`` / ``head.fc.bias``. Returns None for keys that have no
    mmsoft counterpart (callers report them as unknown).
    """
    if key == 'cls_token' or _RE_NORM.match(key):
        return f'stages.3.{key}'
    m = _RE_HEAD.match(key)
    if m:
        return f'head.fc.{m.group(1)}'
    m = _RE_POS.match(key)
    if m:
        return f'stages.{int(m.group(1)) - 1}.pos_embed'
    m = _RE_PATCH.match(key)
    if m:
        stage, idx, name = int(m.group(1)) - 1, int(m.group(2)), m.group(3)
        layer, pos = divmod(idx, 3)  # Conv, BN, ReLU per layer
        if stage > 0 and layer > 0:
            return None
        if stage == 0 and layer > 2:
            return None
        if pos == 0 and name in ('weight', 'bias'):
            return f'stages.{stage}.patch_embed.proj.{layer}.conv.{name}'
        if pos == 1 and name in _BN_KEYS:
            return f'stages.{stage}.patch_embed.proj.{layer}.bn.{name}'
        return None
    m = _RE_BLOCK.match(key)
    if m:
        stage, blk, rest = int(m.group(1)) - 1, int(m.group(2)), m.group(3)
        rules = _SOFT_BLOCK_RULES if stage < 3 else _SOFTMAX_BLOCK_RULES
        for off, mine in rules:
            if rest.startswith(off):
                tail = rest[len(off):]
                if tail not in ('weight', 'bias'):
                    return None
                return f'stages.{stage}.blocks.{blk}.{mine}{tail}'
        return None
    return None


def mmsoft_to_official_key(key: str) -> Optional[str]:
    """Inverse of :func:`official_to_mmsoft_key` (backbone keys without the
    ``backbone.`` prefix, plus ``head.fc.*``). None if there is no match."""
    m = _RE_M_LAST.match(key)
    if m:
        return m.group(1)
    if key in ('head.fc.weight', 'head.fc.bias'):
        return 'head.' + key.rsplit('.', 1)[1]
    m = _RE_M_POS.match(key)
    if m:
        return f'pos_embed{int(m.group(1)) + 1}'
    m = _RE_M_PATCH.match(key)
    if m:
        stage, layer = int(m.group(1)), int(m.group(2))
        kind, name = m.group(3), m.group(4)
        if layer > (2 if stage == 0 else 0):
            return None
        if kind == 'conv' and name not in ('weight', 'bias'):
            return None
        if kind == 'bn' and name not in _BN_KEYS:
            return None
        idx = 3 * layer + (0 if kind == 'conv' else 1)
        return f'patch_embed{stage + 1}.proj.{idx}.{name}'
    m = _RE_M_BLOCK.match(key)
    if m:
        stage, blk, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        rules = _SOFT_BLOCK_RULES if stage < 3 else _SOFTMAX_BLOCK_RULES
        for off, mine in rules:
            if rest.startswith(mine):
                tail = rest[len(mine):]
                if tail not in ('weight', 'bias'):
                    return None
                return f'block{stage + 1}.{blk}.{off}{tail}'
        return None
    return None


# ----------------------------------------------------------- architecture
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
            m = _RE_BLOCK.match(k)
            if m and int(m.group(1)) == i + 1:
                idx.add(int(m.group(2)))
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
        for n in _BN_KEYS:
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
    for j in range(D[3]):
        p = f'block4.{j}.'
        ln(p + 'norm1.', c)
        linear(p + 'attn.q.', c, c)
        linear(p + 'attn.kv.', c, 2 * c)
        linear(p + 'attn.proj.', c, c)
        ln(p + 'norm2.', c)
        linear(p + 'mlp.fc1.', c, hid)
        linear(p + 'mlp.fc2.', hid, c)
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
    for name, preset in SOFT.arch_zoo.items():
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


# --------------------------------------------------------- checkpoint files
def positive_int(text: str) -> int:
    """argparse type of counts such as ``--stage4-heads``."""
    import argparse
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(
            f'expected a positive integer, got {text!r}')
    return value


def load_checkpoint_file(path: str, trust: bool = False):
    """``torch.load`` on the CPU.

    By default only tensors and plain containers are unpickled
    (``weights_only=True``; ``argparse.Namespace``, which timm stores as
    ``args``, is allowed too). ``trust=True`` unpickles anything - only for
    files from a trusted source (e.g. mmengine checkpoints with a
    ``message_hub``).

    Errors (:class:`ConversionError`, one line each): a missing file, a
    directory, a damaged file (empty, truncated, CRC error: reported as
    damaged, never with the advice to unpickle it), pickled objects refused
    by the weights-only unpickler (the refused globals are named), and a
    checkpoint whose mmsoft checksum does not match.
    """
    from .checkpoint_io import (CheckpointError, describe_damage,
                                refused_globals, verify_checksum)
    if os.path.isdir(path):
        raise ConversionError(f'checkpoint {path!r} is a directory, not a '
                              f'file')
    if not os.path.isfile(path):
        raise ConversionError(f'checkpoint {path!r} does not exist')
    damage = describe_damage(path)
    if damage is not None:
        raise ConversionError(
            f'checkpoint {path!r} {damage}: the file is damaged and cannot '
            f'be converted; download or copy it again')
    import argparse
    try:
        if trust:
            ckpt = torch.load(path, map_location='cpu', weights_only=False)
        else:
            with torch.serialization.safe_globals([argparse.Namespace]):
                ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:  # pickle.UnpicklingError and friends
        first = str(e).splitlines()[0] if str(e) else ''
        if trust:
            raise ConversionError(
                f'cannot load {path!r} ({type(e).__name__}: {first})'
            ) from None
        refused = [
            g for g in refused_globals(path) if g != 'argparse.Namespace'
        ]
        if refused:
            raise ConversionError(
                f'{path!r} holds pickled objects other than tensors and '
                f'plain containers, refused by the weights-only unpickler: '
                f'{", ".join(refused)}. If you trust the file, run again '
                f'with --trust-checkpoint.') from None
        raise ConversionError(
            f'cannot load {path!r} ({type(e).__name__}: {first})') from None
    try:
        verify_checksum(ckpt, path)
    except CheckpointError as e:
        raise ConversionError(str(e)) from None
    return ckpt


def _not_a_regular_file(path: str) -> Optional[str]:
    """What ``path`` is if it exists but is neither a regular file nor a
    directory (a device such as /dev/full, a FIFO, a socket), else None."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISCHR, 'a character device'),
                       (stat.S_ISBLK, 'a block device'),
                       (stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket')):
        if test(mode):
            return what
    return None


def check_output_path(src: str, dst: str) -> None:
    """Refuse an output that would replace the input (the same file, also
    through a symlink or another relative path), that is a directory, or
    that exists and is not a regular file (the atomic rename would replace
    e.g. the device node /dev/full by a regular file when run as root)."""
    if os.path.isdir(dst):
        raise ConversionError(
            f'output {dst!r} is a directory; give a file name, e.g. '
            f'{os.path.join(dst, os.path.basename(src))!r}')
    kind = _not_a_regular_file(dst)
    if kind is not None:
        raise ConversionError(
            f'output {dst!r} is {kind}, not a regular file: refusing to '
            f'replace it; give a file name')
    same = os.path.realpath(src) == os.path.realpath(dst)
    if not same and os.path.exists(dst) and os.path.exists(src):
        try:
            same = os.path.samefile(src, dst)
        except OSError:
            pass
    if same:
        raise ConversionError(
            f'output {dst!r} is the input file {src!r}: refusing to replace '
            f'it; choose another output path')


def strip_module_prefix(sd: Mapping[str, torch.Tensor]) -> 'OrderedDict':
    """Remove (repeated) DataParallel / DDP ``module.`` prefixes."""
    out = OrderedDict()
    for k, v in sd.items():
        while k.startswith('module.'):
            k = k[len('module.'):]
        if k in out:
            raise ConversionError(f'key {k!r} occurs twice after stripping '
                                  f'"module." prefixes')
        out[k] = v
    return out


def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor)
        for k, v in obj.items())


def extract_state_dict(ckpt,
                       prefer_ema: bool = True) -> Tuple['OrderedDict', str]:
    """The model weights of a loaded checkpoint in any timm layout.

    Looks for ``state_dict_ema`` (first when ``prefer_ema``), ``state_dict``,
    ``model``, ``model_ema``, or takes ``ckpt`` itself as a bare state dict.
    ``module.`` prefixes are stripped. Returns ``(state_dict, source)`` where
    source names the entry used (``'<bare>'`` for a bare state dict).
    """
    if not isinstance(ckpt, Mapping):
        raise ConversionError(f'checkpoint is a {type(ckpt).__name__}, not '
                              f'a dict')
    order = ['state_dict', 'model', 'state_dict_ema', 'model_ema']
    if prefer_ema:
        order = ['state_dict_ema', 'model_ema', 'state_dict', 'model']
    for name in order:
        if name in ckpt and _is_state_dict(ckpt[name]):
            return strip_module_prefix(ckpt[name]), name
    if _is_state_dict(ckpt):
        return strip_module_prefix(ckpt), '<bare>'
    raise ConversionError(
        f'no state dict found in the checkpoint: expected one of '
        f'{order} holding tensors, or a bare state dict; top-level keys are '
        f'{sorted(map(str, ckpt))[:20]}')


def save_checkpoint_atomic(obj, path: str) -> None:
    """``torch.save`` to a temporary file next to ``path``, ``fsync``, then
    ``os.replace``: ``path`` is either the complete new file or untouched,
    and no temporary file is left behind (also on SIGINT / SIGTERM;
    temporaries of a SIGKILLed earlier run are removed first). A dict
    ``obj`` gets an mmsoft checksum of its entries in ``obj['meta']``
    (verified when mmsoft / mmengine load the file). OS errors (unwritable
    directory, full disk, ...) raise a one-line :class:`ConversionError`.
    """
    from .checkpoint_io import add_checksum, remove_stale_temps, save_atomic
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    if os.path.isdir(path):
        raise ConversionError(f'output {path!r} is a directory')
    kind = _not_a_regular_file(path)
    if kind is not None:
        raise ConversionError(f'output {path!r} is {kind}, not a regular '
                              f'file: refusing to replace it')
    if not os.path.isdir(d):
        raise ConversionError(f'output directory {d!r} does not exist')
    remove_stale_temps(d, name=os.path.basename(path))
    if isinstance(obj, dict):
        add_checksum(obj)
    try:
        save_atomic(obj, path)
    except OSError as e:
        reason = e.strerror or str(e)
        raise ConversionError(f'cannot write {path!r}: {reason}' +
                              (f' (errno {e.errno})' if e.errno else '') +
                              '; nothing was written') from None


# -------------------------------------------------------------- conversion
def _check(sd: Mapping[str, torch.Tensor],
           expected: Mapping[str, Tuple[int, ...]],
           what: str,
           rename=lambda k: k) -> None:
    """Unknown keys, missing keys and shape mismatches, all at once."""
    problems: List[str] = []
    for k in sd:
        if k not in expected:
            problems.append(f'unknown key {rename(k)!r} '
                            f'(shape {tuple(sd[k].shape)})')
    for k, shp in expected.items():
        if k not in sd:
            problems.append(f'missing key {rename(k)!r} (expected shape '
                            f'{shp})')
        elif tuple(sd[k].shape) != tuple(shp):
            problems.append(f'shape mismatch for {rename(k)!r}: expected '
                            f'{tuple(shp)}, found {tuple(sd[k].shape)}')
    if problems:
        raise ConversionError(
            f'the {what} does not match the inferred architecture '
            f'({len(problems)} problem(s)):', problems)


def _fill_bn_counters(sd: 'OrderedDict',
                      expected: Mapping[str, Tuple[int, ...]]) -> List[str]:
    """Some exporters drop BatchNorm's ``num_batches_tracked`` buffers; they
    carry no weights, so missing ones are filled with 0 (listed in the
    return value)."""
    filled = []
    for k in expected:
        if k.endswith('num_batches_tracked') and k not in sd:
            sd[k] = torch.tensor(0, dtype=torch.long)
            filled.append(k)
    return filled


def convert_official_to_mmpretrain(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict, List[str]]:
    """Official state dict -> mmpretrain ``ImageClassifier`` state dict.

    Returns ``(state_dict, arch, notes)``: backbone keys get ``prefix``, the
    official ``head.*`` becomes ``head.fc.*``; ``arch`` is
    :func:`infer_official_arch`'s result. Raises :class:`ConversionError` on
    unknown keys, missing keys or shape mismatches (all listed).
    """
    sd = strip_module_prefix(sd)
    notes: List[str] = []
    arch = infer_official_arch(sd, stage4_heads)
    expected = official_shapes(arch, arch['in_channels'], arch['num_classes'],
                               arch['pretrain_img_size'])
    filled = _fill_bn_counters(sd, expected)
    if filled:
        notes.append(f'{len(filled)} BatchNorm num_batches_tracked buffers '
                     f'were missing and set to 0')
    _check(sd, expected, 'official checkpoint')
    out = OrderedDict()
    for k in expected:  # official order, which is also mmsoft's order
        new = official_to_mmsoft_key(k)
        if new is None:  # pragma: no cover - official_shapes is exhaustive
            raise ConversionError(f'no mmsoft name for {k!r}')
        if not new.startswith('head.'):
            new = prefix + new
        out[new] = sd[k]
    return out, arch, notes


def convert_mmpretrain_to_official(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict, List[str]]:
    """mmpretrain classifier (or bare mmsoft backbone) state dict -> official
    layout. Inverse of :func:`convert_official_to_mmpretrain`.

    Keys starting with ``prefix`` are backbone keys; ``head.fc.*`` is the
    classifier. If no key has the prefix the dict is taken as a bare backbone
    state dict. Other keys (e.g. a neck) are reported as unknown. Keys of
    mmsoft checkpoints of version 1 are read too (see
    :meth:`SOFT.upgrade_state_dict`).
    """
    sd = strip_module_prefix(sd)
    has_prefix = any(k.startswith(prefix) for k in sd)
    sd = SOFT.upgrade_state_dict(sd, prefix if has_prefix else '')
    official = OrderedDict()
    origin = {}
    problems = []
    for k, v in sd.items():
        if has_prefix and k.startswith(prefix):
            name = mmsoft_to_official_key(k[len(prefix):])
            if name is not None and name.startswith('head.'):
                name = None
        elif k.startswith('head.fc.') or not has_prefix:
            name = mmsoft_to_official_key(k)
        else:
            name = None
        if name is None:
            problems.append(f'unknown key {k!r} (shape {tuple(v.shape)})')
            continue
        official[name] = v
        origin[name] = k
    if problems:
        raise ConversionError(
            'the mmsoft checkpoint has keys with no official counterpart:',
            problems)
    arch = infer_official_arch(official, stage4_heads)
    expected = official_shapes(arch, arch['in_channels'], arch['num_classes'],
                               arch['pretrain_img_size'])
    notes: List[str] = []
    filled = _fill_bn_counters(official, expected)
    if filled:
        notes.append(f'{len(filled)} BatchNorm num_batches_tracked buffers '
                     f'were missing and set to 0')

    def rename(k):
        if k in origin:
            return origin[k]
        new = official_to_mmsoft_key(k)
        if new is None:
            return k
        return new if new.startswith('head.') or not has_prefix \
            else prefix + new

    _check(official, expected, 'mmsoft checkpoint', rename)
    return OrderedDict((k, official[k]) for k in expected), arch, notes
