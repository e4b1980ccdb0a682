"""Checkpoint files for the converters: reading, layouts, atomic writing.

What the official-checkpoint converters (``tools/model_converters``) do with
files, independent of any model:

* :func:`load_checkpoint_file` - ``torch.load`` (weights only by default)
  with one-line errors for missing, damaged or untrusted files;
* :func:`extract_state_dict`, :func:`strip_module_prefix` - the weights of
  any timm checkpoint layout;
* :func:`check_output_path`, :func:`save_checkpoint_atomic` - refuse to
  replace the input, write atomically.

Problems raise :class:`ConversionError` (one line each). Loading weights
into models (layout detection, conversion, strict load) is
:mod:`mmsoft.models.loading`, which uses :func:`extract_state_dict`.
"""
import os
import pickle
from collections import OrderedDict
from typing import Mapping, Optional, Sequence, Tuple

import torch

__all__ = [
    'ConversionError', 'load_checkpoint_file', 'check_output_path',
    'strip_module_prefix', 'extract_state_dict', 'save_checkpoint_atomic'
]


class ConversionError(ValueError):
    """A checkpoint does not match the expected layout.

    ``problems`` lists one human-readable line per offending key.
    """

    def __init__(self, message: str, problems: Sequence[str] = ()):
        self.problems = list(problems)
        if self.problems:
            message = message + '\n  ' + '\n  '.join(self.problems)
        super().__init__(message)


def load_checkpoint_file(path: str, trust: bool = False):
    """``torch.load`` on the CPU.

    By default only tensors and plain containers are unpickled
    (``weights_only=True``; ``argparse.Namespace``, which timm stores as
    ``args``, is allowed too). ``trust=True`` unpickles anything - only for
    files from a trusted source (e.g. mmengine checkpoints with a
    ``message_hub``).

    Errors (:class:`ConversionError`, one line each): a missing file, a
    directory, a damaged file (empty, truncated, CRC error: reported as
    damaged, never with the advice to unpickle it), pickled objects refused
    by the weights-only unpickler (the refused globals are named).
    """
    from mmsoft.utils.checkpoint_io import (describe_damage, refusal_message,
                                            refused_globals)
    from mmsoft.utils.safe_load import safe_torch_load
    if os.path.isdir(path):
        raise ConversionError(f'checkpoint {path!r} is a directory, not a '
                              f'file')
    if not os.path.isfile(path):
        raise ConversionError(f'checkpoint {path!r} does not exist')
    damage = describe_damage(path)
    if damage is not None:
        raise ConversionError(
            f'checkpoint {path!r} {damage}: the file is damaged and cannot '
            f'be converted; download or copy it again')
    import argparse
    try:
        if trust:
            ckpt = torch.load(path, map_location='cpu', weights_only=False)
        else:
            ckpt = safe_torch_load(
                path, map_location='cpu', extra=[argparse.Namespace])
    except Exception as e:  # pickle.UnpicklingError and friends
        first = str(e).splitlines()[0] if str(e) else ''
        if trust or not isinstance(e, pickle.UnpicklingError):
            raise ConversionError(
                f'cannot load {path!r} ({type(e).__name__}: {first})'
            ) from None
        refused = [
            g for g in refused_globals(path) if g != 'argparse.Namespace'
        ]
        raise ConversionError(refusal_message(path, refused,
                                              converter=True)) from None
    return ckpt


def _not_a_regular_file(path: str) -> Optional[str]:
    """What ``path`` is if it exists but is neither a regular file nor a
    directory (a device such as /dev/full, a FIFO, a socket), else None."""
    import stat
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    for test, what in ((stat.S_ISCHR, 'a character device'),
                       (stat.S_ISBLK, 'a block device'),
                       (stat.S_ISFIFO, 'a FIFO'), (stat.S_ISSOCK, 'a socket')):
        if test(mode):
            return what
    return None


