"""Weights into mmsoft models, in one place: file -> layout -> conversion ->
strict (or explicitly partial) load -> a one-line report.

1. **File**: :func:`read_checkpoint` - MMEngine's loader (local files,
   URLs, ``open-mmlab://`` ...) under mmsoft's safe loading
   (:func:`mmsoft.runtime.setup`: weights-only unpickling on every torch,
   damage and checksum checks; a code-running pickle is refused).
   The converter tools read files with
   :func:`~mmsoft.utils.checkpoint_files.load_checkpoint_file` (the same
   safe loader, converter wording).
2. **Layout** (:func:`to_mmsoft`): the authors' ``soft_*`` /
   ``soft_norm_*`` files (fudan-zvg/SOFT keys ``patch_embed1.*``,
   ``block1.0.*``, ``pos_embed1``, under ``model`` / ``state_dict`` /
   ``state_dict_ema`` or bare); mmsoft / OpenMMLab checkpoints (``state_dict``
   or ``model`` entry, or bare), including whole classifiers, detectors and
   segmentors whose backbone keys start with ``backbone.``; keys of older
   mmsoft versions (:func:`upgrade_legacy_keys`).
3. **Conversion**: the authors' layout is renamed by
   :func:`mmsoft.models.converters.convert_official_to_mmpretrain` (the
   same code as ``tools/model_converters/soft2mmsoft.py``).
4. **Load** (:func:`load_pretrained`): the tensors (under ``prefix``; for a
   whole-model file without ``prefix``, those under ``backbone.``) are
   compared with the module
   (:func:`mmsoft.utils.strict_load.check_state_dict`): missing,
   unexpected or mis-shaped tensors raise
   :class:`~mmsoft.utils.strict_load.CheckpointMismatchError` naming them;
   ``strict=False`` loads the matching ones. Weights converted for the other
   attention normalisation are refused (:func:`check_attn_norm`).
5. **Report**: one line in MMEngine's current logger, e.g.
   ``mmsoft: loaded soft_norm_tiny.pth: authors' soft_norm_tiny layout
   ('model'), converted, keys under 'backbone.', 185 tensors, strict``.

``init_cfg=dict(type='Pretrained', checkpoint=...)`` on the SOFT backbone
runs :class:`SOFTPretrainedInit` (``'SOFTPretrained'`` in MMEngine's root
``WEIGHT_INITIALIZERS``, usable in any ``init_cfg``) instead of MMEngine's
``PretrainedInit`` (``strict=False``: wrong weights only warn); see
:func:`pretrained_init_cfg`.

Whole-model loads (``load_from``, ``--resume``, ``tools/test.py``, the
inferencers of ``demo/image_demo.py``) stay MMEngine's: the Runner and the
inferencers read the file and copy its ``state_dict`` into the model
themselves. mmsoft checks what they loaded with
:func:`check_checkpoint_for_model` (``StrictLoadHook``, the demo, the ONNX
export); an authors' file there gets the converter command, since the
Runner would load its unconverted keys.
"""
import os.path as osp
from collections import OrderedDict
from typing import (Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple,
                    Union)

import torch
from mmengine.logging import print_log
from mmengine.model.weight_init import update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS

from mmsoft.runtime import setup
from mmsoft.utils.checkpoint_files import ConversionError, extract_state_dict
from mmsoft.utils.strict_load import (CheckpointMismatchError, LoadReport,
                                      check_state_dict, few_keys, strip_prefix,
                                      unwrap_model)
from .converters import (OFFICIAL_FILES, OFFICIAL_PAGE, arch_for_mmsoft,
                         convert_official_to_mmpretrain, describe_arch,
                         find_official_state_dict, match_arch_preset,
                         official_model_name, official_soft_hint)
from .layers.soft_attention import SOFTAttention

__all__ = [
    # the steps
    'read_checkpoint',
    'Weights',
    'to_mmsoft',
    'upgrade_legacy_keys',
    'load_pretrained',
    'check_attn_norm',
    'check_checkpoint_for_model',
    # init_cfg
    'SOFTPretrainedInit',
    'pretrained_init_cfg',
    'missing_weights_message',
    'missing_pretrained',
    # the converter tools
    'official_weights',
    'converter_parser',
    'run_converter',
]

