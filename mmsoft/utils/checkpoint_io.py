"""Checkpoint files that survive a kill and cannot be silently corrupt.

Used by mmsoft's :class:`~mmsoft.engine.hooks.SafeCheckpointHook` (training
checkpoints), the converters in ``tools/model_converters`` and, through
:func:`install_loader`, by every local checkpoint that mmengine loads after
:func:`mmsoft.setup` (which building a SOFT backbone or an mmsoft hook runs:
``Runner(resume=...)``, ``load_from``, ``tools/test.py``,
``init_cfg=dict(type='Pretrained', ...)``):

* :func:`save_atomic` - ``torch.save`` through
  :func:`mmsoft.utils.atomic.atomic_path` (a temporary file in the target
  directory, ``fsync``, ``os.replace``, ``fsync`` of the directory): the
  target is either the complete new file or untouched. The temporary file is
  removed on any exception and on SIGTERM / SIGINT; its name
  (``.<name>.<pid>.<random>.mmsoft-tmp``) lets :func:`remove_stale_temps`
  delete what a SIGKILL left behind.
* :func:`add_checksum` / :func:`verify_checksum` - a SHA-256 of each saved
  entry (``state_dict``, ``optimizer``, ...: every tensor, array and plain
  value with its key path, in key order; of ``meta`` only mmsoft's RNG
  states and sampler seed, and mmengine's ``message_hub`` is not covered),
  stored under ``checkpoint['meta']['mmsoft_checksum']``.
* :func:`describe_damage` - why a file cannot be a complete checkpoint
  (empty, truncated, CRC error in a record), or None.
* :func:`find_newest_complete` - the newest ``epoch_N.pth`` / ``iter_N.pth``
  of a work dir that loads and passes its checksum; damaged newer ones are
  skipped with a warning.
"""
import hashlib
import logging
import os
import os.path as osp
import pickle
import re
import zipfile
from collections.abc import Mapping
from typing import Iterable, List, Optional, Tuple

import numpy as np
import torch

# the temporaries' names and their clean-up are those of every atomic write
from .atomic import TMP_SUFFIX, atomic_path, remove_stale_temps

__all__ = [
    'CheckpointError', 'CheckpointWriteError', 'save_atomic', 'add_checksum',
    'verify_checksum', 'state_checksum', 'describe_damage', 'load_verified',
    'find_newest_complete', 'remove_stale_temps', 'checkpoint_candidates',
    'install_loader', 'refused_globals', 'check_complete', 'TMP_SUFFIX',
    'CHECKSUM_KEY', 'CheckpointRefused', 'refusal_message', 'is_legacy_pickle'
]

#: where the checksum lives: ``checkpoint['meta'][CHECKSUM_KEY]``
CHECKSUM_KEY = 'mmsoft_checksum'
#: top-level entries that the checksum does not cover
UNCOVERED = ('meta', 'message_hub')
#: entries of ``meta`` that it does cover (written by mmsoft's
#: SafeCheckpointHook: the RNG states are tensor records too), as
#: ``'meta/<key>'`` digests
COVERED_META = ('mmsoft_rng', 'mmsoft_sampler_seed')

_CKPT_RE = re.compile(r'^(?:epoch|iter)_(\d+)\.pth$')


class CheckpointError(RuntimeError):
    """A checkpoint file is damaged or fails its checksum."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (full disk, ...): the message
    names the file and what was kept (``SafeCheckpointHook``)."""

    def __str__(self):
        return self.strerror or super().__str__()


def _log(msg, level=logging.INFO):
    from mmengine.logging import print_log
    print_log(msg, logger='current', level=level)


# ------------------------------------------------------------------ checksum
def _update(h, path: str, value) -> None:
    """Feed one leaf (tensor, array, plain value or container) to ``h``."""
    if isinstance(value, torch.Tensor):
        t = value.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        t = t.cpu().contiguous().reshape(-1)
        h.update(f'{path}:tensor:{t.dtype}:{tuple(value.shape)}:'.encode())
        if t.numel():
            h.update(t.view(torch.uint8).numpy().data)
    elif isinstance(value, np.ndarray) and value.dtype != object:
        a = np.ascontiguousarray(value)
        h.update(f'{path}:ndarray:{a.dtype.str}:{a.shape}:'.encode())
        h.update(a.view(np.uint8).data if a.size else b'')
    elif isinstance(value, Mapping):
        h.update(f'{path}:dict:{len(value)}:'.encode())
        for k, v in value.items():
            _update(h, f'{path}/{k!r}', v)
    elif isinstance(value, (list, tuple)):
        h.update(f'{path}:{type(value).__name__}:{len(value)}:'.encode())
        for i, v in enumerate(value):
            _update(h, f'{path}/{i}', v)
    elif value is None or isinstance(
            value, (bool, int, float, complex, str, bytes, np.generic)):
        h.update(f'{path}:{type(value).__name__}:{value!r}:'.encode())
    else:  # other objects: only their type (their repr may hold addresses)
        h.update(f'{path}:{type(value).__qualname__}:'.encode())


