"""The authors' SOFT checkpoints (github fudan-zvg/SOFT, timm ``soft_*`` /
``soft_norm_*``) and older mmsoft checkpoints, as key maps beside the model.

* :data:`KEY_MAP` - official key <-> mmsoft key, one template pair per
  tensor kind (``{j}``: block index, ``{w}``: weight / bias, ``{bn}``: a
  BatchNorm tensor); no tensor is reshaped;
* :data:`LEGACY_KEYS` - ``(regex, replacement)`` renames of the keys of the
  SOFT backbone's ``_version`` 1 and 2 (applied as mmengine's
  ``revise_keys`` are, under the backbone's prefix);
* the architecture read off the tensor shapes (:func:`infer_official_arch`)
  and the full official key -> shape table (:func:`official_shapes`),
  against which both conversions are validated.

``soft_*`` and ``soft_norm_*`` files hold the same tensors: the attention
normalisation is not in the weights, nor are the heads of the softmax stage
4 (assumed to keep stage 3's head width unless given). Nothing here imports
the backbone (the presets are :mod:`mmsoft.models.arch_zoo`).
"""
import os.path as osp
import re
from collections import Counter, OrderedDict
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from .arch_zoo import ARCH_DEFAULTS, ARCH_ZOO, NUM_STAGES

__all__ = [
    'ConversionError', 'KEY_MAP', 'LEGACY_KEYS', 'official_to_mmsoft_key',
    'mmsoft_to_official_key', 'upgrade_legacy_state_dict',
    'extract_state_dict', 'strip_module_prefix', 'find_official_state_dict',
    'official_soft_hint', 'infer_official_arch', 'official_shapes',
    'arch_for_mmsoft', 'match_arch_preset', 'describe_arch',
    'official_model_name', 'convert_official_to_mmpretrain',
    'convert_mmpretrain_to_official'
]


class ConversionError(ValueError):
    """A checkpoint does not match the expected layout; ``problems`` lists
    one line per offending key."""

    def __init__(self, message: str, problems: Sequence[str] = ()):
        self.problems = list(problems)
        super().__init__('\n  '.join([message, *self.problems]))


# ------------------------------------------------------------ the key map
#: (official, mmsoft) inside a block of stages 1-3 (SOFT attention)
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
#: the same in stage 4 (timm's pre-norm softmax block)
_SOFTMAX_BLOCK_RULES = (
    ('norm1.', 'norm1.'),
    ('norm2.', 'norm2.'),
    ('attn.q.', 'attn.q.'),
    ('attn.kv.', 'attn.kv.'),
    ('attn.proj.', 'attn.proj.'),
    ('mlp.fc1.', 'ffn.layers.0.0.'),
    ('mlp.fc2.', 'ffn.layers.1.'),
)
BN_KEYS = ('weight', 'bias', 'running_mean', 'running_var',
           'num_batches_tracked')
_FIELDS = dict(j=r'\d+', w='weight|bias', bn='|'.join(BN_KEYS))

#: official key template -> mmsoft key template (``head`` -> ``head.fc``)
KEY_MAP = [('cls_token', 'stages.3.cls_token'),
           ('norm.{w}', 'stages.3.norm.{w}'), ('head.{w}', 'head.fc.{w}')]
for _s in range(NUM_STAGES):
    KEY_MAP.append((f'pos_embed{_s + 1}', f'stages.{_s}.pos_embed'))
    for _n in range(3 if _s == 0 else 1):  # (conv, BN, ReLU) per layer
        _o, _m = f'patch_embed{_s + 1}.proj.', f'stages.{_s}.patch_embed.proj.'
        KEY_MAP += [(f'{_o}{3 * _n}.{{w}}', f'{_m}{_n}.conv.{{w}}'),
                    (f'{_o}{3 * _n + 1}.{{bn}}', f'{_m}{_n}.bn.{{bn}}')]
    for _o, _m in _SOFT_BLOCK_RULES if _s < 3 else _SOFTMAX_BLOCK_RULES:
        KEY_MAP.append((f'block{_s + 1}.{{j}}.{_o}{{w}}',
                        f'stages.{_s}.blocks.{{j}}.{_m}{{w}}'))


def _regex(template: str):
    parts = re.split(r'\{(\w+)\}', template)  # literal, field, literal ...
    return re.compile(''.join(f'(?P<{p}>{_FIELDS[p]})' if i %
                              2 else re.escape(p)
                              for i, p in enumerate(parts)))


_TO_MMSOFT = [(_regex(o), m) for o, m in KEY_MAP]
_TO_OFFICIAL = [(_regex(m), o) for o, m in KEY_MAP]


