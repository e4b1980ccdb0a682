"""The authors' SOFT checkpoints (docs/en/user_guides/official_weights.md)."""
import os.path as osp
import re
from collections import Counter, OrderedDict
from typing import Dict, Mapping, Optional, Tuple

import torch

from mmsoft.utils.strict_load import few_keys
from .arch_zoo import (ARCH_DEFAULTS, ARCH_ZOO, KEY_MAP, OFFICIAL_FILES,
                       OFFICIAL_PAGE, OFFICIAL_PRESETS)


class ConversionError(ValueError):
    """A checkpoint does not have the expected layout."""


_NAME = r'(?P<t>weight|bias|running_mean|running_var|num_batches_tracked)'
#: the rename table of each direction: (regex, template)
_RULES = [[(re.compile(
    re.escape(a).replace(r'\{j\}', r'(?P<j>\d+)') + _NAME * a.endswith('.')),
            b + '{t}' * a.endswith('.')) for a, b in pairs]
          for pairs in (KEY_MAP, [(m, o) for o, m in KEY_MAP])]


def official_to_mmsoft_key(key: str, rules=_RULES[0]) -> Optional[str]:
    """mmsoft's name of an official key (None: no counterpart)."""
    return next((t.format(**m.groupdict()) for r, t in rules
                 for m in [r.fullmatch(key)] if m), None)


def mmsoft_to_official_key(key: str) -> Optional[str]:
    """The official name of one mmsoft backbone key or ``head.fc.*``."""
    return official_to_mmsoft_key(key, _RULES[1])


def extract_state_dict(ckpt,
                       prefer_ema: bool = True) -> Tuple['OrderedDict', str]:
    """``(state_dict, entry)`` of a checkpoint (``'<bare>'``: the dict)."""
    order = ['state_dict', 'model', 'state_dict_ema', 'model_ema']
    order = order[2:] + order[:2] if prefer_ema else order
    if not isinstance(ckpt, Mapping):
        raise ConversionError(f'checkpoint is a {type(ckpt).__name__}, '
                              f'not a dict')
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
    """``(state_dict, entry)`` (EMA first) of an authors' file, else None."""
    try:
        sd, entry = extract_state_dict(checkpoint)
    except ConversionError:
        return None
    n = sum(
        bool(_OFFICIAL_RE.match(k) and official_to_mmsoft_key(k)) for k in sd)
    return (sd, entry) if n and n >= len(sd) // 2 else None


def official_soft_hint(checkpoint, source: str = 'SRC') -> Optional[str]:
    """The converter command for an authors' file, else None."""
    found = find_official_state_dict(checkpoint)
    if not found:
        return None
    first = next(k for k in found[0] if _OFFICIAL_RE.match(k))
    dst = osp.join('weights', osp.basename(str(source)) or 'soft.pth')
    return (f'{source!s} is an official SOFT checkpoint (fudan-zvg/SOFT key '
            f'layout, e.g. {first!r}); convert it first: python '
            f'tools/model_converters/soft2mmsoft.py {source} {dst} [--norm '
            f'for soft_norm_* weights], and load the converted file (the '
            f"SOFT backbone alone reads it directly: init_cfg=dict(type="
            f"'Pretrained', checkpoint={source!s})).")


def common_shape(sd: Mapping, key: str) -> Tuple[int, ...]:
    """The most common shape of ``key`` (``*``: any block)."""
    rx = re.compile(re.escape(key).replace(r'\*', r'\d+'))
    found = Counter(tuple(v.shape) for k, v in sd.items() if rx.fullmatch(k))
    if not found:
        raise ConversionError(
            f'cannot infer the architecture: key {key!r} is missing')
    return found.most_common(1)[0][0]


