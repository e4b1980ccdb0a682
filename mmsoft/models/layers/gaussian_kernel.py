"""Gaussian kernel between two token sets without n x m temporaries.

SOFT's similarity (NeurIPS 2021 Eq. 5, IJCV Eq. 5)::

    S_ij = exp(-||q_i - k_j||^2 / (2 sqrt(d)))

The callers pass tokens already scaled by d^(-1/4), so this module computes
``exp(-||x_i - y_j||^2 / 2)``. It is written as one custom autograd Function:

* forward: one (n, m) buffer, filled by ``x @ y^T`` and then updated in place
  (``-|x|^2/2``, ``-|y|^2/2``, clamp to <= 0, ``exp``), instead of the three
  (n, m) temporaries of ``x^2 @ 1 + 1 @ y^2 - 2 x @ y^T``;
* backward: with G' = grad * K (elementwise),
  ``grad_x = G' y - rowsum(G') * x`` and ``grad_y = G'^T x - colsum(G') * y``.

Computation is always float32 (float64 if the inputs are), with autocast
disabled, so the exponent never overflows or loses precision in half
precision. Clamping the exponent at 0 keeps K in [0, 1] even with rounding.
"""
import torch

from . import export_ops

__all__ = ['gaussian_kernel', 'GaussianKernel']


class GaussianKernel(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        K = torch.matmul(x, y.transpose(-1, -2))
        K.sub_(x.square().sum(-1, keepdim=True), alpha=0.5)
        K.sub_(y.square().sum(-1).unsqueeze(-2), alpha=0.5)
        K.clamp_(max=0.0).exp_()
        ctx.save_for_backward(x, y, K)
        return K

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, y, K = ctx.saved_tensors
        GK = grad * K
        grad_x = grad_y = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.matmul(GK, y) - GK.sum(-1, keepdim=True) * x
        if ctx.needs_input_grad[1]:
            grad_y = (torch.matmul(GK.transpose(-1, -2), x) -
                      GK.sum(-2).unsqueeze(-1) * y)
            # y may have been broadcast along batch dims
            if grad_y.shape != y.shape:
                grad_y = grad_y.sum_to_size(y.shape)
        if grad_x is not None and grad_x.shape != x.shape:
            grad_x = grad_x.sum_to_size(x.shape)
        return grad_x, grad_y


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """K_ij = exp(-||x_i - y_j||^2 / 2) for x (..., n, d), y (..., m, d).

    Returns (..., n, m) in float32 (float64 for float64 inputs) regardless of
    autocast.
    """
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f'gaussian_kernel: feature sizes differ '
                         f'({x.shape[-1]} vs {y.shape[-1]})')
    dtype = torch.float64 if torch.float64 in (x.dtype, y.dtype) \
        else torch.float32
    with torch.autocast(device_type=x.device.type, enabled=False):
        if export_ops.is_exporting():  # ONNX: plain out-of-place ops
            return export_ops.gaussian_kernel(x.to(dtype), y.to(dtype))
        return GaussianKernel.apply(x.to(dtype), y.to(dtype))