def state_checksum(value) -> str:
    """SHA-256 (hex) of one checkpoint entry: its tensors, arrays and plain
    values with their key paths, in key order."""
    h = hashlib.sha256()
    _update(h, '', value)
    return h.hexdigest()


def _entries(checkpoint: Mapping):
    """(digest name, value) of what the checksum covers: the top-level
    entries but ``meta`` / ``message_hub``, and ``meta``'s
    :data:`COVERED_META` entries as ``'meta/<key>'``."""
    for k, v in checkpoint.items():
        if k not in UNCOVERED:
            yield k, v
    meta = checkpoint.get('meta')
    if isinstance(meta, Mapping):
        for k in COVERED_META:
            if k in meta:
                yield f'meta/{k}', meta[k]


def _lookup(checkpoint: Mapping, name: str):
    """(present, value) of the entry a digest name refers to."""
    if name.startswith('meta/') and name not in checkpoint:
        meta = checkpoint.get('meta')
        key = name[len('meta/'):]
        if isinstance(meta, Mapping) and key in meta:
            return True, meta[key]
        return False, None
    return name in checkpoint, checkpoint.get(name)


def add_checksum(checkpoint: dict) -> dict:
    """Store a checksum of each entry of ``checkpoint`` (but ``meta`` and
    ``message_hub``; of ``meta`` only mmsoft's RNG states and sampler seed)
    in ``checkpoint['meta']['mmsoft_checksum']`` (in place). Per-entry
    digests keep a subset of the entries (e.g. mmengine's
    ``published_keys``) verifiable."""
    if checkpoint.get('meta') is None:
        checkpoint['meta'] = {}
    checkpoint['meta'][CHECKSUM_KEY] = dict(
        algorithm='sha256',
        digests={
            k: state_checksum(v)
            for k, v in _entries(checkpoint)
        })
    return checkpoint


def verify_checksum(checkpoint, filename: str = '<checkpoint>') -> bool:
    """Check the checksums stored by :func:`add_checksum`.

    Returns True when they match, False when there are none (files not
    written by mmsoft); raises :class:`CheckpointError` naming the file and
    the entries on a mismatch. Entries absent from the file are skipped.
    """
    if not isinstance(checkpoint, Mapping):
        return False
    meta = checkpoint.get('meta')
    if not isinstance(meta, Mapping) or CHECKSUM_KEY not in meta:
        return False
    info = meta[CHECKSUM_KEY]
    if not isinstance(info, Mapping) or info.get('algorithm') != 'sha256' \
            or not isinstance(info.get('digests'), Mapping):
        raise CheckpointError(
            f'checkpoint {filename}: unreadable checksum record {info!r}')
    bad = []
    for k, d in info['digests'].items():
        present, value = _lookup(checkpoint, k)
        if present and state_checksum(value) != d:
            bad.append(k)
    if bad:
        raise CheckpointError(
            f'checkpoint {filename} is corrupt: the SHA-256 of its saved '
            f'{", ".join(map(str, bad))} does not match the one recorded at '
            f'save time; do not use it (resume from an earlier checkpoint, '
            f'or convert / copy it again)')
    return True


# ----------------------------------------------------------------- damage
def describe_damage(path: str) -> Optional[str]:
    """Why ``path`` cannot be a complete torch checkpoint, or None.

    Detects an empty file, a truncated zip archive (no central directory)
    and records whose CRC-32 does not match (flipped bytes anywhere in a
    record). Reads the whole file.
    """
    try:
        size = os.path.getsize(path)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if size == 0:
        return 'is empty (0 bytes)'
    with open(path, 'rb') as f:
        head = f.read(4)
    if head[:2] != b'PK':  # not torch's zip format: legacy pickle or junk
        if head[:1] == b'\x80':  # a pickle (legacy torch.save format)
            return None
        return f'is not a torch checkpoint (starts with {head!r})'
    try:
        with zipfile.ZipFile(path) as z:
            bad = z.testzip()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
        return f'is truncated or corrupt ({size} bytes; {e})'
    except Exception as e:  # noqa: BLE001 - zlib errors and friends
        return f'is corrupt ({type(e).__name__}: {e})'
    if bad is not None:
        return f'is corrupt (CRC error in record {bad!r})'
    return None


