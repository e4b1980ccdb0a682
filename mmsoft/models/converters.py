"""The authors' SOFT checkpoints (fudan-zvg/SOFT, timm ``soft_*`` /
``soft_norm_*``) and older mmsoft keys, renamed by the tables of
:mod:`mmsoft.models.arch_zoo` (docs/en/user_guides/official_weights.md).
Shapes are not checked here: the strict load against the model (or the
converter tools' model of the inferred arch) names what is missing or
mis-shaped."""
import os.path as osp
import re
from collections import Counter, OrderedDict
from typing import Dict, Mapping, Optional, Tuple

import torch

from mmsoft.utils.strict_load import few_keys
from .arch_zoo import (ARCH_DEFAULTS, ARCH_ZOO, LEGACY_KEYS, NUM_STAGES,
                       OFFICIAL_FILES, OFFICIAL_PAGE, OFFICIAL_PRESETS,
                       OFFICIAL_SOFT_BLOCK, OFFICIAL_SOFTMAX_BLOCK,
                       OFFICIAL_STEM)

__all__ = [
    'ConversionError', 'KEY_MAP', 'LEGACY_KEYS', 'official_to_mmsoft_key',
    'mmsoft_to_official_key', 'upgrade_legacy_state_dict',
    'extract_state_dict', 'strip_module_prefix', 'find_official_state_dict',
    'official_soft_hint', 'infer_official_arch', 'arch_for_mmsoft',
    'match_arch_preset', 'describe_arch', 'official_model_name',
    'convert_official_to_mmpretrain', 'OFFICIAL_FILES', 'OFFICIAL_PAGE'
]


class ConversionError(ValueError):
    """A checkpoint does not have the expected layout."""


#: official -> mmsoft key template (``{j}``: block index); a template
#: ending in '.' takes a tensor name (``weight``, ``bias``, BN statistics)
KEY_MAP = [
    (f'pos_embed{s + 1}', f'stages.{s}.pos_embed') for s in range(NUM_STAGES)
] + [('cls_token', 'stages.3.cls_token'), ('norm.', 'stages.3.norm.'),
     ('head.', 'head.fc.')] + [
         (f'patch_embed{s + 1}.proj.{3 * n + i}.',
          f'stages.{s}.patch_embed.proj.{n}.{("conv", "bn")[i]}.')
         for s, n in OFFICIAL_STEM for i in (0, 1)
     ] + [
         (f'block{s + 1}.{{j}}.{o}', f'stages.{s}.blocks.{{j}}.{m}')
         for s in range(NUM_STAGES)
         for o, m in (OFFICIAL_SOFT_BLOCK if s < 3 else OFFICIAL_SOFTMAX_BLOCK)
     ]
_NAME = r'(?P<t>weight|bias|running_mean|running_var|num_batches_tracked)'
_RULES = [[(re.compile(
    re.escape(a).replace(r'\{j\}', r'(?P<j>\d+)') +
    (_NAME if a.endswith('.') else '')),
            b + ('{t}' if a.endswith('.') else '')) for a, b in pairs]
          for pairs in (KEY_MAP, [(m, o) for o, m in KEY_MAP])]


def _rename(key: str, rules) -> Optional[str]:
    return next((t.format(**m.groupdict()) for r, t in rules
                 for m in [r.fullmatch(key)] if m), None)


def official_to_mmsoft_key(key: str) -> Optional[str]:
    """mmsoft's name of one official key (None: no counterpart)."""
    return _rename(key, _RULES[0])


def mmsoft_to_official_key(key: str) -> Optional[str]:
    """The official name of one mmsoft backbone key or ``head.fc.*``."""
    return _rename(key, _RULES[1])


def upgrade_legacy_state_dict(state_dict: Mapping,
                              prefix: str = '',
                              num_stages: int = NUM_STAGES) -> Dict:
    """``state_dict`` with the :data:`LEGACY_KEYS` under ``prefix`` renamed;
    other keys, the order and ``_metadata`` kept."""
    p, r = re.escape(prefix), prefix.replace('\\', r'\\')
    rules = [(re.compile(f'^{p}{old}'),
              r + new.replace('{last}', str(num_stages - 1)))
             for old, new in LEGACY_KEYS]
    out = type(state_dict)() if isinstance(state_dict, dict) else {}
    for k, v in state_dict.items():
        for regex, new in rules:
            k = regex.sub(new, k)
        out[k] = v
    if getattr(state_dict, '_metadata', None) is not None:
        out._metadata = state_dict._metadata
    return out