def check_output_path(src: str, dst: str) -> None:
    """Refuse an output that would replace the input (the same file, also
    through a symlink or another relative path), that is a directory, or
    that exists and is not a regular file (the atomic rename would replace
    e.g. the device node /dev/full by a regular file when run as root)."""
    if os.path.isdir(dst):
        raise ConversionError(
            f'output {dst!r} is a directory; give a file name, e.g. '
            f'{os.path.join(dst, os.path.basename(src))!r}')
    kind = _not_a_regular_file(dst)
    if kind is not None:
        raise ConversionError(
            f'output {dst!r} is {kind}, not a regular file: refusing to '
            f'replace it; give a file name')
    same = os.path.realpath(src) == os.path.realpath(dst)
    if not same and os.path.exists(dst) and os.path.exists(src):
        try:
            same = os.path.samefile(src, dst)
        except OSError:
            pass
    if same:
        raise ConversionError(
            f'output {dst!r} is the input file {src!r}: refusing to replace '
            f'it; choose another output path')


def strip_module_prefix(sd: Mapping[str, torch.Tensor]) -> 'OrderedDict':
    """Remove (repeated) DataParallel / DDP ``module.`` prefixes."""
    out = OrderedDict()
    for k, v in sd.items():
        while k.startswith('module.'):
            k = k[len('module.'):]
        if k in out:
            raise ConversionError(f'key {k!r} occurs twice after stripping '
                                  f'"module." prefixes')
        out[k] = v
    return out


def _is_state_dict(obj) -> bool:
    return isinstance(obj, Mapping) and len(obj) > 0 and all(
        isinstance(k, str) and isinstance(v, torch.Tensor)
        for k, v in obj.items())


def extract_state_dict(ckpt,
                       prefer_ema: bool = True) -> Tuple['OrderedDict', str]:
    """The model weights of a loaded checkpoint in any timm layout.

    Looks for ``state_dict_ema`` (first when ``prefer_ema``), ``state_dict``,
    ``model``, ``model_ema``, or takes ``ckpt`` itself as a bare state dict.
    ``module.`` prefixes are stripped. Returns ``(state_dict, source)`` where
    source names the entry used (``'<bare>'`` for a bare state dict).
    """
    if not isinstance(ckpt, Mapping):
        raise ConversionError(f'checkpoint is a {type(ckpt).__name__}, not '
                              f'a dict')
    order = ['state_dict', 'model', 'state_dict_ema', 'model_ema']
    if prefer_ema:
        order = ['state_dict_ema', 'model_ema', 'state_dict', 'model']
    for name in order:
        if name in ckpt and _is_state_dict(ckpt[name]):
            return strip_module_prefix(ckpt[name]), name
    if _is_state_dict(ckpt):
        return strip_module_prefix(ckpt), '<bare>'
    raise ConversionError(
        f'no state dict found in the checkpoint: expected one of '
        f'{order} holding tensors, or a bare state dict; top-level keys are '
        f'{sorted(map(str, ckpt))[:20]}')


def save_checkpoint_atomic(obj, path: str) -> None:
    """``torch.save`` to a temporary file next to ``path``, ``fsync``, then
    ``os.replace``: ``path`` is either the complete new file or untouched,
    and no temporary file is left behind (also on SIGINT / SIGTERM;
    temporaries of a SIGKILLed earlier run are removed first). OS errors
    (unwritable directory, full disk, ...) raise a one-line
    :class:`ConversionError`.
    """
    from mmsoft.utils.checkpoint_io import remove_stale_temps, save_atomic
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    if os.path.isdir(path):
        raise ConversionError(f'output {path!r} is a directory')
    kind = _not_a_regular_file(path)
    if kind is not None:
        raise ConversionError(f'output {path!r} is {kind}, not a regular '
                              f'file: refusing to replace it')
    if not os.path.isdir(d):
        raise ConversionError(f'output directory {d!r} does not exist')
    remove_stale_temps(d, name=os.path.basename(path))
    try:
        save_atomic(obj, path)
    except OSError as e:
        reason = e.strerror or str(e)
        raise ConversionError(f'cannot write {path!r}: {reason}' +
                              (f' (errno {e.errno})' if e.errno else '') +
                              '; nothing was written') from None
