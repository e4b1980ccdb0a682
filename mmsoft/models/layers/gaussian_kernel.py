"""SOFT's Gaussian kernel (Eq. 5) as one autograd Function.

Tokens come scaled by d^(-1/4): K_ij = exp(-||x_i - y_j||^2 / 2). Both sets
are translated by the mean landmark c (per sample and head), so that
||x||^2 + ||y||^2 - 2 x.y cancels relative to the tokens' spread, not their
norm. float32 (float64 stays), autocast off.
"""
import torch

from . import export_ops
from .amp import autocast_off, compute_dtype

__all__ = ['gaussian_kernel', 'kernel_forward', 'GaussianKernel']


def kernel_forward(x, y, self_kernel=False) -> torch.Tensor:
    """K for x (..., n, d), y (..., m, d) without autograd, in one (n, m)
    buffer updated in place: the Function's forward and the export path.
    The self-kernel's diagonal is exactly 1."""
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


class GaussianKernel(torch.autograd.Function):
    """K with G' = grad * K: grad_x = G' y - rowsum(G') x, grad_y = G'^T x -
    colsum(G') y (on the translated tokens, recomputed in the backward)."""

    @staticmethod
    def forward(ctx, x, y, self_kernel=False):
        K = kernel_forward(x, y, self_kernel)
        ctx.self_kernel = self_kernel
        ctx.save_for_backward(y if self_kernel else x, y,
                              y.mean(-2, keepdim=True), K)
        return K

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, y, c, K = ctx.saved_tensors
        yc = y - c
        xc = yc if ctx.self_kernel else x - c
        GK = grad * K
        grad_x = grad_y = None
        if ctx.needs_input_grad[0]:  # sum_to_size: x, y may be broadcast
            grad_x = (torch.matmul(GK, yc) -
                      GK.sum(-1, keepdim=True) * xc).sum_to_size(x.shape)
        if ctx.needs_input_grad[1]:
            grad_y = (torch.matmul(GK.transpose(-1, -2), xc) -
                      GK.sum(-2).unsqueeze(-1) * yc).sum_to_size(y.shape)
        return grad_x, grad_y, None


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """K_ij = exp(-||x_i - y_j||^2 / 2), (..., n, m), for x (..., n, d) and
    y (..., m, d); ``gaussian_kernel(y, y)`` is the self-kernel A."""
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f'gaussian_kernel: feature sizes differ '
                         f'({x.shape[-1]} vs {y.shape[-1]})')
    dtype = compute_dtype(x, y)
    self_kernel = x is y
    with autocast_off(x.device.type):
        if export_ops.is_exporting():  # ONNX: no autograd Function
            return kernel_forward(x.to(dtype), y.to(dtype), self_kernel)
        y = y.to(dtype)
        # the self-kernel passes a view of y as x (torch.compile refuses one
        # tensor given twice to a Function); both gradients reach y
        return GaussianKernel.apply(
            y.view_as(y) if self_kernel else x.to(dtype), y, self_kernel)
