"""What the SOFT backbone does with unusual inputs: a non-tensor or a
tensor that is not (B, C, H, W) (a clear error), an empty batch (empty
outputs of the right shapes) and a batch whose patch-embedding BatchNorm
sees one value per channel (what it means and how to fix it)."""
from typing import Tuple

import torch

__all__ = ['check_images', 'empty_outputs', 'one_value_per_channel']


def check_images(x) -> None:
    """``x`` must be a (B, C, H, W) tensor."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f'SOFT expects a (B, C, H, W) tensor, got a '
                        f'{type(x).__name__}; stack the images first '
                        f'(torch.stack)')
    if x.dim() != 4:
        raise ValueError(f'SOFT expects (B, C, H, W) images, got shape '
                         f'{tuple(x.shape)}')


def empty_outputs(backbone, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """The outputs of ``backbone`` (a :class:`SOFT`) for an empty batch
    (B = 0): every conv of the patch embeddings has kernel 3, stride 2
    (the stem's middle conv stride 1) and padding 1, so each stage has
    ceil(H_prev / 2) rows."""
    H, W = x.shape[2:]
    outs = []
    for i, cfg in enumerate(backbone.stage_cfgs):
        for _ in range(2 if cfg['stem'] else 1):
            H, W = (H + 1) // 2, (W + 1) // 2
        if i in backbone.out_indices:
            dims = backbone.embed_dims[i]
            cls = backbone.stages[i].num_extra_tokens > 0 and \
                backbone.out_type == 'cls_token'
            outs.append(x.new_zeros((0, dims) if cls else (0, dims, H, W)))
    return tuple(outs)


def one_value_per_channel(i: int, x: torch.Tensor) -> str:
    """What BatchNorm's "Expected more than 1 value per channel" in stage
    ``i`` (input ``x``) means here, and how to fix it."""
    B, _, H, W = x.shape
    stride = 4 if i == 0 else 2
    h, w = -(-H // stride), -(-W // stride)
    return (f'SOFT stage {i + 1}: in training mode its patch-embedding '
            f'BatchNorm sees one value per channel (batch size {B}, a '
            f'{h} x {w} map from the stage\'s {H} x {W} input), where '
            f'batch statistics are undefined. Train with a batch size '
            f'>= 2 or larger images, or set norm_eval=True (BatchNorm '
            f'uses its running statistics) or patch_norm_cfg='
            f"dict(type='GN', num_groups=1) on the backbone")
