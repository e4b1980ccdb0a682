"""Softmax-free attention (SOFT), NeurIPS 2021 Alg. 1 + IJCV 2024 Eq. (25).

Q = K shared, Q~ = f_s(Q) the m bottleneck tokens (Sec. 3.2), P = exp(Q (-)
Q~) (n x m) and A = exp(Q~ (-) Q~) (m x m) the Gaussian kernel (Eq. 5), A^+
by Newton-Raphson (Alg. 2), D = diag(A 1_m)::

    S^ = P A^+ P^T                 (NeurIPS, attn_norm=False)
    S^ = P D^-1/2 A^+ D^-1/2 P^T   (IJCV, attn_norm=True)
    out = S^ V = P (A^+_n (P^T V))

S^ (n x n) is never formed; A, A^+, D and P are float32 under autocast.
"""
import copy
from typing import Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.registry import ATTENTIONS
from .amp import autocast_off, compute_dtype
from .attention_base import AttentionBase
from .checks import check_choice, check_int
from .gaussian_kernel import gaussian_kernel
from .grid import landmark_grid, reduce_map
from .nr_config import NRConfig
from .safe_conv import SafeConv2d

__all__ = [
    'BottleneckSampler', 'SOFTAttention', 'soft_attention',
    'bottleneck_inverse', 'bottleneck_apply', 'SAMPLING_MODES', 'with_nr'
]

SAMPLING_MODES = ('conv', 'avgpool', 'random', 'biased')


def bottleneck_inverse(A, attn_norm=True, nr=None):
    """A^+, or A^+_n = D^-1/2 A^+ D^-1/2 with ``attn_norm`` (Eq. 25), in
    float32 (float64 stays); ``nr``: :class:`NRConfig` or its fields."""
    A_inv = NRConfig.of(nr, attn_norm).inverse(A)
    if not attn_norm:
        return A_inv
    with autocast_off(A.device.type):
        d = A.to(A_inv.dtype).sum(-1).rsqrt()  # entries of A are in (0, 1]
        return d.unsqueeze(-1) * A_inv * d.unsqueeze(-2)


def bottleneck_apply(A, W, attn_norm=True, nr=None, nr_stats=None):
    """``bottleneck_inverse(A, ...) @ W`` without the m x m inverse (D^-1/2
    applied to the m x d operands); ``nr_stats``: see :class:`NRConfig`."""
    nr = NRConfig.of(nr, attn_norm)
    if not attn_norm:
        return nr.apply(A, W, nr_stats)
    with autocast_off(A.device.type):
        dtype = compute_dtype(A)
        d = A.to(dtype).sum(-1, keepdim=True).rsqrt()  # entries in (0, 1]
        return d * nr.apply(A, d * W.to(dtype), nr_stats)


def soft_attention(q, landmarks, v, attn_norm=True, nr=None, nr_stats=None):
    """out = P (A^+_n (P^T V)) (v's dtype) for q, v (B, h, n, d) and
    landmarks (B, h, m, d), q and landmarks scaled by d^(-1/4) (Eq. 5)."""
    P = gaussian_kernel(q, landmarks)  # (B, h, n, m)
    A = gaussian_kernel(landmarks, landmarks)  # (B, h, m, m)
    with autocast_off(v.device.type):
        PtV = torch.matmul(P.transpose(-1, -2), v.to(P.dtype))  # (B,h,m,d)
        Z = bottleneck_apply(A, PtV, attn_norm, nr, nr_stats)
        out = torch.matmul(P, Z)
    return out.to(v.dtype)


