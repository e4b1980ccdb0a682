"""Key mapping between the official SOFT checkpoints and mmsoft.

The official repository (fudan-zvg/SOFT, ``models/softmax_free_*.py``) trains
timm models whose state dicts use names such as ``patch_embed1.proj.0.weight``
or ``block2.1.att.mha.W_q.weight``. mmsoft's :class:`~mmsoft.models.SOFT`
backbone names the same tensors ``stages.0.patch_embed.proj.0.conv.weight``
and ``stages.1.blocks.1.attn.q.weight``; inside an mmpretrain
``ImageClassifier`` they get the prefix ``backbone.`` and the official
``head`` becomes ``head.fc``.

* :func:`official_to_mmsoft_key` / :func:`mmsoft_to_official_key` - the
  one-to-one renaming of single keys (no tensor is reshaped);
* :func:`official_soft_hint` - recognise an unconverted official checkpoint
  and name the converter command (for the strict-load errors).
"""
import os.path as osp
import re
from typing import Optional, Tuple

from mmsoft.utils.checkpoint_files import ConversionError, extract_state_dict

__all__ = [
    'official_to_mmsoft_key', 'mmsoft_to_official_key', 'official_block',
    'official_soft_hint', 'find_official_state_dict', 'BN_KEYS'
]

#: the tensors of one BatchNorm
BN_KEYS = ('weight', 'bias', 'running_mean', 'running_var',
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
    ('att.ff1.', 'ffn.layers.0.0.'),  # mmcv FFN: fc1
    ('att.ff2.', 'ffn.layers.1.'),  # fc2
)
# stage 4 (softmax attention, pre-norm ViT block)
_SOFTMAX_BLOCK_RULES = (
    ('norm1.', 'norm1.'),
    ('norm2.', 'norm2.'),
    ('attn.q.', 'attn.q.'),
    ('attn.kv.', 'attn.kv.'),
    ('attn.proj.', 'attn.proj.'),
    ('mlp.fc1.', 'ffn.layers.0.0.'),
    ('mlp.fc2.', 'ffn.layers.1.'),
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
        if pos == 1 and name in BN_KEYS:
            return f'stages.{stage}.patch_embed.proj.{layer}.bn.{name}'
        return None
    m = _RE_BLOCK.match(key)
    if m:
        stage, blk, rest = int(m.group(1)) - 1, int(m.group(2)), m.group(3)
        rules = _SOFT_BLOCK_RULES if stage < 3 else _SOFTMAX_BLOCK_RULES
        new = _rename_in_block(rest, rules)
        return f'stages.{stage}.blocks.{blk}.{new}' if new else None
    return None


def _rename_in_block(rest: str, rules) -> Optional[str]:
    """``rest`` (a key inside one block) renamed by the first ``(from,
    to)`` prefix rule that matches; None unless that leaves a weight or a
    bias."""
    for old, new in rules:
        if rest.startswith(old):
            tail = rest[len(old):]
            return new + tail if tail in ('weight', 'bias') else None
    return None


def official_block(key: str) -> Optional[Tuple[int, int]]:
    """(stage 1-4, block index) of an official ``block{s}.{j}.*`` key, else
    None."""
    m = _RE_BLOCK.match(key)
    return (int(m.group(1)), int(m.group(2))) if m else None


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
        if kind == 'bn' and name not in BN_KEYS:
            return None
        idx = 3 * layer + (0 if kind == 'conv' else 1)
        return f'patch_embed{stage + 1}.proj.{idx}.{name}'
    m = _RE_M_BLOCK.match(key)
    if m:
        stage, blk, rest = int(m.group(1)), int(m.group(2)), m.group(3)
        rules = _SOFT_BLOCK_RULES if stage < 3 else _SOFTMAX_BLOCK_RULES
        old = _rename_in_block(rest, [(mine, off) for off, mine in rules])
        return f'block{stage + 1}.{blk}.{old}' if old else None
    return None


_OFFICIAL_RE = re.compile(r'^(patch_embed[1-4]\.|block[1-4]\.\d+\.|'
                          r'pos_embed[1-4]$)')


def find_official_state_dict(checkpoint) -> Optional[Tuple[dict, str]]:
    """``(state_dict, entry)`` if ``checkpoint`` (a loaded checkpoint dict)
    has the key layout of the official SOFT code (most keys are official
    backbone keys; :func:`extract_state_dict` picks the entry, EMA first as
    the converter does), else None."""
    try:
        sd, entry = extract_state_dict(checkpoint)
    except ConversionError:
        return None
    official = [
        k for k in sd if _OFFICIAL_RE.match(k) and official_to_mmsoft_key(k)
    ]
    if not official or len(official) < len(sd) // 2:
        return None
    return sd, entry


def official_soft_hint(checkpoint, source: str = 'SRC') -> Optional[str]:
    """The converter command if ``checkpoint`` (a loaded checkpoint dict)
    has the key layout of the official SOFT code, else None (for loads of
    a whole model; the backbone's ``init_cfg`` reads such files directly,
    :mod:`mmsoft.models.loading`)."""
    found = find_official_state_dict(checkpoint)
    if found is None:
        return None
    first = next(k for k in found[0] if _OFFICIAL_RE.match(k))
    dst = osp.join('weights', osp.basename(str(source)) or 'soft.pth')
    return (f'{source!s} is an official SOFT checkpoint (fudan-zvg/SOFT key '
            f'layout, e.g. {first!r}); convert it first:\n'
            f'    python tools/model_converters/soft2mmsoft.py {source} '
            f'{dst} [--norm for soft_norm_* weights]\n'
            f'  and load the converted file (the SOFT backbone alone reads '
            f"it directly: init_cfg=dict(type='Pretrained', "
            f'checkpoint={source!s})).')
