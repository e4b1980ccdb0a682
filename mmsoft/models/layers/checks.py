"""Argument checks shared by the SOFT backbone and its layers.

Every check raises one ``ValueError`` / ``TypeError`` naming the option,
the value received and what is accepted, at construction time (instead of a
shape error in the first forward pass, or a silently ignored option).
"""
import numbers
from typing import Any, Optional

__all__ = [
    'check_int', 'check_rate', 'check_kernel_size',
    'check_ignored_attn_options'
]


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_int(name: str,
              value: Any,
              minimum: int = 1,
              allow_none: bool = False) -> Optional[int]:
    """``value`` must be an int >= ``minimum`` (or None with
    ``allow_none``); returns it as a python int."""
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


def check_kernel_size(name: str, value: Any, allow_zero: bool = True) -> int:
    """A depthwise-conv kernel size: an odd positive int (``'same'``
    padding ``k // 2`` keeps the token map only for odd k); 0 disables
    the conv where ``allow_zero``."""
    if _is_int(value) and (value % 2 == 1 or (allow_zero and value == 0)) \
            and value >= 0:
        return int(value)
    zero = ' (or 0 to disable the conv)' if allow_zero else ''
    raise ValueError(f'{name} must be an odd positive int{zero}, got '
                     f'{value!r}: an even kernel changes the token map size')


def check_ignored_attn_options(attn_type: str, options: dict,
                               defaults: dict) -> None:
    """Reject options that ``attn_type`` ignores but were set anyway.

    ``options``: the values given (name -> value) of the SOFT-only options
    (:data:`mmsoft.models.layers.attention_zoo._SOFT_ONLY`); ``defaults``:
    their defaults. An option left at its default is fine; a non-default
    value of an option the chosen attention does not use is an error (it
    would otherwise be dropped silently). ``attn_type='soft_norm'`` always
    normalises, so ``attn_norm=False`` contradicts it.
    """
    from .attention_zoo import _SOFT_ONLY, ATTENTIONS, _accepted
    from .soft_attention import SOFTAttention
    if attn_type == 'soft_norm':
        if options.get('attn_norm', True) is not True:
            raise ValueError("attn_type='soft_norm' always uses the "
                             'normalisation; attn_norm=False contradicts '
                             "it (use attn_type='soft', attn_norm=False)")
        return
    cls = ATTENTIONS.get(attn_type)
    if cls is None or cls is SOFTAttention:
        return  # unknown types are reported by build_attention
    ignored = []
    for key in _SOFT_ONLY:
        if key not in options or key not in defaults:
            continue
        if key == 'max_landmarks' and _accepted(cls, key):
            continue
        if options[key] != defaults[key]:
            ignored.append(f'{key}={options[key]!r}')
    if ignored:
        raise ValueError(
            f"attn_type={attn_type!r} does not use {', '.join(ignored)} "
            f'(SOFT-attention options); remove them or leave them at their '
            f'defaults')