class BottleneckSampler(nn.Module):
    """f_s: the m bottleneck tokens Q~ from the n tokens Q (Table 4b / 8).

    Args:
        head_dims (int): channels per head (one sampler for all heads).
        ratio (int): r, the stride; m = n / r^2 (:func:`landmark_grid`).
        mode (str): ``'conv'`` (r x r conv, stride r, LayerNorm, GELU: the
            official one), ``'avgpool'``, ``'random'`` (evenly spaced in
            eval) or ``'biased'`` (the first m tokens). Default: 'conv'.
        max_landmarks (int | None): opt-in cap on m (adaptive average
            pooling of the grid). Default: None.
        landmark_hw (tuple[int, int] | None): opt-in fixed grid (never
            larger than the strided one), not with ``max_landmarks``.
            Default: None.
    """

    def __init__(self,
                 head_dims: int,
                 ratio: int,
                 mode: str = 'conv',
                 max_landmarks: Optional[int] = None,
                 landmark_hw: Optional[Tuple[int, int]] = None):
        super().__init__()
        check_choice('sampling', mode, SAMPLING_MODES)
        check_int('sampling ratio', ratio)
        check_int('max_landmarks', max_landmarks, allow_none=True)
        if landmark_hw is not None:
            if max_landmarks is not None:
                raise ValueError('set either max_landmarks or landmark_hw '
                                 '(a fixed grid), not both')
            if not isinstance(landmark_hw,
                              (tuple, list)) or len(landmark_hw) != 2:
                raise ValueError(f'landmark_hw must be a pair (gh, gw) of '
                                 f'ints >= 1, got {landmark_hw!r}')
            landmark_hw = tuple(
                check_int(f'landmark_hw[{i}]', side)
                for i, side in enumerate(landmark_hw))
        self.mode, self.ratio = mode, ratio
        self.max_landmarks, self.landmark_hw = max_landmarks, landmark_hw
        if mode == 'conv':
            self.conv = SafeConv2d(
                head_dims, head_dims, ratio, ratio, bias=False)
            self.norm = nn.LayerNorm(head_dims)

    def forward(self, q: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """Landmarks (B, h, m, d) of the scaled queries q (B, h, n, d)."""
        B, h, n, d = q.shape
        if n != hw[0] * hw[1]:
            raise ValueError(f'{n} tokens do not form a {hw[0]}x{hw[1]} map')
        if self.mode in ('conv', 'avgpool'):
            x = q.reshape(B * h, *hw, d).permute(0, 3, 1, 2)
            x = reduce_map(
                x,
                self.ratio,
                self.max_landmarks,
                self.landmark_hw,
                conv=self.conv if self.mode == 'conv' else None)
            x = x.flatten(2).transpose(1, 2)
            if self.mode == 'conv':
                x = F.gelu(self.norm(x))
            return x.reshape(B, h, -1, d)
        gh, gw = landmark_grid(hw, self.ratio, self.max_landmarks,
                               self.landmark_hw)
        m = min(gh * gw, n)
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
        if self.landmark_hw:
            cap = f', landmark_hw={self.landmark_hw}'
        return f'mode={self.mode}, ratio={self.ratio}{cap}'


def _fixed(attn: nn.Module, value) -> None:
    raise AttributeError(
        f'the Newton-Raphson settings of {type(attn).__name__} are fixed at '
        f'construction: build the attention with the settings '
        f'(nr=NRConfig(...), or the attn_cfg keys nr_*), or copy a model '
        f'with other ones (mmsoft.models.layers.with_nr)')


@ATTENTIONS.register_module(name=['SOFTAttention', 'soft'])
class SOFTAttention(AttentionBase):
    """Multi-head SOFT attention with the official block details:
    out = P A^+_n P^T V (:func:`soft_attention`), Q = K (projection ``q``),
    the per-head depthwise conv of V and ``proj`` (:class:`AttentionBase`).

    Args:
        embed_dims, num_heads, sampling_ratio, dw_kernel_size, qkv_bias: the
            stage's (:class:`AttentionBase`; biases of ``q`` / ``v``).
        attn_norm (bool): D^-1/2 A^+ D^-1/2 (IJCV, Eq. 25); False is the
            NeurIPS model. Default: True.
        sampling (str): f_s, one of ``SAMPLING_MODES``. Default: 'conv'.
        nr (NRConfig | dict | None): the Newton-Raphson settings (a dict of
            the fields; ``init`` missing: the variant's official rule),
            fixed at construction (:func:`with_nr` copies a model with
            other ones); ``attn_cfg`` keys ``nr_<field>``. Default: None.
        nr_diagnostics (bool): keep the NR convergence of every forward
            in ``last_nr_stats`` (see :class:`NRConfig`). Default: False.
        max_landmarks, landmark_hw: see :class:`BottleneckSampler`.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3,
                 qkv_bias: bool = True,
                 attn_norm: bool = True,
                 sampling: str = 'conv',
                 nr: Union[NRConfig, Mapping, None] = None,
                 nr_diagnostics: bool = False,
                 max_landmarks: Optional[int] = None,
                 landmark_hw: Optional[Tuple[int, int]] = None):
        super().__init__(embed_dims, num_heads, sampling_ratio, dw_kernel_size)
        if not isinstance(attn_norm, bool):
            raise ValueError(f'attn_norm must be True or False, got '
                             f'{attn_norm!r}')
        self.attn_norm = attn_norm
        self._nr = NRConfig.of(nr, attn_norm)
        self.nr_diagnostics = nr_diagnostics
        self.last_nr_stats: Optional[dict] = None
        self.q, self.v = (
            nn.Linear(embed_dims, embed_dims, bias=qkv_bias) for _ in range(2))
        self.sampler = BottleneckSampler(self.head_dims, sampling_ratio,
                                         sampling, max_landmarks, landmark_hw)
        self._build_output_layers()

    #: the NR settings and their fields, read-only
    nr = property(lambda self: self._nr, _fixed)
    nr_iters = property(lambda self: self._nr.iters, _fixed)
    nr_init = property(lambda self: self._nr.init, _fixed)
    nr_method = property(lambda self: self._nr.method, _fixed)
    nr_backward = property(lambda self: self._nr.backward, _fixed)

    def _queries(self, x: torch.Tensor, hw: Tuple[int, int]):
        """q (B, h, n, d) scaled by d^(-1/4) (Eq. 5), and its landmarks."""
        q = self._split(self.q(x)) * self.head_dims**-0.25
        return q, self.sampler(q, hw)

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        q, landmarks = self._queries(x, hw)
        v_tokens = self.v(x)
        stats = {} if self.nr_diagnostics else None
        out = soft_attention(q, landmarks, self._split(v_tokens),
                             self.attn_norm, self._nr, stats)
        self.last_nr_stats = stats
        return out, v_tokens

    def _kernels(self, x: torch.Tensor, hw: Tuple[int, int]):
        """P (B, h, n, m) and A^+_n (B, h, m, m)."""
        q, landmarks = self._queries(x, hw)
        A = gaussian_kernel(landmarks, landmarks)
        return gaussian_kernel(q, landmarks), bottleneck_inverse(
            A, self.attn_norm, self._nr)

    def _row(self, x, hw, i) -> torch.Tensor:
        """Row ``i`` of S^, P_i A^+_n P^T (B, h, n), in O(n m)."""
        P, A_inv = self._kernels(x, hw)
        return ((P[:, :, i:i + 1] @ A_inv) @ P.transpose(-1, -2)).squeeze(-2)

    @torch.no_grad()
    def attention_matrix(self, x, hw) -> torch.Tensor:
        """S^ = P A^+_n P^T (B, h, n, n) itself (small inputs only)."""
        self._check(x, hw)
        P, A_inv = self._kernels(x, hw)
        return P @ A_inv @ P.transpose(-1, -2)

    def extra_repr(self) -> str:
        return (f'heads={self.num_heads}, attn_norm={self.attn_norm}, '
                f'nr_iters={self._nr.iters}, nr_init={self._nr.init}, '
                f'nr_backward={self._nr.backward}')


def with_nr(model, nr=None, **changes) -> nn.Module:
    """A deep copy of ``model`` whose :class:`SOFTAttention` s use ``nr``
    (default: their own) with ``changes``, e.g. ``with_nr(model,
    method='iterative')``; ``model`` and the random state unchanged."""
    model = copy.deepcopy(model)
    for mod in model.modules():
        if isinstance(mod, SOFTAttention):
            settings = NRConfig.of(mod.nr if nr is None else nr, mod.attn_norm)
            mod._nr = settings.replace(**changes) if changes else settings
    return model
