"""SimA: softmax-free attention with l1-normalised queries and keys.

Koohpayegani and Pirsiavash, "SimA: Simple Softmax-free Attention for
Vision Transformers" (WACV 2024). Per head, every channel of Q and of K is
divided by its l1 norm across the n tokens::

    Q^_{:,c} = Q_{:,c} / ||Q_{:,c}||_1,      K^_{:,c} = K_{:,c} / ||K_{:,c}||_1
    out = Q^ K^^T V

There is no softmax, so the product can be associated either way:
(Q^ K^^T) V costs O(n^2 d), Q^ (K^^T V) costs O(n d^2); the order is chosen
per call from n and d (``order='auto'``: the linear one when n > d), as the
SimA paper does at test time. The attention values are bounded by d in
absolute value and may be negative.
"""
from typing import Tuple

import torch

from mmsoft.registry import ATTENTIONS
from .common import ZooAttention

__all__ = ['SimAAttention', 'l1_normalize_tokens', 'sima_order']

ORDERS = ('auto', 'quadratic', 'linear')


def l1_normalize_tokens(t: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Divide each channel of t (..., n, d) by its l1 norm over tokens."""
    return t / (t.abs().sum(-2, keepdim=True) + eps)


def sima_order(n: int, d: int, order: str = 'auto') -> str:
    """``'linear'`` (Q^ (K^^T V)) or ``'quadratic'`` ((Q^ K^^T) V)."""
    if order not in ORDERS:
        raise ValueError(f'unknown order {order!r}; choose one of {ORDERS}')
    if order != 'auto':
        return order
    return 'linear' if n > d else 'quadratic'


@ATTENTIONS.register_module(name=['SimAAttention', 'sima'])
class SimAAttention(ZooAttention):
    """SimA with SOFT's block details.

    The stage arguments (``*args, **kwargs``) are those of
    :class:`ZooAttention`.

    Args:
        order (str): ``'auto'`` (from n vs d), ``'quadratic'`` or
            ``'linear'``. Default: 'auto'.
        eps (float): added to the l1 norms. Default: 1e-6.
    """

    def __init__(self,
                 *args,
                 order: str = 'auto',
                 eps: float = 1e-6,
                 **kwargs):
        super().__init__(*args, **kwargs)
        sima_order(1, 1, order)  # validate
        self.order = order
        self.eps = eps

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

    def _row(self, x: torch.Tensor, hw: Tuple[int, int],
             i: int) -> torch.Tensor:
        q, k = self._qk(x)
        return (q[:, :, i:i + 1] @ k.transpose(-1, -2)).squeeze(-2)

    def extra_repr(self) -> str:
        return super().extra_repr() + f', order={self.order}'
