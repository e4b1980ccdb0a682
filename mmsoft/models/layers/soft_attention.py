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
under fp16/bf16 autocast (see :func:`gaussian_kernel`, :class:`NRConfig`).
"""
import copy
from typing import Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.registry import ATTENTIONS
from .amp import autocast_off
from .attention_base import AttentionBase
from .checks import check_choice, check_int
from .gaussian_kernel import gaussian_kernel
from .grid import fixed_grid, landmark_grid, reduce_map
from .nr_config import NRConfig
from .safe_conv import SafeConv2d

__all__ = [
    'BottleneckSampler', 'SOFTAttention', 'soft_attention',
    'bottleneck_inverse', 'bottleneck_apply', 'SAMPLING_MODES', 'with_nr'
]

SAMPLING_MODES = ('conv', 'avgpool', 'random', 'biased')


def bottleneck_inverse(A: torch.Tensor,
                       attn_norm: bool = True,
                       nr: Optional[NRConfig] = None) -> torch.Tensor:
    """A^+ (Alg. 2), or D^-1/2 A^+ D^-1/2 with ``attn_norm`` (Eq. 25).

    D = diag(A 1_m); ``nr`` (:class:`~mmsoft.models.layers.nr_config.NRConfig`)
    defaults to the settings of the official variant (the official alpha
    rule per sample, ``'soft_norm_per_sample'``, with the normalisation,
    else ``'soft'``; 20 iterations). float32 (float64 for float64 A),
    autocast disabled.
    """
    A_inv = NRConfig.of(nr, attn_norm).inverse(A)
    if not attn_norm:
        return A_inv
    with autocast_off(A.device.type):
        d = A.to(A_inv.dtype).sum(-1).rsqrt()  # entries of A are in (0, 1]
        return d.unsqueeze(-1) * A_inv * d.unsqueeze(-2)


def bottleneck_apply(A: torch.Tensor,
                     W: torch.Tensor,
                     attn_norm: bool = True,
                     nr: Optional[NRConfig] = None,
                     nr_stats: Optional[dict] = None) -> torch.Tensor:
    """A^+ W, or D^-1/2 A^+ D^-1/2 W with ``attn_norm`` (Eq. 25).

    The same function as ``bottleneck_inverse(A, ...) @ W`` without the
    m x m inverse (see :meth:`NRConfig.apply`): D^-1/2 is applied to
    the m x d operands instead, and its gradient (D depends on A) flows by
    autograd, with either ``nr.backward``. float32 (float64 for float64 A),
    autocast disabled. ``nr`` as :func:`bottleneck_inverse`; ``nr_stats``:
    optional dict for the convergence of the iterations (see
    :class:`NRConfig`).
    """
    nr = NRConfig.of(nr, attn_norm)
    if not attn_norm:
        return nr.apply(A, W, nr_stats)
    with autocast_off(A.device.type):
        dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
        d = A.to(dtype).sum(-1, keepdim=True).rsqrt()  # entries in (0, 1]
        return d * nr.apply(A, d * W.to(dtype), nr_stats)


def soft_attention(q: torch.Tensor,
                   landmarks: torch.Tensor,
                   v: torch.Tensor,
                   attn_norm: bool = True,
                   nr: Optional[NRConfig] = None,
                   nr_stats: Optional[dict] = None) -> torch.Tensor:
    """out = P A_n^+ P^T V for q (B, h, n, d), landmarks (B, h, m, d).

    ``q`` and ``landmarks`` must already carry the 1/d^(1/4) scale so that
    exp(-||q - k||^2 / 2) equals the paper's exp(-||q - k||^2 / (2 sqrt d)).
    Associated as P (A_n^+ (P^T V)): n m d + m^2 d work besides the inverse,
    and with the spectral method A_n^+ is never formed. ``nr``: the
    Newton-Raphson settings (:func:`bottleneck_inverse`).
    Returns a tensor of v's dtype.
    """
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
        head_dims (int): channels per head (the sampler is shared by all
            heads).
        ratio (int): r, the spatial sampling stride (sp = r x r); m = n / r^2
            for sizes divisible by r, otherwise :func:`landmark_grid`.
        mode (str): ``'conv'`` r x r conv with stride r, no bias, then
            LayerNorm and GELU (the official default); ``'avgpool'`` r x r
            average pooling; ``'random'`` m tokens drawn uniformly at random
            in training (evenly spaced tokens in eval mode, for reproducible
            inference); ``'biased'`` the first m tokens. Default: 'conv'.
        max_landmarks (int | None): opt-in cap on m: the strided grid is
            adaptively average-pooled to at most this many tokens (conv:
            before LayerNorm / GELU), linear cost at every input size; a
            different function where it binds (for training from scratch).
            Default: None.
        landmark_hw (tuple[int, int] | None): opt-in fixed grid (gh, gw)
            wherever the strided grid is that large (never up-sampled:
            ``grid.fixed_grid``), e.g. the m = 49 of the NeurIPS
            Fig. 1b memory study. Exclusive with ``max_landmarks``.
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
        self.mode = mode
        self.ratio = ratio
        self.max_landmarks = max_landmarks
        self.landmark_hw = landmark_hw
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
        grid = landmark_grid(hw, self.ratio, self.max_landmarks)
        gh, gw = fixed_grid(self.landmark_hw, grid) \
            if self.landmark_hw else grid
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


def _fixed_nr(name: str, field: Optional[str] = None) -> property:
    """A read-only attribute of :class:`SOFTAttention`: its NR settings
    (``field`` None) or one of their fields."""

    def fail(attn, value):
        raise AttributeError(
            f'{type(attn).__name__}.{name} is fixed at construction: build '
            f'the attention with the settings (nr=NRConfig(...), or the '
            f'attn_cfg keys nr_*), or copy a model with other ones '
            f'(mmsoft.models.layers.with_nr)')

    return property(
        lambda attn: attn._nr
        if field is None else getattr(attn._nr, field), fail)


@ATTENTIONS.register_module(name=['SOFTAttention', 'soft'])
class SOFTAttention(AttentionBase):
    """Multi-head softmax-free attention with the official block details.

    out = P A_n^+ P^T V (:func:`soft_attention`) with Q = K (one projection
    ``q``), values ``v``, plus the per-head depthwise conv of V and the
    output projection ``proj`` of :class:`AttentionBase`.

    Args:
        embed_dims (int): token channels.
        num_heads (int): heads; must divide ``embed_dims``.
        sampling_ratio (int): r of :class:`BottleneckSampler`.
        dw_kernel_size (int): k of the depthwise conv on V (0 disables it).
            Default: 3.
        qkv_bias (bool): biases of the q / v projections. Default: True.
        attn_norm (bool): the IJCV symmetric normalisation
            D^-1/2 A^+ D^-1/2 (Eq. 25); False is the NeurIPS model.
            Default: True.
        sampling (str): f_s, one of ``SAMPLING_MODES``. Default: 'conv'.
        nr (NRConfig | dict | None): the Newton-Raphson settings
            ``iters``, ``init``, ``method``, ``backward`` (an
            :class:`NRConfig` or a dict of its fields; ``init`` missing:
            the official rule of the variant), fixed at construction
            (:func:`with_nr` copies a model with other ones). An
            ``attn_cfg`` writes them ``nr_iters``, ``nr_init``,
            ``nr_method``, ``nr_backward``. Default: None, all defaults.
        nr_diagnostics (bool): record the NR convergence of every forward
            in ``last_nr_stats`` (``'residual'``, ``'unconverged'``, per
            matrix; see ``nr_diagnostics.nr_residual``).
            Default: False.
        max_landmarks (int | None): opt-in cap on the bottleneck size (see
            :class:`BottleneckSampler`). Default: None.
        landmark_hw (tuple[int, int] | None): opt-in fixed bottleneck grid
            (gh, gw), m = gh * gw where the strided grid is that large, never
            up-sampled (see :class:`BottleneckSampler`). Default: None.
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
        self._nr = NRConfig.of(nr, attn_norm)  # read as ``nr`` (fixed)
        self.nr_diagnostics = nr_diagnostics
        self.last_nr_stats: Optional[dict] = None
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.v = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.sampler = BottleneckSampler(self.head_dims, sampling_ratio,
                                         sampling, max_landmarks, landmark_hw)
        self._build_output_layers()

    def _queries(self, x: torch.Tensor, hw: Tuple[int, int]):
        """Scaled queries q (B, h, n, d) and their landmarks (B, h, m, d).

        q carries the 1/d^(1/4) scale, so that exp(-||q - k||^2 / 2) is the
        paper's exp(-||q - k||^2 / (2 sqrt d)) (Eq. 5).
        """
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
        """P (B, h, n, m) and the (normalised) pseudo-inverse A_n^+
        (B, h, m, m) in use."""
        q, landmarks = self._queries(x, hw)
        A = gaussian_kernel(landmarks, landmarks)
        return gaussian_kernel(q, landmarks), bottleneck_inverse(
            A, self.attn_norm, self._nr)

    def _row(self, x: torch.Tensor, hw: Tuple[int, int],
             i: int) -> torch.Tensor:
        """(B, h, n): row ``i`` of S^ = P A_n^+ P^T, i.e.
        P_i A_n^+ P^T ((1 x m) (m x m) (m x n), O(n m))."""
        P, A_inv = self._kernels(x, hw)
        return ((P[:, :, i:i + 1] @ A_inv) @ P.transpose(-1, -2)).squeeze(-2)

    @torch.no_grad()
    def attention_matrix(self, x: torch.Tensor,
                         hw: Tuple[int, int]) -> torch.Tensor:
        """(B, h, n, n): S^ = P A_n^+ P^T itself (small inputs only)."""
        self._check(x, hw)
        P, A_inv = self._kernels(x, hw)
        return P @ A_inv @ P.transpose(-1, -2)

    #: the Newton-Raphson settings (:class:`NRConfig`) and its fields as
    #: ``nr_iters``, ``nr_init``, ``nr_method``, ``nr_backward``; read-only
    nr = _fixed_nr('nr')
    nr_iters = _fixed_nr('nr_iters', 'iters')
    nr_init = _fixed_nr('nr_init', 'init')
    nr_method = _fixed_nr('nr_method', 'method')
    nr_backward = _fixed_nr('nr_backward', 'backward')

    def extra_repr(self) -> str:
        return (f'heads={self.num_heads}, attn_norm={self.attn_norm}, '
                f'nr_iters={self._nr.iters}, nr_init={self._nr.init}, '
                f'nr_backward={self._nr.backward}')


def with_nr(model: nn.Module,
            nr: Union[NRConfig, Mapping, None] = None,
            **changes) -> nn.Module:
    """A copy of ``model`` whose SOFT attentions use other NR settings.

    Every :class:`SOFTAttention` of the copy (or the copy of ``model``
    itself) gets ``nr`` (an :class:`NRConfig` or a dict of its fields;
    default: its current settings) with the fields ``changes`` replaced
    (``with_nr(model, method='iterative')``). The settings hold no
    parameters: the copy (``copy.deepcopy``) keeps the weights,
    ``requires_grad``, dtype, device, training mode and ``nr_diagnostics``;
    ``model`` and the global random state are unchanged.
    """
    model = copy.deepcopy(model)
    for mod in model.modules():
        if isinstance(mod, SOFTAttention):
            settings = NRConfig.of(mod.nr if nr is None else nr, mod.attn_norm)
            mod._nr = settings.replace(**changes) if changes else settings
    return model
