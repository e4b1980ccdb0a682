"""The options of the :class:`~mmsoft.models.backbones.SOFT` backbone:
checks and per-stage expansion.

Every function raises one ``ValueError`` / ``TypeError`` that names the
option, what it got and what to write instead, at construction time.

Per-stage settings take one entry per stage (4). A setting that only the
:class:`~mmsoft.models.backbones.soft.SOFTStage` takes (``dw_kernel_sizes``
of ``arch``, a list ``attn_cfg``) has ``None`` as the entry of the softmax
:class:`~mmsoft.models.backbones.soft.ClsTokenStage` (stage 4). The
3-entry lists of mmsoft 0.2 are an error that says so, as the attention
options of mmsoft 0.1 are (:func:`check_legacy_options`).
"""
import copy
import inspect
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from ..layers import checks
from ..layers.blocks import RESIDUAL_DROPS, check_norm_cfg

__all__ = [
    'LEGACY_ATTN_ARGS', 'OUT_TYPES', 'check_legacy_options', 'check_options',
    'parse_arch', 'parse_out_indices', 'per_stage', 'parse_norm_cfgs',
    'parse_attn_cfg', 'parse_stage_cfgs', 'stage_args'
]

#: the SOFT-attention options the backbone took before ``attn_cfg``
#: (mmsoft 0.1); see :func:`check_legacy_options`
LEGACY_ATTN_ARGS = ('attn_type', 'attn_norm', 'sampling', 'nr_iters',
                    'nr_init', 'nr_method', 'nr_backward', 'nr_diagnostics',
                    'max_landmarks')
#: the values of ``out_type``
OUT_TYPES = ('featmap', 'cls_token')
#: ``arch`` keys: the required ones (the optional ones: ``arch_defaults``)
ARCH_KEYS = ('embed_dims', 'num_heads', 'depths')
#: the settings of ``stage_cfgs`` that ``arch`` defines (set them there)
_FROM_ARCH = dict(
    type='the stage types',
    in_channels='the previous stage',
    embed_dims="arch['embed_dims']",
    num_heads="arch['num_heads']",
    depth="arch['depths']",
    num_extra_tokens='the stage type')


def check_legacy_options(legacy: Dict) -> None:
    """Options the backbone took before ``attn_cfg`` (mmsoft 0.1): one
    ``TypeError`` with the ``attn_cfg`` to write instead; other unknown
    options: a ``TypeError`` naming them."""
    if not legacy:
        return
    unknown = sorted(set(legacy) - set(LEGACY_ATTN_ARGS))
    if unknown:
        raise TypeError(f'SOFT got unexpected arguments {unknown}')
    opts = {k: v for k, v in legacy.items() if k != 'attn_type'}
    attn_type = legacy.get('attn_type', 'soft')
    if attn_type == 'soft_norm':
        attn_type, opts['attn_norm'] = 'soft', True
    items = ', '.join(f'{k}={v!r}' for k, v in opts.items())
    new = f"attn_cfg=dict(type={attn_type!r}{', ' if items else ''}" \
        f'{items})'
    raise TypeError(f'SOFT no longer takes {sorted(legacy)}: the attention '
                    f'options moved into attn_cfg; write {new}')


def check_options(num_stages: int, in_channels, pretrain_img_size, out_type,
                  frozen_stages, residual_drop, **rates: float) -> None:
    """The scalar options; ``rates``: the dropout / drop-path rates."""
    checks.check_int('SOFT: in_channels', in_channels)
    checks.check_int('SOFT: pretrain_img_size', pretrain_img_size, minimum=32)
    rates = {k: checks.check_rate(f'SOFT: {k}', r) for k, r in rates.items()}
    if out_type not in OUT_TYPES:
        raise ValueError(f'unknown out_type {out_type!r}; choose one of '
                         f'{OUT_TYPES}')
    checks.check_int('SOFT: frozen_stages', frozen_stages, minimum=-1)
    if frozen_stages > num_stages:
        raise ValueError(f'frozen_stages must be in [-1, {num_stages}], got '
                         f'{frozen_stages}')
    if residual_drop not in RESIDUAL_DROPS:
        raise ValueError(f'SOFT: residual_drop must be one of '
                         f'{RESIDUAL_DROPS}, got {residual_drop!r}')
    return rates


def stage_args(stage_cls: type) -> Tuple[str, ...]:
    """The constructor arguments of a stage class and of its bases (a
    subclass passes the common ones on as ``**kwargs``)."""
    names: List[str] = []
    for klass in stage_cls.__mro__:
        init = klass.__dict__.get('__init__')
        if init is None:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.name != 'self' and p.kind not in (p.VAR_POSITIONAL,
                                                   p.VAR_KEYWORD) and \
                    p.name not in names:
                names.append(p.name)
    return tuple(names)