def refused_globals(path: str) -> List[str]:
    """Globals in ``path`` that mmsoft's weights-only loading refuses
    (:func:`mmsoft.compat.unsafe_globals`)."""
    from mmsoft.utils.safe_load import unsafe_globals
    return unsafe_globals(path)


def is_legacy_pickle(path: str) -> bool:
    """True for a file that is a pickle, not torch's zip format (a legacy
    ``torch.save(..., _use_new_zipfile_serialization=False)`` file or a
    plain ``pickle.dump``)."""
    try:
        with open(path, 'rb') as f:
            return f.read(1) == b'\x80'
    except OSError:
        return False


def refusal_message(path: str,
                    refused: List[str],
                    converter: bool = False) -> str:
    """One line for a checkpoint that weights-only loading refused: the
    file, what it holds and the safe fix (the converter; the explicit
    trust flag only for a file the user trusts) - never torch's advice to
    load it with ``weights_only=False``."""
    what = 'pickled objects other than tensors and plain containers'
    if refused:
        what += f' ({", ".join(refused)})'
    if is_legacy_pickle(path):
        what = f"a plain / legacy pickle (not torch's zip format) with {what}"
    fix = ('if you trust the file, run again with --trust-checkpoint'
           if converter else
           'convert it with tools/model_converters/soft2mmsoft.py SRC DST '
           '(add --trust-checkpoint there only if you trust the file)')
    return (f'checkpoint {path} was refused: it holds {what}, which could '
            f'run code when unpickled; {fix}')


class CheckpointRefused(pickle.UnpicklingError):
    """mmsoft's weights-only loading refused a checkpoint (one line:
    :func:`refusal_message`)."""


def load_verified(path: str,
                  map_location='cpu',
                  weights_only=None,
                  verify: bool = True,
                  **kwargs):
    """``torch.load`` that never runs code from the file, on every torch
    (:func:`mmsoft.compat.safe_torch_load`; ``weights_only=False``
    unpickles anything, for files the caller explicitly trusts), with
    clear errors: a damaged file raises :class:`CheckpointError` saying so,
    a refused one :class:`CheckpointRefused` naming the file and the safe
    fix (never suggesting ``weights_only=False``), and the stored checksum
    (if any) is verified."""
    from mmsoft.utils.safe_load import safe_torch_load
    try:
        if weights_only is False:
            ckpt = torch.load(
                path, map_location=map_location, weights_only=False, **kwargs)
        else:
            ckpt = safe_torch_load(path, map_location=map_location)
    except Exception as e:
        damage = describe_damage(path)
        if damage is not None:
            raise CheckpointError(
                f'checkpoint {path} {damage}; it was not loaded (use an '
                f'earlier or a fresh copy)') from None
        if isinstance(e, pickle.UnpicklingError) and weights_only is not \
                False:
            raise CheckpointRefused(
                refusal_message(path, refused_globals(path))) from None
        raise
    if verify:
        verify_checksum(ckpt, path)
    return ckpt


def load_from_local(filename, map_location):
    """mmengine's local checkpoint loader, plus the damage / checksum
    checks of :func:`load_verified` (registered by :func:`install_loader`).
    """
    filename = osp.expanduser(filename)
    if not osp.isfile(filename):
        raise FileNotFoundError(f'{filename} can not be found.')
    return load_verified(filename, map_location=map_location)


def load_from_http(filename,
                   map_location=None,
                   model_dir=None,
                   progress=False):
    """mmengine's loader of ``http(s)://`` checkpoints (``init_cfg``
    ``Pretrained`` with a URL), loading the downloaded file with
    :func:`load_verified`: mmengine's own loader calls ``torch.load`` with
    torch's default, which unpickles anything before torch 2.6. The file
    is cached in ``<torch hub dir>/checkpoints`` as mmengine does."""
    from urllib.parse import urlparse

    from torch.hub import download_url_to_file, get_dir
    model_dir = model_dir or osp.join(get_dir(), 'checkpoints')
    os.makedirs(model_dir, exist_ok=True)
    cached = osp.join(model_dir, osp.basename(urlparse(filename).path))
    if not osp.isfile(cached):
        download_url_to_file(filename, cached, None, progress=progress)
    return load_verified(cached, map_location=map_location)


