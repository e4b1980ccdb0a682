"""Weights into mmsoft models (docs/en/user_guides/official_weights.md)."""
import contextlib
import os
import os.path as osp
import re
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Tuple, Union

import torch
from mmengine.logging import print_log
from mmengine.model import BaseTTAModel, is_model_wrapper
from mmengine.model.weight_init import PretrainedInit, update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS

from mmsoft.utils.strict_load import (CheckpointMismatchError, LoadReport,
                                      check_state_dict, few_keys)
from . import converters as cv
from .converters import missing_weights_message
from .layers.soft_attention import SOFTAttention

PRETRAINED = ('Pretrained', 'SOFTPretrained')


def read_checkpoint(filename, map_location='cpu', mmap: bool = False):
    """A path or URL (cached as torch.hub does) read safely (``mmap``)."""
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
        raise FileNotFoundError(f'checkpoint {path} ' + (
            'is a directory, not a file' if osp.isdir(path) else 'does not '
            'exist') + '; pass a .pth checkpoint file')
    with contextlib.suppress(Exception):  # legacy format: read it whole
        if mmap:  # weights only: nothing runs from the file
            return torch.load(path, 'cpu', weights_only=True, mmap=True)
    return load_verified(path, map_location=map_location)


def attn_norms(model: torch.nn.Module) -> set:
    return set(m.attn_norm for m in model.modules()
               if isinstance(m, SOFTAttention))


def check_attn_norm(model, checkpoint, source: str, config=None) -> None:
    """Refuse weights converted or trained with another ``attn_norm``."""
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else 0
    meta = meta if isinstance(meta, Mapping) else {}
    conv, have, trained = meta.get('attn_norm'), attn_norms(model), \
        meta.get('mmsoft_attn_norm')
    trained = trained if isinstance(trained, (list, tuple)) else ()
    want = {conv} if isinstance(conv, bool) else \
        {v for v in trained if isinstance(v, bool)}
    if not want or not have or want == have:
        return
    s = [' / '.join(f'attn_norm={v}' for v in sorted(x)) for x in (want, have)]
    opt = (f'--cfg-options model.backbone.attn_cfg.{s[0]}'
           if len(want) == 1 else 'its attn_cfg settings')
    kind = ('soft_*', 'soft_norm_*')
    found, fix = (
        f"holds {meta.get('official_model') or kind[conv]} weights (converted"
        f" with {s[0]}, {'' if conv else 'no '}--norm)",
        f'a {kind[conv]} config or {opt}; if the weights are {kind[not conv]}'
        f' ones, convert them again {"without" if conv else "with"} --norm'
    ) if isinstance(
        conv, bool) else (f'was trained with {s[0]} (recorded in its meta)',
                          f'the config it was trained with or {opt}')
    raise CheckpointMismatchError(
        f'checkpoint {source} {found}, but the model'
        f'{f" of {config}" if config else ""} has {s[1]} (its SOFT attention)'
        f': the weights would load and give wrong results. Use {fix}.')