def _only_some_stages(name: str,
                      arg: str,
                      values: Sequence,
                      stages: Sequence[type],
                      example: str,
                      error: type = ValueError) -> None:
    """A per-stage setting that some stage types do not take (``arg``):
    one entry per stage, None at those stages; else ``error``."""
    n = len(stages)
    takes = [arg in stage_args(s) for s in stages]
    if len(values) == sum(takes) != n:
        i = takes.index(False)
        raise error(f'SOFT {name} has {len(values)} entries; give {n}, one '
                    f'per stage, with None for stage {i + 1} (a '
                    f'{stages[i].__name__}, which takes no {arg}): '
                    f'{example}')
    if len(values) != n:
        raise error(f'SOFT {name} must be a list of {n} values (one '
                    f'per stage), got {values!r}')
    for i, (t, v) in enumerate(zip(takes, values)):
        if not t and v is not None:
            raise error(f'SOFT {name}[{i}] must be None: stage {i + 1} '
                        f'is a {stages[i].__name__}, which takes no '
                        f'{arg}; got {v!r}')


def parse_arch(arch, arch_zoo: Mapping, arch_defaults: Mapping,
               stages: Sequence[type]) -> Dict:
    """The settings of ``arch`` (a preset name or a dict), its optional
    keys filled from ``arch_defaults``; ``stages``: the stage classes."""
    if isinstance(arch, str):
        key = arch.lower()
        if key not in arch_zoo:
            raise ValueError(f'unknown SOFT arch {arch!r}; valid presets: '
                             f'{sorted(arch_zoo)} (or pass a dict)')
        settings = copy.deepcopy(arch_zoo[key])
    elif isinstance(arch, dict):
        settings = dict(copy.deepcopy(arch))
        for key in ARCH_KEYS:
            if key not in settings:
                raise ValueError(f'SOFT arch dict is missing {key!r}; it '
                                 f'needs {", ".join(ARCH_KEYS)}')
    else:
        raise TypeError(f'SOFT arch must be a str or dict, got '
                        f'{type(arch).__name__}')
    for k, v in arch_defaults.items():
        settings.setdefault(k, list(v))
    unknown = set(settings) - {*ARCH_KEYS, *arch_defaults}
    if unknown:
        raise ValueError(f'SOFT arch dict has unknown keys {sorted(unknown)}; '
                         f'valid keys are {", ".join(ARCH_KEYS)}, '
                         f'{", ".join(arch_defaults)}')
    n = len(stages)
    for key, val in settings.items():
        if not isinstance(val, (list, tuple)):
            raise ValueError(f'SOFT arch[{key!r}] must be a list of {n} '
                             f'values (one per stage), got {val!r}')
    kernels = settings['dw_kernel_sizes']
    _only_some_stages("arch['dw_kernel_sizes']", 'dw_kernel_size', kernels,
                      stages, f'dw_kernel_sizes={[*kernels, None]}')
    for key, val in settings.items():
        if len(val) != n:
            raise ValueError(f'SOFT arch[{key!r}] must be a list of {n} '
                             f'values (one per stage), got {val!r}')
    for i, (c, h) in enumerate(
            zip(settings['embed_dims'], settings['num_heads'])):
        if h <= 0 or c % h != 0:
            raise ValueError(f'SOFT arch: num_heads[{i}]={h} does not '
                             f'divide embed_dims[{i}]={c}')
    if any(d < 1 for d in settings['depths']):
        raise ValueError(f'SOFT arch: every depth must be >= 1, got '
                         f'{settings["depths"]}')
    for i, k in enumerate(kernels):
        if k is not None:
            checks.check_kernel_size(f'SOFT arch: dw_kernel_sizes[{i}]', k)
    for i, r in enumerate(settings['sampling_ratios']):
        checks.check_int(f'SOFT arch: sampling_ratios[{i}]', r)
    for i, e in enumerate(settings['mlp_ratios']):
        if isinstance(e, bool) or not isinstance(e, (int, float)) or e <= 0:
            raise ValueError(f'SOFT arch: mlp_ratios[{i}] must be a '
                             f'positive number, got {e!r}')
    return settings


def parse_out_indices(out_indices, num_stages: int) -> Tuple[int, ...]:
    """Sorted, unique stage indices (negative ones count from the end)."""
    if isinstance(out_indices, int):
        out_indices = [out_indices]
    out = []
    for idx in out_indices:
        j = idx + num_stages if idx < 0 else idx
        if not 0 <= j < num_stages:
            raise ValueError(f'out_indices entry {idx} is out of range; '
                             f'SOFT has stages 0..{num_stages - 1}')
        out.append(j)
    if not out:
        raise ValueError(f'out_indices is empty; SOFT needs at least one '
                         f'output stage (0-{num_stages - 1})')
    return tuple(sorted(set(out)))


