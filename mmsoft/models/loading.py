"""Weights into mmsoft models: file -> layout -> conversion -> strict load
-> a one-line report (docs/en/user_guides/official_weights.md)."""
import os
import os.path as osp
import re
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
    'read_checkpoint', 'upgrade_legacy_keys', 'load_pretrained',
    'check_attn_norm', 'check_checkpoint_for_model', 'SOFTPretrainedInit',
    'pretrained_init_cfg', 'missing_weights_message'
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
        raise FileNotFoundError(f'checkpoint {path} ' +
                                ('is a directory, not a file' if osp.
                                 isdir(path) else 'does not exist') +
                                '; pass a .pth checkpoint file')
    if mmap:
        try:  # weights only: nothing runs from the file
            return torch.load(
                path, map_location='cpu', weights_only=True, mmap=True)
        except Exception:  # noqa: BLE001 - legacy format: read it whole
            pass
    return load_verified(path, map_location=map_location)


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
    ours, other = ('soft_norm_*', 'soft_*')[::1 if want else -1]
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
    """Check a loaded ``checkpoint`` (``source``: its file) that the Runner
    or an inferencer loads into a whole ``model`` (wrappers unwrapped): keys
    and shapes (older SOFT keys upgraded; an authors' file gets the
    converter command), then :func:`check_attn_norm`. ``allow_partial``
    logs a mismatch instead; ``opt_in`` (how to allow that) and ``config``
    are named in the errors."""
    model = unwrap_model(model)
    sd = checkpoint.get('state_dict', checkpoint) \
        if isinstance(checkpoint, Mapping) else checkpoint
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {source} holds a {type(sd).__name__}, not a state '
            f'dict')
    sd = OrderedDict((re.sub(r'^module\.', '', k), v) for k, v in sd.items())
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


def _to_mmsoft(ckpt, source: str, module: torch.nn.Module, strict: bool):
    """``(state_dict, layout, converted)``: an authors' file converted (one
    of another arch than the module's SOFT: one line naming the preset to
    use), other files as they are."""
    found = cv.find_official_state_dict(ckpt)
    soft = [m for m in module.modules() if hasattr(m, 'arch_settings')]
    try:
        sd, entry = found or cv.extract_state_dict(ckpt, False)
        if found:
            sd, arch = cv.convert_official_to_mmpretrain(
                sd, soft[0].num_heads[3] if soft else None)
    except cv.ConversionError as e:
        what = " has the authors' SOFT key layout (fudan-zvg/SOFT) but " \
            'cannot be converted' if found else ''
        raise CheckpointMismatchError(f'checkpoint {source}{what}: {e}') \
            from None
    entry = '' if entry == '<bare>' else f' ({entry!r})'
    if not found:
        return sd, f'mmsoft layout{entry}', False
    have, name = soft[0].arch_settings if soft else None, cv.describe_arch
    if strict and have and cv.arch_for_mmsoft(have) != cv.arch_for_mmsoft(
            arch):
        preset, dims = cv.match_arch_preset(arch), list(arch['embed_dims'])
        raise CheckpointMismatchError(
            f"checkpoint {source} holds the authors' weights of {name(arch)} "
            f"(depths {list(arch['depths'])}), not of the configured "
            f'{name(have)}: use ' +
            (f'--cfg-options model.backbone.arch={preset}'
             if preset else f'model.backbone.{name(arch)} in the config') +
            ('' if list(have['embed_dims']) ==
             dims else f' and neck / head in_channels {dims}'))
    norms = _attn_norms(module)
    model = cv.official_model_name(
        arch,
        norms.pop() if len(norms) == 1 else None) or f'SOFT {name(arch)}'
    return sd, f"authors' {model} layout{entry}", True


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """Load ``checkpoint`` (a file or ``http(s)://`` URL) of any layout (an
    authors' file is converted) into ``module`` and log the one-line report.
    ``prefix``: load the keys under it (default: a whole-model file's
    ``backbone.`` keys if none of its keys is the module's). ``strict=False``
    loads the matching tensors (none is an error even then); ``opt_in``:
    how to allow that, named in the error."""
    source = str(checkpoint)
    ckpt = read_checkpoint(checkpoint, map_location)
    sd, layout, converted = _to_mmsoft(ckpt, source, module, strict)
    own, keys = module.state_dict(), list(map(str, sd))
    if not (prefix or any(k in own for k in sd)) and any(
            k.startswith('backbone.')
            for k in keys) and not any(k.startswith('backbone.') for k in own):
        prefix = 'backbone.'
    if prefix:
        prefix = prefix.rstrip('.') + '.'
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
    under = f' (checkpoint keys under {prefix!r})' if prefix else ''
    r = check_state_dict(own, upgraded, source,
                         type(module).__name__ + under, not strict, opt_in)
    check_attn_norm(module, ckpt, source)
    bad = {k for k, _, _ in r.mismatched}
    module.load_state_dict({
        k: v
        for k, v in upgraded.items() if k not in bad
    },
                           strict=False)
    parts = (layout, 'converted' * converted, prefix
             and f'keys under {prefix!r}', f'{r.matched} tensors, strict' +
             '=False' * (not strict) + ', partial' * (not r.ok))
    print_log(
        f'mmsoft: loaded {source}: ' + ', '.join(p for p in parts if p),
        logger='current')
    return r


@WEIGHT_INITIALIZERS.register_module(name='SOFTPretrained')
class SOFTPretrainedInit(PretrainedInit):
    """mmengine's ``Pretrained`` initialiser, strict: :func:`load_pretrained`
    with its arguments (``strict=False`` logs a mismatch and loads the
    matching tensors; ``opt_in`` is named in the error)."""

    def __init__(self,
                 checkpoint: str,
                 prefix: Optional[str] = None,
                 map_location='cpu',
                 strict: bool = True,
                 opt_in: str = 'set model.backbone.init_cfg.strict=False'):
        super().__init__(checkpoint, prefix, map_location)
        self.strict, self.opt_in = strict, opt_in

    def __call__(self, module: torch.nn.Module) -> None:
        path = osp.expanduser(str(self.checkpoint))
        if '://' not in path and not osp.exists(path):  # not mmengine's
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
    """``init_cfg`` with its ``Pretrained`` entries run by
    :class:`SOFTPretrainedInit` (last, as mmengine orders them), and whether
    a strict load replaces every tensor. ``checkpoint=None`` ("no weights
    yet") drops the entry, with a log line."""
    cfgs = [init_cfg] if isinstance(init_cfg, Mapping) else list(init_cfg
                                                                 or [])
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
