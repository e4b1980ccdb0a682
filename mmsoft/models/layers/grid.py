"""The strided token grid shared by SOFT's bottleneck sampler and the zoo.

SOFT reduces an H x W token map to its m bottleneck tokens with an r x r,
stride-r operation (Sec. 3.2; r = ``sampling_ratio``); Linformer's spatial
reduction and Nystromformer's landmarks use the same geometry in the
comparisons of Table 1. :func:`landmark_grid` is the rule for the size of
that grid, :func:`reduce_map` the reduction itself.
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ['landmark_grid', 'reduce_map']


def landmark_grid(hw: Tuple[int, int],
                  ratio: int,
                  max_landmarks: Optional[int] = None) -> Tuple[int, int]:
    """Bottleneck grid for an H x W token map and sampling ratio r.

    Rule: ``max(1, H // r) x max(1, W // r)``. As in the official strided
    convolution, the last ``H mod r`` rows / ``W mod r`` columns are not pooled
    into a landmark (they still attend to all landmarks through P); a side
    shorter than r is zero-padded to r, giving one landmark along it.

    With ``max_landmarks`` the grid is shrunk, keeping its aspect ratio, to
    at most that many cells: ``floor(gh * s) x floor(gw * s)`` (each >= 1)
    with ``s = sqrt(max_landmarks / (gh * gw))``.
    """
    H, W = hw
    gh, gw = max(1, H // ratio), max(1, W // ratio)
    if max_landmarks is not None and gh * gw > max_landmarks:
        s = math.sqrt(max_landmarks / (gh * gw))
        gh, gw = max(1, int(gh * s)), max(1, int(gw * s))
        while gh * gw > max_landmarks:  # only when one side is clamped to 1
            if gh >= gw:
                gh -= 1
            else:
                gw -= 1
    return gh, gw


def reduce_map(x: torch.Tensor,
               ratio: int,
               max_landmarks: Optional[int] = None,
               landmark_hw: Optional[Tuple[int, int]] = None,
               conv: Optional[nn.Module] = None) -> torch.Tensor:
    """r x r, stride-r reduction of a (N, C, H, W) map to the landmark grid.

    A side shorter than r is zero-padded to r; the last ``H mod r`` rows /
    ``W mod r`` columns are not covered (:func:`landmark_grid`). ``conv``
    (an r x r stride-r convolution, as SOFT's ``'conv'`` sampler and PVT's
    spatial reduction) replaces the r x r average pooling. The grid is then
    adaptively average-pooled down to ``landmark_hw``, or to at most
    ``max_landmarks`` cells, if given.
    """
    H, W = x.shape[-2:]
    r = ratio
    if H < r or W < r:
        x = F.pad(x, (0, max(0, r - W), 0, max(0, r - H)))
    if conv is not None:
        x = conv(x)
    elif r > 1:
        x = F.avg_pool2d(x, r, r)
    if landmark_hw is not None:
        target = tuple(landmark_hw)
    else:
        target = landmark_grid(x.shape[-2:], 1, max_landmarks)
    if tuple(x.shape[-2:]) != target:
        x = F.adaptive_avg_pool2d(x, target)
    return x
