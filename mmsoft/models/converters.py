"""The authors' SOFT checkpoints (fudan-zvg/SOFT, timm ``soft_*`` /
``soft_norm_*``) and older mmsoft keys, converted by the tables of
:mod:`mmsoft.models.arch_zoo` (docs/en/user_guides/official_weights.md)."""
import os.path as osp
import re
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .arch_zoo import (ARCH_DEFAULTS, ARCH_ZOO, LEGACY_KEYS, NUM_STAGES,
                       OFFICIAL_FILES, OFFICIAL_PAGE, OFFICIAL_PRESETS,
                       OFFICIAL_SOFT_BLOCK, OFFICIAL_SOFTMAX_BLOCK,
                       OFFICIAL_STEM)

__all__ = [
    'ConversionError', 'KEY_MAP', 'LEGACY_KEYS', 'official_to_mmsoft_key',
    'mmsoft_to_official_key', 'upgrade_legacy_state_dict',
    'extract_state_dict', 'strip_module_prefix', 'find_official_state_dict',
    'official_soft_hint', 'infer_official_arch', 'official_shapes',
    'arch_for_mmsoft', 'match_arch_preset', 'describe_arch',
    'official_model_name', 'convert_official_to_mmpretrain',
    'convert_mmpretrain_to_official', 'OFFICIAL_FILES', 'OFFICIAL_PAGE'
]


class ConversionError(ValueError):
    """A checkpoint does not match the expected layout; ``problems`` lists
    one line per offending key."""

    def __init__(self, message: str, problems: Sequence[str] = ()):
        self.problems = list(problems)
        super().__init__('\n  '.join([message, *self.problems]))


_BN = ('weight', 'bias', 'running_mean', 'running_var', 'num_batches_tracked')


def official_tensors(depths: Optional[Sequence[int]] = None) -> List[Tuple]:
    """``(stage, official key, mmsoft key, shape)`` of every tensor of the
    official model, in its order; block keys hold ``{j}`` without
    ``depths``."""
    rows = [(s, f'pos_embed{s + 1}', f'stages.{s}.pos_embed', (1, 'n', 'c'))
            for s in range(4)] + [(3, 'cls_token', 'stages.3.cls_token',
                                   (1, 1, 'c'))]

    def add(s, official, mine, shape, bias=True):
        rows.append((s, official + 'weight', mine + 'weight', shape))
        if bias:
            rows.append((s, official + 'bias', mine + 'bias', shape[:1]))

    for s, n, cout, cin in OFFICIAL_STEM:
        o, m = f'patch_embed{s + 1}.proj.', f'stages.{s}.patch_embed.proj.{n}.'
        add(s, f'{o}{3 * n}.', m + 'conv.', (cout, cin, 3, 3))
        rows += [(s, f'{o}{3 * n + 1}.{k}', f'{m}bn.{k}',
                  () if k == 'num_batches_tracked' else (cout, )) for k in _BN]
    for s in range(4):
        block = OFFICIAL_SOFT_BLOCK if s < 3 else OFFICIAL_SOFTMAX_BLOCK
        for j in range(depths[s]) if depths else ['{j}']:
            for o, m, shape in block:
                add(s, f'block{s + 1}.{j}.{o}', f'stages.{s}.blocks.{j}.{m}',
                    shape,
                    len(shape) < 4)
    add(3, 'norm.', 'stages.3.norm.', ('c', ))
    add(3, 'head.', 'head.fc.', ('classes', 'c'))
    return rows


#: official key template -> mmsoft key template (``{j}``: block index)
KEY_MAP = [(o, m) for _, o, m, _ in official_tensors()]
_RULES = [[(re.compile(re.escape(a).replace(r'\{j\}', r'(?P<j>\d+)')), b)
           for a, b in pairs]
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
    entry = next((n for n in order + ['<bare>']
                  if _is_state_dict(ckpt if n == '<bare>' else ckpt.get(n))),
                 None)
    if entry is None:
        raise ConversionError(
            f'no state dict found in the checkpoint: expected one of '
            f'{order} holding tensors, or a bare state dict; top-level keys '
            f'are {sorted(map(str, ckpt))[:20]}')
    return strip_module_prefix(ckpt if entry == '<bare>' else ckpt[entry]), \
        entry


def strip_module_prefix(sd: Mapping) -> 'OrderedDict':
    """``sd`` without DataParallel / DDP ``module.`` prefixes."""
    out = OrderedDict(
        (re.sub(r'^(module\.)+', '', k), v) for k, v in sd.items())
    if len(out) < len(sd):
        raise ConversionError('keys occur twice after stripping "module." '
                              'prefixes')
    return out


def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor)
        for k, v in obj.items())


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
            f'layout, e.g. {first!r}); convert it first:\n'
            f'    python tools/model_converters/soft2mmsoft.py {source} '
            f'{dst} [--norm for soft_norm_* weights]\n'
            f'  and load the converted file (the SOFT backbone alone reads '
            f"it directly: init_cfg=dict(type='Pretrained', "
            f'checkpoint={source!s})).')


