"""Command-line helpers shared by the tools (argparse types)."""
import argparse

__all__ = ['positive_int']


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
