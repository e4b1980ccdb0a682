"""Strict weight loading: a mismatch is one error naming the keys."""
import logging
from typing import Callable, Mapping, NamedTuple, Optional, Sequence, Tuple

import torch
from mmengine.logging import print_log


class CheckpointMismatchError(RuntimeError):
    """A checkpoint's tensors do not match the model they are loaded into."""


class LoadReport(NamedTuple):
    """Missing, unexpected, (key, ckpt shape, model shape) and counts."""
    missing: Tuple[str, ...]
    unexpected: Tuple[str, ...]
    mismatched: Tuple[Tuple[str, tuple, tuple], ...]
    matched: int
    n_model: int
    n_ckpt: int

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.mismatched)


def compare_state_dicts(model_sd: Mapping, ckpt_sd: Mapping) -> LoadReport:
    own = [k for k in model_sd if not k.endswith('num_batches_tracked')]
    bad = tuple((k, tuple(v.shape), tuple(model_sd[k].shape))
                for k, v in ckpt_sd.items()
                if k in model_sd and isinstance(v, torch.Tensor)
                and v.shape != model_sd[k].shape)
    return LoadReport(
        tuple(k for k in own if k not in ckpt_sd),
        tuple(k for k in ckpt_sd if k not in model_sd), bad,
        sum(k in model_sd for k in ckpt_sd) - len(bad), len(own), len(ckpt_sd))


def few_keys(keys: Sequence[str], n: int = 5) -> str:
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
    """One :class:`CheckpointMismatchError` line unless ``ckpt_sd`` fits."""
    r = compare_state_dicts(model_sd, ckpt_sd)
    if r.ok:
        return r
    hint = hint and hint()
    none = ' (none: a checkpoint of another model?)' if not r.matched else ''
    head = (f'checkpoint {source} does not match {target}: {r.matched} of '
            f'its {r.n_ckpt} tensors would load{none}.')
    what = (f"of the model's {r.n_model} tensors are missing from the "
            f"checkpoint", f"of the checkpoint's {r.n_ckpt} tensors are not "
            f'in the model (unexpected)', 'tensors have another shape')
    keys = (r.missing, r.unexpected, [
        f'{k} (checkpoint {list(a)} vs model {list(b)})'
        for k, a, b in r.mismatched
    ])
    parts = [f'{len(k)} {w}: {few_keys(k)}' for k, w in zip(keys, what) if k]
    if hint is None and allow_partial and r.matched > 0:
        msg = 'partial load (allowed): ' + '\n  '.join([head] + parts)
        print_log(msg, logger='current', level=logging.WARNING)
        return r
    fix = hint or (f'If a partial load is intended (e.g. another head), '
                   f'{opt_in}.' if opt_in and r.matched > 0 else '')
    raise CheckpointMismatchError(f"{head} {'; '.join(parts)}. {fix}".strip())
