"""Transformer blocks and patch embeddings of the SOFT architecture (Table 2).

* :class:`SOFTBlock` - stages 1-3: post-norm residual layers around a
  token mixer built from ``attn_cfg`` (:class:`SOFTAttention` by default)
  and a 2-layer FFN (expansion e = 4, tanh-GELU), as
  the official model (and its checkpoints) has them.
* :class:`SoftmaxBlock` - stage 4 ("sp. 1x1, w. cls token"): a pre-norm ViT
  block with standard softmax attention over the 7x7 tokens + cls token.
* :class:`ConvPatchEmbed` - the C33-BN-ReLU stem (strides 2, 1, 2) and the
  C31-BN-ReLU down-sampling between stages.
"""
from typing import Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention_zoo import build_attention

__all__ = [
    'ConvBNReLU', 'ConvPatchEmbed', 'FFN', 'SOFTBlock', 'SoftmaxAttention',
    'SoftmaxBlock', 'DropPath'
]


class DropPath(nn.Module):
    """Stochastic depth per sample (drops the whole residual branch)."""

    def __init__(self, drop_prob: float = 0.):
        super().__init__()
        self.drop_prob = float(drop_prob)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.drop_prob == 0. or not self.training:
            return x
        keep = 1 - self.drop_prob
        mask = x.new_empty((x.shape[0], ) + (1, ) * (x.dim() - 1))
        return x * mask.bernoulli_(keep).div_(keep)

    def extra_repr(self) -> str:
        return f'drop_prob={self.drop_prob}'


class ConvBNReLU(nn.Sequential):
    """3x3 Conv -> BatchNorm -> ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride, 1)
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU(inplace=True)


class ConvPatchEmbed(nn.Module):
    """Overlapping conv tokenizer. ``stem=True``: C33-BN-ReLU, stride 4 in
    total (32 hidden channels); otherwise one C31-BN-ReLU of stride 2."""

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 stem: bool,
                 stem_channels: int = 32):
        super().__init__()
        if stem:
            self.proj = nn.Sequential(
                ConvBNReLU(in_channels, stem_channels, 2),
                ConvBNReLU(stem_channels, stem_channels, 1),
                ConvBNReLU(stem_channels, embed_dims, 2))
        else:
            self.proj = nn.Sequential(ConvBNReLU(in_channels, embed_dims, 2))

    def forward(self, x: torch.Tensor):
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), hw


class FFN(nn.Module):
    """fc1 -> GELU -> fc2 (``approximate='tanh'`` for SOFT layers), with
    dropout of rate ``drop`` after each when > 0."""

    def __init__(self,
                 embed_dims: int,
                 hidden_dims: int,
                 approximate: str = 'none',
                 drop: float = 0.):
        super().__init__()
        self.fc1 = nn.Linear(embed_dims, hidden_dims)
        self.fc2 = nn.Linear(hidden_dims, embed_dims)
        self.approximate = approximate
        self.drop = nn.Dropout(drop) if drop > 0 else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.gelu(self.fc1(x), approximate=self.approximate)
        return self.drop(self.fc2(self.drop(x)))


class SOFTBlock(nn.Module):
    """Post-norm SOFT layer: x = LN(x + drop(Attn(x))), then
    x = LN(x + drop(FFN(x))).

    Args:
        embed_dims (int): token channels.
        num_heads (int): attention heads.
        sampling_ratio (int): r of the stage's bottleneck.
        dw_kernel_size (int): k of the per-head depthwise conv on V.
            Default: 3.
        attn_cfg (dict): the token mixer, built from
            :data:`mmsoft.registry.ATTENTIONS` with the five arguments
            above and ``qkv_bias`` (which the stage fixes). Default:
            ``dict(type='SOFTAttention')``.
        qkv_bias (bool): biases of the attention's projections. Default:
            True.
        mlp_ratio (float): FFN hidden width / ``embed_dims``. Default: 4.
        drop_path_rate (float): rate of the residual drop. Default: 0.
        residual_drop (str): how that rate is applied: ``'dropout'`` (the
            official training recipe, an element-wise dropout on the
            residual branch) or ``'drop_path'`` (true stochastic depth).
            Default: 'dropout'.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3,
                 attn_cfg: Optional[dict] = None,
                 qkv_bias: bool = True,
                 mlp_ratio: float = 4.,
                 drop_path_rate: float = 0.,
                 residual_drop: str = 'dropout'):
        super().__init__()
        self.attn = build_attention(
            attn_cfg if attn_cfg is not None else dict(type='SOFTAttention'),
            embed_dims=embed_dims,
            num_heads=num_heads,
            sampling_ratio=sampling_ratio,
            dw_kernel_size=dw_kernel_size,
            qkv_bias=qkv_bias)
        self.norm1 = nn.LayerNorm(embed_dims)
        self.ffn = FFN(embed_dims, int(embed_dims * mlp_ratio), 'tanh')
        self.norm2 = nn.LayerNorm(embed_dims)
        if residual_drop == 'dropout':
            self.drop = nn.Dropout(drop_path_rate) if drop_path_rate > 0 \
                else nn.Identity()
        elif residual_drop == 'drop_path':
            self.drop = DropPath(drop_path_rate)
        else:
            raise ValueError(f'residual_drop must be "dropout" or '
                             f'"drop_path", got {residual_drop!r}')

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn(x, hw)))
        return self.norm2(x + self.drop(self.ffn(x)))