def _rename(key: str, rules) -> Optional[str]:
    for regex, template in rules:
        m = regex.fullmatch(key)
        if m:
            return template.format(**m.groupdict())
    return None


def official_to_mmsoft_key(key: str) -> Optional[str]:
    """mmsoft's name of one official key (None: no counterpart)."""
    return _rename(key, _TO_MMSOFT)


def mmsoft_to_official_key(key: str) -> Optional[str]:
    """The official name of one mmsoft backbone key or ``head.fc.*``."""
    return _rename(key, _TO_OFFICIAL)


#: keys of the SOFT backbone's ``_version`` 1 (before stages were
#: modules) and 2 (before mmcv's FFN) -> version 3, under its prefix;
#: no pattern matches a version-3 key. ``{last}``: the last stage
LEGACY_KEYS = (
    (r'patch_embeds\.(\d+)\.', r'stages.\1.patch_embed.'),
    (r'pos_embeds\.(\d+)$', r'stages.\1.pos_embed'),
    (r'stages\.(\d+)\.(\d+)\.', r'stages.\1.blocks.\2.'),
    (r'cls_token$', 'stages.{last}.cls_token'),
    (r'norm\.', 'stages.{last}.norm.'),
    (r'(stages\.\d+\.blocks\.\d+\.ffn\.)fc1\.', r'\1layers.0.0.'),
    (r'(stages\.\d+\.blocks\.\d+\.ffn\.)fc2\.', r'\1layers.1.'),
)


def upgrade_legacy_state_dict(state_dict: Mapping,
                              prefix: str = '',
                              num_stages: int = NUM_STAGES) -> Dict:
    """``state_dict`` with the version-1 / -2 keys under ``prefix`` renamed
    (:data:`LEGACY_KEYS`); other keys, their order and ``_metadata`` kept."""
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


# ---------------------------------------------------------------- layouts
def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor)
        for k, v in obj.items())


def extract_state_dict(ckpt,
                       prefer_ema: bool = True) -> Tuple['OrderedDict', str]:
    """``(state_dict, entry)`` of a loaded checkpoint in any timm / OpenMMLab
    layout: ``state_dict_ema`` / ``model_ema`` (first when ``prefer_ema``),
    ``state_dict``, ``model`` or the dict itself (entry ``'<bare>'``);
    ``module.`` prefixes stripped."""
    order = ['state_dict', 'model', 'state_dict_ema', 'model_ema']
    order = order[2:] + order[:2] if prefer_ema else order
    if not isinstance(ckpt, Mapping):
        raise ConversionError(f'checkpoint is a {type(ckpt).__name__}, not '
                              f'a dict')
    entry = next((n for n in order if _is_state_dict(ckpt.get(n))),
                 '<bare>' if _is_state_dict(ckpt) else None)
    if entry is None:
        raise ConversionError(
            f'no state dict found in the checkpoint: expected one of '
            f'{order} holding tensors, or a bare state dict; top-level keys '
            f'are {sorted(map(str, ckpt))[:20]}')
    return strip_module_prefix(ckpt if entry ==
                               '<bare>' else ckpt[entry]), entry


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
            f'layout, e.g. {first!r}); convert it first:\n'
            f'    python tools/model_converters/soft2mmsoft.py {source} '
            f'{dst} [--norm for soft_norm_* weights]\n'
            f'  and load the converted file (the SOFT backbone alone reads '
            f"it directly: init_cfg=dict(type='Pretrained', "
            f'checkpoint={source!s})).')


# ----------------------------------------------------------- architecture
#: hidden channels of the official three-conv stem
OFFICIAL_STEM_CHANNELS = 32
#: the official model sizes and the mmsoft presets with their architecture
OFFICIAL_PRESETS = dict(
    tiny='tiny',
    small='small-official',
    medium='medium',
    large='large',
    huge='huge')


def _shape(sd: Mapping, key: str) -> Tuple[int, ...]:
    if key not in sd:
        raise ConversionError(
            f'cannot infer the architecture: key {key!r} is missing')
    return tuple(sd[key].shape)


def _ratio(hidden: int, dims: int):
    return hidden // dims if hidden % dims == 0 else hidden / dims


