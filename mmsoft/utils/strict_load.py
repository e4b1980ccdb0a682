"""Strict weight loading: wrong weights are an error, not a warning.

MMEngine loads checkpoints with ``strict=False``: a checkpoint of another
architecture, of another model (a RetinaNet checkpoint into a classifier:
0 tensors load) or with a 1000-class head on a 3-class model only logs a
WARNING, and evaluation / training goes on with partly or fully random
weights. mmsoft compares the checkpoint with the model first and raises
:class:`CheckpointMismatchError`, naming a few missing / unexpected /
mis-shaped keys and their counts; for an unconverted official SOFT
checkpoint (fudan-zvg/SOFT key layout) it prints the converter command.

An intended partial load (e.g. another head) is an explicit opt-in
(``allow_partial=True``: ``tools/test.py --partial-load``, or
``init_cfg=dict(type='Pretrained', ..., strict=False)`` on the backbone);
it loads the matching tensors and logs what was left out. Loading nothing
is an error even then.

Used by :class:`mmsoft.engine.hooks.StrictLoadHook` (``tools/test.py``) and
by ``SOFT.init_weights`` (``init_cfg=dict(type='Pretrained', ...)``).
"""
import logging
import os.path as osp
import re
from collections import OrderedDict
from typing import Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log

__all__ = [
    'CheckpointMismatchError', 'LoadReport', 'compare_state_dicts',
    'check_state_dict', 'official_soft_hint', 'unwrap_model',
    'load_pretrained', 'upgrade_legacy_keys'
]

#: keys that may be absent from a checkpoint (BatchNorm step counters;
#: MMEngine ignores them too)
OPTIONAL_KEYS = ('num_batches_tracked', )
_N_SHOW = 5
_OFFICIAL_RE = re.compile(r'^(patch_embed[1-4]\.|block[1-4]\.\d+\.|'
                          r'pos_embed[1-4]$)')


class CheckpointMismatchError(RuntimeError):
    """A checkpoint's tensors do not match the model they are loaded into."""


class LoadReport(NamedTuple):
    missing: Tuple[str, ...]  # in the model, not in the checkpoint
    unexpected: Tuple[str, ...]  # in the checkpoint, not in the model
    mismatched: Tuple[Tuple[str, tuple, tuple], ...]  # key, ckpt, model
    matched: int  # tensors that load
    n_model: int
    n_ckpt: int

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)


def _shape(v) -> Optional[tuple]:
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def compare_state_dicts(model_sd: Mapping, ckpt_sd: Mapping) -> LoadReport:
    """Keys and shapes of a checkpoint state dict against a model's."""
    missing = tuple(
        k for k in model_sd
        if k not in ckpt_sd and not k.endswith(OPTIONAL_KEYS))
    unexpected = tuple(k for k in ckpt_sd if k not in model_sd)
    mismatched, matched = [], 0
    for k, v in ckpt_sd.items():
        if k not in model_sd:
            continue
        a, b = _shape(v), _shape(model_sd[k])
        if a is not None and b is not None and a != b:
            mismatched.append((k, a, b))
        else:
            matched += 1
    n_model = sum(1 for k in model_sd if not k.endswith(OPTIONAL_KEYS))
    return LoadReport(missing, unexpected, tuple(mismatched), matched, n_model,
                      len(ckpt_sd))


def _few(keys: Sequence[str]) -> str:
    shown = ', '.join(keys[:_N_SHOW])
    return shown + (f', ... (+{len(keys) - _N_SHOW} more)'
                    if len(keys) > _N_SHOW else '')


def describe(report: LoadReport) -> str:
    """One line per kind of problem, each with a few keys and a count."""
    lines = []
    if report.missing:
        lines.append(f'{len(report.missing)} of the model\'s '
                     f'{report.n_model} tensors are missing from the '
                     f'checkpoint: {_few(report.missing)}')
    if report.unexpected:
        lines.append(f'{len(report.unexpected)} of the checkpoint\'s '
                     f'{report.n_ckpt} tensors are not in the model '
                     f'(unexpected): {_few(report.unexpected)}')
    if report.mismatched:
        mm = [
            f'{k} (checkpoint {list(a)} vs model {list(b)})'
            for k, a, b in report.mismatched
        ]
        lines.append(f'{len(mm)} tensors have another shape: {_few(mm)}')
    return '\n  '.join(lines)


def official_soft_hint(checkpoint, source: str = 'SRC') -> Optional[str]:
    """The converter command if ``checkpoint`` (a loaded checkpoint dict)
    has the key layout of the official SOFT code, else None."""
    from .official_keys import (ConversionError, extract_state_dict,
                                official_to_mmsoft_key)
    try:
        sd, _ = extract_state_dict(checkpoint)
    except ConversionError:
        return None
    official = [
        k for k in sd if _OFFICIAL_RE.match(k) and official_to_mmsoft_key(k)
    ]
    if not official or len(official) < len(sd) // 2:
        return None
    dst = osp.join('weights', osp.basename(str(source)) or 'soft.pth')
    return (f'{source!s} is an official SOFT checkpoint (fudan-zvg/SOFT key '
            f'layout, e.g. {official[0]!r}); convert it first:\n'
            f'    python tools/model_converters/soft2mmsoft.py {source} '
            f'{dst} [--norm for soft_norm_* weights]\n'
            f'  and load the converted file.')


