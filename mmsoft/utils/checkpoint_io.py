"""Checkpoint files that survive a kill and are never silently damaged
(docs/en/advanced_guides/fault_tolerance.md)."""
import os
import os.path as osp
import pickle
import warnings
import zipfile
from typing import List, Optional

import torch

from .atomic import TMP_SUFFIX, atomic_path, remove_stale_temps
from .safe_load import safe_torch_load, unsafe_globals

__all__ = [
    'CheckpointError', 'CheckpointWriteError', 'CheckpointRefused',
    'save_atomic', 'describe_damage', 'load_verified', 'remove_stale_temps',
    'refusal_message', 'TMP_SUFFIX'
]


class CheckpointError(RuntimeError):
    """A checkpoint file is damaged."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, ...)."""

    def __str__(self):
        return self.strerror or super().__str__()


class CheckpointRefused(pickle.UnpicklingError):
    """Weights-only loading refused a checkpoint."""


def _head(path: str, n: int) -> bytes:
    with open(path, 'rb') as f:
        return f.read(n)


def describe_damage(path: str) -> Optional[str]:
    """Why ``path`` cannot be a complete torch checkpoint, or None: empty,
    not a checkpoint, truncated, a record failing its CRC-32 (which
    ``torch.load`` does not check)."""
    try:
        size, head = os.path.getsize(path), _head(path, 4)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if head[:2] != b'PK':  # b'\x80': a pickle (legacy torch.save format)
        return None if head[:1] == b'\x80' else 'is empty (0 bytes)' \
            if not size else f'is not a torch checkpoint (starts with ' \
            f'{head!r})'
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - BadZipFile, zlib errors ...
        return f'is truncated or corrupt ({size} bytes; {e})'
    return bad and f'is corrupt (CRC error in record {bad!r})'


def refusal_message(path: str, refused: List[str], converter=False) -> str:
    """One line for a refused checkpoint: the file, what it holds and the
    safe fix (never ``weights_only=False``)."""
    what = 'pickled objects other than tensors and plain containers' + (
        f' ({", ".join(refused)})' if refused else '')
    if osp.isfile(path) and _head(path, 1) == b'\x80':
        what = f"a plain / legacy pickle (not torch's zip format) with {what}"
    fix = 'if you trust the file, run again with --trust-checkpoint' \
        if converter else ('convert it with tools/model_converters/'
                           'soft2mmsoft.py SRC DST (add --trust-checkpoint '
                           'there only if you trust the file)')
    return (f'checkpoint {path} was refused: it holds {what}, which could '
            f'run code when unpickled; {fix}')


def load_verified(path: str, map_location='cpu', weights_only=None):
    """Load ``path`` without running code from it (``weights_only=False``:
    anything, for a trusted file). A damaged file raises
    :class:`CheckpointError`, one that pickles code
    :class:`CheckpointRefused`: one line naming the file and the fix."""
    damage = describe_damage(path)
    if damage is not None:
        raise CheckpointError(f'checkpoint {path} {damage}; it was not '
                              f'loaded (use an earlier or a fresh copy)')
    if weights_only is False:
        return torch.load(path, map_location=map_location, weights_only=False)
    try:
        return safe_torch_load(path, map_location=map_location)
    except pickle.UnpicklingError:
        raise CheckpointRefused(refusal_message(
            path, unsafe_globals(path))) from None


def save_atomic(obj, path: str, writer=None) -> None:
    """``writer(obj, file)`` (default ``torch.save``) into ``path``
    atomically and durably."""
    with atomic_path(path, durable=True) as tmp:
        with open(tmp, 'xb') as f:
            (writer or torch.save)(obj, f)


#: 0.3.0's names, deprecated in 0.4, removed in 0.5: (object, why)
_DEPRECATED = dict(
    add_checksum=(lambda checkpoint: checkpoint, 'does nothing: damage is '
                  'detected by the zip CRC-32s (describe_damage)'),
    verify_checksum=(lambda checkpoint, filename='': False, 'does nothing: '
                     'use describe_damage(path) / load_verified(path)'),
    refused_globals=(unsafe_globals,
                     'use mmsoft.utils.safe_load.unsafe_globals'))


def __getattr__(name):
    if name not in _DEPRECATED:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    warnings.warn(
        f'mmsoft.utils.checkpoint_io.{name} is deprecated: '
        f'{_DEPRECATED[name][1]}',
        DeprecationWarning,
        stacklevel=2)
    return _DEPRECATED[name][0]
