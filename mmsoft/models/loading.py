"""Weights into mmsoft models, in one place: file -> layout -> conversion ->
strict (or explicitly partial) load -> a one-line report.

:func:`read_checkpoint` reads safely with mmsoft's loader (not by patching
mmengine's); :func:`to_mmsoft` takes the authors' ``soft_*`` /
``soft_norm_*`` files (converted by :mod:`mmsoft.models.converters`, as
``soft2mmsoft.py`` does) and mmsoft / OpenMMLab files (also whole models
and older mmsoft keys); :func:`load_pretrained` loads strictly unless
``strict=False`` and logs e.g. ``mmsoft: loaded soft_norm_tiny.pth:
authors' soft_norm_tiny layout ('model'), converted, keys under
'backbone.', 185 tensors, strict``. ``init_cfg=dict(type='Pretrained')`` of
SOFT runs it through :class:`SOFTPretrainedInit` (``'SOFTPretrained'``).

Whole-model loads by the Runner (``load_from``, ``--resume``,
``tools/test.py``) and the inferencers stay MMEngine's:
:func:`check_checkpoint_for_model` checks what they load (``StrictLoadHook``,
the demo; an authors' file gets the converter command) and
:func:`load_checkpoint_to_model` checks and loads for tools without a
Runner (the ONNX export).
"""
import os
import os.path as osp
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch
from mmengine.logging import print_log
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS

from mmsoft.utils.strict_load import (CheckpointMismatchError, LoadReport,
                                      check_state_dict, few_keys, unwrap_model)
from .converters import (OFFICIAL_FILES, OFFICIAL_PAGE, ConversionError,
                         arch_for_mmsoft, convert_official_to_mmpretrain,
                         describe_arch, extract_state_dict,
                         find_official_state_dict, match_arch_preset,
                         official_model_name, official_soft_hint)
from .layers.soft_attention import SOFTAttention

__all__ = [
    'read_checkpoint', 'to_mmsoft', 'upgrade_legacy_keys', 'load_pretrained',
    'check_attn_norm', 'check_checkpoint_for_model',
    'load_checkpoint_to_model', 'SOFTPretrainedInit', 'pretrained_init_cfg',
    'missing_weights_message', 'missing_pretrained'
]

#: how a partial load of the backbone's init_cfg is allowed (in the error)
BACKBONE_OPT_IN = 'set model.backbone.init_cfg.strict=False'


