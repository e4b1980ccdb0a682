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

__all__ = ['landmark_grid', 'reduce_map', 'fixed_grid']


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


def fixed_grid(landmark_hw: Tuple[int, int],
               grid: Tuple[int, int]) -> Tuple[int, int]:
    """The grid a fixed ``landmark_hw`` gives on a strided grid ``grid``:
    each side clamped to the strided grid's.

    SOFT's bottleneck is a down-sampling of the token map (Sec. 3.2: m =
    n / r^2 landmarks); ``landmark_hw`` (and ``max_landmarks``) may only
    reduce it further. A larger grid would be interpolated from the same
    strided cells - no information the strided grid does not hold - while
    its cost grows as m^2 n + m^3 (24 x 24 landmarks on the 16 x 16 map of a
    64 x 64 input: m = 576 > n = 256, 9x slower, and m > n defeats the
    linear complexity altogether), so it is clamped instead.
    """
    return (min(int(landmark_hw[0]),
                int(grid[0])), min(int(landmark_hw[1]), int(grid[1])))


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
    ``max_landmarks`` cells, if given. It is never up-sampled: a side of
    ``landmark_hw`` larger than the strided grid's is clamped to it
    (:func:`fixed_grid`), so m <= n / r^2 <= n.
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
        target = fixed_grid(landmark_hw, tuple(x.shape[-2:]))
    else:
        target = landmark_grid(x.shape[-2:], 1, max_landmarks)
    if tuple(x.shape[-2:]) != target:
        x = F.adaptive_avg_pool2d(x, target)
    return x
