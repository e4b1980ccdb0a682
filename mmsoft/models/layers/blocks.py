"""Transformer blocks and patch embeddings of the SOFT architecture (Table 2),
built from mmcv's bricks (``FFN``, ``ConvModule``, ``build_norm_layer``,
``build_dropout``) as OpenMMLab backbones are.

* :class:`SOFTBlock` - stages 1-3: post-norm residual layers around a
  token mixer built from ``attn_cfg`` (:class:`SOFTAttention` by default)
  and a 2-layer FFN (expansion e = 4, tanh-GELU), as
  the official model (and its checkpoints) has them.
* :class:`SoftmaxBlock` - stage 4 ("sp. 1x1, w. cls token"): a pre-norm ViT
  block with standard softmax attention over the 7x7 tokens + cls token.
* :class:`ConvPatchEmbed` - the C33-BN-ReLU stem (strides 2, 1, 2) and the
  C31-BN-ReLU down-sampling between stages.
"""
import functools
import types
import warnings
from typing import Dict, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from .attention_zoo import build_attention
from .safe_conv import SafeConv2d

__all__ = [
    'ConvPatchEmbed', 'SOFTBlock', 'build_norm', 'mmcv_bricks',
    'SoftmaxAttention', 'SoftmaxBlock', 'RESIDUAL_DROPS', 'residual_drop_cfg'
]

#: how ``drop_path_rate`` is applied to a residual branch
RESIDUAL_DROPS = ('drop_path', 'dropout')


