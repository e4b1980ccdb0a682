"""Whole-checkpoint conversion between the official SOFT layout and mmsoft.

:func:`convert_official_to_mmpretrain` and
:func:`convert_mmpretrain_to_official` rename every key
(:mod:`.official_keys`) and validate the result against the architecture
read off the shapes (:mod:`.official_arch`); problems raise
:class:`~mmsoft.utils.checkpoint_files.ConversionError` naming the keys.
Used by ``tools/model_converters/soft2mmsoft.py`` and ``mmsoft2soft.py``.
"""
from collections import OrderedDict
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from mmsoft.utils.checkpoint_files import ConversionError, strip_module_prefix
from .legacy_keys import upgrade_legacy_state_dict
from .official_arch import infer_official_arch, official_shapes
from .official_keys import mmsoft_to_official_key, official_to_mmsoft_key

__all__ = ['convert_official_to_mmpretrain', 'convert_mmpretrain_to_official']


def _check(sd: Mapping[str, torch.Tensor],
           expected: Mapping[str, Tuple[int, ...]],
           what: str,
           rename=lambda k: k) -> None:
    """Unknown keys, missing keys and shape mismatches, all at once."""
    problems: List[str] = []
    for k in sd:
        if k not in expected:
            problems.append(f'unknown key {rename(k)!r} '
                            f'(shape {tuple(sd[k].shape)})')
    for k, shp in expected.items():
        if k not in sd:
            problems.append(f'missing key {rename(k)!r} (expected shape '
                            f'{shp})')
        elif tuple(sd[k].shape) != tuple(shp):
            problems.append(f'shape mismatch for {rename(k)!r}: expected '
                            f'{tuple(shp)}, found {tuple(sd[k].shape)}')
    if problems:
        raise ConversionError(
            f'the {what} does not match the inferred architecture '
            f'({len(problems)} problem(s)):', problems)


def _fill_bn_counters(sd: 'OrderedDict',
                      expected: Mapping[str, Tuple[int, ...]]) -> List[str]:
    """Some exporters drop BatchNorm's ``num_batches_tracked`` buffers; they
    carry no weights, so missing ones are filled with 0 (listed in the
    return value)."""
    filled = []
    for k in expected:
        if k.endswith('num_batches_tracked') and k not in sd:
            sd[k] = torch.tensor(0, dtype=torch.long)
            filled.append(k)
    return filled


def convert_official_to_mmpretrain(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict, List[str]]:
    """Official state dict -> mmpretrain ``ImageClassifier`` state dict.

    Returns ``(state_dict, arch, notes)``: backbone keys get ``prefix``, the
    official ``head.*`` becomes ``head.fc.*``; ``arch`` is
    :func:`infer_official_arch`'s result. Raises :class:`ConversionError` on
    unknown keys, missing keys or shape mismatches (all listed).
    """
    sd = strip_module_prefix(sd)
    notes: List[str] = []
    arch = infer_official_arch(sd, stage4_heads)
    expected = official_shapes(arch, arch['in_channels'], arch['num_classes'],
                               arch['pretrain_img_size'])
    filled = _fill_bn_counters(sd, expected)
    if filled:
        notes.append(f'{len(filled)} BatchNorm num_batches_tracked buffers '
                     f'were missing and set to 0')
    _check(sd, expected, 'official checkpoint')
    out = OrderedDict()
    for k in expected:  # official order, which is also mmsoft's order
        new = official_to_mmsoft_key(k)
        if new is None:  # pragma: no cover - official_shapes is exhaustive
            raise ConversionError(f'no mmsoft name for {k!r}')
        if not new.startswith('head.'):
            new = prefix + new
        out[new] = sd[k]
    return out, arch, notes


def convert_mmpretrain_to_official(sd: Mapping[str, torch.Tensor],
                                   stage4_heads: Optional[int] = None,
                                   prefix: str = 'backbone.'
                                   ) -> Tuple['OrderedDict', Dict, List[str]]:
    """mmpretrain classifier (or bare mmsoft backbone) state dict -> official
    layout. Inverse of :func:`convert_official_to_mmpretrain`.

    Keys starting with ``prefix`` are backbone keys; ``head.fc.*`` is the
    classifier. If no key has the prefix the dict is taken as a bare backbone
    state dict. Other keys (e.g. a neck) are reported as unknown. Keys of
    mmsoft checkpoints of version 1 are read too (see
    :func:`.legacy_keys.upgrade_legacy_state_dict`).
    """
    sd = strip_module_prefix(sd)
    has_prefix = any(k.startswith(prefix) for k in sd)
    sd = upgrade_legacy_state_dict(sd, prefix if has_prefix else '')
    official = OrderedDict()
    origin = {}
    problems = []
    for k, v in sd.items():
        if has_prefix and k.startswith(prefix):
            name = mmsoft_to_official_key(k[len(prefix):])
            if name is not None and name.startswith('head.'):
                name = None
        elif k.startswith('head.fc.') or not has_prefix:
            name = mmsoft_to_official_key(k)
        else:
            name = None
        if name is None:
            problems.append(f'unknown key {k!r} (shape {tuple(v.shape)})')
            continue
        official[name] = v
        origin[name] = k
    if problems:
        raise ConversionError(
            'the mmsoft checkpoint has keys with no official counterpart:',
            problems)
    arch = infer_official_arch(official, stage4_heads)
    expected = official_shapes(arch, arch['in_channels'], arch['num_classes'],
                               arch['pretrain_img_size'])
    notes: List[str] = []
    filled = _fill_bn_counters(official, expected)
    if filled:
        notes.append(f'{len(filled)} BatchNorm num_batches_tracked buffers '
                     f'were missing and set to 0')

    def rename(k):
        if k in origin:
            return origin[k]
        new = official_to_mmsoft_key(k)
        if new is None:
            return k
        return new if new.startswith('head.') or not has_prefix \
            else prefix + new

    _check(official, expected, 'mmsoft checkpoint', rename)
    return OrderedDict((k, official[k]) for k in expected), arch, notes