#: the tensors of a SOFT block whose shapes give the architecture
_ARCH_KEYS = ('att.mha.attn.Qlandmark_op.weight', 'att.mha.attn.conv.weight',
              'att.ff1.weight')


def _shape(sd: Mapping, key: str) -> Tuple[int, ...]:
    if key not in sd:
        raise ConversionError(
            f'cannot infer the architecture: key {key!r} is missing')
    return tuple(sd[key].shape)


def _typical(sd: Mapping, stage: int, depth: int, names: Sequence[str]):
    """``(block prefix, shapes of names)`` of the first block of ``stage``
    with the most common shapes: a damaged block is reported, not taken as
    the architecture."""
    found = {}
    for p in (f'block{stage}.{j}.' for j in range(depth)):
        if all(p + n in sd for n in names):
            sig = tuple(tuple(sd[p + n].shape) for n in names)
            found.setdefault(sig, []).append(p)
    if not found:
        p = f'block{stage}.0.'
        return p, tuple(_shape(sd, p + n) for n in names)
    sig = max(found, key=lambda s: len(found[s]))
    return found[sig][0], sig


def infer_official_arch(sd: Mapping[str, torch.Tensor],
                        stage4_heads: Optional[int] = None) -> Dict:
    """The architecture of an authors' state dict, read off its shapes.

    Args:
        sd (Mapping): the state dict in the authors' key layout.
        stage4_heads (int, optional): the heads of the softmax stage 4 (not
            in the weights). Default: stage 3's head width.

    Returns:
        dict: mmsoft's arch entries, ``in_channels``, ``num_classes`` (0: no
        head), ``pretrain_img_size`` and ``stage4_heads_given``.
    """
    C = [_shape(sd, f'pos_embed{s}')[-1] for s in range(1, 5)]
    depths = []
    for s in range(1, 5):
        found = [
            int(m[1]) for m in (re.match(rf'block{s}\.(\d+)\.', k) for k in sd)
            if m
        ]
        if not found:
            raise ConversionError(
                f'cannot infer the architecture: no block{s}.* keys')
        depths.append(max(found) + 1)
    stages = []  # (heads, sampling ratio, dw kernel, MLP hidden width)
    for s in range(1, 4):
        pre, (lm, dw, ff1) = _typical(sd, s, depths[s - 1], _ARCH_KEYS)
        if len(lm) != 4 or len(dw) != 4:
            raise ConversionError(
                f'cannot infer the architecture: {pre}{_ARCH_KEYS[0]} should '
                f'be (d, d, r, r) and {pre}{_ARCH_KEYS[1]} (heads, 1, k, k); '
                f'found {lm} and {dw} (linear landmark ops, sr_ratio 1, are '
                f'not supported)')
        if dw[0] * lm[0] != C[s - 1]:
            raise ConversionError(
                f'inconsistent stage {s}: {dw[0]} heads ({pre}{_ARCH_KEYS[1]} '
                f'{dw}) x head width {lm[0]} ({pre}{_ARCH_KEYS[0]} {lm}) != '
                f'embed dim {C[s - 1]}')
        stages.append((dw[0], lm[-1], dw[-1], ff1[0]))
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
    (fc1, ) = _typical(sd, 4, depths[3], ('mlp.fc1.weight', ))[1]
    stages.append((heads, 1, None, fc1[0]))  # no dw conv
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


def official_shapes(arch: Mapping,
                    in_channels: int = 3,
                    num_classes: int = 1000,
                    pretrain_img_size: int = 224
                    ) -> 'OrderedDict[str, Tuple[int, ...]]':
    """Every key of an official model of ``arch`` (an mmsoft arch dict) with
    its shape, in the official order; ``num_classes=0``: no ``head.*``."""
    a = dict(ARCH_DEFAULTS, **arch)
    out = OrderedDict()
    for s, key, _, shape in official_tensors(a['depths']):
        c, g = a['embed_dims'][s], pretrain_img_size // (4 * 2**s)
        dims = dict(
            c=c,
            cp=a['embed_dims'][s - 1],
            d=c // a['num_heads'][s],
            h=a['num_heads'][s],
            r=a['sampling_ratios'][s],
            k=a['dw_kernel_sizes'][s],
            f=int(c * a['mlp_ratios'][s]),
            kv=2 * c,
            n=g * g + (s == 3),  # + the cls token
            classes=num_classes)
        dims['in'] = in_channels
        if num_classes or not key.startswith('head.'):
            out[key] = tuple(dims.get(x, x) for x in shape)
    return out


def arch_for_mmsoft(arch: Mapping) -> Dict:
    """The minimal mmsoft arch dict: ``embed_dims``, ``num_heads``,
    ``depths`` and the optional entries that differ from the defaults."""
    out = {k: list(arch[k]) for k in ('embed_dims', 'num_heads', 'depths')}
    out.update({
        k: list(arch[k])
        for k, v in ARCH_DEFAULTS.items() if k in arch and list(arch[k]) != v
    })
    return out