def extract_state_dict(ckpt,
                       prefer_ema: bool = True) -> Tuple['OrderedDict', str]:
    """``(state_dict, entry)`` of a loaded timm / OpenMMLab checkpoint:
    ``state_dict_ema`` / ``model_ema`` (first if ``prefer_ema``),
    ``state_dict``, ``model`` or the dict itself (``'<bare>'``), without
    ``module.`` prefixes."""
    order = ['state_dict', 'model', 'state_dict_ema', 'model_ema']
    order = order[2:] + order[:2] if prefer_ema else order
    if not isinstance(ckpt, Mapping):
        raise ConversionError(
            f'checkpoint is a {type(ckpt).__name__}, not a dict')
    for entry in order + ['<bare>']:
        sd = ckpt if entry == '<bare>' else ckpt.get(entry)
        if isinstance(sd, Mapping) and sd and all(
                isinstance(k, str) and isinstance(v, torch.Tensor)
                for k, v in sd.items()):
            return strip_module_prefix(sd), entry
    raise ConversionError(
        f'no state dict found in the checkpoint: expected one of {order} '
        f'holding tensors, or a bare state dict; top-level keys are '
        f'{sorted(map(str, ckpt))[:20]}')


def strip_module_prefix(sd: Mapping) -> 'OrderedDict':
    """``sd`` without DataParallel / DDP ``module.`` prefixes."""
    out = OrderedDict(
        (re.sub(r'^(module\.)+', '', k), v) for k, v in sd.items())
    if len(out) < len(sd):
        raise ConversionError('keys occur twice after stripping "module." '
                              'prefixes')
    return out


_OFFICIAL_RE = re.compile(r'(patch_embed[1-4]\.|block[1-4]\.\d+\.|pos_embed)')


def find_official_state_dict(checkpoint) -> Optional[Tuple[Dict, str]]:
    """``(state_dict, entry)`` (EMA first) if most keys of ``checkpoint``
    are the authors' backbone keys, else None."""
    try:
        sd, entry = extract_state_dict(checkpoint)
    except ConversionError:
        return None
    n = sum(1 for k in sd
            if _OFFICIAL_RE.match(k) and official_to_mmsoft_key(k))
    return (sd, entry) if n and n >= len(sd) // 2 else None


def official_soft_hint(checkpoint, source: str = 'SRC') -> Optional[str]:
    """The converter command for an authors' file loaded as a whole model
    (the backbone's ``init_cfg`` converts it itself), else None."""
    found = find_official_state_dict(checkpoint)
    if found is None:
        return None
    first = next(k for k in found[0] if _OFFICIAL_RE.match(k))
    dst = osp.join('weights', osp.basename(str(source)) or 'soft.pth')
    return (f'{source!s} is an official SOFT checkpoint (fudan-zvg/SOFT key '
            f'layout, e.g. {first!r}); convert it first: python '
            f'tools/model_converters/soft2mmsoft.py {source} {dst} [--norm '
            f'for soft_norm_* weights], and load the converted file (the '
            f"SOFT backbone alone reads it directly: init_cfg=dict(type="
            f"'Pretrained', checkpoint={source!s})).")


def _shape(sd: Mapping, key: str) -> Tuple[int, ...]:
    """The most common shape of ``key`` (``*``: any block): a damaged block
    is reported by the strict check, not taken as the architecture."""
    rx = re.compile(re.escape(key).replace(r'\*', r'\d+'))
    found = Counter(tuple(v.shape) for k, v in sd.items() if rx.fullmatch(k))
    if not found:
        raise ConversionError(
            f'cannot infer the architecture: key {key!r} is missing')
    return found.most_common(1)[0][0]


