"""The token mixers SOFT is compared with in NeurIPS Table 1, each on
SOFT's :class:`~mmsoft.models.layers.AttentionBase`."""
import math
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.models.layers import AttentionBase, query_index, reduce_map
from mmsoft.models.layers.amp import (SafeConv2d, autocast_off, check_choice,
                                      check_int, compute_dtype)
from mmsoft.registry import ATTENTIONS


def spread_to_tokens(w, hw, ratio, max_landmarks=None, landmark_hw=None):
    """``w`` (..., m) on the reduced tokens -> (..., H*W) by the transpose
    of ``reduce_map()``'s pooling (``w_j / |cell j|`` per token)."""
    lead = w.shape[:-1]
    H, W = hw
    z = torch.zeros(
        1, 1, H, W, dtype=w.dtype, device=w.device, requires_grad=True)
    with torch.enable_grad():
        y = reduce_map(z, ratio, max_landmarks, landmark_hw)
        m = y.shape[-2] * y.shape[-1]
        if w.shape[-1] != m:
            raise ValueError(f'{w.shape[-1]} weights for {m} reduced tokens')
        wf = w.detach().reshape(-1, m)
        # one vector-Jacobian product per row of weights
        outs = [
            torch.autograd.grad(y.flatten() @ row, z,
                                retain_graph=True)[0].flatten() for row in wf
        ]
    return torch.stack(outs).reshape(*lead, H * W)