def _typical_block(sd: Mapping, stage: int, depth: int) -> str:
    """The prefix of the block whose shapes are the most common in the
    stage (the first on ties): one damaged block is reported as the odd one
    out instead of redefining the stage."""
    names = ('mha.attn.Qlandmark_op.weight', 'mha.attn.conv.weight',
             'ff1.weight')
    pres = [f'block{stage + 1}.{j}.att.' for j in range(depth)]
    sigs = [
        tuple(tuple(sd[p + n].shape) if p + n in sd else None for n in names)
        for p in pres
    ]
    counts = Counter(s for s in sigs if None not in s)
    best = max(counts.values(), default=None)
    return next((p for p, s in zip(pres, sigs) if counts.get(s) == best),
                pres[0])


def infer_official_arch(sd: Mapping[str, torch.Tensor],
                        stage4_heads: Optional[int] = None) -> Dict:
    """The architecture of an official-layout state dict, from its shapes:
    mmsoft's arch dict entries (``embed_dims``, ``num_heads``, ``depths``,
    ``sampling_ratios``, ``mlp_ratios``, ``dw_kernel_sizes``) plus
    ``in_channels``, ``num_classes`` (0 without a head),
    ``pretrain_img_size`` and ``stage4_heads_given`` (False: stage 4's heads,
    not in the weights, keep stage 3's head width)."""
    C, depths = [], []
    for i in range(4):
        shp = _shape(sd, f'pos_embed{i + 1}')
        if len(shp) != 3:
            raise ConversionError(
                f'cannot infer the architecture: pos_embed{i + 1} should be '
                f'(1, N, C), found {shp}')
        C.append(shp[-1])
        blocks = [
            int(m.group(1))
            for m in map(re.compile(rf'block{i + 1}\.(\d+)\.').match, sd) if m
        ]
        if not blocks:
            raise ConversionError(
                f'cannot infer the architecture: no block{i + 1}.* keys')
        depths.append(max(blocks) + 1)
    heads, ratios, kernels, mlp = [], [], [], []
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
        if dw[0] * lm[0] != C[i]:
            raise ConversionError(
                f'inconsistent stage {i + 1}: {dw[0]} heads (from '
                f'{pre}mha.attn.conv.weight {dw}) x head width {lm[0]} '
                f'(from {pre}mha.attn.Qlandmark_op.weight {lm}) != '
                f'embed dim {C[i]}')
        heads.append(dw[0])
        ratios.append(lm[-1])
        kernels.append(dw[-1])
        mlp.append(_ratio(_shape(sd, pre + 'ff1.weight')[0], C[i]))
    given = stage4_heads is not None
    if given and (isinstance(stage4_heads, bool)
                  or not isinstance(stage4_heads, int) or stage4_heads < 1):
        raise ConversionError(f'stage-4 heads must be a positive integer, '
                              f'got {stage4_heads!r}')
    if not given:
        if C[3] % lm[0]:
            raise ConversionError(
                f'cannot guess the heads of stage 4: embed dim {C[3]} is not '
                f'a multiple of the head width {lm[0]} of stage 3; give them '
                f'explicitly')
        stage4_heads = C[3] // lm[0]
    elif C[3] % stage4_heads:
        raise ConversionError(f'stage-4 heads {stage4_heads} do not divide '
                              f'its embed dim {C[3]}')
    hidden = Counter(sd[k].shape[0] for k in (f'block4.{j}.mlp.fc1.weight'
                                              for j in range(depths[3]))
                     if k in sd)
    if not hidden:
        _shape(sd, 'block4.0.mlp.fc1.weight')  # raises: missing
    n1 = _shape(sd, 'pos_embed1')[1]
    g = int(round(n1**0.5))
    if g * g != n1:
        raise ConversionError(f'pos_embed1 has {n1} tokens, not a square '
                              f'grid')
    return dict(
        embed_dims=C,
        num_heads=heads + [stage4_heads],
        depths=depths,
        sampling_ratios=ratios + [1],
        mlp_ratios=mlp + [_ratio(hidden.most_common(1)[0][0], C[3])],
        dw_kernel_sizes=kernels + [None],  # stage 4: no depthwise conv
        in_channels=_shape(sd, 'patch_embed1.proj.0.weight')[1],
        num_classes=sd['head.weight'].shape[0] if 'head.weight' in sd else 0,
        pretrain_img_size=4 * g,
        stage4_heads_given=given)


