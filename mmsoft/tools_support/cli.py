"""Command-line helpers shared by the tools (argparse types, input checks)."""
import argparse
import os.path as osp

__all__ = ['positive_int', 'check_readable']


def positive_int(text: str) -> int:
    """argparse type of counts such as ``--stage4-heads``."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(
            f'expected a positive integer, got {text!r}')
    return value


def check_readable(path: str) -> None:
    """An existing input file that cannot be opened (permissions, ...)
    raises a one-line ``ConversionError`` naming it and the reason, instead
    of a ``PermissionError`` traceback; a missing file or a directory is
    left to the loader's own message."""
    from mmsoft.utils.checkpoint_files import ConversionError
    if not osp.isfile(path):
        return
    try:
        with open(path, 'rb') as f:
            f.read(1)
    except OSError as e:
        raise ConversionError(
            f'cannot read {path!r}: {e.strerror or e}' +
            (f' (errno {e.errno})' if e.errno else '') +
            '; check its permissions (ls -l) or copy it somewhere readable'
        ) from None