def read_checkpoint(filename, map_location='cpu', mmap: bool = False):
    """The checkpoint ``filename`` (a path or an ``http(s)://`` URL,
    downloaded to torch's hub cache as MMEngine does), read safely; other
    schemes (``open-mmlab://`` ...) are MMEngine's.
    ``mmap=True``: the tensors of a local zip file stay on disk (to inspect
    its structure)."""
    from mmsoft.utils.checkpoint_io import load_verified
    filename = osp.expanduser(str(filename))
    if filename.startswith(('http://', 'https://')):
        from torch.hub import download_url_to_file, get_dir
        cached = osp.join(get_dir(), 'checkpoints', osp.basename(filename))
        try:
            if not osp.isfile(cached):
                os.makedirs(osp.dirname(cached), exist_ok=True)
                download_url_to_file(filename, cached, None, progress=False)
        except OSError as e:  # offline, 404, ...
            raise FileNotFoundError(
                f'checkpoint {filename} could not be downloaded ({e}); '
                f'check the URL, or download it and pass the file') from None
        filename = cached
    elif '://' in filename:  # open-mmlab://, s3:// ...: MMEngine's loaders
        from mmengine.runner import CheckpointLoader
        return CheckpointLoader.load_checkpoint(filename, map_location)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'checkpoint {filename} ' +
                                ('is a directory, not a file' if osp.
                                 isdir(filename) else 'does not exist') +
                                '; pass a .pth checkpoint file')
    if mmap:
        try:  # torch's weights-only unpickler: nothing runs from the file
            return torch.load(
                filename, map_location='cpu', weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - legacy format: read it whole
            pass
    return load_verified(filename, map_location=map_location)


def to_mmsoft(ckpt,
              source: str,
              stage4_heads: Optional[int] = None,
              attn_norm: Optional[bool] = None
              ) -> Tuple['OrderedDict', str, Optional[Dict]]:
    """``(state_dict, layout, arch)`` of a loaded checkpoint in mmsoft's key
    layout. An authors' file is converted to an mmpretrain classifier's keys
    (``backbone.*``, ``head.fc.*``) and ``arch`` is its architecture
    (``stage4_heads`` and ``attn_norm``, not in the weights, name it);
    other files are mmsoft's (``arch`` None)."""
    found = find_official_state_dict(ckpt)
    try:
        if found is None:
            sd, entry = extract_state_dict(ckpt, prefer_ema=False)
            arch, layout = None, 'mmsoft layout'
        else:
            sd, arch, _ = convert_official_to_mmpretrain(
                found[0], stage4_heads)
            entry = found[1]
            layout = "authors' " + (official_model_name(arch, attn_norm) or
                                    f'SOFT {describe_arch(arch)}') + ' layout'
    except ConversionError as e:
        what = " has the authors' SOFT key layout (fudan-zvg/SOFT) but " \
            'cannot be converted' if found else ''
        raise CheckpointMismatchError(
            f'checkpoint {source}{what}: {e}') from None
    return sd, layout + ('' if entry == '<bare>' else f' ({entry!r})'), arch


def _soft_backbones(model: torch.nn.Module):
    """``(name, module)`` of the modules whose class upgrades older
    checkpoint keys (``upgrade_state_dict``: the SOFT backbone)."""
    return [(name, m) for name, m in model.named_modules()
            if callable(getattr(type(m), 'upgrade_state_dict', None))]


def upgrade_legacy_keys(model: torch.nn.Module, sd: Mapping) -> Mapping:
    """``sd`` with the keys of older SOFT versions renamed for every SOFT
    backbone in ``model`` (as its ``_load_from_state_dict`` does)."""
    for name, mod in _soft_backbones(model):
        sd = type(mod).upgrade_state_dict(sd, f'{name}.' if name else '')
    return sd


def check_attn_norm(model: torch.nn.Module,
                    checkpoint,
                    source: str,
                    config: Optional[str] = None) -> None:
    """Refuse weights converted for the other attention normalisation:
    ``soft_*`` and ``soft_norm_*`` weights have the same tensors, but
    ``soft2mmsoft.py`` records ``--norm`` as ``meta['attn_norm']``."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
    want = meta.get('attn_norm') if isinstance(meta, Mapping) else None
    have = {
        m.attn_norm
        for m in model.modules() if isinstance(m, SOFTAttention)
    }
    if not isinstance(want, bool) or have in (set(), {want}):
        return
    name = meta.get('official_model') or ('soft_norm_*' if want else 'soft_*')
    kind = 'soft_* (attn_norm=False)' if want else \
        'soft_norm_* (attn_norm=True)'
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
    """Check a checkpoint (dict) that MMEngine loads into a whole model: the
    keys and shapes of its ``state_dict`` (or the dict itself, as the Runner
    reads it; older SOFT keys upgraded, ``module.`` stripped, the converter
    command for an authors' file) and :func:`check_attn_norm`."""
    model = unwrap_model(model)
    sd = checkpoint.get('state_dict', checkpoint) \
        if isinstance(checkpoint, Mapping) else checkpoint
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {source} holds a {type(sd).__name__}, not a state '
            f'dict')
    sd = OrderedDict(
        (k[7:] if k.startswith('module.') else k, v) for k, v in sd.items())
    report = check_state_dict(
        model.state_dict(),
        upgrade_legacy_keys(model, sd),
        source,
        f'the model ({type(model).__name__})',
        allow_partial=allow_partial,
        opt_in=opt_in,
        hint=lambda: official_soft_hint(checkpoint, source))
    check_attn_norm(model, checkpoint, source, config)
    return report


def load_checkpoint_to_model(model: torch.nn.Module,
                             filename: str,
                             allow_partial: bool = False,
                             opt_in: str = '') -> LoadReport:
    """Read ``filename``, check it as :func:`check_checkpoint_for_model`
    does and load it with MMEngine (``revise_keys`` strips ``module.``);
    with ``allow_partial`` the mis-shaped tensors are left out."""
    from mmengine.runner.checkpoint import _load_checkpoint_to_model
    ckpt = read_checkpoint(filename)
    report = check_checkpoint_for_model(model, ckpt, str(filename),
                                        allow_partial, opt_in)
    bad = {k for k, _, _ in report.mismatched}
    sd = ckpt.get('state_dict', ckpt)
    _load_checkpoint_to_model(
        unwrap_model(model), {
            k: v
            for k, v in sd.items() if k.replace('module.', '', 1) not in bad
        },
        strict=False)
    return report


def _select(sd: Mapping, own: Mapping, prefix: Optional[str],
            source: str) -> Tuple['OrderedDict', Optional[str]]:
    """The tensors under ``prefix``; without one, those under ``backbone.``
    of a whole-model file (none of its keys is the module's, and the module
    has no ``backbone.`` keys)."""
    if not prefix and not any(k in own for k in sd) and \
            any(k.startswith('backbone.') for k in sd) and \
            not any(k.startswith('backbone.') for k in own):
        prefix = 'backbone.'
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


def _wrong_arch(arch: Optional[dict], module: torch.nn.Module,
                source: str) -> Optional[str]:
    """One line when an authors' file (its ``arch``) holds another
    architecture than the SOFT ``module`` is built with: the arch found and
    the option to use."""
    have = getattr(module, 'arch_settings', None)
    if arch is None or have is None or \
            arch_for_mmsoft(have) == arch_for_mmsoft(arch):
        return None
    found, preset = describe_arch(arch), match_arch_preset(arch)
    fix = (f'--cfg-options model.backbone.arch={preset}'
           if preset else f'model.backbone.{found} in the config')
    same = list(have['embed_dims']) == list(arch['embed_dims'])
    return (f"checkpoint {source} holds the authors' weights of {found} "
            f"(depths {list(arch['depths'])}), not of the configured "
            f'{describe_arch(have)}: use {fix}' +
            ('' if same else ' and neck / head in_channels '
             f"{list(arch['embed_dims'])}"))


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """Load ``checkpoint`` (any layout of ``to_mmsoft``) into
    ``module``, strictly unless ``strict=False``, and log the one-line
    report. ``prefix`` selects the keys of a whole-model file (e.g.
    ``'backbone.'``; the others are ignored), as MMEngine's ``Pretrained``
    does; without it, a whole-model file's ``backbone.`` keys are taken
    when none of its keys is the module's."""
    source = str(checkpoint)
    ckpt = read_checkpoint(checkpoint, map_location)
    norms = {
        m.attn_norm
        for m in module.modules() if isinstance(m, SOFTAttention)
    }
    soft = [m for _, m in _soft_backbones(module)]
    sd, layout, arch = to_mmsoft(ckpt, source,
                                 soft[0].num_heads[3] if soft else None,
                                 norms.pop() if len(norms) == 1 else None)
    own = module.state_dict()
    sd, used = _select(sd, own, prefix, source)
    upgraded = upgrade_legacy_keys(module, sd)
    if list(upgraded) != list(sd):
        layout = 'older ' + layout.replace('layout', 'layout (upgraded)', 1)
    target = type(module).__name__ + (f' (checkpoint keys under {used!r})'
                                      if used else '')
    wrong = strict and _wrong_arch(arch, module, source)
    if wrong:
        raise CheckpointMismatchError(wrong)
    report = check_state_dict(own, upgraded, source, target, not strict,
                              opt_in)
    check_attn_norm(module, ckpt, source)
    bad = {k for k, _, _ in report.mismatched}
    module.load_state_dict(
        OrderedDict((k, v) for k, v in upgraded.items() if k not in bad),
        strict=False)
    parts = (layout, 'converted' if arch else '',
             f'keys under {used!r}' if used else '',
             f'{report.matched} tensors',
             ('strict' if strict else 'strict=False') +
             ('' if report.ok else ', partial'))
    print_log(
        f'mmsoft: loaded {source}: ' + ', '.join(p for p in parts if p),
        logger='current')
    return report


@WEIGHT_INITIALIZERS.register_module(name='SOFTPretrained')
class SOFTPretrainedInit(PretrainedInit):
    """MMEngine's ``Pretrained`` initialiser, strict
    (:func:`load_pretrained`).

    Args:
        checkpoint (str): the checkpoint file (or URL) to load.
        prefix (str, optional): load the keys under this prefix (e.g.
            ``'backbone.'`` of a whole classifier). Default: None.
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
        super().__init__(checkpoint, prefix, map_location)
        self.strict, self.opt_in = strict, opt_in

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


def pretrained_init_cfg(init_cfg: Union[Dict, List[Dict], None],
                        owner: str = 'SOFT'
                        ) -> Tuple[Union[Dict, List[Dict], None], bool]:
    """``init_cfg`` of a SOFT backbone with its ``Pretrained`` entries run by
    :class:`SOFTPretrainedInit` (last, as MMEngine orders ``Pretrained``),
    and whether a strict load replaces every tensor (then the backbone's
    own initialisation is skipped). ``checkpoint=None`` ("no weights yet",
    so that ``--cfg-options model.backbone.init_cfg.checkpoint=...`` works)
    drops the entry, with a log line."""
    cfgs = [init_cfg] if isinstance(init_cfg, Mapping) else list(init_cfg
                                                                 or [])
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
            strict_load |= cfg.get('strict', True) is not False
            loads.append(dict(cfg, type='SOFTPretrained'))
    out = others + loads
    if not out:
        return None, False
    return (out[0] if isinstance(init_cfg, Mapping) else out), strict_load


def _is_missing(checkpoint) -> bool:
    """A local path (no ``scheme://``) that does not exist (a directory is
    :func:`read_checkpoint`'s one line)."""
    path = osp.expanduser(str(checkpoint))
    return '://' not in path and not osp.exists(path)


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