#: how a partial load of the backbone's init_cfg is allowed (in the error)
BACKBONE_OPT_IN = 'set model.backbone.init_cfg.strict=False'
#: the prefix of the backbone's keys in a whole-model checkpoint
BACKBONE_PREFIX = 'backbone.'


# ------------------------------------------------------------- 1. file
def read_checkpoint(filename: str, map_location='cpu', mmap: bool = False):
    """The loaded checkpoint ``filename`` (a path or URL): MMEngine's
    loader with mmsoft's safe loading in effect. ``mmap=True`` (to inspect
    the structure of a local file, e.g. before an inferencer loads it):
    the tensors stay on disk where the file format allows it."""
    from mmengine.runner.checkpoint import _load_checkpoint
    setup()  # weights-only loader, allow-list, checksums (mmsoft.runtime)
    if mmap:
        try:  # torch's weights-only unpickler: nothing runs from the file
            return torch.load(
                filename, map_location='cpu', weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - legacy format: read it whole
            pass
    return _load_checkpoint(filename, map_location=map_location)


# ----------------------------------------------------------- 2. layout
class Weights(NamedTuple):
    """A checkpoint's tensors in mmsoft's key layout."""
    state_dict: 'OrderedDict'
    layout: str  # e.g. "authors' soft_tiny layout ('model')"
    converted: bool  # renamed from the authors' layout
    arch: Optional[Dict]  # the authors' architecture (when converted)


def _entry(entry: str) -> str:
    return '' if entry == '<bare>' else f' ({entry!r})'


def mmsoft_state_dict(ckpt, source: str) -> Tuple['OrderedDict', str]:
    """``(state_dict, entry)`` of an mmsoft / OpenMMLab checkpoint: its
    ``state_dict`` or ``model`` entry, or the dict itself (``'<bare>'``);
    ``module.`` prefixes stripped."""
    if isinstance(ckpt, Mapping) and 'state_dict' in ckpt:
        entry = 'state_dict'
    elif isinstance(ckpt, Mapping) and isinstance(ckpt.get('model'), Mapping):
        entry = 'model'
    else:
        entry = '<bare>'
    sd = ckpt if entry == '<bare>' else ckpt[entry]
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {source} holds a {type(sd).__name__}, not a state '
            f'dict')
    return strip_prefix(sd), entry


def to_mmsoft(ckpt,
              source: str,
              stage4_heads: Optional[int] = None,
              attn_norm: Optional[bool] = None) -> Weights:
    """The tensors of a loaded checkpoint in mmsoft's layout.

    An authors' (fudan-zvg/SOFT) file is converted to the layout of an
    mmpretrain ``ImageClassifier`` (``backbone.*``, ``head.fc.*``), exactly
    as ``soft2mmsoft.py`` does; ``stage4_heads`` and ``attn_norm`` (not
    visible in the weights) only name the model in :attr:`Weights.layout`.
    Other files are taken as mmsoft checkpoints.
    """
    found = find_official_state_dict(ckpt)
    if found is None:
        sd, entry = mmsoft_state_dict(ckpt, source)
        return Weights(sd, 'mmsoft layout' + _entry(entry), False, None)
    sd, entry = found
    try:
        out, arch, _ = convert_official_to_mmpretrain(sd, stage4_heads)
    except ConversionError as e:
        raise CheckpointMismatchError(
            f"checkpoint {source} has the authors' SOFT key layout "
            f'(fudan-zvg/SOFT) but cannot be converted: {e}') from None
    name = official_model_name(arch, attn_norm) or \
        f'SOFT {describe_arch(arch)}'
    return Weights(out, f"authors' {name} layout" + _entry(entry), True, arch)


def _soft_backbones(model: torch.nn.Module):
    """``(name, module)`` of the modules whose class upgrades older
    checkpoint keys (``upgrade_state_dict``: the SOFT backbone)."""
    for name, mod in model.named_modules():
        if callable(getattr(type(mod), 'upgrade_state_dict', None)):
            yield name, mod


