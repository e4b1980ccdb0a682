"""SOFT (NeurIPS 2021 Alg. 1, IJCV 2024 Eq. 25) and :class:`AttentionBase`.
Q = K, Q~ = f_s(Q) (Sec. 3.2), P = exp(Q (-) Q~), A = exp(Q~ (-) Q~) (Eq. 5),
A^+ by Newton-Raphson (Alg. 2), D = diag(A 1_m)::

    S^ = P A^+ P^T  (NeurIPS),  P D^-1/2 A^+ D^-1/2 P^T  (IJCV, attn_norm)
    out = S^ V = P (A^+_n (P^T V)), S^ never formed; float32 under autocast
"""
import copy
import math
from typing import Mapping, Optional, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from mmsoft.registry import ATTENTIONS
from . import amp
from .amp import (SafeConv2d, autocast_off, check_choice, check_int,
                  check_kernel_size, compiling, compute_dtype, conv2d)
from .nr import NR_FIELDS, NRConfig

SAMPLING_MODES = ('conv', 'avgpool', 'random', 'biased')


def query_index(index, hw: Tuple[int, int]) -> int:
    """A flat token index from an int or a (row, col) pair."""
    H, W = hw
    if isinstance(index, (tuple, list)):
        r, c = index
        if 0 <= r < H and 0 <= c < W:
            return int(r) * W + int(c)
        raise IndexError(f'query {tuple(index)} outside the {H}x{W} map')
    if 0 <= int(index) < H * W:
        return int(index)
    raise IndexError(f'query index {int(index)} outside the {H}x{W} map')


class AttentionBase(nn.Module):
    """Multi-head token mixer with a per-head depthwise conv on V and ``proj``;
    subclasses implement ``_mix(x, hw)`` -> (out, v_tokens), ``_row``."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3):
        super().__init__()
        check_int('embed_dims', embed_dims)
        check_int('num_heads', num_heads)
        if embed_dims % num_heads != 0:
            raise ValueError(f'num_heads ({num_heads}) must divide '
                             f'embed_dims ({embed_dims})')
        check_int('sampling_ratio', sampling_ratio)
        check_kernel_size('dw_kernel_size', dw_kernel_size)
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.head_dims = embed_dims // num_heads
        self.sampling_ratio = sampling_ratio
        self.dw_kernel_size = dw_kernel_size

    def _build_output_layers(self) -> None:
        """``dw_conv`` (h filters of k x k, or None) and ``proj``."""
        k, h = self.dw_kernel_size, self.num_heads
        self.dw_conv: Optional[nn.Conv2d] = nn.Conv2d(
            h, h, k, padding=k // 2, groups=h, bias=False) if k else None
        self.proj = nn.Linear(self.embed_dims, self.embed_dims)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, C) -> (B, h, n, d)."""
        B, N, _ = x.shape
        return x.view(B, N, self.num_heads, self.head_dims).transpose(1, 2)

    def dw_conv_tokens(self, v: torch.Tensor, hw: Tuple[int, int]):
        """Per-head k x k conv of the (B, n, C) value tokens."""
        B, N, C = v.shape
        x = v.transpose(1, 2).reshape(B, C, *hw)  # a channels-last view
        w = self.dw_conv.weight.repeat_interleave(self.head_dims, 0)
        x = conv2d(x, w, None, 1, self.dw_conv.padding, 1, C)
        return x.flatten(2).transpose(1, 2)

    @staticmethod
    def _check(x: torch.Tensor, hw: Tuple[int, int]) -> None:
        if x.dim() != 3 or x.shape[1] != hw[0] * hw[1]:
            raise ValueError(f'expected (B, {hw[0]}*{hw[1]}, C) tokens, got '
                             f'shape {tuple(x.shape)}')

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """x: (B, n, C) tokens of an H x W map -> (B, n, C)."""
        self._check(x, hw)
        B, N, C = x.shape
        out, v_tokens = self._mix(x, hw)
        out = out.transpose(1, 2).reshape(B, N, C)
        if self.dw_conv is not None:
            out = out + self.dw_conv_tokens(v_tokens, hw)
        return self.proj(out)

    @torch.no_grad()
    def attention_row(self, x, hw, index) -> torch.Tensor:
        """(B, h, n) weights over V of query ``index`` (flat or (row, col))."""
        self._check(x, hw)
        return self._row(x, hw, query_index(index, hw))