def install_loader() -> bool:
    """Register :func:`load_from_local` as mmengine's loader of local paths
    (``CheckpointLoader``'s empty prefix) and :func:`load_from_http` for
    ``http(s)://``; idempotent."""
    from mmengine.runner.checkpoint import CheckpointLoader
    if CheckpointLoader._schemes.get('') is not load_from_local:
        CheckpointLoader.register_scheme(
            prefixes='', loader=load_from_local, force=True)
    if CheckpointLoader._schemes.get('https://') is not load_from_http:
        CheckpointLoader.register_scheme(
            prefixes=('http://', 'https://'),
            loader=load_from_http,
            force=True)
    return True


# ------------------------------------------------------------- atomic save
def save_atomic(obj, path: str, writer=None) -> None:
    """Write ``obj`` to ``path`` atomically and durably (see the module doc
    and :func:`mmsoft.utils.atomic.atomic_path`).

    ``writer(obj, file)`` defaults to ``torch.save``. On any error - an
    unwritable directory, a full disk, SIGINT / SIGTERM - the temporary file
    is removed, ``path`` is untouched and the exception propagates; an
    ``OSError`` that the writer wrapped in another exception (torch.save on
    a full disk) is raised as that ``OSError``.
    """
    writer = writer or torch.save
    with atomic_path(path, durable=True) as tmp:
        with open(tmp, 'xb') as f:
            writer(obj, f)


# ----------------------------------------------------- newest complete one
def checkpoint_candidates(dirs: Iterable[str],
                          extra: Iterable[str] = ()) -> List[str]:
    """``epoch_N.pth`` / ``iter_N.pth`` files of ``dirs`` plus ``extra``
    paths, newest first (by N, then by modification time)."""
    found = {}
    for d in dirs:
        try:
            entries = os.listdir(d)
        except OSError:
            continue
        for entry in entries:
            m = _CKPT_RE.match(entry)
            if m:
                p = osp.abspath(osp.join(d, entry))
                found[p] = int(m.group(1))
    for p in extra:
        if p and osp.isfile(p):
            p = osp.abspath(p)
            m = _CKPT_RE.match(osp.basename(p))
            found.setdefault(p, int(m.group(1)) if m else -1)

    def key(p):
        try:
            mtime = os.path.getmtime(p)
        except OSError:
            mtime = 0.
        return (found[p], mtime)

    return sorted(found, key=key, reverse=True)


def check_complete(path: str) -> Optional[str]:
    """None if ``path`` loads and passes its checksum, else the reason."""
    damage = describe_damage(path)
    if damage is not None:
        return damage
    from mmsoft.utils.safe_load import safe_torch_load
    try:
        ckpt = safe_torch_load(path, map_location='cpu')
        verify_checksum(ckpt, path)
    except CheckpointError as e:
        return str(e)
    except Exception as e:  # noqa: BLE001
        return f'cannot be loaded ({type(e).__name__}: ' \
               f'{str(e).splitlines()[0] if str(e) else ""})'
    if not isinstance(ckpt, Mapping) or 'meta' not in ckpt:
        return 'is not a training checkpoint (no meta)'
    return None


def find_newest_complete(work_dir: str,
                         out_dir: Optional[str] = None
                         ) -> Tuple[Optional[str], List[Tuple[str, str]]]:
    """The newest complete training checkpoint of a run.

    Looks at the file named by ``<work_dir>/last_checkpoint`` and at every
    ``epoch_N.pth`` / ``iter_N.pth`` in ``work_dir``, ``out_dir`` and the
    directory of that file. Returns ``(path or None, skipped)`` where
    ``skipped`` lists ``(path, reason)`` of newer, damaged checkpoints; each
    is also logged as a warning.
    """
    dirs = [work_dir] + ([out_dir] if out_dir else [])
    last = None
    pointer = osp.join(work_dir, 'last_checkpoint')
    if osp.isfile(pointer):
        try:
            with open(pointer) as f:
                last = f.read().strip() or None
        except OSError:
            last = None
    if last:
        dirs.append(osp.dirname(osp.abspath(last)))
    skipped = []
    for p in checkpoint_candidates(
            dict.fromkeys(dirs), [last] if last else []):
        reason = check_complete(p)
        if reason is None:
            return p, skipped
        skipped.append((p, reason))
        _log(
            f'mmsoft: skipping checkpoint {p}: it {reason}'
            if not reason.startswith('checkpoint ') else
            f'mmsoft: skipping {reason}', logging.WARNING)
    if last and not osp.isfile(last):
        _log(f'mmsoft: last_checkpoint names {last}, which does not exist',
             logging.WARNING)
    return None, skipped