def upgrade_legacy_keys(model: torch.nn.Module, sd: Mapping) -> Mapping:
    """``sd`` with the keys of older SOFT checkpoint layouts renamed for
    every SOFT backbone inside ``model`` (what its ``_load_from_state_dict``
    does while loading), so that they are compared under the new names."""
    for name, mod in _soft_backbones(model):
        sd = type(mod).upgrade_state_dict(sd, f'{name}.' if name else '')
    return sd


def _attn_norms(model: torch.nn.Module) -> set:
    """The ``attn_norm`` values of the SOFT attentions inside ``model``."""
    return {
        m.attn_norm
        for m in model.modules() if isinstance(m, SOFTAttention)
    }


def _stage4_heads(model: torch.nn.Module) -> Optional[int]:
    """The heads of stage 4 of the (first) SOFT backbone in ``model``."""
    for _, mod in _soft_backbones(model):
        heads = getattr(mod, 'num_heads', None)
        if isinstance(heads, (list, tuple)) and len(heads) == 4:
            return heads[3]
    return None


# -------------------------------------------------------------- 4. load
def check_attn_norm(model: torch.nn.Module,
                    checkpoint,
                    source: str,
                    config: Optional[str] = None) -> None:
    """Refuse weights converted for the other attention normalisation.

    ``soft_*`` and ``soft_norm_*`` weights have the same tensors, so the
    shape check cannot tell them apart; ``soft2mmsoft.py`` records the
    choice (``--norm``) as ``meta['attn_norm']`` (and the official model's
    name as ``meta['official_model']``). When the checkpoint has that record
    and ``model``'s SOFT attentions use the other setting, raise
    :class:`CheckpointMismatchError` naming both and the fixes.
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
    want = meta.get('attn_norm') if isinstance(meta, Mapping) else None
    if not isinstance(want, bool):
        return
    have = _attn_norms(model)
    if not have or have == {want}:
        return
    name = meta.get('official_model') or \
        ('soft_norm_*' if want else 'soft_*')
    kind = 'soft_norm_* (attn_norm=True)' if not want else \
        'soft_* (attn_norm=False)'
    cfg = f' of {config}' if config else ''
    raise CheckpointMismatchError(
        f'checkpoint {source} holds {name} weights (converted with '
        f'attn_norm={want}{", --norm" if want else ", no --norm"}), but the '
        f'model{cfg} is a {kind} model: its SOFT attention has '
        f'attn_norm={not want}. Use a {"soft_norm_*" if want else "soft_*"} '
        f'config or --cfg-options model.backbone.attn_cfg.attn_norm={want}; '
        f'if the weights are {"soft_*" if want else "soft_norm_*"} ones, '
        f'convert them again {"without" if want else "with"} --norm.')


def check_checkpoint_for_model(model: torch.nn.Module,
                               checkpoint,
                               source: str,
                               allow_partial: bool = False,
                               opt_in: str = '',
                               config: Optional[str] = None) -> LoadReport:
    """Check a checkpoint (dict) that MMEngine loads into a whole model:
    keys and shapes of its ``state_dict`` (or the dict itself, as the
    Runner reads it; :func:`check_state_dict`, legacy SOFT keys upgraded,
    ``module.`` prefixes stripped, the converter command for an authors'
    file) and the attention normalisation recorded by the converter
    (:func:`check_attn_norm`). Used by ``StrictLoadHook``
    (``tools/train.py`` ``load_from`` / ``--resume``, ``tools/test.py``),
    ``demo/image_demo.py`` and the ONNX export."""
    model = unwrap_model(model)
    sd = checkpoint.get('state_dict', checkpoint) \
        if isinstance(checkpoint, Mapping) else checkpoint
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {source} holds a {type(sd).__name__}, not a state '
            f'dict')
    report = check_state_dict(
        model.state_dict(),
        upgrade_legacy_keys(model, strip_prefix(sd)),
        source,
        f'the model ({type(model).__name__})',
        allow_partial=allow_partial,
        opt_in=opt_in,
        hint=lambda: official_soft_hint(checkpoint, source))
    check_attn_norm(model, checkpoint, source, config)
    return report


def _select(sd: Mapping, own: Mapping, prefix: Optional[str],
            source: str) -> Tuple['OrderedDict', Optional[str]]:
    """The tensors meant for the module: those under ``prefix``; without
    one, those under ``backbone.`` of a whole-model file (when none of its
    keys is the module's and the module has no ``backbone.`` keys)."""
    if not prefix and not any(k in own for k in sd) and \
            any(k.startswith(BACKBONE_PREFIX) for k in sd) and \
            not any(k.startswith(BACKBONE_PREFIX) for k in own):
        prefix = BACKBONE_PREFIX
    if not prefix:
        return OrderedDict(sd), None
    p = prefix if prefix.endswith('.') else prefix + '.'
    selected = OrderedDict(
        (k[len(p):], v) for k, v in sd.items() if k.startswith(p))
    if not selected:
        raise CheckpointMismatchError(
            f'checkpoint {source} has no tensor under the prefix {p!r} '
            f'(init_cfg.prefix); its keys look like '
            f'{few_keys(list(map(str, sd)))}')
    return selected, p


def _wrong_arch(weights: Weights, module: torch.nn.Module,
                source: str) -> Optional[str]:
    """One line when an authors' file holds another architecture than the
    SOFT ``module`` is built with: the arch found and the option to use."""
    have = getattr(module, 'arch_settings', None)
    if not weights.converted or have is None or \
            arch_for_mmsoft(have) == arch_for_mmsoft(weights.arch):
        return None
    found = describe_arch(weights.arch)
    preset = match_arch_preset(weights.arch)
    fix = (f'--cfg-options model.backbone.arch={preset}'
           if preset else f'model.backbone.{found} in the config')
    same = list(have['embed_dims']) == list(weights.arch['embed_dims'])
    return (f"checkpoint {source} holds the authors' weights of {found} "
            f"(depths {list(weights.arch['depths'])}), not of the configured "
            f'{describe_arch(have)}: use {fix}' +
            ('' if same else ' and neck / head in_channels '
             f"{list(weights.arch['embed_dims'])}"))


def describe_load(source: str, weights: Weights, prefix: Optional[str],
                  report: LoadReport, strict: bool) -> str:
    """The one-line report of :func:`load_pretrained`."""
    parts = [weights.layout]
    if weights.converted:
        parts.append('converted')
    if prefix:
        parts.append(f'keys under {prefix!r}')
    parts.append(f'{report.matched} tensors')
    parts.append(('strict' if strict else 'strict=False') +
                 ('' if report.ok else ', partial'))
    return f'mmsoft: loaded {source}: ' + ', '.join(parts)


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """Load ``checkpoint`` (any layout of the module docstring) into
    ``module``, strictly unless ``strict=False``; log the one-line report.

    ``prefix`` selects the keys of a whole-model checkpoint (e.g.
    ``'backbone.'``; the others, such as the head, are ignored), as
    MMEngine's ``Pretrained`` does; without it, a whole-model file's
    ``backbone.`` keys are taken when none of its keys is the module's.
    """
    source = str(checkpoint)
    ckpt = read_checkpoint(checkpoint, map_location)
    norms = _attn_norms(module)
    weights = to_mmsoft(ckpt, source, _stage4_heads(module),
                        next(iter(norms)) if len(norms) == 1 else None)
    own = module.state_dict()
    sd, used = _select(weights.state_dict, own, prefix, source)
    upgraded = upgrade_legacy_keys(module, sd)
    if list(upgraded) != list(sd):
        weights = weights._replace(
            layout=weights.layout.replace('mmsoft layout',
                                          'older mmsoft layout (upgraded)'))
    wrong = strict and _wrong_arch(weights, module, source)
    if wrong:
        raise CheckpointMismatchError(wrong)
    target = type(module).__name__ + (f' (checkpoint keys under {used!r})'
                                      if used else '')
    report = check_state_dict(
        own, upgraded, source, target, allow_partial=not strict, opt_in=opt_in)
    check_attn_norm(module, ckpt, source)
    bad = {k for k, _, _ in report.mismatched}
    module.load_state_dict(
        OrderedDict((k, v) for k, v in upgraded.items() if k not in bad),
        strict=False)
    print_log(
        describe_load(source, weights, used, report, strict), logger='current')
    return report


@WEIGHT_INITIALIZERS.register_module(name='SOFTPretrained')
class SOFTPretrainedInit:
    """Initialise a module from a checkpoint, strictly
    (:func:`load_pretrained`).

    Args:
        checkpoint (str): the checkpoint file (or URL) to load.
        prefix (str, optional): load the keys under this prefix (e.g.
            ``'backbone.'`` of a whole classifier checkpoint). Default: None.
        map_location (str): where tensors are loaded. Default: 'cpu'.
        strict (bool): a mismatch is an error; False logs it and loads the
            matching tensors (loading nothing is an error even then).
            Default: True.
        opt_in (str): how to allow a partial load, shown in the error.
            Default: the backbone's ``init_cfg.strict=False``.
    """

    def __init__(self,
                 checkpoint: str,
                 prefix: Optional[str] = None,
                 map_location='cpu',
                 strict: bool = True,
                 opt_in: str = BACKBONE_OPT_IN):
        self.checkpoint = checkpoint
        self.prefix = prefix
        self.map_location = map_location
        self.strict = strict
        self.opt_in = opt_in

    def __call__(self, module: torch.nn.Module) -> None:
        if _is_missing(self.checkpoint):  # not mmengine's bare traceback
            raise FileNotFoundError(missing_weights_message(self.checkpoint))
        load_pretrained(
            module,
            self.checkpoint,
            prefix=self.prefix,
            map_location=self.map_location,
            strict=self.strict,
            opt_in=self.opt_in)
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())

    def _get_init_info(self) -> str:
        return f'{self.__class__.__name__}: load from {self.checkpoint}'