class ZooAttention(AttentionBase):
    """q / k / v projections on :class:`~mmsoft.models.layers.AttentionBase`
    (its arguments as ``*args, **kwargs``)."""
    #: the attributes ``extra_repr`` shows after the heads and ratio
    repr_keys: Tuple[str, ...] = ()

    def __init__(self, *args, qkv_bias: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.scale = self.head_dims**-0.5
        self._build_output_layers()
        C = self.embed_dims
        self.q, self.k, self.v = (
            nn.Linear(C, C, bias=qkv_bias) for _ in range(3))

    @torch.no_grad()
    def attention_matrix(self, x, hw) -> torch.Tensor:
        """The (B, h, n, n) token-mixing matrix, row by row (small n)."""
        n = hw[0] * hw[1]
        return torch.stack([self.attention_row(x, hw, i) for i in range(n)],
                           dim=-2)

    def extra_repr(self) -> str:
        extra = ''.join(f', {k}={getattr(self, k)}' for k in self.repr_keys)
        return f'heads={self.num_heads}, ratio={self.sampling_ratio}{extra}'


class ReducedGridAttention(ZooAttention):
    """Over the m r x r cells of SOFT's bottleneck grid (``reduce_map()``;
    ``max_landmarks`` caps m, ``landmark_hw`` fixes the grid (gh, gw))."""

    def __init__(self, *args, max_landmarks=None, landmark_hw=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_landmarks = max_landmarks
        self.landmark_hw = landmark_hw

    def _reduce_map(self, t, conv=None) -> torch.Tensor:
        """``reduce_map()`` on this grid."""
        return reduce_map(t, self.sampling_ratio, self.max_landmarks,
                          self.landmark_hw, conv)


@ATTENTIONS.register_module(name=['SoftmaxZooAttention', 'softmax'])
class SoftmaxZooAttention(ZooAttention):
    """Full softmax attention, softmax(Q K^T / sqrt(d)) V (the
    "Transformer" row), by ``scaled_dot_product_attention``."""

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        vt = self.v(x)
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), \
            self._split(vt)
        return F.scaled_dot_product_attention(q, k, v), vt

    def _row(self, x, hw, i) -> torch.Tensor:
        q = self._split(self.q(x[:, i:i + 1]))
        k = self._split(self.k(x))
        logits = (q @ k.transpose(-1, -2)).squeeze(-2) * self.scale
        return logits.softmax(-1)


@ATTENTIONS.register_module(name=['LinformerAttention', 'linformer'])
class LinformerAttention(ReducedGridAttention):
    """Linformer-style: PVT's spatial reduction of keys / values, ratio r =
    SOFT's sampling ratio::

        X_r = LN(Conv_{r x r, stride r}(X))          (m = n / r^2 tokens)
        out = softmax(Q (X_r W_k)^T / sqrt(d)) (X_r W_v)

    ``sr_mode='avgpool'``: r x r average pooling instead of conv + LN (the
    mixer is then ``softmax(Q K_r^T / sqrt d) Pool``, n x n, on V). The
    depthwise conv of SOFT's block sees the full-resolution ``X W_v``.
    """
    repr_keys = ('sr_mode', )

    def __init__(self, *args, sr_mode: str = 'conv', **kwargs):
        super().__init__(*args, **kwargs)
        self.sr_mode = check_choice('sr_mode', sr_mode, ('conv', 'avgpool'))
        r, C = self.sampling_ratio, self.embed_dims
        if sr_mode == 'conv' and r > 1:
            self.sr = SafeConv2d(C, C, r, r)
            self.norm = nn.LayerNorm(C)
        else:
            self.sr = self.norm = None

    def _reduce(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        """(B, n, C) -> (B, m, C) reduced tokens."""
        B, N, C = x.shape
        xm = x.transpose(1, 2).reshape(B, C, *hw)
        xr = self._reduce_map(xm, conv=self.sr)
        xr = xr.flatten(2).transpose(1, 2)
        return self.norm(xr) if self.norm is not None else xr

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        xr = self._reduce(x, hw)
        q = self._split(self.q(x))
        k, vr = self._split(self.k(xr)), self._split(self.v(xr))
        out = F.scaled_dot_product_attention(q, k, vr)
        return out, (self.v(x) if self.dw_conv is not None else None)

    @torch.no_grad()
    def reduced_attention_row(self, x, hw, index) -> torch.Tensor:
        """(B, h, m) softmax weights of query ``index`` over the m keys."""
        self._check(x, hw)
        i = query_index(index, hw)
        q = self._split(self.q(x[:, i:i + 1]))
        k = self._split(self.k(self._reduce(x, hw)))
        return ((q @ k.transpose(-1, -2)).squeeze(-2) * self.scale).softmax(-1)

    def _row(self, x, hw, i) -> torch.Tensor:
        """The reduced row spread over its cells (exact for avgpool)."""
        return spread_to_tokens(
            self.reduced_attention_row(x, hw, i), hw, self.sampling_ratio,
            self.max_landmarks, self.landmark_hw)


def orthogonal_gaussian(num_features: int,
                        dims: int,
                        generator: Optional[torch.Generator] = None,
                        dtype=torch.float32) -> torch.Tensor:
    """(M, d) rows: blocks of d orthogonal directions, chi(d) norms."""
    blocks = []
    for _ in range(math.ceil(num_features / dims)):
        g = torch.randn(dims, dims, generator=generator, dtype=torch.float64)
        q, r = torch.linalg.qr(g)
        q = q * torch.sign(torch.diagonal(r)).unsqueeze(0)  # Haar
        blocks.append(q.T)
    w = torch.cat(blocks)[:num_features]
    norms = torch.randn(
        num_features, dims, generator=generator, dtype=torch.float64).norm(
            dim=1, keepdim=True)
    return (w * norms).to(dtype)


def favor_features(x, w, is_query) -> torch.Tensor:
    """phi(x) (B, h, n, M) of x (B, h, n, d), scaled by d^(-1/4), up to
    a factor that cancels in D^-1."""
    proj = x @ w.to(x.dtype).t()  # (B, h, n, M)
    proj = proj - 0.5 * x.square().sum(-1, keepdim=True)
    shift = proj.amax(-1 if is_query else (-2, -1), keepdim=True)
    return torch.exp(proj - shift.detach()) / math.sqrt(w.shape[0])


@ATTENTIONS.register_module(name=['PerformerAttention', 'performer'])
class PerformerAttention(ZooAttention):
    """Performer (Choromanski et al., ICLR 2021), FAVOR+; q' = q / d^(1/4)::

        phi(x) = exp(W x - |x|^2 / 2) / sqrt(M)        (W: M x d)
        out = D^-1 phi(Q') (phi(K')^T V),  D = diag(phi(Q') phi(K')^T 1_n)

    W (buffer ``features``, ``orthogonal_gaussian()``): ``num_features``
    M rows (None: ``max(16, round(d ln d))``), drawn again by ``redraw()``
    (every ``redraw_interval`` training forwards if > 0).
    """
    repr_keys = ('num_features', )

    def __init__(self,
                 *args,
                 num_features: Optional[int] = None,
                 redraw_interval: int = 0,
                 eps: float = 1e-6,
                 **kwargs):
        super().__init__(*args, **kwargs)
        d = self.head_dims
        if num_features is None:
            num_features = max(16, int(round(d * math.log(max(d, 2)))))
        self.num_features = check_int('num_features', num_features)
        self.redraw_interval, self.eps = redraw_interval, eps
        self.register_buffer('features', orthogonal_gaussian(num_features, d))
        self._calls = 0

    @torch.no_grad()
    def redraw(self, generator: Optional[torch.Generator] = None):
        """Draw a new set of random features (in place)."""
        self.features.copy_(
            orthogonal_gaussian(self.num_features, self.head_dims, generator))

    def _phi(self, x: torch.Tensor):
        s = self.head_dims**-0.25
        q = self._split(self.q(x)) * s
        k = self._split(self.k(x)) * s
        w = self.features
        return favor_features(q, w, True), favor_features(k, w, False)

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        if self.training and self.redraw_interval > 0:
            if self._calls % self.redraw_interval == 0:
                self.redraw()
            self._calls += 1
        pq, pk = self._phi(x)
        vt = self.v(x)
        v = self._split(vt)
        kv = pk.transpose(-1, -2) @ v.to(pk.dtype)  # (B, h, M, d)
        denom = pq @ pk.sum(-2).unsqueeze(-1)  # (B, h, n, 1)
        out = (pq @ kv) / (denom + self.eps)
        return out.to(v.dtype), vt

    def _row(self, x, hw, i) -> torch.Tensor:
        pq, pk = self._phi(x)
        row = (pq[:, :, i:i + 1] @ pk.transpose(-1, -2)).squeeze(-2)
        return row / (row.sum(-1, keepdim=True) + self.eps)


def iterative_pinv(A: torch.Tensor, iters: int) -> torch.Tensor:
    """Nystromformer's iteration for A^+ in float32+: Z_0 = A^T /
    (||A||_1 ||A||_inf) per matrix (the reference: over the batch),
    Z_{k+1} = Z_k (13 I - A Z_k (15 I - A Z_k (7 I - A Z_k))) / 4, with
    I the identity of A Z_k (A's rows), so a rectangular A works too."""
    A = A.to(compute_dtype(A))
    eye = torch.eye(A.shape[-2], dtype=A.dtype, device=A.device)
    col = A.abs().sum(-2).amax(-1)
    row = A.abs().sum(-1).amax(-1)
    Z = A.transpose(-1, -2) / (col * row)[..., None, None]
    for _ in range(iters):
        AZ = A @ Z
        Z = 0.25 * Z @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ)))
    return Z


