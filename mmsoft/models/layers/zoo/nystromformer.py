"""Nystromformer attention with 2D average-pooled landmarks.

Xiong et al., "Nystromformer" (AAAI 2021), adapted to images as in Table 1
of the SOFT paper: the 1D segment means of the landmarks become r x r
average pooling of the query / key maps, with r = SOFT's sampling ratio::

    Q~ = avgpool_r(Q),  K~ = avgpool_r(K)                 (m landmarks)
    F = softmax(Q K~^T / sqrt d),  A = softmax(Q~ K~^T / sqrt d),
    B = softmax(Q~ K^T / sqrt d)
    out = F A^+ (B V)

with A^+ by the iterative method of Razavi et al. used by Nystromformer
(``pinv_iters`` = 6 by default), or exactly (``pinv='exact'``,
:func:`torch.linalg.pinv`). With m = n (r = 1) and an exact inverse the
approximation is exact: F A^+ B = S S^+ S = S.
"""
from typing import Tuple

import torch

from mmsoft.registry import ATTENTIONS
from ..amp import autocast_off
from ..checks import check_choice
from .common import ReducedGridAttention

__all__ = ['NystromformerAttention', 'iterative_pinv']

PINV_MODES = ('iterative', 'exact')


def iterative_pinv(A: torch.Tensor, iters: int = 6) -> torch.Tensor:
    """Nystromformer's cubic-convergence iteration for A^+ (float32+).

    Z_0 = A^T / (||A||_1 ||A||_inf),
    Z_{k+1} = Z_k (13 I - A Z_k (15 I - A Z_k (7 I - A Z_k))) / 4.
    The scale is taken per matrix (the reference code takes the maximum over
    the batch).
    """
    dtype = torch.float64 if A.dtype == torch.float64 else torch.float32
    A = A.to(dtype)
    eye = torch.eye(A.shape[-1], dtype=dtype, device=A.device)
    col = A.abs().sum(-2).amax(-1)
    row = A.abs().sum(-1).amax(-1)
    Z = A.transpose(-1, -2) / (col * row)[..., None, None]
    for _ in range(iters):
        AZ = A @ Z
        Z = 0.25 * Z @ (13 * eye - AZ @ (15 * eye - AZ @ (7 * eye - AZ)))
    return Z


@ATTENTIONS.register_module(name=['NystromformerAttention', 'nystromformer'])
class NystromformerAttention(ReducedGridAttention):
    """Softmax Nystrom attention with SOFT's block details; its landmarks
    are the cells of a :class:`ReducedGridAttention` grid, whose arguments
    (the stage's, ``max_landmarks``, ``landmark_hw``) it takes as
    ``*args, **kwargs``.

    Args:
        pinv (str): ``'iterative'`` (Nystromformer) or ``'exact'``.
            Default: 'iterative'.
        pinv_iters (int): iterations of :func:`iterative_pinv`. Default: 6.
    """

    def __init__(self,
                 *args,
                 pinv: str = 'iterative',
                 pinv_iters: int = 6,
                 **kwargs):
        super().__init__(*args, **kwargs)
        self.pinv = check_choice('pinv', pinv, PINV_MODES)
        self.pinv_iters = pinv_iters

    def _landmarks(self, t: torch.Tensor, hw: Tuple[int, int]):
        """(B, h, n, d) -> (B, h, m, d): the tokens pooled over the grid."""
        B, h, n, d = t.shape
        tm = self._reduce_map(t.reshape(B * h, *hw, d).permute(0, 3, 1, 2))
        return tm.flatten(2).transpose(1, 2).reshape(B, h, -1, d)

    def _kernels(self, x: torch.Tensor, hw: Tuple[int, int]):
        """F (B,h,n,m), A^+ (B,h,m,m) in float32, B-side pieces."""
        q = self._split(self.q(x))
        k = self._split(self.k(x))
        ql, kl = self._landmarks(q, hw), self._landmarks(k, hw)
        s = self.scale
        F_ = (q @ kl.transpose(-1, -2) * s).softmax(-1)
        A = (ql @ kl.transpose(-1, -2) * s).softmax(-1)
        B_ = (ql @ k.transpose(-1, -2) * s).softmax(-1)
        with autocast_off(x.device.type):
            if self.pinv == 'exact':
                dtype = torch.float64 if A.dtype == torch.float64 \
                    else torch.float32
                A_inv = torch.linalg.pinv(A.to(dtype))
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

    def _row(self, x: torch.Tensor, hw: Tuple[int, int],
             i: int) -> torch.Tensor:
        F_, A_inv, B_ = self._kernels(x, hw)
        dt = A_inv.dtype
        return ((F_[:, :, i:i + 1].to(dt) @ A_inv) @ B_.to(dt)).squeeze(-2)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f', pinv={self.pinv}, '
                                       f'pinv_iters={self.pinv_iters}')