def infer_official_arch(sd: Mapping[str, torch.Tensor],
                        stage4_heads: Optional[int] = None) -> Dict:
    """The arch and input / head sizes of an authors' state dict."""
    C = [common_shape(sd, f'pos_embed{s}')[-1] for s in range(1, 5)]
    lm, dw, ff = ([
        common_shape(sd, f'block{s}.*.att.{n}.weight') for s in (1, 2, 3)
    ] for n in ('mha.attn.Qlandmark_op', 'mha.attn.conv', 'ff1'))
    ff.append(common_shape(sd, 'block4.*.mlp.fc1.weight'))
    return dict(
        embed_dims=C,
        num_heads=[d[0]
                   for d in dw] + [stage4_heads or max(C[3] // lm[2][0], 1)],
        depths=[
            len({k.split('.')[1]
                 for k in sd if k.startswith(f'block{s}.')})
            for s in range(1, 5)
        ],
        sampling_ratios=[m[-1] for m in lm] + [1],
        mlp_ratios=[f / c if f % c else f // c for (f, *_), c in zip(ff, C)],
        dw_kernel_sizes=[d[-1] for d in dw] + [None],
        in_channels=common_shape(sd, 'patch_embed1.proj.0.weight')[1],
        num_classes=sd['head.weight'].shape[0] if 'head.weight' in sd else 0,
        pretrain_img_size=4 * round(common_shape(sd, 'pos_embed1')[1]**0.5),
        stage4_heads_given=stage4_heads is not None)


def arch_for_mmsoft(arch: Mapping) -> Dict:
    """The minimal mmsoft arch dict (optional entries that differ only)."""
    return {
        k: list(arch[k])
        for k in ['embed_dims', 'num_heads', 'depths'] +
        [k for k, v in ARCH_DEFAULTS.items() if list(arch.get(k, v)) != v]
    }


def match_arch_preset(arch: Mapping) -> Optional[str]:
    """The ``SOFT.arch_zoo`` preset equal to ``arch``, or None."""
    return next((name for name, preset in ARCH_ZOO.items()
                 if arch_for_mmsoft(preset) == arch_for_mmsoft(arch)), None)


def describe_arch(arch: Mapping) -> str:
    """``arch='tiny'`` or ``arch=dict(...)``, as in a config file."""
    name, items = match_arch_preset(arch), arch_for_mmsoft(arch).items()
    return f"arch='{name}'" if name else 'arch=dict(%s)' % ', '.join(
        f'{k}={v}' for k, v in items)


def official_model_name(arch: Mapping, attn_norm=None) -> Optional[str]:
    """``soft_tiny`` / ``soft_norm_tiny`` / (None) ``soft[_norm]_tiny``."""
    name = match_arch_preset(arch)
    infix = {None: '[_norm]', True: '_norm', False: ''}[attn_norm]
    return next((f'soft{infix}_{s}'
                 for s, p in OFFICIAL_PRESETS.items() if p == name), None)


def convert_official_to_mmpretrain(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict]:
    """An authors' state dict as an mmpretrain classifier's, and its arch."""
    sd = strip_module_prefix(sd)
    arch = infer_official_arch(sd, stage4_heads)
    new = {k: official_to_mmsoft_key(k) for k in sd}
    bad = [f'{k} {tuple(sd[k].shape)}' for k, n in new.items() if n is None]
    if bad:
        raise ConversionError(f"{len(bad)} keys have no counterpart in "
                              f"mmsoft's SOFT: {few_keys(bad)}")
    return OrderedDict((n if n.startswith('head.') else prefix + n, sd[k])
                       for k, n in new.items()), arch


def missing_weights_message(checkpoint,
                            backbone: str = 'model.backbone',
                            key: str = 'init_cfg.checkpoint') -> str:
    """The line for a backbone's missing ``init_cfg`` file."""
    name = osp.splitext(osp.basename(str(checkpoint)))[0]
    known, key = OFFICIAL_FILES.get(name), f'{backbone}.{key}'
    get = (f"download the authors' {name} ImageNet file ('{known['link']}' "
           f'on {OFFICIAL_PAGE}) to that path' if known and known['link'] else
           f'the authors publish no {name} file ({OFFICIAL_PAGE}): train '
           f"configs/{known['configs'][0]}.py and give its checkpoint" if known
           else f"download the authors' ImageNet file from {OFFICIAL_PAGE}")
    return (f'{checkpoint} ({key}) does not exist: {get}, or use another '
            f'file with --cfg-options {key}=PATH; to train from scratch on '
            f'purpose: --cfg-options {backbone}.init_cfg=None '
            f'{backbone}.norm_eval=False')