@ATTENTIONS.register_module(name=['NystromformerAttention', 'nystromformer'])
class NystromformerAttention(ReducedGridAttention):
    """Nystromformer (Xiong et al., AAAI 2021) with 2D landmarks, the
    cells of a :class:`ReducedGridAttention` grid::

        Q~ = avgpool_r(Q),  K~ = avgpool_r(K)                 (m landmarks)
        F = softmax(Q K~^T / sqrt d),  A = softmax(Q~ K~^T / sqrt d),
        B = softmax(Q~ K^T / sqrt d),  out = F A^+ (B V)

    A^+ by :func:`iterative_pinv` (``pinv='iterative'``, ``pinv_iters``
    steps) or ``'exact'``; with r = 1 and the exact inverse F A^+ B = S.
    """
    repr_keys = ('pinv', 'pinv_iters')

    def __init__(self, *args, pinv='iterative', pinv_iters=6, **kwargs):
        super().__init__(*args, **kwargs)
        self.pinv = check_choice('pinv', pinv, ('iterative', 'exact'))
        self.pinv_iters = pinv_iters

    def _landmarks(self, t: torch.Tensor, hw: Tuple[int, int]):
        """(B, h, n, d) -> (B, h, m, d): the tokens pooled over the grid."""
        B, h, n, d = t.shape
        tm = self._reduce_map(t.reshape(B * h, *hw, d).permute(0, 3, 1, 2))
        return tm.flatten(2).transpose(1, 2).reshape(B, h, -1, d)

    def _kernels(self, x: torch.Tensor, hw: Tuple[int, int]):
        """F (B, h, n, m), A^+ (B, h, m, m) in float32+, B (B, h, m, n)."""
        q = self._split(self.q(x))
        k = self._split(self.k(x))
        ql, kl = self._landmarks(q, hw), self._landmarks(k, hw)
        s = self.scale
        F_ = (q @ kl.transpose(-1, -2) * s).softmax(-1)
        A = (ql @ kl.transpose(-1, -2) * s).softmax(-1)
        B_ = (ql @ k.transpose(-1, -2) * s).softmax(-1)
        with autocast_off(x.device.type):
            if self.pinv == 'exact':
                A_inv = torch.linalg.pinv(A.to(compute_dtype(A)))
            else:
                A_inv = iterative_pinv(A, self.pinv_iters)
        return F_, A_inv, B_

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        F_, A_inv, B_ = self._kernels(x, hw)
        vt = self.v(x)
        v = self._split(vt)
        with autocast_off(x.device.type):
            dt = A_inv.dtype
            out = F_.to(dt) @ (A_inv @ (B_.to(dt) @ v.to(dt)))
        return out.to(v.dtype), vt

    def _row(self, x, hw, i) -> torch.Tensor:
        F_, A_inv, B_ = self._kernels(x, hw)
        dt = A_inv.dtype
        return ((F_[:, :, i:i + 1].to(dt) @ A_inv) @ B_.to(dt)).squeeze(-2)