def official_shapes(arch: Mapping,
                    in_channels: int = 3,
                    num_classes: int = 1000,
                    pretrain_img_size: int = 224
                    ) -> 'OrderedDict[str, Tuple[int, ...]]':
    """Every key of an official model of ``arch`` (an mmsoft arch dict) with
    its shape, in the official order; ``num_classes=0``: no ``head.*``."""
    a = dict(
        ARCH_DEFAULTS, **{
            k: v
            for k, v in arch.items()
            if k in ('embed_dims', 'num_heads', 'depths', *ARCH_DEFAULTS)
        })
    C, H, D = a['embed_dims'], a['num_heads'], a['depths']
    out = OrderedDict()
    for i in range(4):
        g = pretrain_img_size // (4 * 2**i)
        out[f'pos_embed{i + 1}'] = (1, g * g + (i == 3), C[i])
    out['cls_token'] = (1, 1, C[3])

    def conv_bn(pre, cin, cout, n=0):  # conv 3n, BN 3n + 1
        out[f'{pre}{3 * n}.weight'] = (cout, cin, 3, 3)
        out[f'{pre}{3 * n}.bias'] = (cout, )
        for k in BN_KEYS:
            out[f'{pre}{3 * n + 1}.{k}'] = () if k.startswith('num') else (
                cout, )

    stem = (in_channels, OFFICIAL_STEM_CHANNELS, OFFICIAL_STEM_CHANNELS, C[0])
    for n in range(3):
        conv_bn('patch_embed1.proj.', stem[n], stem[n + 1], n)
    for i in range(1, 4):
        conv_bn(f'patch_embed{i + 1}.proj.', C[i - 1], C[i])

    def linear(pre, cin, cout):  # cin None: a LayerNorm
        out[pre + 'weight'] = (cout, ) if cin is None else (cout, cin)
        out[pre + 'bias'] = (cout, )

    for i in range(4):
        c, d = C[i], C[i] // H[i]
        r, k = a['sampling_ratios'][i], a['dw_kernel_sizes'][i]
        hid = int(c * a['mlp_ratios'][i])
        for j in range(D[i]):
            p = f'block{i + 1}.{j}.'
            if i < 3:
                linear(p + 'att.mha.W_q.', c, c)
                linear(p + 'att.mha.W_v.', c, c)
                out[p + 'att.mha.attn.Qlandmark_op.weight'] = (d, d, r, r)
                linear(p + 'att.mha.attn.Qnorm_act.0.', None, d)
                out[p + 'att.mha.attn.conv.weight'] = (H[i], 1, k, k)
                for name, cin, cout in (('mha.ff.', c, c), ('norm1.', None, c),
                                        ('ff1.', c, hid), ('ff2.', hid, c),
                                        ('norm2.', None, c)):
                    linear(f'{p}att.{name}', cin, cout)
            else:  # timm's pre-norm Block
                for name, cin, cout in (('norm1.', None, c), ('attn.q.', c, c),
                                        ('attn.kv.', c,
                                         2 * c), ('attn.proj.', c,
                                                  c), ('norm2.', None, c),
                                        ('mlp.fc1.', c, hid), ('mlp.fc2.', hid,
                                                               c)):
                    linear(p + name, cin, cout)
    linear('norm.', None, C[3])
    if num_classes:
        linear('head.', C[3], num_classes)
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
    """The ``SOFT.arch_zoo`` preset equal to ``arch``, or None."""
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
    if size is None:
        return None
    infix = {None: '[_norm]', True: '_norm', False: ''}[attn_norm]
    return f'soft{infix}_{size}'


# ------------------------------------------------------------ conversion
def _validate(sd: 'OrderedDict', arch: Dict, what: str, rename=str):
    """The official shape table of ``arch``, and notes; BatchNorm counters
    missing from ``sd`` (some exporters drop them) are set to 0, unknown /
    missing / mis-shaped keys raise one :class:`ConversionError`."""
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
    """An official state dict -> ``(state_dict, arch, notes)`` of an
    mmpretrain ``ImageClassifier``: backbone keys under ``prefix``, the
    official ``head`` as ``head.fc``; ``arch`` from
    :func:`infer_official_arch`. Unknown, missing or mis-shaped keys raise
    :class:`ConversionError` listing them all."""
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
    """The inverse of :func:`convert_official_to_mmpretrain`, for a
    classifier (``prefix`` keys and ``head.fc.*``) or a bare backbone state
    dict (no key under ``prefix``), also of older mmsoft versions
    (:data:`LEGACY_KEYS`); other keys (e.g. a neck) are unknown."""
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

    def rename(k):
        new = official_to_mmsoft_key(k)
        if k in origin or new is None:
            return origin.get(k, k)
        return new if new.startswith(
            'head.') or not has_prefix else prefix + new

    arch = infer_official_arch(official, stage4_heads)
    expected, notes = _validate(official, arch, 'mmsoft checkpoint', rename)
    return OrderedDict((k, official[k]) for k in expected), arch, notes
