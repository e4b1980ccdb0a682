"""Gaussian kernel between two token sets without n x m temporaries.

SOFT's similarity (Eq. 5) S_ij = exp(-||q_i - k_j||^2 / (2 sqrt(d))); the
callers pass tokens scaled by d^(-1/4), so this is exp(-||x_i - y_j||^2 / 2),
one custom autograd Function:

* forward (:func:`~.export_ops.gaussian_kernel`, also the export path):
  one (n, m) buffer, ``x @ y^T`` updated in place (``-|x|^2/2``,
  ``-|y|^2/2``, clamp to <= 0, ``exp``);
* backward: with G' = grad * K, ``grad_x = G' y - rowsum(G') * x`` and
  ``grad_y = G'^T x - colsum(G') * y``.

Large-norm tokens: ``||x||^2 + ||y||^2 - 2 x.y`` cancels catastrophically
when the norms are large compared with the distance (float32: the diagonal
of A is 0.94 at token norm 1e3, 3e-4 at 1e4, and the normalisation returns
NaN). K depends on x - y only, so both sets are first translated by the
mean landmark c (per sample and head: batch-independent); the error is
then relative to the tokens' spread. The self-kernel's diagonal is exactly
1. The backward recomputes the translated tensors instead of saving them.
Always float32 (float64 for float64 inputs) with autocast disabled.
"""
import torch

from . import export_ops
from .amp import autocast_off

__all__ = ['gaussian_kernel', 'GaussianKernel']


class GaussianKernel(torch.autograd.Function):

    @staticmethod
    def forward(ctx,
                x: torch.Tensor,
                y: torch.Tensor,
                self_kernel: bool = False) -> torch.Tensor:
        K = export_ops.gaussian_kernel(x, y, self_kernel)
        # the inputs (kept alive by autograd anyway) and c are saved, not
        # the translated copies: backward recomputes them
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
        if ctx.needs_input_grad[0]:
            grad_x = torch.matmul(GK, yc) - GK.sum(-1, keepdim=True) * xc
            if grad_x.shape != x.shape:
                grad_x = grad_x.sum_to_size(x.shape)
        if ctx.needs_input_grad[1]:
            grad_y = (
                torch.matmul(GK.transpose(-1, -2), xc) -
                GK.sum(-2).unsqueeze(-1) * yc)
            # y may have been broadcast along batch dims
            if grad_y.shape != y.shape:
                grad_y = grad_y.sum_to_size(y.shape)
        return grad_x, grad_y, None


def gaussian_kernel(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """K_ij = exp(-||x_i - y_j||^2 / 2) for x (..., n, d), y (..., m, d).

    Returns (..., n, m) in float32 (float64 for float64 inputs) regardless of
    autocast. Passing the same tensor twice (``gaussian_kernel(y, y)``)
    computes the self-kernel, whose diagonal is exactly 1.
    """
    if x.shape[-1] != y.shape[-1]:
        raise ValueError(f'gaussian_kernel: feature sizes differ '
                         f'({x.shape[-1]} vs {y.shape[-1]})')
    dtype = torch.float64 if torch.float64 in (x.dtype, y.dtype) \
        else torch.float32
    self_kernel = x is y
    with autocast_off(x.device.type):
        if export_ops.is_exporting():  # ONNX: no autograd Function
            return export_ops.gaussian_kernel(
                x.to(dtype), y.to(dtype), self_kernel)
        y = y.to(dtype)
        # the self-kernel passes a view of y as x: the same values and the
        # same gradient (both inputs' gradients reach y), and torch.compile
        # traces it (Dynamo refuses one tensor given twice to a Function)
        return GaussianKernel.apply(
            y.view_as(y) if self_kernel else x.to(dtype), y, self_kernel)
