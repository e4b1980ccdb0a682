"""Softmax-free attention (SOFT), NeurIPS 2021 Alg. 1 + IJCV 2024 Eq. (25).

Notation of the papers (tokens Q in R^{n x d}, Q = K shared):

* ``f_s``  bottleneck sampling, Q~ = f_s(Q) in R^{m x d}      (Sec. 3.2)
* ``P``    = exp(Q (-) Q~)  in R^{n x m}, Gaussian kernel     (Eq. 5)
* ``A``    = exp(Q~ (-) Q~) in R^{m x m}
* ``A^+``  Moore-Penrose inverse by Newton-Raphson            (Alg. 2)
* ``D``    = diag(A 1_m), the symmetric normalisation         (Eq. 25)

    S^  = P A^+ P^T                      (NeurIPS, ``attn_norm=False``)
    S^  = P D^-1/2 A^+ D^-1/2 P^T        (IJCV,    ``attn_norm=True``)
    out = S^ V = P (A^+_n (P^T V))

The n x n matrix S^ is never formed; products are associated right to left
(cost n m d instead of n m^2). A, A^+, D, P and their products run in float32
under fp16/bf16 autocast (see :func:`gaussian_kernel`, :func:`newton_inverse`).
"""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .checks import check_int, check_kernel_size
from .gaussian_kernel import gaussian_kernel
from .pinv import (NR_BACKWARDS, NR_METHODS, canonical_init, default_init,
                   newton_inverse, newton_inverse_apply)

__all__ = [
    'BottleneckSampler', 'SOFTAttention', 'soft_attention',
    'bottleneck_inverse', 'bottleneck_apply', 'SAMPLING_MODES', 'landmark_grid'
]

SAMPLING_MODES = ('conv', 'avgpool', 'random', 'biased')


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


def bottleneck_inverse(A: torch.Tensor,
                       attn_norm: bool = True,
                       nr_iters: int = 20,
                       nr_init: Optional[str] = None,
                       nr_method: str = 'auto',
                       nr_backward: str = 'eq16') -> torch.Tensor:
    """A^+ (Alg. 2), or D^-1/2 A^+ D^-1/2 with ``attn_norm`` (Eq. 25).

    D = diag(A 1_m); ``nr_init`` defaults to the initialisation of the
    official variant (the official rule per sample,
    ``'soft_norm_per_sample'``, with the normalisation, else ``'soft'``).
    float32 (float64 for float64 A), autocast disabled.
    """
    if nr_init is None:
        nr_init = default_init(attn_norm)
    A_inv = newton_inverse(A, nr_iters, nr_init, nr_method, nr_backward)
    if not attn_norm:
        return A_inv
    with torch.autocast(device_type=A.device.type, enabled=False):
        d = A.to(A_inv.dtype).sum(-1).rsqrt()  # entries of A are in (0, 1]
        return d.unsqueeze(-1) * A_inv * d.unsqueeze(-2)


def bottleneck_apply(A: torch.Tensor,
                     W: torch.Tensor,
                     attn_norm: bool = True,
                     nr_iters: int = 20,
                     nr_init: Optional[str] = None,
                     nr_method: str = 'auto',
                     nr_backward: str = 'eq16',
                     nr_stats: Optional[dict] = None) -> torch.Tensor:
    """A^+ W, or D^-1/2 A^+ D^-1/2 W with ``attn_norm`` (Eq. 25).

    The same function as ``bottleneck_inverse(A, ...) @ W`` without the
    m x m inverse (see :func:`newton_inverse_apply`): D^-1/2 is applied to
    the m x d operands instead, and its gradient (D depends on A) flows by
    autograd, with either ``nr_backward``. float32 (float64 for float64 A),
    autocast disabled. ``nr_stats``: optional dict for the convergence of
    the iterations (see :func:`newton_inverse`).
    """
    if nr_init is None:
        nr_init = default_init(attn_norm)
    if not attn_norm:
        return newton_inverse_apply(A, W, nr_iters, nr_init, nr_method,
                                    nr_backward, nr_stats)
    with torch.autocast(device_type=A.device.type, enabled=False):
        dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
        d = A.to(dtype).sum(-1, keepdim=True).rsqrt()  # entries in (0, 1]
        return d * newton_inverse_apply(A, d * W.to(dtype), nr_iters, nr_init,
                                        nr_method, nr_backward, nr_stats)