def match_arch_preset(arch: Mapping) -> Optional[str]:
    """The name of the ``SOFT.arch_zoo`` preset equal to ``arch`` (an arch
    dict), or None."""
    want = arch_for_mmsoft(arch)
    return next((name for name, preset in ARCH_ZOO.items()
                 if arch_for_mmsoft(dict(ARCH_DEFAULTS, **preset)) == want),
                None)


def describe_arch(arch: Mapping) -> str:
    """``arch='tiny'`` or ``arch=dict(...)``, as in a config file."""
    name = match_arch_preset(arch)
    if name is not None:
        return f"arch='{name}'"
    items = ', '.join(f'{k}={v}' for k, v in arch_for_mmsoft(arch).items())
    return f'arch=dict({items})'


def official_model_name(arch: Mapping,
                        attn_norm: Optional[bool] = None) -> Optional[str]:
    """``soft_tiny`` / ``soft_norm_tiny`` ... (``soft[_norm]_tiny`` for
    ``attn_norm=None``) of an official model size, else None."""
    name = match_arch_preset(arch)
    size = next((s for s, p in OFFICIAL_PRESETS.items() if p == name), None)
    infix = {None: '[_norm]', True: '_norm', False: ''}[attn_norm]
    return None if size is None else f'soft{infix}_{size}'


def _validate(sd: 'OrderedDict', arch: Dict, what: str, rename=str):
    """The official shape table of ``arch`` and notes; missing BatchNorm
    counters are set to 0, unknown / missing / mis-shaped keys raise one
    :class:`ConversionError`."""
    expected = official_shapes(arch, arch['in_channels'], arch['num_classes'],
                               arch['pretrain_img_size'])
    filled = [
        k for k in expected if k.endswith('batches_tracked') and k not in sd
    ]
    sd.update((k, torch.tensor(0, dtype=torch.long)) for k in filled)
    problems = [
        f'unknown key {rename(k)!r} (shape {tuple(v.shape)})'
        for k, v in sd.items() if k not in expected
    ]
    for k, shp in expected.items():
        if k not in sd:
            problems.append(f'missing key {rename(k)!r} (expected shape '
                            f'{shp})')
        elif tuple(sd[k].shape) != shp:
            problems.append(f'shape mismatch for {rename(k)!r}: expected '
                            f'{shp}, found {tuple(sd[k].shape)}')
    if problems:
        raise ConversionError(
            f'the {what} does not match the inferred architecture '
            f'({len(problems)} problem(s)):', problems)
    return expected, [
        f'{len(filled)} BatchNorm num_batches_tracked buffers were missing '
        f'and set to 0'
    ] if filled else []


def convert_official_to_mmpretrain(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict, List[str]]:
    """An authors' state dict -> an mmpretrain ``ImageClassifier``'s.

    Args:
        sd (Mapping): the state dict in the authors' key layout.
        stage4_heads (int, optional): see :func:`infer_official_arch`.
        prefix (str): the prefix of the backbone keys. Default: 'backbone.'.

    Returns:
        tuple: the state dict (the authors' ``head`` as ``head.fc``), the
        arch and notes. Unknown, missing or mis-shaped keys raise one
        :class:`ConversionError` naming them all.
    """
    sd = strip_module_prefix(sd)
    arch = infer_official_arch(sd, stage4_heads)
    expected, notes = _validate(sd, arch, 'official checkpoint')
    out = OrderedDict()
    for k in expected:  # the official order is also mmsoft's
        new = official_to_mmsoft_key(k)
        out[new if new.startswith('head.') else prefix + new] = sd[k]
    return out, arch, notes


def convert_mmpretrain_to_official(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict, List[str]]:
    """The inverse of :func:`convert_official_to_mmpretrain`.

    Args:
        sd (Mapping): a classifier's or a bare backbone's state dict (no key
            under ``prefix``) of any mmsoft version; other keys (a neck ...)
            are errors.
        stage4_heads (int, optional): see :func:`infer_official_arch`.
        prefix (str): the prefix of the backbone keys. Default: 'backbone.'.
    """
    sd = strip_module_prefix(sd)
    has_prefix = any(k.startswith(prefix) for k in sd)
    sd = upgrade_legacy_state_dict(sd, prefix if has_prefix else '')
    official, origin, problems = OrderedDict(), {}, []
    for k, v in sd.items():
        inner = k[len(prefix):] if has_prefix and k.startswith(prefix) else k
        name = mmsoft_to_official_key(inner)
        if has_prefix and name and (inner != k) == name.startswith('head.'):
            name = None  # a head inside the backbone, a backbone key outside
        if name is None:
            problems.append(f'unknown key {k!r} (shape {tuple(v.shape)})')
        else:
            official[name], origin[name] = v, k
    if problems:
        raise ConversionError(
            'the mmsoft checkpoint has keys with no official counterpart:',
            problems)

    def rename(k):  # the mmsoft name of an official key, in the messages
        new = official_to_mmsoft_key(k) or ''
        pre = prefix if has_prefix and not new.startswith('head.') else ''
        return origin.get(k) or (pre + new if new else k)

    arch = infer_official_arch(official, stage4_heads)
    expected, notes = _validate(official, arch, 'mmsoft checkpoint', rename)
    return OrderedDict((k, official[k]) for k in expected), arch, notes