def per_stage(name: str, value, n: int) -> List[Optional[Dict]]:
    """One config (or None: the stage default) per stage, from one dict /
    None for all stages or a list of ``n``."""
    if value is None or isinstance(value, Mapping):
        return [copy.deepcopy(value) for _ in range(n)]
    if isinstance(value, (list, tuple)) and len(value) == n and all(
            v is None or isinstance(v, Mapping) for v in value):
        return [copy.deepcopy(v) for v in value]
    raise TypeError(f'SOFT: {name} must be a dict or a list of {n} '
                    f'dicts / None (one per stage), got {value!r}')


def parse_norm_cfgs(norm_cfg, patch_norm_cfg, n: int) -> List[Optional[Dict]]:
    """The blocks' norm of each stage (:func:`per_stage`); every norm type,
    ``patch_norm_cfg``'s too, must be a registered norm layer."""
    norm_cfgs = per_stage('norm_cfg', norm_cfg, n)
    for i, cfg in enumerate(norm_cfgs):
        check_norm_cfg(
            'norm_cfg' if isinstance(norm_cfg, Mapping) else f'norm_cfg[{i}]',
            cfg)
    check_norm_cfg('patch_norm_cfg', patch_norm_cfg)
    return norm_cfgs


def parse_attn_cfg(attn_cfg, stages: Sequence[type]) -> List[Optional[Dict]]:
    """One attention config per stage: ``attn_cfg`` (default SOFT
    attention) for the stages that take one, None for the others."""
    takes = ['attn_cfg' in stage_args(s) for s in stages]
    if attn_cfg is None:
        attn_cfg = dict(type='SOFTAttention')
    if isinstance(attn_cfg, Mapping):
        return [dict(attn_cfg) if t else None for t in takes]
    if not isinstance(attn_cfg, (list, tuple)) or not all(
            c is None or isinstance(c, Mapping) for c in attn_cfg):
        raise TypeError(f'SOFT: attn_cfg must be a dict or a list of '
                        f'{len(stages)} dicts / None (one per stage), got '
                        f'{attn_cfg!r}')
    _only_some_stages('attn_cfg', 'attn_cfg', attn_cfg, stages,
                      f'attn_cfg=[<your {len(attn_cfg)} dicts>, None]',
                      TypeError)
    for i, (t, c) in enumerate(zip(takes, attn_cfg)):
        if t and c is None:
            raise TypeError(f'SOFT: attn_cfg[{i}] is None, but stage '
                            f'{i + 1} ({stages[i].__name__}) needs an '
                            f'attention dict')
    return [dict(c) if t else None for t, c in zip(takes, attn_cfg)]


def parse_stage_cfgs(stage_cfgs, stages: Sequence[type]) -> List[Dict]:
    """The user's extra config of each stage: one dict for all stages
    (each stage takes the keys its type has) or a list of one dict per
    stage (every key must be an argument of that stage's type)."""
    n = len(stages)
    if isinstance(stage_cfgs, Mapping):
        unused = set(stage_cfgs).difference(*map(stage_args, stages))
        _check_stage_keys('stage_cfgs', stage_cfgs, unused, stages)
        return [{
            k: copy.deepcopy(v)
            for k, v in stage_cfgs.items() if k in stage_args(s)
        } for s in stages]
    if not isinstance(stage_cfgs, (list, tuple)) or len(stage_cfgs) != n or \
            not all(isinstance(c, Mapping) for c in stage_cfgs):
        raise ValueError(f'SOFT: stage_cfgs must be a dict (for every stage) '
                         f'or a list of {n} dicts (one per stage), got '
                         f'{stage_cfgs!r}')
    for i, (cfg, s) in enumerate(zip(stage_cfgs, stages)):
        _check_stage_keys(f'stage_cfgs[{i}]', cfg,
                          set(cfg) - set(stage_args(s)), [s])
    return [copy.deepcopy(dict(c)) for c in stage_cfgs]


def _check_stage_keys(name: str, cfg: Mapping, unknown: set,
                      stages: Sequence[type]) -> None:
    for key in cfg:
        if key in _FROM_ARCH:
            raise ValueError(f'SOFT: {name} sets {key!r}, which comes from '
                             f'{_FROM_ARCH[key]}; set it there')
    if unknown:
        valid = [a for s in stages for a in stage_args(s)]
        valid = sorted(set(valid) - set(_FROM_ARCH))
        kinds = '/'.join(dict.fromkeys(s.__name__ for s in stages))
        raise ValueError(f'SOFT: {name} has unknown keys {sorted(unknown)}; '
                         f'a {kinds} takes {", ".join(valid)}')