def check_state_dict(model_sd: Mapping,
                     ckpt_sd: Mapping,
                     source: str,
                     target: str = 'the model',
                     allow_partial: bool = False,
                     opt_in: str = '',
                     checkpoint=None) -> LoadReport:
    """Raise :class:`CheckpointMismatchError` unless ``ckpt_sd`` matches
    ``model_sd`` (keys and shapes). With ``allow_partial`` a mismatch is
    logged as a warning instead, unless no tensor at all would load.

    ``opt_in`` names the switch for intended partial loads (shown in the
    error); ``checkpoint`` (the whole loaded file) lets the error recognise
    an unconverted official SOFT checkpoint.
    """
    report = compare_state_dicts(model_sd, ckpt_sd)
    if report.ok:
        return report
    hint = official_soft_hint(
        checkpoint if checkpoint is not None else ckpt_sd, source)
    head = (f'checkpoint {source} does not match {target}: '
            f'{report.matched} of its {report.n_ckpt} tensors would load' +
            (' (none: a checkpoint of another model?)'
             if report.matched == 0 else '') + '.')
    if hint is None and allow_partial and report.matched > 0:
        print_log(
            f'partial load (allowed): {head}\n  {describe(report)}',
            logger='current',
            level=logging.WARNING)
        return report
    msg = f'{head}\n  {describe(report)}'
    if hint:
        msg += f'\n  {hint}'
    elif opt_in and report.matched > 0:
        msg += (f'\n  If a partial load is intended (e.g. another head), '
                f'{opt_in}.')
    raise CheckpointMismatchError(msg)


def unwrap_model(model):
    """The model inside DDP / DataParallel wrappers and TTA models (what
    MMEngine loads checkpoints into)."""
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    return model


def strip_prefix(sd: Mapping, pattern: str = r'^module\.') -> 'OrderedDict':
    return OrderedDict((re.sub(pattern, '', k), v) for k, v in sd.items())


def upgrade_legacy_keys(model: torch.nn.Module, sd: Mapping) -> Mapping:
    """``sd`` with the keys of older SOFT checkpoint layouts renamed for
    every SOFT backbone inside ``model`` (what its ``_load_from_state_dict``
    does while loading), so that they are compared under the new names."""
    from mmsoft.models.backbones.soft import SOFT
    for name, mod in model.named_modules():
        if isinstance(mod, SOFT):
            sd = SOFT.upgrade_state_dict(sd, f'{name}.' if name else '')
    return sd


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """``init_cfg=dict(type='Pretrained', ...)`` with a strict check.

    Reads ``checkpoint`` with MMEngine's loader, takes its ``state_dict``
    (the keys under ``prefix``, e.g. ``'backbone.'`` of a whole classifier
    checkpoint; the other keys, such as the head, are ignored), checks it
    against ``module`` (:func:`check_state_dict`; ``strict=False`` allows
    partial loads) and loads the matching tensors.
    """
    from mmengine.runner.checkpoint import _load_checkpoint
    ckpt = _load_checkpoint(checkpoint, map_location=map_location)
    sd = ckpt['state_dict'] if isinstance(ckpt, Mapping) and \
        'state_dict' in ckpt else ckpt
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {checkpoint} holds a {type(sd).__name__}, not a '
            f'state dict')
    sd = strip_prefix(sd)
    if prefix:
        p = prefix if prefix.endswith('.') else prefix + '.'
        selected = OrderedDict(
            (k[len(p):], v) for k, v in sd.items() if k.startswith(p))
        if not selected:
            hint = official_soft_hint(ckpt, checkpoint)
            raise CheckpointMismatchError(
                f'checkpoint {checkpoint} has no tensor under the prefix '
                f'{p!r} (init_cfg.prefix); its keys look like '
                f'{_few(list(map(str, sd)))}' +
                (f'\n  {hint}' if hint else ''))
        sd = selected
    sd = upgrade_legacy_keys(module, sd)
    target = type(module).__name__ + (f' (checkpoint keys under {prefix!r})'
                                      if prefix else '')
    report = check_state_dict(
        module.state_dict(),
        sd,
        str(checkpoint),
        target,
        allow_partial=not strict,
        opt_in=opt_in,
        checkpoint=ckpt)
    bad = {k for k, _, _ in report.mismatched}
    module.load_state_dict(
        OrderedDict((k, v) for k, v in sd.items() if k not in bad),
        strict=False)
    print_log(
        f'{type(module).__name__}: loaded {report.matched} tensors '
        f'from {checkpoint}',
        logger='current')
    return report
