"""Argument checks of the SOFT backbone and its layers: one ``ValueError``
at construction naming the option, the value and what is accepted."""
import numbers
from typing import Any, Optional, Sequence

__all__ = ['check_int', 'check_rate', 'check_kernel_size', 'check_choice']


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name, value, minimum=1, allow_none=False) -> Optional[int]:
    """An int >= ``minimum`` (or None with ``allow_none``), as an int."""
    if value is None and allow_none:
        return None
    if not _is_int(value) or value < minimum:
        what = f'an int >= {minimum}' + (' or None' if allow_none else '')
        raise ValueError(f'{name} must be {what}, got {value!r} '
                         f'({type(value).__name__})')
    return int(value)


def check_rate(name: str, value: Any) -> float:
    """A dropout / drop-path probability in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or \
            not 0 <= value < 1:
        raise ValueError(f'{name} must be a number in [0, 1), got {value!r}')
    return float(value)


def check_kernel_size(name: str, value: Any) -> int:
    """An odd positive int (``'same'`` padding keeps the map only for odd
    k), or 0 (no conv)."""
    if _is_int(value) and (value % 2 == 1 or value == 0) and value >= 0:
        return int(value)
    raise ValueError(f'{name} must be an odd positive int (or 0 to disable '
                     f'the conv), got {value!r}: an even kernel changes the '
                     f'token map size')


def check_choice(name: str, value: Any, choices: Sequence) -> Any:
    """One of ``choices``; returns it."""
    if value not in choices:
        raise ValueError(f'unknown {name} {value!r}; choose one of {choices}')
    return value