def soft_attention(q: torch.Tensor,
                   landmarks: torch.Tensor,
                   v: torch.Tensor,
                   attn_norm: bool = True,
                   nr_iters: int = 20,
                   nr_init: Optional[str] = None,
                   nr_method: str = 'auto',
                   nr_backward: str = 'eq16',
                   nr_stats: Optional[dict] = None) -> torch.Tensor:
    """out = P A_n^+ P^T V for q (B, h, n, d), landmarks (B, h, m, d).

    ``q`` and ``landmarks`` must already carry the 1/d^(1/4) scale so that
    exp(-||q - k||^2 / 2) equals the paper's exp(-||q - k||^2 / (2 sqrt d)).
    Associated as P (A_n^+ (P^T V)): n m d + m^2 d work besides the inverse,
    and with the spectral method A_n^+ is never formed.
    Returns a tensor of v's dtype.
    """
    P = gaussian_kernel(q, landmarks)  # (B, h, n, m)
    A = gaussian_kernel(landmarks, landmarks)  # (B, h, m, m)
    with torch.autocast(device_type=v.device.type, enabled=False):
        PtV = torch.matmul(P.transpose(-1, -2), v.to(P.dtype))  # (B,h,m,d)
        Z = bottleneck_apply(A, PtV, attn_norm, nr_iters, nr_init, nr_method,
                             nr_backward, nr_stats)
        out = torch.matmul(P, Z)
    return out.to(v.dtype)


