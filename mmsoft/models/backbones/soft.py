"""The SOFT backbone (NeurIPS 2021 / IJCV 2024 Table 2)."""
import copy
import functools
import math
import types
import warnings
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft.registry import ATTENTIONS, register_model
from ..arch_zoo import ARCH_DEFAULTS, ARCH_ZOO, NUM_STAGES
from ..layers.amp import (SafeConv2d, check_choice, check_int,
                          check_kernel_size, check_rate)
from ..loading import pretrained_init_cfg

#: how ``drop_path_rate`` is applied to a residual branch
RESIDUAL_DROPS = ('drop_path', 'dropout')


@functools.lru_cache(maxsize=None)
def mmcv_bricks() -> types.SimpleNamespace:
    """mmcv's bricks, imported at the first build, quietly."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore', ImportWarning)
        from mmcv.cnn import ConvModule, build_norm_layer  # noqa: F401
        from mmcv.cnn.bricks.drop import build_dropout  # noqa: F401
        from mmcv.cnn.bricks.transformer import FFN  # noqa: F401
    return types.SimpleNamespace(**locals())


def check_norm_cfg(name: str, cfg: Optional[Dict]) -> None:
    """An unregistered norm ``type`` names the known norms."""
    if cfg is not None and (not hasattr(cfg, 'get') or 'type' not in cfg):
        raise TypeError(f'SOFT: {name} must be a dict with a "type" (e.g. '
                        f"dict(type='LN')), got {cfg!r}")
    if cfg is None or not isinstance(cfg['type'], str):
        return  # a class: mmcv checks it when building
    mmcv_bricks()  # registers mmcv's norms
    from mmengine.registry import MODELS
    with MODELS.switch_scope_and_registry(None) as registry:
        if registry.get(cfg['type']) is not None:
            return
    known = sorted(k for k, c in MODELS.module_dict.items()
                   if isinstance(c, type) and issubclass(c, nn.Module)
                   and 'Norm' in c.__name__)
    raise KeyError(f'SOFT: {name} has type {cfg["type"]!r}, which is not a '
                   f'registered norm layer; known norms: {", ".join(known)}')


def build_norm(cfg: Dict, num_features: int) -> nn.Module:
    """The norm layer of ``cfg`` (mmcv ``build_norm_layer``)."""
    return mmcv_bricks().build_norm_layer(cfg, num_features)[1]


def residual_drop_cfg(rate, residual_drop='drop_path') -> Optional[Dict]:
    """``DropPath`` or ``Dropout`` of ``rate`` (None for 0)."""
    if residual_drop not in RESIDUAL_DROPS:
        raise ValueError(f'residual_drop must be one of {RESIDUAL_DROPS}, '
                         f'got {residual_drop!r}')
    if not rate:
        return None
    kind = 'DropPath' if residual_drop == 'drop_path' else 'Dropout'
    return dict(type=kind, drop_prob=float(rate))


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


class ConvPatchEmbed(nn.Module):
    """3x3 conv-norm-act layers: the C33 stem (strides 2, 1, 2) or one."""

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 stem: bool,
                 stem_channels: int = 32,
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None):
        super().__init__()
        kw = dict(norm_cfg=dict(type='BN') if norm_cfg is None else norm_cfg,
                  act_cfg=dict(type='ReLU') if act_cfg is None else act_cfg,
                  conv_cfg=dict(type=SafeConv2d), bias=True)  # yapf: disable
        chans = [in_channels] + [stem_channels] * 2 * stem + [embed_dims]
        self.proj = nn.Sequential()
        strides = (2, 1, 2) if stem else (2, )
        for cin, cout, stride in zip(chans, chans[1:], strides):
            # the default init from the stream an nn.Conv2d would draw
            with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
                warnings.filterwarnings('ignore', 'Unnecessary conv bias',
                                        UserWarning)
                layer = mmcv_bricks().ConvModule(cin, cout, 3, stride, 1, **kw)
            layer.conv.reset_parameters()
            self.proj.append(layer)

    def forward(self, x: torch.Tensor):
        x = self.proj(x)
        return x.flatten(2).transpose(1, 2), (x.shape[2], x.shape[3])


class SOFTBlock(nn.Module):
    """Post-norm: x = LN(x + drop(Attn(x))); x = LN(x + drop(FFN(x)))."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 sampling_ratio: int,
                 dw_kernel_size: int = 3,
                 attn_cfg: Optional[Dict] = None,
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
        attn_cfg = dict(type='SOFTAttention') if attn_cfg is None else attn_cfg
        cfg = dict(embed_dims=embed_dims, num_heads=num_heads,
                   sampling_ratio=sampling_ratio, qkv_bias=qkv_bias,
                   dw_kernel_size=dw_kernel_size)  # yapf: disable
        cfg.update(attn_cfg, _scope_='mmsoft')  # no mmdet / mmseg child here
        self.attn = ATTENTIONS.build(cfg)
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
    """Pre-norm: x += DP(Attn(LN(x))); x += DP(MLP(LN(x)))."""

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