class SoftmaxAttention(nn.Module):
    """Standard multi-head softmax attention (q, fused kv, proj) of the
    stage-4 blocks.

    Args:
        embed_dims (int): token channels.
        num_heads (int): heads; must divide ``embed_dims``.
        qkv_bias (bool): biases of the q / kv projections. Default: True.
        attn_drop (float): dropout on the attention weights. Default: 0.
        proj_drop (float): dropout after the output projection. Default: 0.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 qkv_bias: bool = True,
                 attn_drop: float = 0.,
                 proj_drop: float = 0.):
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(f'num_heads ({num_heads}) must divide '
                             f'embed_dims ({embed_dims})')
        self.num_heads = num_heads
        self.q = nn.Linear(embed_dims, embed_dims, bias=qkv_bias)
        self.kv = nn.Linear(embed_dims, embed_dims * 2, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(embed_dims, embed_dims)
        self.proj_drop = nn.Dropout(proj_drop) if proj_drop > 0 \
            else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x).view(B, N, h, C // h).transpose(1, 2)
        k, v = self.kv(x).view(B, N, 2, h, C // h).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.attn_drop if self.training else 0.)
        return self.proj_drop(self.proj(x.transpose(1, 2).reshape(B, N, C)))


class SoftmaxBlock(nn.Module):
    """Pre-norm ViT block: x += DP(Attn(LN(x))); x += DP(MLP(LN(x))).

    Args:
        embed_dims (int): token channels.
        num_heads (int): heads.
        mlp_ratio (float): MLP hidden width / ``embed_dims``. Default: 4.
        qkv_bias (bool): biases of the q / kv projections. Default: True.
        drop_rate (float): dropout after the attention projection and in
            the MLP. Default: 0.
        attn_drop_rate (float): dropout on the attention weights.
            Default: 0.
        drop_path_rate (float): stochastic depth (DP) rate. Default: 0.
        norm_eps (float): epsilon of the LayerNorms. Default: 1e-6.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_eps: float = 1e-6):
        super().__init__()
        self.norm1 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.attn = SoftmaxAttention(embed_dims, num_heads, qkv_bias,
                                     attn_drop_rate, drop_rate)
        self.drop_path = DropPath(drop_path_rate)
        self.norm2 = nn.LayerNorm(embed_dims, eps=norm_eps)
        self.ffn = FFN(embed_dims, int(embed_dims * mlp_ratio), 'none',
                       drop_rate)

    def forward(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.ffn(self.norm2(x)))