def pretrained_init_cfg(init_cfg: Union[Dict, List[Dict], None],
                        owner: str = 'SOFT'
                        ) -> Tuple[Union[Dict, List[Dict], None], bool]:
    """``init_cfg`` of a SOFT backbone with its ``Pretrained`` entries run
    by :class:`SOFTPretrainedInit` (last, after the other entries, as
    MMEngine orders ``Pretrained``), and whether a strict load replaces
    every tensor (then the backbone's own initialisation is skipped).

    ``checkpoint=None`` means "no weights yet" (configs set it so that
    ``--cfg-options model.backbone.init_cfg.checkpoint=...`` works): the
    entry is dropped and logged.
    """
    cfgs = [init_cfg] if isinstance(init_cfg, Mapping) else \
        list(init_cfg or [])
    others, loads, strict_load = [], [], False
    for cfg in cfgs:
        if cfg.get('type') not in ('Pretrained', 'SOFTPretrained'):
            others.append(cfg)
        elif cfg.get('checkpoint') is None:
            print_log(
                f'{owner}: init_cfg has no checkpoint; using random '
                f'initialisation',
                logger='current')
        else:
            strict = cfg.get('strict', True)
            strict_load |= strict is not False
            loads.append(
                dict(
                    type='SOFTPretrained',
                    checkpoint=cfg['checkpoint'],
                    prefix=cfg.get('prefix'),
                    map_location=cfg.get('map_location', 'cpu'),
                    strict=strict))
    out = others + loads
    if not out:
        return None, False
    if isinstance(init_cfg, Mapping):
        return out[0], strict_load
    return out, strict_load


