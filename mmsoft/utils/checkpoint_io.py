"""Checkpoint files that survive a kill and are never silently damaged
(docs/en/advanced_guides/fault_tolerance.md)."""
import os
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


def describe_damage(path: str) -> Optional[str]:
    """Why ``path`` cannot be a complete torch checkpoint, or None: empty,
    not a checkpoint, truncated, a record failing its CRC-32 (which
    ``torch.load`` does not check)."""
    try:
        size = os.path.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(4)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if size == 0:
        return 'is empty (0 bytes)'
    if head[:2] != b'PK':
        if head[:1] == b'\x80':  # a pickle (legacy torch.save format)
            return None
        return f'is not a torch checkpoint (starts with {head!r})'
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - BadZipFile, zlib errors ...
        return f'is truncated or corrupt ({size} bytes; {e})'
    return None if bad is None else f'is corrupt (CRC error in record ' \
        f'{bad!r})'


def refusal_message(path: str,
                    refused: List[str],
                    converter: bool = False) -> str:
    """One line for a refused checkpoint: the file, what it holds and the
    safe fix (never ``weights_only=False``)."""
    what = 'pickled objects other than tensors and plain containers'
    if refused:
        what += f' ({", ".join(refused)})'
    try:
        with open(path, 'rb') as f:
            legacy = f.read(1) == b'\x80'
    except OSError:
        legacy = False
    if legacy:
        what = f"a plain / legacy pickle (not torch's zip format) with {what}"
    fix = ('if you trust the file, run again with --trust-checkpoint'
           if converter else
           'convert it with tools/model_converters/soft2mmsoft.py SRC DST '
           '(add --trust-checkpoint there only if you trust the file)')
    return (f'checkpoint {path} was refused: it holds {what}, which could '
            f'run code when unpickled; {fix}')


def load_verified(path: str, map_location='cpu', weights_only=None):
    """Load ``path`` without running code from it (``weights_only=False``:
    anything, for a trusted file).

    Raises:
        CheckpointError: a damaged file. CheckpointRefused: a file that
        pickles code. Both one line naming the file and the fix.
    """
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


def add_checksum(checkpoint):
    """Deprecated in 0.4, removed in 0.5: does nothing."""
    warnings.warn(
        'mmsoft.utils.checkpoint_io.add_checksum is deprecated and does '
        'nothing: damage is detected by the zip CRC-32s (describe_damage)',
        DeprecationWarning,
        stacklevel=2)
    return checkpoint


def verify_checksum(checkpoint, filename: str = '<checkpoint>') -> bool:
    """Deprecated in 0.4, removed in 0.5: returns False."""
    warnings.warn(
        'mmsoft.utils.checkpoint_io.verify_checksum is deprecated and does '
        'nothing: use describe_damage(path) / load_verified(path)',
        DeprecationWarning,
        stacklevel=2)
    return False


def __getattr__(name):
    if name == 'refused_globals':  # in 0.3.0; removed in 0.5
        warnings.warn(
            'mmsoft.utils.checkpoint_io.refused_globals is deprecated: use '
            'mmsoft.utils.safe_load.unsafe_globals',
            DeprecationWarning,
            stacklevel=2)
        return unsafe_globals
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