class BottleneckSampler(nn.Module):
    """f_s: the m bottleneck tokens Q~ from the n tokens Q (Table 4b / 8).

    Args:
        head_dims: channels per head (the sampler is shared by all heads).
        ratio: r, the spatial sampling stride (sp = r x r); m = n / r^2 for
            sizes divisible by r, otherwise :func:`landmark_grid`.
        mode: ``'conv'`` r x r conv with stride r, no bias, then LayerNorm and
            GELU (the official default); ``'avgpool'`` r x r average pooling;
            ``'random'`` m tokens drawn uniformly at random in training
            (evenly spaced tokens in eval mode, for reproducible inference);
            ``'biased'`` the first m tokens.
        max_landmarks: opt-in cap on m for any resolution. The strided
            grid is adaptively average-pooled down to at most this many
            tokens (conv: after the conv, before LayerNorm / GELU), so the
            cost is linear in n at every input size. This changes the
            function at sizes where the cap binds, so it is for training
            from scratch, not for official weights (trained uncapped).
    """

    def __init__(self,
                 head_dims: int,
                 ratio: int,
                 mode: str = 'conv',
                 max_landmarks: Optional[int] = None):
        super().__init__()
        if mode not in SAMPLING_MODES:
            raise ValueError(f'unknown sampling {mode!r}; choose one of '
                             f'{SAMPLING_MODES}')
        if ratio < 1:
            raise ValueError(f'sampling ratio must be >= 1, got {ratio}')
        check_int('max_landmarks', max_landmarks, allow_none=True)
        self.mode = mode
        self.ratio = ratio
        self.max_landmarks = max_landmarks
        if mode == 'conv':
            self.conv = nn.Conv2d(
                head_dims, head_dims, ratio, ratio, bias=False)
            self.norm = nn.LayerNorm(head_dims)

    def num_landmarks(self, hw: Tuple[int, int]) -> int:
        gh, gw = landmark_grid(hw, self.ratio, self.max_landmarks)
        return gh * gw

    def _cap(self, x: torch.Tensor) -> torch.Tensor:
        """Adaptive pooling of a (N, d, gh, gw) grid to the capped grid."""
        if self.max_landmarks is None or \
                x.shape[2] * x.shape[3] <= self.max_landmarks:
            return x
        gh, gw = landmark_grid((x.shape[2], x.shape[3]), 1, self.max_landmarks)
        return F.adaptive_avg_pool2d(x, (gh, gw))

    def _grid(self, q: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        B, h, n, d = q.shape
        H, W = hw
        x = q.reshape(B * h, H, W, d).permute(0, 3, 1, 2)
        r = self.ratio
        if H < r or W < r:
            x = F.pad(x, (0, max(0, r - W), 0, max(0, r - H)))
        return x

    def forward(self, q: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        B, h, n, d = q.shape
        if n != hw[0] * hw[1]:
            raise ValueError(f'{n} tokens do not form a {hw[0]}x{hw[1]} map')
        r = self.ratio
        if self.mode == 'conv':
            x = self._cap(self.conv(self._grid(q, hw)))
            x = x.flatten(2).transpose(1, 2)
            return F.gelu(self.norm(x)).reshape(B, h, -1, d)
        if self.mode == 'avgpool':
            x = self._cap(F.avg_pool2d(self._grid(q, hw), r, r))
            return x.flatten(2).transpose(1, 2).reshape(B, h, -1, d)
        m = min(self.num_landmarks(hw), n)
        if self.mode == 'biased':
            return q[:, :, :m]
        if self.training:
            idx = torch.randperm(n, device=q.device)[:m].sort().values
        else:
            idx = torch.linspace(0, n - 1, m, device=q.device).round().long()
        return q.index_select(2, idx)

    def extra_repr(self) -> str:
        cap = f', max_landmarks={self.max_landmarks}' \
            if self.max_landmarks else ''
        return f'mode={self.mode}, ratio={self.ratio}{cap}'


class SOFTAttention(nn.Module):
    """Multi-head softmax-free attention with the official block details.

    Q = K (one projection ``q``), values ``v``, output projection ``proj``.
    A per-head depthwise k x k convolution of V over the token map is added to
    the attention output (one filter per head, shared by the head's
    channels), as in the official model.

    Args:
        embed_dims: token channels.
        num_heads: heads; must divide ``embed_dims``.
        sampling_ratio: r of :class:`BottleneckSampler`.
        sampling: f_s, one of ``SAMPLING_MODES``.
        dw_kernel_size: k of the depthwise conv on V (0 disables it).
        attn_norm: IJCV symmetric normalisation D^-1/2 A^+ D^-1/2 (Eq. 25).
        nr_iters: Newton-Raphson iterations.
        nr_init: alpha rule of the NR iterations (``INIT_MODES``:
            ``'soft_norm_per_sample'``, ``'soft_norm_per_matrix'``,
            ``'soft_norm_per_batch'``, ``'soft'``); None: the official rule
            of the variant (per sample with ``attn_norm``, else ``'soft'``).
        nr_method: how the NR iterations are evaluated: ``'auto'``,
            ``'iterative'`` or ``'spectral'`` (same function, see
            :mod:`mmsoft.models.layers.pinv`).
        nr_backward: ``'eq16'`` (the papers' closed form) or ``'exact'``
            (the gradient of the T iterations as computed, alpha fixed).
        nr_diagnostics: record the NR convergence of every forward in
            ``last_nr_stats`` (``'residual'``, ``'unconverged'``, per
            matrix; see :func:`mmsoft.models.layers.pinv.nr_residual`).
        qkv_bias: biases of the q / v projections.
        max_landmarks: opt-in cap on the bottleneck size (see
            :class:`BottleneckSampler`).
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 sampling: str = 'conv',
                 dw_kernel_size: int = 3,
                 attn_norm: bool = True,
                 nr_iters: int = 20,
                 nr_init: Optional[str] = None,
                 qkv_bias: bool = True,
                 nr_method: str = 'auto',
                 max_landmarks: Optional[int] = None,
                 nr_backward: str = 'eq16',
                 nr_diagnostics: bool = False):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'num_heads ({num_heads}) must divide '
                             f'embed_dims ({embed_dims})')
        check_int('nr_iters', nr_iters)
        check_kernel_size('dw_kernel_size', dw_kernel_size)
        self.embed_dims = embed_dims
        self.num_heads = num_heads
        self.head_dims = embed_dims // num_heads
        self.attn_norm = attn_norm
        self.nr_iters = nr_iters
        self.nr_init = default_init(attn_norm) if nr_init is None \
            else canonical_init(nr_init)
        if nr_backward not in NR_BACKWARDS:
            raise ValueError(f'unknown nr_backward {nr_backward!r}; choose '
                             f'one of {NR_BACKWARDS}')
        self.nr_backward = nr_backward
        self.nr_diagnostics = nr_diagnostics
        self.last_nr_stats: Optional[dict] = None
        if nr_method not in NR_METHODS:
            raise ValueError(f'unknown nr_method {nr_method!r}; choose one '
                             f'of {NR_METHODS}')
        self.nr_method = nr_method
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.v = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.sampler = BottleneckSampler(self.head_dims, sampling_ratio,
                                         sampling, max_landmarks)
        self.dw_conv = nn.Conv2d(
            num_heads,
            num_heads,
            dw_kernel_size,
            padding=dw_kernel_size // 2,
            groups=num_heads,
            bias=False) if dw_kernel_size else None
        self.proj = nn.Linear(embed_dims, embed_dims)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        B, N, _ = x.shape
        return x.view(B, N, self.num_heads, self.head_dims).transpose(1, 2)

    def _dw_conv_tokens(self, v: torch.Tensor, hw: Tuple[int,
                                                         int]) -> torch.Tensor:
        """Per-head k x k conv of the (B, N, C) value tokens -> (B, N, C).

        One channels-last depthwise conv over the C channels, head g's
        filter repeated for its d channels: the same function as the
        official (B*d, h, H, W) grouped conv, without its two permuted
        copies, and several times faster on the CPU (forward and backward).
        """
        B, N, C = v.shape
        x = v.transpose(1, 2).reshape(B, C, *hw)  # a channels-last view
        w = self.dw_conv.weight.repeat_interleave(self.head_dims, 0)
        x = F.conv2d(x, w, None, 1, self.dw_conv.padding, 1, C)
        return x.flatten(2).transpose(1, 2)

    def _dw_conv_v(self, v: torch.Tensor, hw: Tuple[int, int]):
        """The same conv for split heads: (B, h, N, d) -> (B, h, N, d)."""
        B, h, N, d = v.shape
        out = self._dw_conv_tokens(v.transpose(1, 2).reshape(B, N, h * d), hw)
        return out.view(B, N, h, d).transpose(1, 2)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: (B, N, C) tokens of an H x W map -> (B, N, C)."""
        B, N, C = x.shape
        q = self._split(self.q(x)) * self.head_dims**-0.25
        v_tokens = self.v(x)
        v = self._split(v_tokens)
        landmarks = self.sampler(q, hw)
        stats = {} if self.nr_diagnostics else None
        out = soft_attention(q, landmarks, v, self.attn_norm, self.nr_iters,
                             self.nr_init, self.nr_method, self.nr_backward,
                             stats)
        self.last_nr_stats = stats
        out = out.transpose(1, 2).reshape(B, N, C)
        if self.dw_conv is not None:
            out = out + self._dw_conv_tokens(v_tokens, hw)
        return self.proj(out)

    def extra_repr(self) -> str:
        return (f'heads={self.num_heads}, attn_norm={self.attn_norm}, '
                f'nr_iters={self.nr_iters}, nr_init={self.nr_init}, '
                f'nr_backward={self.nr_backward}')
