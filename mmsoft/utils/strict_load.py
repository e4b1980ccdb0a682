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

This module compares state dicts only (it knows no model or file
layout). The loads themselves are :mod:`mmsoft.models.loading` (what
``init_cfg=dict(type='Pretrained', ...)`` of SOFT runs, and the check of
:class:`mmsoft.engine.hooks.StrictLoadHook`, ``tools/test.py``).
"""
import logging
import re
from collections import OrderedDict
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log

__all__ = [
    'CheckpointMismatchError', 'LoadReport', 'compare_state_dicts',
    'check_state_dict', 'describe', 'few_keys', 'unwrap_model', 'strip_prefix'
]

#: keys that may be absent from a checkpoint (BatchNorm step counters;
#: MMEngine ignores them too)
OPTIONAL_KEYS = ('num_batches_tracked', )
_N_SHOW = 5


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


def few_keys(keys: Sequence[str]) -> str:
    """The first few keys, and how many more."""
    shown = ', '.join(keys[:_N_SHOW])
    return shown + (f', ... (+{len(keys) - _N_SHOW} more)'
                    if len(keys) > _N_SHOW else '')


def describe(report: LoadReport) -> str:
    """One line per kind of problem, each with a few keys and a count."""
    lines = []
    if report.missing:
        lines.append(f'{len(report.missing)} of the model\'s '
                     f'{report.n_model} tensors are missing from the '
                     f'checkpoint: {few_keys(report.missing)}')
    if report.unexpected:
        lines.append(f'{len(report.unexpected)} of the checkpoint\'s '
                     f'{report.n_ckpt} tensors are not in the model '
                     f'(unexpected): {few_keys(report.unexpected)}')
    if report.mismatched:
        mm = [
            f'{k} (checkpoint {list(a)} vs model {list(b)})'
            for k, a, b in report.mismatched
        ]
        lines.append(f'{len(mm)} tensors have another shape: {few_keys(mm)}')
    return '\n  '.join(lines)


def check_state_dict(model_sd: Mapping,
                     ckpt_sd: Mapping,
                     source: str,
                     target: str = 'the model',
                     allow_partial: bool = False,
                     opt_in: str = '',
                     hint: Optional[Callable[[], Optional[str]]] = None
                     ) -> LoadReport:
    """Raise :class:`CheckpointMismatchError` unless ``ckpt_sd`` matches
    ``model_sd`` (keys and shapes). With ``allow_partial`` a mismatch is
    logged as a warning instead, unless no tensor at all would load.

    ``opt_in`` names the switch for intended partial loads (shown in the
    error). ``hint``, called only on a mismatch, may return a line that
    explains it (e.g. the converter command for an unconverted official
    SOFT checkpoint, :func:`mmsoft.models.converters.official_soft_hint`);
    a checkpoint with a hint is never loaded partially.
    """
    report = compare_state_dicts(model_sd, ckpt_sd)
    if report.ok:
        return report
    hint = hint() if hint is not None else None
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
