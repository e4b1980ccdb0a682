"""Performer attention: FAVOR+ with positive orthogonal random features.

Choromanski et al., "Rethinking attention with Performers" (ICLR 2021).
The softmax kernel exp(q.k / sqrt(d)) is the expectation of
phi(q')^T phi(k') over w ~ N(0, I_d), with q' = q / d^(1/4) and the positive
features

    phi(x) = exp(W x - |x|^2 / 2) / sqrt(M)        (W: M x d, rows w_i)

so that

    out = D^-1 phi(Q') (phi(K')^T V),   D = diag(phi(Q') (phi(K')^T 1_n))

costs O(n M d). The rows of W are drawn in blocks of d orthogonal
directions with chi(d)-distributed norms (the "OR+" estimator). For
numerical range, phi(Q') is shifted by its row maximum and phi(K') by its
maximum over keys and features; both shifts cancel in D^-1.

The features live in the buffer ``features`` (saved with the weights);
``redraw()`` draws new ones (``redraw_interval`` > 0 does that every that
many training forwards, as the Performer paper suggests).
"""
import math
from typing import Optional, Tuple

import torch

from mmsoft.registry import ATTENTIONS
from ..checks import check_int
from .common import ZooAttention

__all__ = ['PerformerAttention', 'orthogonal_gaussian']


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


def favor_features(x: torch.Tensor, w: torch.Tensor,
                   is_query: bool) -> torch.Tensor:
    """phi(x) up to a factor that cancels in the normalisation.

    x: (B, h, n, d) already scaled by d^(-1/4); w: (M, d).
    """
    proj = x @ w.to(x.dtype).t()  # (B, h, n, M)
    proj = proj - 0.5 * x.square().sum(-1, keepdim=True)
    if is_query:
        shift = proj.amax(-1, keepdim=True)
    else:
        shift = proj.amax((-2, -1), keepdim=True)
    return torch.exp(proj - shift.detach()) / math.sqrt(w.shape[0])


@ATTENTIONS.register_module(name=['PerformerAttention', 'performer'])
class PerformerAttention(ZooAttention):
    """FAVOR+ linear attention with SOFT's block details.

    The stage arguments (``*args, **kwargs``) are those of
    :class:`ZooAttention`.

    Args:
        num_features (int | None): M random features per head. Default:
            None, ``max(16, round(d ln d))`` as in the Performer reference
            code.
        redraw_interval (int): draw new features every that many training
            forwards (0: keep them fixed). Default: 0.
        eps (float): added to the normaliser D. Default: 1e-6.
    """

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
        self.redraw_interval = redraw_interval
        self.eps = eps
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
        return (favor_features(q, self.features,
                               True), favor_features(k, self.features, False))

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

    def _row(self, x: torch.Tensor, hw: Tuple[int, int],
             i: int) -> torch.Tensor:
        pq, pk = self._phi(x)
        row = (pq[:, :, i:i + 1] @ pk.transpose(-1, -2)).squeeze(-2)
        return row / (row.sum(-1, keepdim=True) + self.eps)

    def extra_repr(self) -> str:
        return super().extra_repr() + f', num_features={self.num_features}'
