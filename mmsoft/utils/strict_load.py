"""Strict weight loading: wrong weights are an error, not a warning.

MMEngine loads checkpoints with ``strict=False``: a checkpoint of another
architecture or model (0 tensors load) or with a 1000-class head on a
3-class model only logs a WARNING. :func:`check_state_dict` compares the
checkpoint with the model first and raises :class:`CheckpointMismatchError`
naming a few missing / unexpected / mis-shaped keys and their counts. A
partial load is an explicit opt-in (``allow_partial``); loading nothing is
an error even then. The loads are :mod:`mmsoft.models.loading`.
"""
import logging
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log

__all__ = [
    'CheckpointMismatchError', 'LoadReport', 'compare_state_dicts',
    'check_state_dict', 'few_keys', 'unwrap_model'
]

#: keys that may be absent from a checkpoint (as in MMEngine)
OPTIONAL_KEYS = ('num_batches_tracked', )


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


def compare_state_dicts(model_sd: Mapping, ckpt_sd: Mapping) -> LoadReport:
    """Keys and shapes of a checkpoint state dict against a model's."""
    own = [k for k in model_sd if not k.endswith(OPTIONAL_KEYS)]
    mismatched = tuple(
        (k, tuple(v.shape), tuple(model_sd[k].shape))
        for k, v in ckpt_sd.items()
        if isinstance(v, torch.Tensor) and isinstance(
            model_sd.get(k), torch.Tensor) and v.shape != model_sd[k].shape)
    matched = sum(k in model_sd for k in ckpt_sd) - len(mismatched)
    return LoadReport(
        tuple(k for k in own if k not in ckpt_sd),
        tuple(k for k in ckpt_sd if k not in model_sd), mismatched, matched,
        len(own), len(ckpt_sd))


def few_keys(keys: Sequence[str], n: int = 5) -> str:
    """The first ``n`` keys, and how many more."""
    more = f', ... (+{len(keys) - n} more)' if len(keys) > n else ''
    return ', '.join(keys[:n]) + more


def check_state_dict(model_sd: Mapping,
                     ckpt_sd: Mapping,
                     source: str,
                     target: str = 'the model',
                     allow_partial: bool = False,
                     opt_in: str = '',
                     hint: Optional[Callable[[], Optional[str]]] = None
                     ) -> LoadReport:
    """Raise :class:`CheckpointMismatchError` unless ``ckpt_sd`` matches
    ``model_sd`` (keys and shapes); with ``allow_partial`` log the mismatch
    as a warning instead, unless no tensor would load. ``opt_in`` names the
    switch for partial loads; ``hint`` (called on a mismatch) may explain
    it, e.g. with the converter command (then it is never partial)."""
    r = compare_state_dicts(model_sd, ckpt_sd)
    if r.ok:
        return r
    hint = hint() if hint is not None else None
    head = (
        f'checkpoint {source} does not match {target}: {r.matched} of '
        f'its {r.n_ckpt} tensors would load' +
        (' (none: a checkpoint of another model?)' if r.matched == 0 else '') +
        '.')
    shapes = [
        f'{k} (checkpoint {list(a)} vs model {list(b)})'
        for k, a, b in r.mismatched
    ]
    lines = [head] + [
        f'{len(keys)} {what}: {few_keys(keys)}' for keys, what in (
            (r.missing, f"of the model's {r.n_model} tensors are missing "
             f'from the checkpoint'),
            (r.unexpected, f"of the checkpoint's {r.n_ckpt} tensors are not "
             f'in the model (unexpected)'),
            (shapes, 'tensors have another shape')) if keys
    ]
    if hint is None and allow_partial and r.matched > 0:
        print_log(
            'partial load (allowed): ' + '\n  '.join(lines),
            logger='current',
            level=logging.WARNING)
        return r
    if hint or (opt_in and r.matched > 0):
        lines.append(hint or f'If a partial load is intended (e.g. another '
                     f'head), {opt_in}.')
    raise CheckpointMismatchError('\n  '.join(lines))


def unwrap_model(model):
    """The model inside DDP / DataParallel wrappers and TTA models (what
    MMEngine loads checkpoints into)."""
    from mmengine.model import BaseTTAModel, is_model_wrapper
    while is_model_wrapper(model) or isinstance(model, BaseTTAModel):
        model = model.module
    return model
