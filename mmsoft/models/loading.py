"""Weights into mmsoft models: file -> layout -> conversion -> strict load
-> a one-line report (docs/en/user_guides/official_weights.md)."""
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
from . import converters as cv
from .layers.soft_attention import SOFTAttention

__all__ = [
    'read_checkpoint', 'to_mmsoft', 'upgrade_legacy_keys', 'load_pretrained',
    'check_attn_norm', 'check_checkpoint_for_model',
    'load_checkpoint_to_model', 'SOFTPretrainedInit', 'pretrained_init_cfg',
    'missing_weights_message', 'missing_pretrained'
]

PRETRAINED = ('Pretrained', 'SOFTPretrained')


def read_checkpoint(filename, map_location='cpu', mmap: bool = False):
    """The checkpoint ``filename`` (a path, or an ``http(s)://`` URL cached as
    torch.hub does) read safely; other schemes are mmengine's. ``mmap``: the
    tensors of a zip file stay on disk."""
    from mmsoft.utils.checkpoint_io import load_verified
    path = osp.expanduser(str(filename))
    if path.startswith(('http://', 'https://')):
        from torch.hub import download_url_to_file, get_dir
        cached = osp.join(get_dir(), 'checkpoints', osp.basename(path))
        try:
            if not osp.isfile(cached):
                os.makedirs(osp.dirname(cached), exist_ok=True)
                download_url_to_file(path, cached, None, progress=False)
        except OSError as e:  # offline, 404, ...
            raise FileNotFoundError(
                f'checkpoint {path} could not be downloaded ({e}); check the '
                f'URL, or download it and pass the file') from None
        path = cached
    elif '://' in path:  # open-mmlab://, s3:// ...
        from mmengine.runner import CheckpointLoader
        return CheckpointLoader.load_checkpoint(path, map_location)
    if not osp.isfile(path):
        what = 'is a directory, not a file' if osp.isdir(path) else \
            'does not exist'
        raise FileNotFoundError(
            f'checkpoint {path} {what}; pass a .pth checkpoint file')
    if mmap:
        try:  # weights only: nothing runs from the file
            return torch.load(
                path, map_location='cpu', weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - legacy format: read it whole
            pass
    return load_verified(path, map_location=map_location)


def to_mmsoft(ckpt,
              source: str,
              stage4_heads: Optional[int] = None,
              attn_norm: Optional[bool] = None
              ) -> Tuple['OrderedDict', str, Optional[Dict]]:
    """``(state_dict, layout, arch)`` of a loaded checkpoint in mmsoft's keys:
    an authors' file converted (``arch``: its architecture), other files as
    they are (``arch`` None)."""
    found = cv.find_official_state_dict(ckpt)
    try:
        if found is None:
            (sd, entry), arch = cv.extract_state_dict(ckpt, False), None
            layout = 'mmsoft'
        else:
            sd, arch, _ = cv.convert_official_to_mmpretrain(
                found[0], stage4_heads)
            entry, layout = found[1], "authors' " + (
                cv.official_model_name(arch, attn_norm)
                or f'SOFT {cv.describe_arch(arch)}')
    except cv.ConversionError as e:
        what = " has the authors' SOFT key layout (fudan-zvg/SOFT) but " \
            'cannot be converted' if found else ''
        raise CheckpointMismatchError(
            f'checkpoint {source}{what}: {e}') from None
    return sd, f'{layout} layout' + ('' if entry == '<bare>' else
                                     f' ({entry!r})'), arch


def upgrade_legacy_keys(model: torch.nn.Module, sd: Mapping) -> Mapping:
    """``sd`` with older SOFT keys renamed for every SOFT backbone in
    ``model`` (as its ``_load_from_state_dict`` does)."""
    for name, m in model.named_modules():
        if hasattr(type(m), 'upgrade_state_dict'):
            sd = type(m).upgrade_state_dict(sd, f'{name}.' if name else '')
    return sd


def _attn_norms(model: torch.nn.Module) -> set:
    return {
        m.attn_norm
        for m in model.modules() if isinstance(m, SOFTAttention)
    }


def check_attn_norm(model: torch.nn.Module,
                    checkpoint,
                    source: str,
                    config: Optional[str] = None) -> None:
    """Refuse weights converted for the other attention normalisation
    (``meta['attn_norm']``, ``soft2mmsoft.py --norm``)."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
    want = meta.get('attn_norm') if isinstance(meta, Mapping) else None
    if not isinstance(want, bool) or _attn_norms(model) in (set(), {want}):
        return
    ours, other = ('soft_norm_*', 'soft_*') if want else ('soft_*',
                                                          'soft_norm_*')
    raise CheckpointMismatchError(
        f"checkpoint {source} holds {meta.get('official_model') or ours} "
        f'weights (converted with attn_norm={want}, '
        f'{"" if want else "no "}--norm), but the model'
        f'{f" of {config}" if config else ""} is a {other} (attn_norm='
        f'{not want}) model: its SOFT attention has attn_norm={not want}. '
        f'Use a {ours} config or --cfg-options model.backbone.attn_cfg.'
        f'attn_norm={want}; if the weights are {other} ones, convert them '
        f'again {"without" if want else "with"} --norm.')


def check_checkpoint_for_model(model: torch.nn.Module,
                               checkpoint,
                               source: str,
                               allow_partial: bool = False,
                               opt_in: str = '',
                               config: Optional[str] = None) -> LoadReport:
    """Check a checkpoint that the Runner or an inferencer loads into a whole
    model: keys and shapes (older SOFT keys upgraded; an authors' file gets
    the converter command), then :func:`check_attn_norm`.

    Args:
        model (nn.Module): the model (wrappers are unwrapped).
        checkpoint (dict): the loaded checkpoint or state dict.
        source (str): the file, named in the errors.
        allow_partial (bool): log a mismatch instead. Default: False.
        opt_in (str): how to allow a partial load, named in the error.
        config (str, optional): the config file, named in the errors.
    """
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
        allow_partial,
        opt_in,
        hint=lambda: cv.official_soft_hint(checkpoint, source))
    check_attn_norm(model, checkpoint, source, config)
    return report


def load_checkpoint_to_model(model: torch.nn.Module,
                             filename: str,
                             allow_partial: bool = False,
                             opt_in: str = '') -> LoadReport:
    """Read ``filename``, check it (:func:`check_checkpoint_for_model`) and
    load it with mmengine (``module.`` stripped, mis-shaped tensors left)."""
    from mmengine.runner.checkpoint import _load_checkpoint_to_model
    ckpt = read_checkpoint(filename)
    report = check_checkpoint_for_model(model, ckpt, str(filename),
                                        allow_partial, opt_in)
    _load_checkpoint_to_model(
        unwrap_model(model), ckpt, strict=False, logger='current')
    return report


def _wrong_arch(arch: Optional[dict], module: torch.nn.Module,
                source: str) -> Optional[str]:
    """The one line for an authors' file of another architecture than
    ``module``'s: the arch found and the option to use."""
    have = getattr(module, 'arch_settings', None)
    if arch is None or have is None or \
            cv.arch_for_mmsoft(have) == cv.arch_for_mmsoft(arch):
        return None
    found, preset = cv.describe_arch(arch), cv.match_arch_preset(arch)
    fix = (f'--cfg-options model.backbone.arch={preset}'
           if preset else f'model.backbone.{found} in the config')
    dims = list(arch['embed_dims'])
    return (f"checkpoint {source} holds the authors' weights of {found} "
            f"(depths {list(arch['depths'])}), not of the configured "
            f'{cv.describe_arch(have)}: use {fix}' +
            ('' if list(have['embed_dims']) == dims else
             f' and neck / head in_channels {dims}'))


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """Load a checkpoint of any layout (``to_mmsoft``) into ``module``
    and log the one-line report.

    Args:
        module (nn.Module): the module to load into.
        checkpoint (str): the file or ``http(s)://`` URL.
        prefix (str, optional): load the keys under it (``'backbone.'``).
            Default: a whole-model file's ``backbone.`` keys if none of its
            keys is the module's.
        map_location (str): where tensors are loaded. Default: 'cpu'.
        strict (bool): a mismatch is an error; False loads the matching
            tensors (loading none is an error even then). Default: True.
        opt_in (str): how to allow a partial load, named in the error.
    """
    source = str(checkpoint)
    ckpt = read_checkpoint(checkpoint, map_location)
    soft = [m for m in module.modules() if hasattr(m, 'upgrade_state_dict')]
    norms = _attn_norms(module)
    sd, layout, arch = to_mmsoft(ckpt, source,
                                 soft[0].num_heads[3] if soft else None,
                                 norms.pop() if len(norms) == 1 else None)
    own = module.state_dict()
    has = [any(k.startswith('backbone.') for k in d) for d in (sd, own)]
    if not prefix and has == [True, False] and not any(k in own for k in sd):
        prefix = 'backbone.'
    if prefix:
        prefix = prefix.rstrip('.') + '.'
        keys = list(map(str, sd))
        sd = OrderedDict((k[len(prefix):], v) for k, v in sd.items()
                         if k.startswith(prefix))
        if not sd:
            raise CheckpointMismatchError(
                f'checkpoint {source} has no tensor under the prefix '
                f'{prefix!r} (init_cfg.prefix); its keys look like '
                f'{few_keys(keys)}')
    upgraded = upgrade_legacy_keys(module, sd)
    if list(upgraded) != list(sd):
        layout = 'older ' + layout.replace('layout', 'layout (upgraded)', 1)
    wrong = strict and _wrong_arch(arch, module, source)
    if wrong:
        raise CheckpointMismatchError(wrong)
    target = type(module).__name__ + (f' (checkpoint keys under {prefix!r})'
                                      if prefix else '')
    report = check_state_dict(own, upgraded, source, target, not strict,
                              opt_in)
    check_attn_norm(module, ckpt, source)
    bad = {k for k, _, _ in report.mismatched}
    module.load_state_dict(
        OrderedDict((k, v) for k, v in upgraded.items() if k not in bad),
        strict=False)
    parts = (layout, 'converted' if arch else '',
             f'keys under {prefix!r}' if prefix else '',
             f'{report.matched} tensors',
             ('strict' if strict else 'strict=False') +
             ('' if report.ok else ', partial'))
    print_log(
        f'mmsoft: loaded {source}: ' + ', '.join(p for p in parts if p),
        logger='current')
    return report


@WEIGHT_INITIALIZERS.register_module(name='SOFTPretrained')
class SOFTPretrainedInit(PretrainedInit):
    """mmengine's ``Pretrained`` initialiser, strict (:func:`load_pretrained`).

    Args:
        checkpoint (str): the checkpoint file (or URL) to load.
        prefix (str, optional): load the keys under this prefix (e.g.
            ``'backbone.'`` of a whole classifier). Default: None.
        map_location (str): where tensors are loaded. Default: 'cpu'.
        strict (bool): a mismatch is an error; False logs it and loads the
            matching tensors. Default: True.
        opt_in (str): how to allow a partial load, shown in the error.
            Default: the backbone's ``init_cfg.strict=False``.
    """

    def __init__(self,
                 checkpoint: str,
                 prefix: Optional[str] = None,
                 map_location='cpu',
                 strict: bool = True,
                 opt_in: str = 'set model.backbone.init_cfg.strict=False'):
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


def _entries(init_cfg) -> list:
    return [init_cfg] if isinstance(init_cfg, Mapping) else list(init_cfg
                                                                 or [])


def pretrained_init_cfg(init_cfg: Union[Dict, List[Dict], None],
                        owner: str = 'SOFT'
                        ) -> Tuple[Union[Dict, List[Dict], None], bool]:
    """``init_cfg`` with its ``Pretrained`` entries run by
    :class:`SOFTPretrainedInit` (last, as mmengine orders them), and whether
    a strict load replaces every tensor. ``checkpoint=None`` ("no weights
    yet") drops the entry, with a log line."""
    cfgs = _entries(init_cfg)
    loads = [
        dict(c, type='SOFTPretrained') for c in cfgs
        if c.get('type') in PRETRAINED and c.get('checkpoint') is not None
    ]
    out = [c for c in cfgs if c.get('type') not in PRETRAINED] + loads
    if len(out) < len(cfgs):
        print_log(
            f'{owner}: init_cfg has no checkpoint; using random '
            f'initialisation',
            logger='current')
    strict = any(c.get('strict', True) is not False for c in loads)
    if not out:
        return None, False
    return (out[0] if isinstance(init_cfg, Mapping) else out), strict


def _is_missing(checkpoint) -> bool:
    """A local path that does not exist (a directory is read_checkpoint's)."""
    path = osp.expanduser(str(checkpoint))
    return checkpoint is not None and '://' not in path and \
        not osp.exists(path)


def missing_weights_message(checkpoint,
                            backbone: str = 'model.backbone',
                            key: str = 'init_cfg.checkpoint') -> str:
    """The one line for a backbone's ``init_cfg`` checkpoint that is not on
    disk: where the authors publish it, another path, training from
    scratch."""
    name = osp.splitext(osp.basename(str(checkpoint)))[0]
    known, key = cv.OFFICIAL_FILES.get(name), f'{backbone}.{key}'
    if known and known['link']:
        get = (f"download the authors' {name} ImageNet file "
               f"('{known['link']}' on {cv.OFFICIAL_PAGE}) to that path")
    elif known:
        get = (f'the authors publish no {name} file ({cv.OFFICIAL_PAGE}): '
               f"train configs/{known['configs'][0]}.py and give its "
               f'checkpoint')
    else:
        get = f"download the authors' ImageNet file from {cv.OFFICIAL_PAGE}"
    return (f'{checkpoint} ({key}) does not exist: {get}, or use another '
            f'file with --cfg-options {key}=PATH; to train from scratch on '
            f'purpose: --cfg-options {backbone}.init_cfg=None '
            f'{backbone}.norm_eval=False')


def missing_pretrained(cfg, key: str = 'model') -> Optional[str]:
    """:func:`missing_weights_message` of the first SOFT backbone under
    ``cfg[key]`` whose ``Pretrained`` checkpoint is a missing local file,
    else None (for the tools, before anything is built)."""
    todo = [(key, cfg.get(key))]
    while todo:
        path, node = todo.pop(0)
        if isinstance(node, (list, tuple)):
            todo[:0] = [(f'{path}[{i}]', v) for i, v in enumerate(node)]
            continue
        if not isinstance(node, Mapping):
            continue
        t = node.get('type')
        if getattr(t, '__name__', str(t)).split('.')[-1] == 'SOFT':
            init = node.get('init_cfg')
            for i, c in enumerate(_entries(init)):
                if c.get('type') in PRETRAINED and \
                        _is_missing(c.get('checkpoint')):
                    where = '' if isinstance(init, Mapping) else f'[{i}]'
                    return missing_weights_message(
                        c['checkpoint'], path, f'init_cfg{where}.checkpoint')
        todo[:0] = [(f'{path}.{k}', v) for k, v in node.items()]
    return None