@functools.lru_cache(maxsize=None)
def mmcv_bricks() -> types.SimpleNamespace:
    """mmcv's ``ConvModule``, ``FFN``, ``build_norm_layer`` and
    ``build_dropout``, imported when the first block is built: ``import
    mmsoft`` stays free of mmcv, whose transformer module raises an
    ``ImportWarning`` (about ``MultiScaleDeformableAttention``) when
    imported; that warning is not mmsoft's users' to fix, so it is
    silenced here."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', ImportWarning)
        from mmcv.cnn import ConvModule, build_norm_layer
        from mmcv.cnn.bricks.drop import build_dropout
        from mmcv.cnn.bricks.transformer import FFN
    return types.SimpleNamespace(
        ConvModule=ConvModule,
        FFN=FFN,
        build_norm_layer=build_norm_layer,
        build_dropout=build_dropout)


def known_norms() -> Tuple[str, ...]:
    """The names of the norm layers in MMEngine's root ``MODELS`` registry
    (mmcv's ``BN``, ``GN``, ``LN``, ``IN``, ``SyncBN`` ... and any norm
    registered there by the user), sorted."""
    mmcv_bricks()  # registers mmcv's norms
    from mmengine.registry import MODELS
    bases = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm,
             nn.LocalResponseNorm)
    return tuple(
        sorted(name for name, cls in MODELS.module_dict.items()
               if isinstance(cls, type) and (issubclass(cls, bases) or (
                   issubclass(cls, nn.Module) and 'Norm' in cls.__name__))))


def check_norm_cfg(name: str, cfg: Optional[Dict]) -> None:
    """Refuse a norm config whose ``type`` is not a registered layer, with
    a message naming it and the known norms (mmcv's ``build_norm_layer``
    says "Cannot find None in registry")."""
    if cfg is None:
        return
    if not hasattr(cfg, 'get') or 'type' not in cfg:
        raise TypeError(f'SOFT: {name} must be a dict with a "type" (e.g. '
                        f"dict(type='LN')), got {cfg!r}")
    typ = cfg['type']
    if not isinstance(typ, str):
        return  # a class: mmcv checks it when building
    mmcv_bricks()
    from mmengine.registry import MODELS
    with MODELS.switch_scope_and_registry(None) as registry:
        found = registry.get(typ)
    if found is None:
        raise KeyError(f'SOFT: {name} has type {typ!r}, which is not a '
                       f'registered norm layer; known norms: '
                       f'{", ".join(known_norms())}')


def build_norm(cfg: Dict, num_features: int) -> nn.Module:
    """The norm layer of ``cfg`` (mmcv ``build_norm_layer``)."""
    return mmcv_bricks().build_norm_layer(cfg, num_features)[1]


def residual_drop_cfg(rate: float,
                      residual_drop: str = 'drop_path') -> Optional[Dict]:
    """The ``build_dropout`` config of a residual branch: ``DropPath``
    (stochastic depth) or ``Dropout`` (element-wise) of ``rate``; None
    (identity) for rate 0."""
    if residual_drop not in RESIDUAL_DROPS:
        raise ValueError(f'residual_drop must be one of {RESIDUAL_DROPS}, '
                         f'got {residual_drop!r}')
    if not rate:
        return None
    kind = 'DropPath' if residual_drop == 'drop_path' else 'Dropout'
    return dict(type=kind, drop_prob=float(rate))


class ConvPatchEmbed(nn.Module):
    """Overlapping conv tokenizer of ``ConvModule`` layers (3x3 conv with
    bias -> ``norm_cfg`` -> ``act_cfg``). ``stem=True``: C33-BN-ReLU, stride
    4 in total (strides 2, 1, 2; 32 hidden channels); otherwise one
    C31-BN-ReLU of stride 2.

    The convs keep PyTorch's default initialisation (that of the official
    model), not ``ConvModule``'s Kaiming init.
    """

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 stem: bool,
                 stem_channels: int = 32,
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None):
        super().__init__()
        norm_cfg = dict(type='BN') if norm_cfg is None else norm_cfg
        act_cfg = dict(type='ReLU') if act_cfg is None else act_cfg
        if stem:
            plan = [(in_channels, stem_channels, 2),
                    (stem_channels, stem_channels, 1),
                    (stem_channels, embed_dims, 2)]
        else:
            plan = [(in_channels, embed_dims, 2)]
        layers = []
        for cin, cout, stride in plan:
            # ConvModule's Kaiming init runs on a forked RNG, so that
            # reset_parameters draws PyTorch's default init from the same
            # stream as a plain nn.Conv2d: seeded models are unchanged.
            # The official convs have a bias (hence the warning filter).
            with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
                warnings.filterwarnings('ignore', 'Unnecessary conv bias',
                                        UserWarning)
                layer = mmcv_bricks().ConvModule(
                    cin,
                    cout,
                    3,
                    stride,
                    1,
                    bias=True,
                    conv_cfg=dict(type=SafeConv2d),
                    norm_cfg=norm_cfg,
                    act_cfg=act_cfg)
            layer.conv.reset_parameters()
            layers.append(layer)
        self.proj = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor):
        x = self.proj(x)
        hw = (x.shape[2], x.shape[3])
        return x.flatten(2).transpose(1, 2), hw


def _ffn(embed_dims: int, mlp_ratio: float, act_cfg: Dict, drop: float,
         residual: Optional[Dict]) -> nn.Module:
    """mmcv ``FFN``: fc1 -> act -> dropout(drop) -> fc2 -> dropout(drop),
    plus the identity through the residual drop ``residual``."""
    return mmcv_bricks().FFN(
        embed_dims=embed_dims,
        feedforward_channels=int(embed_dims * mlp_ratio),
        num_fcs=2,
        act_cfg=act_cfg,
        ffn_drop=drop,
        dropout_layer=residual,
        add_identity=True)


def _drop(cfg: Optional[Dict]) -> nn.Module:
    return mmcv_bricks().build_dropout(cfg) if cfg else nn.Identity()


class SOFTBlock(nn.Module):
    """Post-norm SOFT layer: x = LN(x + drop(Attn(x))), then
    x = LN(x + drop(FFN(x))).

    Args:
        embed_dims, num_heads, sampling_ratio, dw_kernel_size, qkv_bias:
            the arguments the stage gives every attention
            (:class:`~mmsoft.models.layers.attention_base.AttentionBase`).
        attn_cfg (dict): the token mixer, built from
            :data:`mmsoft.registry.ATTENTIONS` with those arguments.
            Default: ``dict(type='SOFTAttention')``.
        mlp_ratio (float): FFN hidden width / ``embed_dims``. Default: 4.
        drop_path_rate (float): rate of the residual drop. Default: 0.
        residual_drop (str): how that rate is applied: ``'drop_path'``
            (stochastic depth) or ``'dropout'`` (the official training
            recipe, an element-wise dropout on the residual branch).
            Default: 'drop_path'.
        norm_cfg (dict): the two norms. Default: ``dict(type='LN')``.
        act_cfg (dict): the FFN activation. Default:
            ``dict(type='GELU', approximate='tanh')`` (the official layer).
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
                 residual_drop: str = 'drop_path',
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None):
        super().__init__()
        norm_cfg = dict(type='LN') if norm_cfg is None else norm_cfg
        act_cfg = dict(type='GELU', approximate='tanh') \
            if act_cfg is None else act_cfg
        residual = residual_drop_cfg(drop_path_rate, residual_drop)
        self.attn = build_attention(
            attn_cfg if attn_cfg is not None else dict(type='SOFTAttention'),
            embed_dims=embed_dims,
            num_heads=num_heads,
            sampling_ratio=sampling_ratio,
            dw_kernel_size=dw_kernel_size,
            qkv_bias=qkv_bias)
        self.norm1 = build_norm(norm_cfg, embed_dims)
        self.drop = _drop(residual)
        self.ffn = _ffn(embed_dims, mlp_ratio, act_cfg, 0., residual)
        self.norm2 = build_norm(norm_cfg, embed_dims)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn(x, hw)))
        return self.norm2(self.ffn(x))  # x + drop(FFN(x))


class SoftmaxAttention(nn.Module):
    """Standard multi-head softmax attention (q, fused kv, proj) of the
    stage-4 blocks; ``attn_drop`` on the attention weights (training
    only), ``proj_drop`` after ``proj``."""

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
        norm_cfg (dict): the two norms. Default: ``dict(type='LN',
            eps=1e-6)`` (the official stage 4).
        act_cfg (dict): the MLP activation. Default: ``dict(type='GELU')``.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 mlp_ratio: float = 4.,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None):
        super().__init__()
        norm_cfg = dict(type='LN', eps=1e-6) if norm_cfg is None else norm_cfg
        act_cfg = dict(type='GELU') if act_cfg is None else act_cfg
        residual = residual_drop_cfg(drop_path_rate, 'drop_path')
        self.norm1 = build_norm(norm_cfg, embed_dims)
        self.attn = SoftmaxAttention(embed_dims, num_heads, qkv_bias,
                                     attn_drop_rate, drop_rate)
        self.drop_path = _drop(residual)
        self.norm2 = build_norm(norm_cfg, embed_dims)
        self.ffn = _ffn(embed_dims, mlp_ratio, act_cfg, drop_rate, residual)

    def forward(self, x: torch.Tensor, hw=None) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return self.ffn(self.norm2(x), identity=x)  # x + DP(MLP(LN(x)))