def _is_missing(checkpoint) -> bool:
    """A local path (no ``scheme://``) that is not a file."""
    path = osp.expanduser(str(checkpoint))
    return '://' not in path and not osp.isfile(path)


def missing_weights_message(checkpoint,
                            backbone: str = 'model.backbone',
                            key: str = 'init_cfg.checkpoint') -> str:
    """The one line for a backbone ``init_cfg`` checkpoint that is not on
    disk: which file (and config key), where the authors publish it
    (``OFFICIAL_FILES``), the option for another path, how to train from
    scratch on purpose."""
    name = osp.splitext(osp.basename(str(checkpoint)))[0]
    known, key = OFFICIAL_FILES.get(name), f'{backbone}.{key}'
    if known and known['link']:
        get = (f"download the authors' {name} ImageNet file "
               f"('{known['link']}' on {OFFICIAL_PAGE}) to that path")
    elif known:
        get = (f'the authors publish no {name} file ({OFFICIAL_PAGE}): '
               f"train configs/{known['configs'][0]}.py and give its "
               f'checkpoint')
    else:
        get = f"download the authors' ImageNet file from {OFFICIAL_PAGE}"
    return (f'{checkpoint} ({key}) does not exist: {get}, or use another '
            f'file with --cfg-options {key}=PATH; to train from scratch on '
            f'purpose: --cfg-options {backbone}.init_cfg=None '
            f'{backbone}.norm_eval=False')