def infer_official_arch(sd: Mapping[str, torch.Tensor],
                        stage4_heads: Optional[int] = None) -> Dict:
    """The architecture of an authors' state dict, read off its shapes:
    mmsoft's arch entries, ``in_channels``, ``num_classes`` (0: no head),
    ``pretrain_img_size`` and ``stage4_heads_given``. ``stage4_heads``:
    the heads of the softmax stage 4, not in the weights (default: stage
    3's head width)."""
    C = [_shape(sd, f'pos_embed{s}')[-1] for s in range(1, 5)]
    depths = [
        len({k.split('.')[1]
             for k in sd if k.startswith(f'block{s}.')}) for s in range(1, 5)
    ]
    stages = []  # (heads, sampling ratio, dw kernel, MLP hidden width)
    for s in range(1, 4):
        lm, dw = (
            _shape(sd, f'block{s}.*.att.mha.attn.{n}.weight')
            for n in ('Qlandmark_op', 'conv'))
        if len(lm) != 4 or len(dw) != 4:
            raise ConversionError(
                f'cannot infer the architecture: block{s}.*.att.mha.attn.'
                f'Qlandmark_op.weight should be (d, d, r, r) and .conv.weight '
                f'(heads, 1, k, k); found {lm} and {dw} (linear landmark ops, '
                f'sr_ratio 1, are not supported)')
        if dw[0] * lm[0] != C[s - 1]:
            raise ConversionError(
                f'inconsistent stage {s}: {dw[0]} heads (block{s}.*.att.mha.'
                f'attn.conv.weight {dw}) x head width {lm[0]} (Qlandmark_op '
                f'{lm}) != embed dim {C[s - 1]}')
        stages.append(
            (dw[0], lm[-1], dw[-1], _shape(sd,
                                           f'block{s}.*.att.ff1.weight')[0]))
    given = stage4_heads is not None
    if given and (isinstance(stage4_heads, bool)
                  or not isinstance(stage4_heads, int) or stage4_heads < 1):
        raise ConversionError(f'stage-4 heads must be a positive integer, '
                              f'got {stage4_heads!r}')
    heads = stage4_heads if given else max(C[3] // lm[0], 1)
    if C[3] % heads or not (given or C[3] % lm[0] == 0):
        raise ConversionError(
            f'stage-4 heads {heads} do not divide its embed dim {C[3]}' +
            ('' if given else f" (stage 3's head width {lm[0]}); give them "
             f'explicitly'))
    stages.append((heads, 1, None, _shape(sd, 'block4.*.mlp.fc1.weight')[0]))
    heads, ratios, kernels, hidden = map(list, zip(*stages))
    return dict(
        embed_dims=C,
        num_heads=heads,
        depths=depths,
        sampling_ratios=ratios,
        mlp_ratios=[
            f // c if f % c == 0 else f / c for f, c in zip(hidden, C)
        ],
        dw_kernel_sizes=kernels,
        in_channels=_shape(sd, 'patch_embed1.proj.0.weight')[1],
        num_classes=sd['head.weight'].shape[0] if 'head.weight' in sd else 0,
        pretrain_img_size=4 * round(_shape(sd, 'pos_embed1')[1]**0.5),
        stage4_heads_given=given)


def arch_for_mmsoft(arch: Mapping) -> Dict:
    """The minimal mmsoft arch dict: ``embed_dims``, ``num_heads``,
    ``depths`` and the optional entries that differ from the defaults."""
    keys = ['embed_dims', 'num_heads', 'depths'] + [
        k for k, v in ARCH_DEFAULTS.items() if list(arch.get(k, v)) != v
    ]
    return {k: list(arch[k]) for k in keys}


def match_arch_preset(arch: Mapping) -> Optional[str]:
    """The name of the ``SOFT.arch_zoo`` preset equal to ``arch`` (an arch
    dict), or None."""
    want = arch_for_mmsoft(arch)
    return next((name for name, preset in ARCH_ZOO.items()
                 if arch_for_mmsoft(preset) == want), None)


def describe_arch(arch: Mapping) -> str:
    """``arch='tiny'`` or ``arch=dict(...)``, as in a config file."""
    name = match_arch_preset(arch)
    items = ', '.join(f'{k}={v}' for k, v in arch_for_mmsoft(arch).items())
    return f"arch='{name}'" if name else f'arch=dict({items})'


def official_model_name(arch: Mapping,
                        attn_norm: Optional[bool] = None) -> Optional[str]:
    """``soft_tiny`` / ``soft_norm_tiny`` ... (``soft[_norm]_tiny`` for
    ``attn_norm=None``) of an official model size, else None."""
    name = match_arch_preset(arch)
    size = next((s for s, p in OFFICIAL_PRESETS.items() if p == name), None)
    infix = {None: '[_norm]', True: '_norm', False: ''}[attn_norm]
    return None if size is None else f'soft{infix}_{size}'


def convert_official_to_mmpretrain(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict]:
    """An authors' state dict -> an mmpretrain ``ImageClassifier``'s (the
    authors' ``head`` as ``head.fc``; ``prefix``: of the backbone keys) and
    its arch (:func:`infer_official_arch`, ``stage4_heads`` as there). Keys
    with no mmsoft counterpart raise one :class:`ConversionError` naming
    them; shapes are the strict load's to check."""
    sd = strip_module_prefix(sd)
    arch = infer_official_arch(sd, stage4_heads)
    new = {k: official_to_mmsoft_key(k) for k in sd}
    bad = [f'{k} {tuple(sd[k].shape)}' for k, n in new.items() if n is None]
    if bad:
        raise ConversionError(
            f'{len(bad)} keys have no counterpart in mmsoft\'s SOFT: '
            f'{few_keys(bad)}')
    return OrderedDict((n if n.startswith('head.') else prefix + n, sd[k])
                       for k, n in new.items()), arch
