"""The strided token grid of SOFT's bottleneck (Sec. 3.2) and the zoo's
reductions: r x r cells with stride r, r = ``sampling_ratio``."""
import math

import torch.nn.functional as F

__all__ = ['landmark_grid', 'reduce_map']


def landmark_grid(hw, ratio, max_landmarks=None, landmark_hw=None):
    """The grid of an H x W map: ``max(1, H // r) x max(1, W // r)`` (as
    the official strided conv); ``landmark_hw`` clamped to it (never
    up-sampled); or shrunk, aspect kept, to at most ``max_landmarks``:
    ``floor(gh * s) x floor(gw * s)``, ``s = sqrt(max_landmarks / (gh gw))``.
    """
    H, W = hw
    gh, gw = max(1, H // ratio), max(1, W // ratio)
    if landmark_hw is not None:
        return min(int(landmark_hw[0]), gh), min(int(landmark_hw[1]), gw)
    if max_landmarks is not None and gh * gw > max_landmarks:
        # floor(gh s) = floor(sqrt(gh max_landmarks / gw)), in integers (a
        # float gh * s can fall just below a whole number)
        gh, gw = (max(1, math.isqrt(gh * max_landmarks // gw)),
                  max(1, math.isqrt(gw * max_landmarks // gh)))
        while gh * gw > max_landmarks:  # only when one side is clamped to 1
            if gh >= gw:
                gh -= 1
            else:
                gw -= 1
    return gh, gw


def reduce_map(x, ratio, max_landmarks=None, landmark_hw=None, conv=None):
    """A (N, C, H, W) map reduced to its :func:`landmark_grid`: r x r
    average pooling (or ``conv``, an r x r stride-r convolution), then
    adaptive average pooling down to ``landmark_hw`` / ``max_landmarks``."""
    H, W = x.shape[-2:]
    r = ratio
    if H < r or W < r:
        x = F.pad(x, (0, max(0, r - W), 0, max(0, r - H)))
    if conv is not None:
        x = conv(x)
    elif r > 1:
        x = F.avg_pool2d(x, r, r)
    target = landmark_grid(x.shape[-2:], 1, max_landmarks, landmark_hw)
    if tuple(x.shape[-2:]) != target:
        x = F.adaptive_avg_pool2d(x, target)
    return x