class PyramidStage(nn.Module):
    """Patch embedding, position embedding, blocks, norm."""

    def __init__(self,
                 in_channels: int,
                 embed_dims: int,
                 pos_grid: int,
                 stem: bool = False,
                 num_extra_tokens: int = 0,
                 drop_rate: float = 0.,
                 patch_norm_cfg: Optional[Dict] = None,
                 patch_act_cfg: Optional[Dict] = None):
        super().__init__()
        self.num_extra_tokens = num_extra_tokens
        self.with_cp = False
        self.patch_embed = ConvPatchEmbed(
            in_channels,
            embed_dims,
            stem,
            norm_cfg=patch_norm_cfg,
            act_cfg=patch_act_cfg)
        self.pos_embed = nn.Parameter(
            torch.zeros(1, pos_grid * pos_grid + num_extra_tokens, embed_dims))
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 \
            else nn.Identity()
        self.blocks = nn.ModuleList()
        self.norm = nn.Identity()

    def forward(self, x: torch.Tensor):
        x, hw = self.patch_embed(x)
        B, e = x.shape[0], self.num_extra_tokens
        pos, g = self.pos_embed, math.isqrt(self.pos_embed.shape[1] - e)
        if (g, g) != tuple(hw):  # resized to the H x W map
            grid = pos[:, e:].reshape(1, g, g, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(
                grid, size=hw, mode='bilinear', align_corners=False)
            pos = torch.cat([pos[:, :e], grid.flatten(2).transpose(1, 2)], 1)
        if e:
            x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
        x = self.pos_drop(x + pos)
        for blk in self.blocks:
            x = cp.checkpoint(blk, x, hw, use_reentrant=False) \
                if self.with_cp and x.requires_grad else blk(x, hw)
        x = self.norm(x)
        fmap = x[:, e:].transpose(1, 2).reshape(B, -1, *hw)
        return fmap, (x[:, 0] if e else None)


class SOFTStage(PyramidStage):
    """Stages 1-3: ``depth`` :class:`SOFTBlock`."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 depth: int,
                 sampling_ratio: int,
                 dw_kernel_size: int,
                 mlp_ratio: float,
                 attn_cfg: Dict,
                 qkv_bias: bool,
                 drop_path_rates: Sequence[float],
                 residual_drop: str = 'drop_path',
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None,
                 **kwargs):
        super().__init__(embed_dims=embed_dims, **kwargs)
        self.blocks.extend(
            SOFTBlock(embed_dims, num_heads, sampling_ratio, dw_kernel_size,
                      attn_cfg, qkv_bias, mlp_ratio, drop_path_rates[j],
                      residual_drop, norm_cfg, act_cfg) for j in range(depth))


class ClsTokenStage(PyramidStage):
    """Stage 4 ("sp. 1x1, w. cls token"): softmax blocks and a norm."""

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 depth: int,
                 mlp_ratio: float,
                 qkv_bias: bool,
                 attn_drop_rate: float,
                 drop_path_rates: Sequence[float],
                 drop_rate: float = 0.,
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None,
                 **kwargs):
        super().__init__(
            embed_dims=embed_dims, num_extra_tokens=1, drop_rate=drop_rate,
            **kwargs)  # yapf: disable
        norm_cfg = dict(type='LN', eps=1e-6) if norm_cfg is None else norm_cfg
        self.blocks.extend(
            SoftmaxBlock(embed_dims, num_heads, mlp_ratio, qkv_bias, drop_rate,
                         attn_drop_rate, drop_path_rates[j], norm_cfg, act_cfg)
            for j in range(depth))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.norm = build_norm(norm_cfg, embed_dims)


STAGE_TYPES = {'SOFTStage': SOFTStage, 'ClsTokenStage': ClsTokenStage}
#: the stage settings from ``arch``, not ``stage_cfgs``
ARCH_KEYS = ('type', 'in_channels', 'embed_dims', 'num_heads', 'depth')


@register_model
class SOFT(BaseModule):
    """SOFT: softmax-free vision transformer with a 4-stage pyramid.

    Args:
        arch (str | dict): an ``arch_zoo`` preset or a dict (+ defaults).
        attn_cfg (dict): the mixer of stages 1-3 (``ATTENTIONS``).
        out_type (str): ``'featmap'`` or ``'cls_token'`` (stage 4).
        drop_path_rate (float): rising linearly; stages 1-3: residual_drop.
        norm_cfg, act_cfg (dict): the blocks'; ``patch_*``: the stems'.
        frozen_stages (int): -1 none; 0 the stem; k >= 1 stages 1..k.
        stage_cfgs (dict | list[dict]): merged over each stage's (Swin's).
    """

    arch_zoo = ARCH_ZOO
    arch_defaults = ARCH_DEFAULTS
    num_stages = NUM_STAGES
    stage_types = ('SOFTStage', 'SOFTStage', 'SOFTStage', 'ClsTokenStage')
    OUT_TYPES = ('featmap', 'cls_token')

    def __init__(self,
                 arch: Union[str, Dict] = 'tiny',
                 attn_cfg: Dict = dict(type='SOFTAttention'),
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
                 out_type: str = 'featmap',
                 pretrain_img_size: int = 224,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 residual_drop: str = 'drop_path',
                 norm_cfg: Optional[Dict] = None,
                 act_cfg: Optional[Dict] = None,
                 patch_norm_cfg: Optional[Dict] = None,
                 patch_act_cfg: Optional[Dict] = None,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 stage_cfgs: Union[Dict, Sequence[Dict]] = dict(),
                 init_cfg: Optional[Union[Dict, List[Dict]]] = None):
        super().__init__(init_cfg=init_cfg)
        n = self.num_stages
        check_int('SOFT: in_channels', in_channels)
        check_int('SOFT: pretrain_img_size', pretrain_img_size, minimum=32)
        drop_rate, attn_drop_rate, drop_path_rate = (check_rate(
            f'SOFT: {k}', r) for k, r in (('drop_rate', drop_rate),
                                          ('attn_drop_rate', attn_drop_rate),
                                          ('drop_path_rate', drop_path_rate)))
        self.out_type = check_choice('out_type', out_type, self.OUT_TYPES)
        if check_int('SOFT: frozen_stages', frozen_stages, minimum=-1) > n:
            raise ValueError(f'frozen_stages must be in [-1, {n}], got '
                             f'{frozen_stages}')
        self.frozen_stages, self.norm_eval = frozen_stages, norm_eval
        self.pretrain_img_size = pretrain_img_size
        self.arch_settings = a = self._parse_arch(arch)
        self.embed_dims, self.num_heads, self.depths = \
            a['embed_dims'], a['num_heads'], a['depths']
        out_indices = [out_indices] if isinstance(out_indices, int) \
            else list(out_indices)
        if not out_indices:
            raise ValueError(f'out_indices is empty; SOFT needs at least one '
                             f'output stage (0-{n - 1})')
        for idx in out_indices:
            if not -n <= idx < n:
                raise ValueError(f'out_indices entry {idx} is out of range; '
                                 f'SOFT has stages 0..{n - 1}')
        self.out_indices = tuple(sorted({idx % n for idx in out_indices}))
        for name, value in (('attn_cfg', attn_cfg), ('norm_cfg', norm_cfg),
                            ('act_cfg', act_cfg)):
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f'SOFT: {name} must be a dict (one stage\'s '
                                f'own: stage_cfgs[i][{name!r}]), got '
                                f'{value!r}')
        check_norm_cfg('norm_cfg', norm_cfg)
        check_norm_cfg('patch_norm_cfg', patch_norm_cfg)
        shared = isinstance(stage_cfgs, Mapping)  # for every stage
        if not shared and not (isinstance(stage_cfgs, (list, tuple))
                               and len(stage_cfgs) == n and all(
                                   isinstance(c, Mapping)
                                   for c in stage_cfgs)):
            raise ValueError(f'SOFT: stage_cfgs must be a dict (for every '
                             f'stage) or a list of {n} dicts (one per '
                             f'stage), got {stage_cfgs!r}')
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        self.stage_cfgs, self.stages, prev = [], nn.ModuleList(), in_channels
        for i, kind in enumerate(self.stage_types):
            depth, cur = self.depths[i], sum(self.depths[:i])
            # yapf: disable
            cfg = dict(
                type=kind, in_channels=prev, embed_dims=self.embed_dims[i],
                pos_grid=pretrain_img_size // (4 * 2**i),
                num_heads=self.num_heads[i], depth=depth,
                mlp_ratio=a['mlp_ratios'][i], qkv_bias=qkv_bias,
                drop_path_rates=dpr[cur:cur + depth], stem=i == 0,
                drop_rate=drop_rate, norm_cfg=norm_cfg, act_cfg=act_cfg,
                patch_norm_cfg=patch_norm_cfg, patch_act_cfg=patch_act_cfg,
                **(dict(sampling_ratio=a['sampling_ratios'][i],
                        dw_kernel_size=a['dw_kernel_sizes'][i],
                        attn_cfg=attn_cfg, residual_drop=residual_drop)
                   if kind == 'SOFTStage' else
                   dict(attn_drop_rate=attn_drop_rate)))
            # yapf: enable
            name = 'stage_cfgs' if shared else f'stage_cfgs[{i}]'
            user = stage_cfgs if shared else stage_cfgs[i]
            user = {k: v for k, v in user.items() if k in cfg or not shared}
            fixed = [k for k in user if k in ARCH_KEYS]
            if fixed:
                raise ValueError(f'SOFT: {name} sets {fixed[0]!r}, which '
                                 f'comes from arch; set it there')
            unknown = sorted(set(user) - set(cfg))
            if unknown:
                raise ValueError(
                    f'SOFT: {name} has unknown keys {unknown}; a {kind} '
                    f'takes {", ".join(sorted(set(cfg) - set(ARCH_KEYS)))}')
            cfg = copy.deepcopy({**cfg, **user})  # Swin's stage_cfgs merge
            if len(cfg['drop_path_rates']) != depth:
                raise ValueError(f'SOFT: {name}: drop_path_rates of stage '
                                 f'{i + 1} needs one value per block '
                                 f'({depth}), got {cfg["drop_path_rates"]!r}')
            check_int(f'SOFT: {name}: pos_grid of stage {i + 1}',
                      cfg['pos_grid'])
            self.stage_cfgs.append(cfg)
            prev = cfg['embed_dims']
        unknown = sorted(set(stage_cfgs) - set().union(*self.stage_cfgs)) \
            if shared else []
        if unknown:
            raise ValueError(f'SOFT: stage_cfgs has unknown keys {unknown}; '
                             f'no stage takes them')
        for cfg in self.stage_cfgs:
            cfg = dict(cfg)
            self.stages.append(STAGE_TYPES[cfg.pop('type')](**cfg))
            self.stages[-1].with_cp = with_cp
        self._freeze_stages()

    def _parse_arch(self, arch) -> Dict:
        required, n = ('embed_dims', 'num_heads', 'depths'), self.num_stages
        if isinstance(arch, str):
            if arch.lower() not in self.arch_zoo:
                raise ValueError(f'unknown SOFT arch {arch!r}; valid presets: '
                                 f'{sorted(self.arch_zoo)} (or pass a dict)')
            arch = self.arch_zoo[arch.lower()]
        elif not isinstance(arch, dict):
            raise TypeError(f'SOFT arch must be a str or dict, got '
                            f'{type(arch).__name__}')
        missing = [k for k in required if k not in arch]
        if missing:
            raise ValueError(f'SOFT arch dict is missing {missing[0]!r}; it '
                             f'needs {", ".join(required)}')
        a = copy.deepcopy(arch)
        for k, v in self.arch_defaults.items():
            a.setdefault(k, list(v))
        unknown = set(a) - {*required, *self.arch_defaults}
        if unknown:
            raise ValueError(f'SOFT arch dict has unknown keys '
                             f'{sorted(unknown)}; valid keys are '
                             f'{", ".join([*required, *self.arch_defaults])}')
        for key, val in a.items():
            if not isinstance(val, (list, tuple)) or len(val) != n:
                raise ValueError(f'SOFT arch[{key!r}] must be a list of {n} '
                                 f'values (one per stage), got {val!r}')
        if any(d < 1 for d in a['depths']):
            raise ValueError(f'SOFT arch: every depth must be >= 1, got '
                             f'{a["depths"]}')
        for i, (c, h, k, r, e) in enumerate(
                zip(*(a[key]
                      for key in ('embed_dims', 'num_heads', 'dw_kernel_sizes',
                                  'sampling_ratios', 'mlp_ratios')))):
            if h <= 0 or c % h != 0:
                raise ValueError(f'SOFT arch: num_heads[{i}]={h} does not '
                                 f'divide embed_dims[{i}]={c}')
            if self.stage_types[i] != 'SOFTStage' and k is not None:
                raise ValueError(f"SOFT arch['dw_kernel_sizes'][{i}] must "
                                 f'be None: stage {i + 1} is a '
                                 f'{self.stage_types[i]}, which takes no '
                                 f'dw_kernel_size; got {k!r}')
            if k is not None:
                check_kernel_size(f'SOFT arch: dw_kernel_sizes[{i}]', k)
            check_int(f'SOFT arch: sampling_ratios[{i}]', r)
            if isinstance(e, bool) or not isinstance(e, (int, float)) or \
                    e <= 0:
                raise ValueError(f'SOFT arch: mlp_ratios[{i}] must be a '
                                 f'positive number, got {e!r}')
        return a

    @property
    def out_channels(self) -> List[int]:
        """Channels of each output (necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    def init_weights(self):
        """The official init (truncated normal 0.02), then ``init_cfg``."""
        if self.is_init:  # mmengine warns and does nothing
            return super().init_weights()
        self.init_cfg, loads_all = pretrained_init_cfg(self.init_cfg)
        if not loads_all:  # else every tensor is loaded
            for m in self.modules():
                if isinstance(m, nn.Linear):
                    trunc_normal_(m.weight, std=.02)
                    if m.bias is not None:
                        nn.init.zeros_(m.bias)
                elif isinstance(m, nn.LayerNorm):
                    nn.init.ones_(m.weight)
                    nn.init.zeros_(m.bias)
            for stage in self.stages:
                trunc_normal_(stage.pos_embed, std=.02)
                if hasattr(stage, 'cls_token'):
                    trunc_normal_(stage.cls_token, std=.02)
        super().init_weights()  # init_cfg, the pretrained load last

    def _freeze_stages(self):
        first, k = self.stages[0], self.frozen_stages  # 0: the stem alone
        frozen, params = ([first.patch_embed], [first.pos_embed]) if k == 0 \
            else (list(self.stages[:max(k, 0)]), [])
        for m in frozen:
            m.eval()
            params += list(m.parameters())
        for p in params:
            p.requires_grad = False

    def train(self, mode: bool = True):
        super().train(mode)
        self._freeze_stages()
        if mode and self.norm_eval:
            for m in self.modules():
                if isinstance(m, _BatchNorm):
                    m.eval()
        return self

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f'SOFT expects a (B, C, H, W) tensor, got a '
                            f'{type(x).__name__}; stack the images first '
                            f'(torch.stack)')
        if x.dim() != 4:
            raise ValueError(f'SOFT expects (B, C, H, W) images, got shape '
                             f'{tuple(x.shape)}')
        outs, hw = [], x.shape[2:]
        for i, cfg in enumerate(self.stage_cfgs if not len(x) else ()):
            for _ in range(1 + cfg['stem']):  # ceil(H / 2) per stride 2
                hw = [(side + 1) // 2 for side in hw]
            cls = self.stages[i].num_extra_tokens and \
                self.out_type == 'cls_token'
            if i in self.out_indices:  # an empty batch: empty outputs
                outs.append(
                    x.new_zeros(0, self.embed_dims[i], *[] if cls else hw))
        if outs:
            return tuple(outs)
        for i in range(self.out_indices[-1] + 1):  # later stages unneeded
            try:
                x, cls = self.stages[i](x)
            except ValueError as e:
                if 'Expected more than 1 value per channel' not in str(e):
                    raise
                B, _, H, W = x.shape
                raise ValueError(
                    f'SOFT stage {i + 1}: in training mode its patch-'
                    f'embedding BatchNorm sees one value per channel (batch '
                    f'size {B}, a 1 x 1 map from the '
                    f"stage's {H} x {W} input), where batch statistics are "
                    f'undefined. Train with a batch size >= 2 or larger '
                    f'images, or set norm_eval=True (BatchNorm uses its '
                    f'running statistics) or patch_norm_cfg='
                    f"dict(type='GN', num_groups=1) on the backbone") from None
            if i in self.out_indices:
                use_cls = cls is not None and self.out_type == 'cls_token'
                outs.append(cls if use_cls else x)
        return tuple(outs)