def l1_normalize_tokens(t: torch.Tensor, eps: float) -> torch.Tensor:
    """Divide each channel of t (..., n, d) by its l1 norm over tokens."""
    return t / (t.abs().sum(-2, keepdim=True) + eps)


def sima_order(n: int, d: int, order: str) -> str:
    """``'linear'`` (Q^ (K^^T V)) or ``'quadratic'`` ((Q^ K^^T) V)."""
    if check_choice('order', order, ('auto', 'quadratic', 'linear')) != 'auto':
        return order
    return 'linear' if n > d else 'quadratic'


@ATTENTIONS.register_module(name=['SimAAttention', 'sima'])
class SimAAttention(ZooAttention):
    """SimA (Koohpayegani and Pirsiavash, WACV 2024), no softmax::

        out = Q^ K^^T V,   Q^_{:,c} = Q_{:,c} / (||Q_{:,c}||_1 + eps)

    (K^ alike, l1 norms over the n tokens), as (Q^ K^^T) V or Q^ (K^^T V):
    ``order`` ``'quadratic'``, ``'linear'`` or ``'auto'`` (linear when
    n > d).
    """
    repr_keys = ('order', )

    def __init__(self, *args, order='auto', eps=1e-6, **kwargs):
        super().__init__(*args, **kwargs)
        sima_order(1, 1, order)  # validate
        self.order, self.eps = order, eps

    def _qk(self, x: torch.Tensor):
        q = l1_normalize_tokens(self._split(self.q(x)), self.eps)
        k = l1_normalize_tokens(self._split(self.k(x)), self.eps)
        return q, k

    def _mix(self, x: torch.Tensor, hw: Tuple[int, int]):
        q, k = self._qk(x)
        vt = self.v(x)
        v = self._split(vt)
        order = sima_order(q.shape[-2], q.shape[-1], self.order)
        if order == 'linear':
            out = q @ (k.transpose(-1, -2) @ v)
        else:
            out = (q @ k.transpose(-1, -2)) @ v
        return out, vt

    def _row(self, x, hw, i) -> torch.Tensor:
        q, k = self._qk(x)
        return (q[:, :, i:i + 1] @ k.transpose(-1, -2)).squeeze(-2)
