"""Checkpoint reads (docs/en/advanced_guides/fault_tolerance.md)."""
import os
import os.path as osp
import pickle
import zipfile
from typing import List, Optional

import torch

from .atomic import TMP_SUFFIX  # noqa: F401
from .safe_load import (RestrictedUnpickler, code_globals, safe_torch_load,
                        unsafe_globals)


class CheckpointError(RuntimeError):
    """A checkpoint file is damaged."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, ...)."""

    def __str__(self):
        return self.strerror or super().__str__()


class CheckpointRefused(pickle.UnpicklingError):
    """Weights-only loading refused a checkpoint."""


def describe_damage(path: str) -> Optional[str]:
    """Why ``path`` is no complete torch checkpoint (truncated, CRC ...)."""
    try:
        with open(path, 'rb') as f:
            size, head = os.fstat(f.fileno()).st_size, f.read(4)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if head[:2] != b'PK':  # b'\x80': a pickle (legacy torch.save format)
        return _legacy_damage(path, size) if head[:1] == b'\x80' else \
            'is empty (0 bytes)' if not size else \
            f'is not a torch checkpoint (starts with {head!r})'
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except Exception as e:  # noqa: BLE001 - BadZipFile, zlib errors ...
        return f'is truncated or corrupt ({size} bytes; {e})'
    return bad and f'is corrupt (CRC error in record {bad!r})'


#: the first pickle of torch's legacy format (``torch.serialization``)
_LEGACY_MAGIC = 0x1950a86a20f9469cfc6c


def _legacy_damage(path: str, size: int) -> Optional[str]:
    """Why the legacy (non-zip) torch file ``path`` is not complete."""
    cut = f"is truncated or corrupt ({size} bytes; torch's legacy (non-zip) " \
        'format, cut short in its '
    try:  # a newer / older torch may lack the dtype of a storage type
        from torch.storage import _get_dtype_from_pickle_storage_type as dtype
        with open(path, 'rb') as f:
            if RestrictedUnpickler(f, []).load() != _LEGACY_MAGIC:
                return None
            # protocol, system info, the object (naming its storages), keys
            walkers = [RestrictedUnpickler(f, []) for _ in range(4)]
            keys = [w.load() for w in walkers][3]
            for key in keys if isinstance(keys, list) else ():
                kind, numel = walkers[2].storages.get(str(key), (None, None))
                if not isinstance(numel, int):
                    return None
                element = 1 if kind == 'UntypedStorage' else \
                    torch._utils._element_size(dtype(kind))
                header = f.read(8)
                if len(header) == 8 and int.from_bytes(header,
                                                       'little') != numel:
                    return (f"is corrupt ({size} bytes; torch's legacy "
                            f'(non-zip) format: storage {key} records '
                            f'another size than its tensor)')
                f.seek(numel * element, 1)
                if len(header) < 8 or f.tell() > size:
                    return cut + 'tensor data)'
    except (EOFError, pickle.UnpicklingError) as e:
        return cut + 'pickles)' if 'truncated' in str(e) or isinstance(
            e, EOFError) else None
    except Exception:  # noqa: BLE001 - not ours to judge: torch.load's
        return None
    return None


def refusal_message(path: str, refused: List[str], fix: str = '') -> str:
    """One line for a refused checkpoint."""
    legacy = osp.isfile(path) and not zipfile.is_zipfile(path)
    kind = "a plain / legacy pickle (not torch's zip format) with " \
        if legacy else ''
    code = code_globals(refused)
    if code:
        return (f'checkpoint {path} was refused: it holds {kind}pickled code '
                f'({", ".join(code)}) that would run when unpickled; mmsoft '
                f'never unpickles such a file, whatever the options: get the '
                f'weights again from their original source')
    what = 'pickled objects other than tensors and plain containers' + (
        f' ({", ".join(refused)})' if refused else '')
    fix = fix or ('convert it with tools/model_converters/soft2mmsoft.py '
                  'SRC DST (add --trust-checkpoint there only if you trust '
                  'the file)')
    return (f'checkpoint {path} was refused: it holds {kind}{what}, which '
            f'could run code when unpickled; {fix}')


def load_verified(path: str, map_location='cpu'):
    """Load ``path`` without running code from it."""
    damage = describe_damage(path)
    if damage:
        raise CheckpointError(f'checkpoint {path} {damage}; it was not '
                              f'loaded (use an earlier or a fresh copy)')
    try:
        return safe_torch_load(path, map_location=map_location)
    except pickle.UnpicklingError:
        raise CheckpointRefused(refusal_message(
            path, unsafe_globals(path))) from None
    except (EOFError, RuntimeError) as e:  # a legacy file describe_damage
        if zipfile.is_zipfile(path):  # could not judge
            raise
        raise CheckpointError(
            f'checkpoint {path} is truncated or corrupt (torch\'s legacy '
            f'(non-zip) format: {type(e).__name__}: '
            f'{" ".join(str(e).split()) or "end of file"}); it was not '
            f'loaded (use an earlier or a fresh copy)') from None