def check_checkpoint_for_model(model: torch.nn.Module,
                               checkpoint,
                               source: str,
                               allow_partial: bool = False,
                               opt_in: str = '',
                               config: Optional[str] = None) -> LoadReport:
    """Check keys, shapes and attn_norm against a whole ``model``."""
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    sd = checkpoint.get('state_dict', checkpoint) \
        if isinstance(checkpoint, Mapping) else checkpoint
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(f'checkpoint {source} holds a '
                                      f'{type(sd).__name__}, not a state dict')
    sd = OrderedDict((re.sub(r'^module\.', '', k), v) for k, v in sd.items())
    report = check_state_dict(
        model.state_dict(), sd, source, f'the model ({type(model).__name__})',
        allow_partial, opt_in,
        lambda: cv.official_soft_hint(checkpoint, source))
    check_attn_norm(model, checkpoint, source, config)
    return report


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """Load ``checkpoint`` (an authors' file converted) into ``module``."""
    source, ckpt = str(checkpoint), read_checkpoint(checkpoint, map_location)
    found, name = cv.find_official_state_dict(ckpt), cv.describe_arch
    soft = [m for m in module.modules() if hasattr(m, 'arch_settings')][:1]
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
    have = soft[0].arch_settings if soft else None
    if found and strict and have and cv.arch_for_mmsoft(
            have) != cv.arch_for_mmsoft(arch):
        preset, dims = cv.match_arch_preset(arch), list(arch['embed_dims'])
        raise CheckpointMismatchError(
            f"checkpoint {source} holds the authors' weights of {name(arch)} "
            f"(depths {list(arch['depths'])}), not of the configured "
            f'{name(have)}: use ' +
            (f'--cfg-options model.backbone.arch={preset}'
             if preset else f'model.backbone.{name(arch)} in the config') +
            ('' if list(have['embed_dims']) ==
             dims else f' and neck / head in_channels {dims}'))
    norms = attn_norms(module)
    layout = ("authors' " +
              (cv.official_model_name(arch,
                                      norms.pop() if len(norms) == 1 else None)
               or f'SOFT {name(arch)}') if found else 'mmsoft') + ' layout' + (
                   '' if entry == '<bare>' else f' ({entry!r})')
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
    under = f' (checkpoint keys under {prefix!r})' if prefix else ''
    r = check_state_dict(own, sd, source,
                         type(module).__name__ + under, not strict, opt_in)
    check_attn_norm(module, ckpt, source)
    bad = {k for k, _, _ in r.mismatched}
    module.load_state_dict({k: sd[k]
                            for k in sd if k not in bad},
                           strict=False)
    parts = (layout, 'converted' * bool(found), prefix
             and f'keys under {prefix!r}', f'{r.matched} tensors, strict' +
             '=False' * (not strict) + ', partial' * (not r.ok))
    msg = f'mmsoft: loaded {source}: ' + ', '.join(filter(None, parts))
    print_log(msg, logger='current')
    return r


@WEIGHT_INITIALIZERS.register_module(name='SOFTPretrained')
class SOFTPretrainedInit(PretrainedInit):
    """mmengine's ``Pretrained``, strict (:func:`load_pretrained`)."""

    def __init__(self,
                 checkpoint: str,
                 prefix: Optional[str] = None,
                 map_location='cpu',
                 strict: bool = True,
                 opt_in: str = 'set model.backbone.init_cfg.strict=False'):
        super().__init__(checkpoint, prefix, map_location)
        self.options = dict(strict=strict, opt_in=opt_in)

    def __call__(self, module: torch.nn.Module) -> None:
        path = osp.expanduser(str(self.checkpoint))
        if '://' not in path and not osp.exists(path):  # not mmengine's
            raise FileNotFoundError(missing_weights_message(self.checkpoint))
        load_pretrained(module, self.checkpoint, self.prefix,
                        self.map_location, **self.options)
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())


def pretrained_init_cfg(init_cfg: Union[Dict, List[Dict], None],
                        owner: str = 'SOFT'
                        ) -> Tuple[Union[Dict, List[Dict], None], bool]:
    """``init_cfg`` with ``Pretrained`` last as ``SOFTPretrained``; strict?"""
    one = isinstance(init_cfg, Mapping)
    cfgs = [init_cfg] if one else list(init_cfg or [])
    loads = [
        dict(c, type='SOFTPretrained') for c in cfgs
        if c.get('type') in PRETRAINED and c.get('checkpoint') is not None
    ]
    out = [c for c in cfgs if c.get('type') not in PRETRAINED] + loads
    if len(out) < len(cfgs):
        print_log(
            f'{owner}: init_cfg has no checkpoint; using random '
            'initialisation', 'current')
    strict = any(c.get('strict', True) is not False for c in loads)
    return ((out[0] if one else out) if out else None), strict and bool(out)