def landmark_grid(hw, ratio, max_landmarks=None, landmark_hw=None):
    """``max(1, H // r) x max(1, W // r)``; ``landmark_hw`` clamped to it;
    or at most ``max_landmarks``: ``floor(gh s) x floor(gw s)``, ``s =
    sqrt(max_landmarks / (gh gw))``."""
    H, W = hw
    gh, gw = max(1, H // ratio), max(1, W // ratio)
    if landmark_hw is not None:
        return min(int(landmark_hw[0]), gh), min(int(landmark_hw[1]), gw)
    if max_landmarks is not None and gh * gw > max_landmarks:
        # floor(gh s) = floor(sqrt(gh max_landmarks / gw)) in integers
        gh, gw = (max(1, math.isqrt(gh * max_landmarks // gw)),
                  max(1, math.isqrt(gw * max_landmarks // gh)))
        while gh * gw > max_landmarks:  # only when one side is clamped to 1
            gh, gw = (gh - 1, gw) if gh >= gw else (gh, gw - 1)
    return gh, gw


def reduce_map(x, ratio, max_landmarks=None, landmark_hw=None, conv=None):
    """(N, C, H, W) -> its :func:`landmark_grid` by pooling (or ``conv``)."""
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


# K_ij = exp(-||x_i - y_j||^2 / 2), x, y translated by the mean landmark
def kernel_forward(x, y, self_kernel=False) -> torch.Tensor:
    """K (..., n, m) without autograd; the self-kernel's diagonal is 1."""
    c = y.mean(-2, keepdim=True)
    yc = y - c
    xc = yc if self_kernel else x - c
    K = torch.matmul(xc, yc.transpose(-1, -2))
    K.sub_(xc.square().sum(-1, keepdim=True), alpha=0.5)
    K.sub_(yc.square().sum(-1).unsqueeze(-2), alpha=0.5)
    K.clamp_(max=0.0).exp_()
    if self_kernel:
        eye = torch.eye(K.shape[-1], dtype=K.dtype, device=K.device)
        K = torch.maximum(K, eye)
    return K


#: from this many entries n m per head on, CPU inference does not form P
FUSED_MIN_ENTRIES = 1 << 21


def kernel_product(x, y, w) -> torch.Tensor:
    """K w without the (n, m) kernel: one fused softmax attention of queries
    [x, 1, |x|^2 / 2] over keys [y, -|y|^2 / 2, 0], [0, 0, 1], values [w, 0],
    [0, 1]; the quotient of the two outputs is K w (translated tokens)."""
    *batch, n, d = x.shape
    m, e = y.shape[-2], w.shape[-1]
    size = max(d + 2, e + 1)
    q = x.new_zeros(*batch, n, size)
    q[..., :d] = x
    q[..., d] = 1
    q[..., d + 1] = x.square().sum(-1).mul_(0.5)
    k = y.new_zeros(*batch, m + 1, size)
    k[..., :m, :d] = y
    k[..., :m, d] = y.square().sum(-1).mul_(-0.5)
    k[..., m, d + 1] = 1
    v = w.new_zeros(*batch, m + 1, size)
    v[..., :m, :e] = w
    v[..., m, e] = 1
    out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    return out[..., :e] / out[..., e:e + 1]


class GaussianKernel(torch.autograd.Function):
    """K, its gradients by :func:`kernel_grads`."""

    @staticmethod
    def forward(ctx, x, y, self_kernel=False):
        K = kernel_forward(x, y, self_kernel)
        ctx.self_kernel = self_kernel
        ctx.save_for_backward(y if self_kernel else x, y, K)
        return K

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, y, K = ctx.saved_tensors
        return (*kernel_grads(ctx, grad * K, x, y), None)


def kernel_grads(ctx, GK, x, y, extra_y=None):
    """(grad_x, grad_y) of K from G' = grad * K (None where not needed):
    G' y - rowsum(G') x, G'^T x - colsum(G') y (+ ``extra_y``), translated
    tokens, summed to the shapes of x, y (which may be broadcast)."""
    c = y.mean(-2, keepdim=True)
    yc = y - c
    xc = yc if ctx.self_kernel else x - c
    grad_x = grad_y = None
    if ctx.needs_input_grad[0]:
        grad_x = (torch.matmul(GK, yc) -
                  GK.sum(-1, keepdim=True) * xc).sum_to_size(x.shape)
    if ctx.needs_input_grad[1]:
        grad_y = (
            torch.matmul(GK.transpose(-1, -2), xc) -
            GK.sum(-2).unsqueeze(-1) * yc)
        grad_y = (grad_y if extra_y is None else grad_y +
                  extra_y).sum_to_size(y.shape)
    return grad_x, grad_y


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """K_ij = exp(-||x_i - y_j||^2 / 2) (..., n, m) (Eq. 5), float32+;
    ``gaussian_kernel(y, y)`` is the self-kernel A."""
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f'gaussian_kernel: feature sizes differ '
                         f'({x.shape[-1]} vs {y.shape[-1]})')
    dtype = compute_dtype(x, y)
    self_kernel = x is y
    with autocast_off(x.device.type):
        if amp.is_exporting():  # ONNX: no autograd Function
            return kernel_forward(x.to(dtype), y.to(dtype), self_kernel)
        y = y.to(dtype)
        # a view of y as x: torch.compile refuses one tensor given twice
        return GaussianKernel.apply(
            y.view_as(y) if self_kernel else x.to(dtype), y, self_kernel)


def bottleneck_apply(A, W=None, attn_norm=True, nr=None):
    """A^+_n W = D^-1/2 A^+ D^-1/2 W (Eq. 25; A^+ W without ``attn_norm``),
    float32+; W None: A^+_n."""
    nr = NRConfig.of(nr, attn_norm)
    if not attn_norm:
        return nr.apply(A, W)
    with autocast_off(A.device.type):
        d = A.to(compute_dtype(A)).sum(-1, keepdim=True).rsqrt()  # A in (0, 1]
        if W is None:
            return d * nr.apply(A, None) * d.transpose(-1, -2)
        return d * nr.apply(A, d * W.to(d.dtype))


def bottleneck_inverse(A, attn_norm=True, nr=None):
    """A^+_n (:func:`bottleneck_apply` without W)."""
    return bottleneck_apply(A, None, attn_norm, nr)


class KernelAttention(torch.autograd.Function):
    """out = P Z, Z = ``inner(y, P^T V)``, P = kernel(x, y), for training:
    grad P = G Z^T + V H^T (H: the gradient of P^T V) in one n x m buffer;
    ``inner`` keeps its autograd graph for the backward."""

    @staticmethod
    def forward(ctx, x, y, v, inner):
        self_kernel = x is y
        P = kernel_forward(x, y, self_kernel)
        with torch.enable_grad():
            y_in = y.detach().requires_grad_(ctx.needs_input_grad[1])
            PtV = torch.matmul(P.transpose(-1, -2), v).requires_grad_()
            Z = inner(y_in, PtV)
        ctx.graph = (Z, PtV, y_in)
        ctx.self_kernel = self_kernel
        ctx.save_for_backward(x, y, v, P, Z.detach())
        return torch.matmul(P, Z.detach())

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor):
        x, y, v, P, Z = ctx.saved_tensors
        Z_graph, PtV, y_in = ctx.graph  # freed with this node
        with autocast_off(grad.device.type):
            inputs = (PtV, y_in) if y_in.requires_grad else (PtV, )
            grads = torch.autograd.grad(  # retained: retain_graph outside
                Z_graph,
                inputs,
                torch.matmul(P.transpose(-1, -2), grad),
                retain_graph=True)
            H = grads[0]
            GK = torch.matmul(
                torch.cat([grad, v.expand_as(grad)], -1),
                torch.cat([Z, H], -1).transpose(-1, -2)).mul_(P)
            grad_x, grad_y = kernel_grads(ctx, GK, x, y, *grads[1:])
            grad_v = torch.matmul(P, H).sum_to_size(v.shape) \
                if ctx.needs_input_grad[2] else None
        return grad_x, grad_y, grad_v, None


def soft_attention(q, landmarks, v, attn_norm=True, nr=None):
    """out = P (A^+_n (P^T V)) (Alg. 1) for q, v (B, h, n, d), landmarks
    (B, h, m, d), q and landmarks scaled by d^(-1/4)."""

    def inner(y, PtV):  # A^+_n (P^T V), A = exp(Q~ (-) Q~)
        A = gaussian_kernel(y, y)  # (B, h, m, m)
        return bottleneck_apply(A, PtV, attn_norm, nr)

    plain = not compiling() and not amp.is_exporting()  # may use Functions
    fused = plain and torch.is_grad_enabled() and any(
        t.requires_grad for t in (q, landmarks, v))
    with autocast_off(v.device.type):
        if fused:
            dtype = compute_dtype(q, landmarks)
            y = landmarks.to(dtype)
            # the self-kernel (m = n): one tensor in both roles
            x = y if q is landmarks else q.to(dtype)
            out = KernelAttention.apply(x, y, v.to(dtype), inner)
        elif (plain and q is not landmarks and q.device.type == 'cpu'
              and q.shape[-2] * landmarks.shape[-2] >= FUSED_MIN_ENTRIES
              and compute_dtype(q, landmarks) == torch.float32):  # no P
            c = landmarks.float().mean(-2, keepdim=True)
            x, y = q.float() - c, landmarks.float() - c
            PtV = kernel_product(y, x, v.float())
            out = kernel_product(x, y, inner(landmarks, PtV))
        else:
            P = gaussian_kernel(q, landmarks)  # (B, h, n, m)
            PtV = torch.matmul(P.transpose(-1, -2), v.to(P.dtype))
            out = torch.matmul(P, inner(landmarks, PtV))
    return out.to(v.dtype)


class BottleneckSampler(nn.Module):
    """f_s: the m bottleneck tokens Q~ of the n tokens Q (Table 4b / 8)."""

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
            conv = self.conv if self.mode == 'conv' else None
            x = reduce_map(x, self.ratio, self.max_landmarks, self.landmark_hw,
                           conv)
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
        cap = f', landmark_hw={self.landmark_hw}' if self.landmark_hw else (
            f', max_landmarks={self.max_landmarks}' * bool(self.max_landmarks))
        return f'mode={self.mode}, ratio={self.ratio}{cap}'


def _fixed(attn: nn.Module, value) -> None:
    raise AttributeError(
        f'the Newton-Raphson settings of {type(attn).__name__} are fixed at '
        f'construction: build the attention with the settings '
        f'(nr=NRConfig(...), or the attn_cfg keys nr_*), or copy a model '
        f'with other ones (mmsoft.models.layers.with_nr)')


@ATTENTIONS.register_module(name=['SOFTAttention', 'soft'])
class SOFTAttention(AttentionBase):
    """out = P A^+_n P^T V, Q = K; ``attn_norm``: IJCV Eq. 25 (False:
    NeurIPS); ``nr`` / ``nr_*``: fixed at construction (:func:`with_nr`)."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3,
                 qkv_bias: bool = True,
                 attn_norm: bool = True,
                 sampling: str = 'conv',
                 nr: Union[NRConfig, Mapping, None] = None,
                 nr_iters: Optional[int] = None,
                 nr_init: Optional[str] = None,
                 nr_method: Optional[str] = None,
                 nr_backward: Optional[str] = None,
                 max_landmarks: Optional[int] = None,
                 landmark_hw: Optional[Tuple[int, int]] = None):
        super().__init__(embed_dims, num_heads, sampling_ratio, dw_kernel_size)
        if not isinstance(attn_norm, bool):
            raise ValueError(f'attn_norm must be True or False, got '
                             f'{attn_norm!r}')
        self.attn_norm = attn_norm
        keys = zip(NR_FIELDS, (nr_iters, nr_init, nr_method, nr_backward))
        keys = {k: v for k, v in keys if v is not None}
        if keys and nr is not None:
            raise ValueError(
                f'SOFTAttention got both nr and '
                f'{sorted("nr_" + k for k in keys)}; give the Newton-Raphson '
                f'settings once (the nr_* keys, or nr=dict(...))')
        self._nr = NRConfig.of(keys if nr is None else nr, attn_norm)
        self.q, self.v = (
            nn.Linear(embed_dims, embed_dims, bias=qkv_bias) for _ in range(2))
        self.sampler = BottleneckSampler(self.head_dims, sampling_ratio,
                                         sampling, max_landmarks, landmark_hw)
        self._build_output_layers()

    nr = property(lambda self: self._nr, _fixed)
    nr_iters, nr_init, nr_method, nr_backward = (  # NR_FIELDS, in order
        property(lambda self, k=k: getattr(self._nr, k), _fixed)
        for k in NR_FIELDS)

    def _queries(self, x: torch.Tensor, hw: Tuple[int, int]):
        """q (B, h, n, d) scaled by d^(-1/4) (Eq. 5), and its landmarks."""
        q = self._split(self.q(x)) * self.head_dims**-0.25
        return q, self.sampler(q, hw)

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        q, landmarks = self._queries(x, hw)
        v_tokens = self.v(x)
        out = soft_attention(q, landmarks, self._split(v_tokens),
                             self.attn_norm, self._nr)
        return out, v_tokens

    def _row(self, x, hw, i) -> torch.Tensor:
        """Row ``i`` of S^, P_i A^+_n P^T (B, h, n), in O(n m)."""
        q, landmarks = self._queries(x, hw)
        A = gaussian_kernel(landmarks, landmarks)
        P = gaussian_kernel(q, landmarks)
        A_inv = bottleneck_inverse(A, self.attn_norm, self._nr)
        return ((P[:, :, i:i + 1] @ A_inv) @ P.transpose(-1, -2)).squeeze(-2)

    def extra_repr(self) -> str:
        return (f'heads={self.num_heads}, attn_norm={self.attn_norm}, '
                f'nr_iters={self._nr.iters}, nr_init={self._nr.init}, '
                f'nr_backward={self._nr.backward}')


def with_nr(model, nr=None, **changes) -> nn.Module:
    """A deep copy of ``model`` whose SOFTAttentions use ``nr`` + changes."""
    model = copy.deepcopy(model)
    for mod in model.modules():
        if isinstance(mod, SOFTAttention):
            settings = NRConfig.of(mod.nr if nr is None else nr, mod.attn_norm)
            mod._nr = settings.replace(**changes) if changes else settings
    return model
