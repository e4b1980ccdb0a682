"""SOFT's blocks and patch embeddings (Table 2) from mmcv bricks: the
post-norm :class:`SOFTBlock` (stages 1-3) with the token mixer of its
``attn_cfg`` (:func:`build_attention`), the pre-norm ViT
:class:`SoftmaxBlock` (stage 4) and :class:`ConvPatchEmbed`."""
import functools
import types
import warnings
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

from mmsoft.registry import ATTENTIONS
from .nr_config import NR_FIELDS
from .safe_conv import SafeConv2d
from .soft_attention import SOFTAttention

__all__ = [
    'ConvPatchEmbed', 'SOFTBlock', 'build_norm', 'mmcv_bricks',
    'SoftmaxAttention', 'SoftmaxBlock', 'RESIDUAL_DROPS', 'residual_drop_cfg',
    'build_attention', 'attention_types', 'STAGE_ARGS', 'NR_KEYS'
]

#: how ``drop_path_rate`` is applied to a residual branch
RESIDUAL_DROPS = ('drop_path', 'dropout')


@functools.lru_cache(maxsize=None)
def mmcv_bricks() -> types.SimpleNamespace:
    """mmcv's bricks, imported at the first build (``import mmsoft`` stays
    free of mmcv) without mmcv.cnn's ``ImportWarning``."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', ImportWarning)
        from mmcv.cnn import ConvModule, build_norm_layer  # noqa: F401
        from mmcv.cnn.bricks.drop import build_dropout  # noqa: F401
        from mmcv.cnn.bricks.transformer import FFN  # noqa: F401
    return types.SimpleNamespace(**locals())


def check_norm_cfg(name: str, cfg: Optional[Dict]) -> None:
    """A norm config whose ``type`` is not a registered layer is an error
    naming it and the known norms (mmcv says "Cannot find None")."""
    if cfg is None:
        return
    if not hasattr(cfg, 'get') or 'type' not in cfg:
        raise TypeError(f'SOFT: {name} must be a dict with a "type" (e.g. '
                        f"dict(type='LN')), got {cfg!r}")
    if not isinstance(cfg['type'], str):
        return  # a class: mmcv checks it when building
    mmcv_bricks()  # registers mmcv's norms
    from mmengine.registry import MODELS
    with MODELS.switch_scope_and_registry(None) as registry:
        if registry.get(cfg['type']) is not None:
            return
    bases = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm,
             nn.LocalResponseNorm)
    known = sorted(key for key, cls in MODELS.module_dict.items()
                   if isinstance(cls, type) and (issubclass(cls, bases) or (
                       issubclass(cls, nn.Module) and 'Norm' in cls.__name__)))
    raise KeyError(f'SOFT: {name} has type {cfg["type"]!r}, which is not a '
                   f'registered norm layer; known norms: {", ".join(known)}')


def build_norm(cfg: Dict, num_features: int) -> nn.Module:
    """The norm layer of ``cfg`` (mmcv ``build_norm_layer``)."""
    return mmcv_bricks().build_norm_layer(cfg, num_features)[1]


#: the arguments a SOFT stage passes to every attention (not attn_cfg keys)
STAGE_ARGS = ('embed_dims', 'num_heads', 'sampling_ratio', 'dw_kernel_size',
              'qkv_bias')
#: the attn_cfg keys of the NR settings of SOFT attention -> NRConfig field
NR_KEYS = {f'nr_{field}': field for field in NR_FIELDS}


def build_attention(cfg: dict, **stage_args) -> nn.Module:
    """The token mixer of a SOFT stage from its ``attn_cfg``, ``dict(type=
    ..., **options)`` of :data:`mmsoft.registry.ATTENTIONS` (listed in
    docs/en/advanced_guides/attention_zoo.md): ``cls(**stage_args,
    **options)``, ``stage_args`` the :data:`STAGE_ARGS`; a SOFT attention's
    ``NR_KEYS`` become its ``nr`` (other attentions reject them)."""
    if not isinstance(cfg, dict) or 'type' not in cfg:
        raise TypeError(f"attn_cfg must be a dict with a 'type' (one of "
                        f'{attention_types()}), got {cfg!r}')
    fixed = sorted(set(cfg) & set(STAGE_ARGS))
    if fixed:
        raise ValueError(
            f'attn_cfg sets {fixed}, which the SOFT stage fixes (from arch '
            f'and qkv_bias); remove them from attn_cfg')
    flat = {k: cfg[k] for k in NR_KEYS if k in cfg}
    cls = cfg['type']
    cls = cls if isinstance(cls, type) else ATTENTIONS.get(cls)
    if flat and isinstance(cls, type) and issubclass(cls, SOFTAttention):
        if cfg.get('nr') is not None:
            raise ValueError(
                f'attn_cfg sets both nr and {sorted(flat)}; give the Newton-'
                f'Raphson settings once (the nr_* keys, or nr=dict(...))')
        cfg = {k: v for k, v in cfg.items() if k not in flat}
        cfg['nr'] = {NR_KEYS[k]: v for k, v in flat.items()}
    # in mmsoft's scope: the ATTENTIONS registry has no mmdet / mmseg /
    # mmpretrain child, and mmengine warns when the default scope is theirs
    return ATTENTIONS.build(
        dict(cfg, _scope_='mmsoft'), default_args=stage_args)


def attention_types() -> List[str]:
    """Every registered attention type (class names and aliases)."""
    ATTENTIONS.import_from_location()
    return sorted(ATTENTIONS.module_dict)


def residual_drop_cfg(rate, residual_drop='drop_path') -> Optional[Dict]:
    """The ``build_dropout`` config of a residual branch: ``DropPath``
    or element-wise ``Dropout`` of ``rate``; None for rate 0."""
    if residual_drop not in RESIDUAL_DROPS:
        raise ValueError(f'residual_drop must be one of {RESIDUAL_DROPS}, '
                         f'got {residual_drop!r}')
    if not rate:
        return None
    kind = 'DropPath' if residual_drop == 'drop_path' else 'Dropout'
    return dict(type=kind, drop_prob=float(rate))


class ConvPatchEmbed(nn.Module):
    """3x3 ``ConvModule`` layers (conv with bias, norm, act): the C33 stem
    (strides 2, 1, 2; ``stem_channels``) or one C31 of stride 2, with
    PyTorch's default conv initialisation (the official model's)."""

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
        self.proj, kw = nn.Sequential(), dict(
            bias=True,
            conv_cfg=dict(type=SafeConv2d),
            norm_cfg=norm_cfg,
            act_cfg=act_cfg)
        for cin, cout, stride in plan:
            # ConvModule's Kaiming init on a forked RNG: reset_parameters
            # draws the default init from the stream an nn.Conv2d would
            with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
                warnings.filterwarnings('ignore', 'Unnecessary conv bias',
                                        UserWarning)
                layer = mmcv_bricks().ConvModule(cin, cout, 3, stride, 1, **kw)
            layer.conv.reset_parameters()
            self.proj.append(layer)

    def forward(self, x: torch.Tensor):
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


def _ffn(embed_dims, mlp_ratio, act_cfg, drop, residual) -> nn.Module:
    """mmcv ``FFN``: fc1, act, fc2 (dropouts ``drop``), + the identity."""
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
    """Post-norm: x = LN(x + drop(Attn(x))); x = LN(x + drop(FFN(x))).
    ``embed_dims`` ... ``qkv_bias`` go to the ``attn_cfg`` attention;
    ``residual_drop``: ``'drop_path'`` or ``'dropout'`` of
    ``drop_path_rate``; defaults: LN, the official tanh GELU."""

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
        args = (embed_dims, num_heads, sampling_ratio, dw_kernel_size,
                qkv_bias)
        self.attn = build_attention(
            dict(type='SOFTAttention') if attn_cfg is None else attn_cfg,
            **dict(zip(STAGE_ARGS, args)))
        self.norm1 = build_norm(norm_cfg, embed_dims)
        self.drop = _drop(residual)
        self.ffn = _ffn(embed_dims, mlp_ratio, act_cfg, 0., residual)
        self.norm2 = build_norm(norm_cfg, embed_dims)

    def forward(self, x: torch.Tensor, hw: Tuple[int, int]) -> torch.Tensor:
        x = self.norm1(x + self.drop(self.attn(x, hw)))
        return self.norm2(self.ffn(x))  # x + drop(FFN(x))


class SoftmaxAttention(nn.Module):
    """Multi-head softmax attention (q, fused kv, proj) of stage 4."""

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
    """Pre-norm: x += DP(Attn(LN(x))); x += DP(MLP(LN(x))). ``drop_rate``
    after the attention projection and in the MLP, ``attn_drop_rate`` on
    the attention weights; defaults: LN with eps 1e-6, GELU."""

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