def missing_pretrained(cfg, key: str = 'model') -> Optional[str]:
    """:func:`missing_weights_message` of the first SOFT backbone under
    ``cfg[key]`` whose ``init_cfg`` ``Pretrained`` checkpoint is a missing
    local file, else None (for the tools, before anything is built)."""

    def backbones(node, path):
        if isinstance(node, (list, tuple)):
            for i, v in enumerate(node):
                yield from backbones(v, f'{path}[{i}]')
        elif isinstance(node, Mapping):
            t = node.get('type')
            if getattr(t, '__name__', str(t)).split('.')[-1] == 'SOFT':
                yield path, node
            for k, v in node.items():
                yield from backbones(v, f'{path}.{k}')

    for path, bb in backbones(cfg.get(key), key):
        init = bb.get('init_cfg')
        entries = [init] if isinstance(init, Mapping) else list(init or [])
        for i, c in enumerate(entries):
            if c.get('type') in ('Pretrained', 'SOFTPretrained') and \
                    c.get('checkpoint') is not None and \
                    _is_missing(c['checkpoint']):
                where = '' if isinstance(init, Mapping) else f'[{i}]'
                return missing_weights_message(c['checkpoint'], path,
                                               f'init_cfg{where}.checkpoint')
    return None


# ------------------------------------------ the converter tools (files)
def official_weights(ckpt,
                     src: str,
                     ema: Optional[bool] = None) -> Tuple['OrderedDict', str]:
    """``(state_dict, entry)`` of an authors' checkpoint for
    ``soft2mmsoft.py``: EMA weights when present (``ema=None``), required
    (``ema=True``) or refused (``ema=False``, the raw weights)."""
    emas = ('state_dict_ema', 'model_ema')
    sd, entry = extract_state_dict(ckpt, prefer_ema=ema is not False)
    if ema is False and entry in emas:
        raise ConversionError(f'--no-ema given but {src!r} only holds EMA '
                              f'weights ({entry!r})')
    if ema and entry not in emas:
        raise ConversionError(f'--ema given but {src!r} has no '
                              f'state_dict_ema / model_ema entry (found '
                              f'{entry!r})')
    return sd, entry


def converter_parser(description: str, src: str, dst: str, stage4_heads: str,
                     heads_type: Callable):
    """The arguments both converter tools take: ``src``, ``dst``,
    ``--stage4-heads`` (parsed by ``heads_type``), ``--trust-checkpoint``
    (their help texts given)."""
    import argparse
    p = argparse.ArgumentParser(description=description)
    p.add_argument('src', help=src)
    p.add_argument('dst', help=dst)
    p.add_argument(
        '--stage4-heads', type=heads_type, default=None, help=stage4_heads)
    p.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='unpickle arbitrary objects in SRC (only for files you trust)')
    return p


def run_converter(convert: Callable, args) -> int:
    """Run a converter tool's ``convert(args)``: 0, or 1 after printing
    its :class:`ConversionError` as ``error: ...`` on stderr."""
    import sys
    setup()  # loads mmengine training checkpoints (mmsoft.compat)
    try:
        convert(args)
    except ConversionError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    return 0
