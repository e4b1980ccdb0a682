"""The SOFT backbone family (NeurIPS 2021 Table 2, IJCV 2024 Table 2).

The backbone is a pyramid of four :class:`PyramidStage` modules:
:class:`SOFTStage` (stages 1-3: softmax-free attention, or any attention of
the zoo through ``attn_cfg``) and :class:`ClsTokenStage` (stage 4: softmax
attention with a cls token). Each stage owns its patch embedding, position
embedding and blocks, built from the per-stage config the backbone
computes, with the user's ``stage_cfgs`` merged over it (as mmpretrain's
Swin). Every option is checked at construction: one error naming the
option, what it got and what to write instead.
"""
import copy
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch.nn.modules.batchnorm import _BatchNorm

from mmsoft.registry import register_model
from ..arch_zoo import ARCH_DEFAULTS, ARCH_ZOO, NUM_STAGES
from ..converters import upgrade_legacy_state_dict
from ..layers.blocks import (ConvPatchEmbed, SOFTBlock, SoftmaxBlock,
                             build_norm, check_norm_cfg)
from ..layers.checks import (check_choice, check_int, check_kernel_size,
                             check_rate)
from ..loading import pretrained_init_cfg

__all__ = ['SOFT', 'PyramidStage', 'SOFTStage', 'ClsTokenStage']


class PyramidStage(nn.Module):
    """One level of the pyramid: patch embedding, (extra tokens), position
    embedding, blocks.

    ``forward(x)`` takes the (B, C_in, H, W) map of the previous level (the
    image for stage 1) and returns the (B, C, H', W') map of this level and
    the extra token (B, C) when the stage has one (else None).

    Args:
        in_channels (int): channels of the input map.
        embed_dims (int): channels C of this level.
        pos_grid (int): side g of the g x g position-embedding grid learned
            at the pretraining size; bilinearly interpolated to any size.
        stem (bool): the C33-BN-ReLU stem of stride 4 (stage 1) instead of
            one C31-BN-ReLU of stride 2. Default: False.
        num_extra_tokens (int): tokens prepended before the position
            embedding (1: the cls token of stage 4). Default: 0.
        drop_rate (float): dropout after the position embedding. Default: 0.
        patch_norm_cfg (dict, optional): norm of the patch-embedding convs
            (``ConvModule``). Default: None (``dict(type='BN')``).
        patch_act_cfg (dict, optional): their activation. Default: None
            (``dict(type='ReLU')``).
    """

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
        self.embed_dims = embed_dims
        self.num_extra_tokens = num_extra_tokens
        self.with_cp = False
        self.patch_embed = ConvPatchEmbed(
            in_channels,
            embed_dims,
            stem=stem,
            norm_cfg=patch_norm_cfg,
            act_cfg=patch_act_cfg)
        self.pos_embed = nn.Parameter(
            torch.zeros(1, pos_grid * pos_grid + num_extra_tokens, embed_dims))
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 \
            else nn.Identity()
        self.blocks = nn.ModuleList()

    def pos_embedding(self, hw: Tuple[int, int]) -> torch.Tensor:
        """(1, extra + H*W, C): the position embedding for an H x W map."""
        e = self.num_extra_tokens
        extra, pos = self.pos_embed[:, :e], self.pos_embed[:, e:]
        g = math.isqrt(pos.shape[1])  # a square grid (__init__)
        if (g, g) != tuple(hw):
            grid = pos.reshape(1, g, g, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(
                grid, size=hw, mode='bilinear', align_corners=False)
            pos = grid.flatten(2).transpose(1, 2)
        return torch.cat([extra, pos], dim=1) if e else pos

    def _extra_tokens(self, B: int) -> Optional[torch.Tensor]:
        return None

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def forward(self, x: torch.Tensor):
        x, hw = self.patch_embed(x)
        B = x.shape[0]
        extra = self._extra_tokens(B)
        if extra is not None:
            x = torch.cat([extra, x], dim=1)
        x = self.pos_drop(x + self.pos_embedding(hw))
        for blk in self.blocks:
            if self.with_cp and x.requires_grad:
                x = cp.checkpoint(blk, x, hw, use_reentrant=False)
            else:
                x = blk(x, hw)
        x = self._finish(x)
        e = self.num_extra_tokens
        fmap = x[:, e:].transpose(1, 2).reshape(B, -1, *hw)
        return fmap, (x[:, 0] if e else None)


class SOFTStage(PyramidStage):
    """Stages 1-3: ``depth`` :class:`SOFTBlock` around the token mixer
    ``attn_cfg`` (SOFT attention by default).

    ``drop_path_rates`` holds the residual drop rate of each block; the other
    arguments are those of :class:`SOFTBlock` (``sampling_ratio`` ...
    ``act_cfg``) and, in ``**kwargs``, of :class:`PyramidStage`.
    """

    def __init__(self,
                 embed_dims: int,
                 num_heads: int,
                 depth: int,
                 sampling_ratio: int,
                 dw_kernel_size: int,
                 mlp_ratio: float,
                 attn_cfg: dict,
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
    """Stage 4 ("sp. 1x1, w. cls token"): a cls token, ``depth`` pre-norm
    :class:`SoftmaxBlock` and a final norm ``norm`` (of ``norm_cfg``,
    default ``dict(type='LN', eps=1e-6)``, as the blocks').

    ``drop_path_rates`` holds the stochastic depth rate of each block; the
    other arguments are those of :class:`SoftmaxBlock` and, in
    ``**kwargs``, of :class:`PyramidStage`.
    """

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
            embed_dims=embed_dims,
            num_extra_tokens=1,
            drop_rate=drop_rate,
            **kwargs)
        norm_cfg = dict(type='LN', eps=1e-6) if norm_cfg is None else norm_cfg
        self.blocks.extend(
            SoftmaxBlock(embed_dims, num_heads, mlp_ratio, qkv_bias, drop_rate,
                         attn_drop_rate, drop_path_rates[j], norm_cfg, act_cfg)
            for j in range(depth))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dims))
        self.norm = build_norm(norm_cfg, embed_dims)

    def _extra_tokens(self, B: int) -> torch.Tensor:
        return self.cls_token.expand(B, -1, -1)

    def _finish(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(x)


#: the stage types of :attr:`SOFT.stage_types`
STAGE_TYPES = {'SOFTStage': SOFTStage, 'ClsTokenStage': ClsTokenStage}


@register_model
class SOFT(BaseModule):
    """SOFT: softmax-free vision transformer with a 4-stage pyramid.

    Stages 1-3 (:class:`SOFTStage`) stack :class:`SOFTBlock` (linear-
    complexity softmax-free attention with a bottleneck of m = 49 tokens at
    224 x 224); stage 4 (:class:`ClsTokenStage`) is a pre-norm
    softmax-attention stage with a cls token. Outputs are at strides
    4 / 8 / 16 / 32.

    Args:
        arch (str | dict): a preset of :attr:`arch_zoo` (``'tiny'``,
            ``'small'``, ``'medium'``, ``'large'``, ``'huge'``, or their
            aliases ``'t'``, ``'s'``, ``'m'``, ``'l'``, ``'h'``, and
            ``'small-official'``, the depths [1, 3, 20, 4] of the official
            ``soft_small`` weights), or a dict with ``embed_dims``,
            ``num_heads``, ``depths`` and optionally ``sampling_ratios``
            (default [8, 4, 2, 1]), ``mlp_ratios`` (default [4, 4, 4, 4])
            and ``dw_kernel_sizes`` (default [9, 5, 3, None]), 4 entries
            each. Default: 'tiny'.
        attn_cfg (dict | list[dict | None]): the token mixer of stages 1-3,
            ``dict(type=..., **options)`` from
            :data:`mmsoft.registry.ATTENTIONS` (see
            :mod:`~mmsoft.models.layers.attention_zoo`): one dict or a list
            of four, the 4th None.
            Default: ``dict(type='SOFTAttention')``, the IJCV
            ``soft_norm_*`` attention (``attn_norm=False``: NeurIPS
            ``soft_*``; the options are those of
            :class:`~mmsoft.models.layers.SOFTAttention`).
        in_channels (int): image channels. Default: 3.
        out_indices (int | Sequence[int]): stages (0-3) whose outputs are
            returned. Default: (0, 1, 2, 3).
        out_type (str): ``'featmap'`` - (B, C, H/s, W/s) maps, for mmdet /
            mmseg; ``'cls_token'`` - stage 4 returns the normalised (B, C)
            cls token, for mmpretrain classifiers (other stages still
            return maps). Default: 'featmap'.
        pretrain_img_size (int): image size the position embeddings were
            learned at (their grids are size/4, /8, /16, /32); they are
            bilinearly interpolated to any input size. Default: 224.
        qkv_bias (bool): biases of the q / k / v projections of every
            attention. Default: True.
        drop_rate (float): dropout after the position embeddings and in
            the stage-4 attention projections and MLPs. Default: 0.
        attn_drop_rate (float): dropout on the stage-4 attention weights.
            Default: 0.
        drop_path_rate (float): stochastic depth rate, increasing linearly
            from 0 over all blocks. Default: 0.
        residual_drop (str): how stages 1-3 apply that rate: 'drop_path'
            (stochastic depth, mmcv ``DropPath``) or 'dropout' (the
            official training recipe: an element-wise ``nn.Dropout`` of that
            rate on the residual branches; stage 4 always uses drop path).
            Default: 'drop_path'.
            Every dropout and drop path (``drop_rate``, ``attn_drop_rate``,
            ``drop_path_rate``) acts in training mode only: in eval mode
            the outputs are deterministic (bitwise repeatable).
        norm_cfg (dict | list[dict], optional): the norms of the transformer
            blocks, one dict for all stages or a list of four (None entries
            keep the stage default). Default: None, the official norms:
            ``dict(type='LN')`` in stages 1-3 and ``dict(type='LN',
            eps=1e-6)`` in stage 4 (its blocks and final norm).
        act_cfg (dict | list[dict], optional): the FFN activations, as
            ``norm_cfg``. Default: None: ``dict(type='GELU',
            approximate='tanh')`` in stages 1-3, ``dict(type='GELU')`` in
            stage 4.
        patch_norm_cfg (dict): norm of the patch-embedding convs
            (``ConvModule``), e.g. ``dict(type='SyncBN')``. Default:
            ``dict(type='BN')``.
        patch_act_cfg (dict): their activation. Default:
            ``dict(type='ReLU')``.
        frozen_stages (int): the parameters that stop training
            (``requires_grad=False``), their modules kept in eval mode
            (BatchNorm statistics, dropouts) by :meth:`train`: -1 none; 0
            the stem, ``stages.0.patch_embed.*`` and ``stages.0.pos_embed``
            (stage 1's blocks train); k >= 1 every parameter of stages
            1..k, ``stages.0.*`` .. ``stages.{k-1}.*`` (patch embedding,
            position embedding, blocks; stage 4 also ``cls_token`` and the
            final ``norm``). Default: -1.
        norm_eval (bool): keep every BatchNorm layer of the backbone (those
            of the patch embeddings) in eval mode while training: their
            running statistics do not change; LayerNorms are unaffected.
            Default: False.
        with_cp (bool): gradient checkpointing of every block. Default:
            False.
        stage_cfgs (dict | Sequence[dict]): Extra config dict for each
            stage, merged into (and overriding) the config the backbone
            computes for it (:attr:`stage_cfgs`): one dict for every stage
            (each stage takes the keys its type has, e.g.
            ``dw_kernel_size`` only the :class:`SOFTStage`) or a list of
            four, one per stage (every key an argument of that stage's
            type). ``embed_dims``, ``num_heads`` and ``depth`` come from
            ``arch``. Default: an empty dict.
        init_cfg (dict | list[dict], optional): mmengine init config, e.g.
            ``dict(type='Pretrained', checkpoint='soft_tiny.pth',
            prefix='backbone.')``. Default: None.

    Examples:
        >>> import torch
        >>> from mmsoft.models import SOFT
        >>> # stage 3: 7 x 7 depthwise convs, dropout on its residuals
        >>> model = SOFT('tiny', stage_cfgs=[
        ...     {}, {}, dict(dw_kernel_size=7, residual_drop='dropout'), {}])
        >>> [o.shape[1] for o in model(torch.rand(1, 3, 224, 224))]
        [64, 128, 320, 512]

    Any input size: each stage has ceil(H_prev / 2) rows; the bottleneck
    grid is ``max(1, H // r) x max(1, W // r)``
    (:func:`~mmsoft.models.layers.landmark_grid`). Checkpoints of version 3
    name tensors by stage (``stages.0.blocks.1.*``, mmcv FFN
    ``ffn.layers.0.0.*``); versions 1 and 2 load unchanged
    (:meth:`upgrade_state_dict`).
    """

    _version = 3

    #: presets (Table 2) under their names and aliases, as Swin's
    #: ``arch_zoo`` (an alias maps to the same dict; :meth:`arch_presets`
    #: lists each preset once); the data is :mod:`mmsoft.models.arch_zoo`
    arch_zoo = ARCH_ZOO
    #: the stage type of each pyramid level (keys of :data:`STAGE_TYPES`)
    stage_types = ('SOFTStage', 'SOFTStage', 'SOFTStage', 'ClsTokenStage')
    arch_defaults = ARCH_DEFAULTS
    num_stages = NUM_STAGES
    OUT_TYPES = ('featmap', 'cls_token')
    #: the SOFT-attention options the backbone took before ``attn_cfg``
    #: (mmsoft 0.1); see :meth:`check_legacy_options`
    LEGACY_ATTN_ARGS = ('attn_type', 'attn_norm', 'sampling', 'nr_iters',
                        'nr_init', 'nr_method', 'nr_backward',
                        'nr_diagnostics', 'max_landmarks')

    def __init__(self,
                 arch: Union[str, Dict] = 'tiny',
                 attn_cfg: Union[Dict, Sequence[Optional[Dict]], None] = None,
                 in_channels: int = 3,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
                 out_type: str = 'featmap',
                 pretrain_img_size: int = 224,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 residual_drop: str = 'drop_path',
                 norm_cfg: Union[Dict, Sequence[Optional[Dict]], None] = None,
                 act_cfg: Union[Dict, Sequence[Optional[Dict]], None] = None,
                 patch_norm_cfg: Optional[Dict] = None,
                 patch_act_cfg: Optional[Dict] = None,
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 stage_cfgs: Union[Dict, Sequence[Dict]] = dict(),
                 init_cfg: Optional[Union[Dict, List[Dict]]] = None,
                 **legacy):
        super().__init__(init_cfg=init_cfg)
        self.check_legacy_options(legacy)
        n = self.num_stages
        check_int('SOFT: in_channels', in_channels)
        check_int('SOFT: pretrain_img_size', pretrain_img_size, minimum=32)
        drop_rate, attn_drop_rate, drop_path_rate = (check_rate(
            f'SOFT: {k}', r) for k, r in (('drop_rate', drop_rate),
                                          ('attn_drop_rate', attn_drop_rate),
                                          ('drop_path_rate', drop_path_rate)))
        check_choice('out_type', out_type, self.OUT_TYPES)
        check_int('SOFT: frozen_stages', frozen_stages, minimum=-1)
        if frozen_stages > n:
            raise ValueError(f'frozen_stages must be in [-1, {n}], got '
                             f'{frozen_stages}')
        self.arch_settings = a = self._parse_arch(arch)
        self.out_indices = self._parse_out_indices(out_indices)
        self.embed_dims, self.num_heads, self.depths = \
            a['embed_dims'], a['num_heads'], a['depths']
        self.out_type = out_type
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.pretrain_img_size = pretrain_img_size

        norm_cfgs = _per_stage('norm_cfg', norm_cfg, n)
        for i, cfg in enumerate(norm_cfgs):
            check_norm_cfg(
                'norm_cfg'
                if isinstance(norm_cfg, Mapping) else f'norm_cfg[{i}]', cfg)
        check_norm_cfg('patch_norm_cfg', patch_norm_cfg)
        act_cfgs = _per_stage('act_cfg', act_cfg, n)
        attn_cfgs = self._parse_attn_cfg(attn_cfg)
        # the config of each stage, computed, then the user's stage_cfgs
        # merged over it (mmpretrain Swin's ``stage_cfgs``)
        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        self.stage_cfgs, prev, cur = [], in_channels, 0
        for i, kind in enumerate(self.stage_types):
            depth = self.depths[i]
            cfg = dict(
                type=kind,
                in_channels=prev,
                embed_dims=self.embed_dims[i],
                pos_grid=pretrain_img_size // (4 * 2**i),
                num_heads=self.num_heads[i],
                depth=depth,
                mlp_ratio=a['mlp_ratios'][i],
                qkv_bias=qkv_bias,
                drop_path_rates=dpr[cur:cur + depth],
                stem=i == 0,
                drop_rate=drop_rate,
                norm_cfg=norm_cfgs[i],
                act_cfg=act_cfgs[i],
                patch_norm_cfg=patch_norm_cfg,
                patch_act_cfg=patch_act_cfg)
            if kind == 'SOFTStage':
                cfg.update(
                    sampling_ratio=a['sampling_ratios'][i],
                    dw_kernel_size=a['dw_kernel_sizes'][i],
                    attn_cfg=attn_cfgs[i],
                    residual_drop=residual_drop)
            else:
                cfg.update(attn_drop_rate=attn_drop_rate)
            self.stage_cfgs.append(cfg)
            prev, cur = cfg['embed_dims'], cur + depth
        for i, (cfg, user) in enumerate(
                zip(self.stage_cfgs, self._parse_stage_cfgs(stage_cfgs))):
            cfg.update(user)
            if len(cfg['drop_path_rates']) != self.depths[i]:
                raise ValueError(f'SOFT: stage_cfgs: drop_path_rates of '
                                 f'stage {i + 1} needs one value per block '
                                 f'({self.depths[i]}), got '
                                 f'{cfg["drop_path_rates"]!r}')
        self.stages = nn.ModuleList()
        for cfg in self.stage_cfgs:
            cfg = copy.deepcopy(cfg)
            stage = STAGE_TYPES[cfg.pop('type')](**cfg)
            stage.with_cp = with_cp
            self.stages.append(stage)
        self._freeze_stages()

    # ------------------------------------------------------------ options
    @classmethod
    def check_legacy_options(cls, legacy: Dict) -> None:
        """Options the backbone took before ``attn_cfg`` (mmsoft 0.1): one
        ``TypeError`` with the ``attn_cfg`` to write instead; other unknown
        options: a ``TypeError`` naming them."""
        if not legacy:
            return
        unknown = sorted(set(legacy) - set(cls.LEGACY_ATTN_ARGS))
        if unknown:
            raise TypeError(f'SOFT got unexpected arguments {unknown}')
        opts = {k: v for k, v in legacy.items() if k != 'attn_type'}
        attn_type = legacy.get('attn_type', 'soft')
        if attn_type == 'soft_norm':
            attn_type, opts['attn_norm'] = 'soft', True
        items = ''.join(f', {k}={v!r}' for k, v in opts.items())
        raise TypeError(f'SOFT no longer takes {sorted(legacy)}: the '
                        f'attention options moved into attn_cfg; write '
                        f'attn_cfg=dict(type={attn_type!r}{items})')

    def _soft_only(self, name: str, arg: str, values: Sequence, example: str,
                   error: type) -> None:
        """A per-stage setting only the SOFT stages take (``arg``): one
        entry per stage, None at the others; else ``error``."""
        n, kinds = self.num_stages, self.stage_types
        takes = [k == 'SOFTStage' for k in kinds]
        if len(values) == sum(takes) != n:
            i = takes.index(False)
            raise error(f'SOFT {name} has {len(values)} entries; give {n}, '
                        f'one per stage, with None for stage {i + 1} (a '
                        f'{kinds[i]}, which takes no {arg}): {example}')
        if len(values) != n:
            raise error(f'SOFT {name} must be a list of {n} values (one '
                        f'per stage), got {values!r}')
        for i, (t, v) in enumerate(zip(takes, values)):
            if not t and v is not None:
                raise error(f'SOFT {name}[{i}] must be None: stage {i + 1} '
                            f'is a {kinds[i]}, which takes no {arg}; got '
                            f'{v!r}')

    def _parse_arch(self, arch) -> Dict:
        """The settings of ``arch`` (a preset name or a dict), its optional
        keys filled from :attr:`arch_defaults`."""
        required = ('embed_dims', 'num_heads', 'depths')
        if isinstance(arch, str):
            if arch.lower() not in self.arch_zoo:
                raise ValueError(f'unknown SOFT arch {arch!r}; valid presets: '
                                 f'{sorted(self.arch_zoo)} (or pass a dict)')
            settings = copy.deepcopy(self.arch_zoo[arch.lower()])
        elif isinstance(arch, dict):
            settings = copy.deepcopy(arch)
            for key in required:
                if key not in settings:
                    raise ValueError(f'SOFT arch dict is missing {key!r}; it '
                                     f'needs {", ".join(required)}')
        else:
            raise TypeError(f'SOFT arch must be a str or dict, got '
                            f'{type(arch).__name__}')
        for k, v in self.arch_defaults.items():
            settings.setdefault(k, list(v))
        unknown = set(settings) - {*required, *self.arch_defaults}
        if unknown:
            raise ValueError(f'SOFT arch dict has unknown keys '
                             f'{sorted(unknown)}; valid keys are '
                             f'{", ".join([*required, *self.arch_defaults])}')
        kernels = settings['dw_kernel_sizes']
        if isinstance(kernels, (list, tuple)):
            self._soft_only("arch['dw_kernel_sizes']", 'dw_kernel_size',
                            kernels, f'dw_kernel_sizes={[*kernels, None]}',
                            ValueError)
        for key, val in settings.items():
            if not isinstance(val, (list, tuple)) or \
                    len(val) != self.num_stages:
                raise ValueError(f'SOFT arch[{key!r}] must be a list of '
                                 f'{self.num_stages} values (one per stage), '
                                 f'got {val!r}')
        for i, (c, h) in enumerate(
                zip(settings['embed_dims'], settings['num_heads'])):
            if h <= 0 or c % h != 0:
                raise ValueError(f'SOFT arch: num_heads[{i}]={h} does not '
                                 f'divide embed_dims[{i}]={c}')
        if any(d < 1 for d in settings['depths']):
            raise ValueError(f'SOFT arch: every depth must be >= 1, got '
                             f'{settings["depths"]}')
        for i, k in enumerate(kernels):
            if k is not None:
                check_kernel_size(f'SOFT arch: dw_kernel_sizes[{i}]', k)
        for i, r in enumerate(settings['sampling_ratios']):
            check_int(f'SOFT arch: sampling_ratios[{i}]', r)
        for i, e in enumerate(settings['mlp_ratios']):
            if isinstance(e, bool) or not isinstance(e, (int, float)) or \
                    e <= 0:
                raise ValueError(f'SOFT arch: mlp_ratios[{i}] must be a '
                                 f'positive number, got {e!r}')
        return settings

    def _parse_out_indices(self, out_indices) -> Tuple[int, ...]:
        """Sorted, unique stage indices (negative ones count from the
        end)."""
        n = self.num_stages
        if isinstance(out_indices, int):
            out_indices = [out_indices]
        out = []
        for idx in out_indices:
            j = idx + n if idx < 0 else idx
            if not 0 <= j < n:
                raise ValueError(f'out_indices entry {idx} is out of range; '
                                 f'SOFT has stages 0..{n - 1}')
            out.append(j)
        if not out:
            raise ValueError(f'out_indices is empty; SOFT needs at least one '
                             f'output stage (0-{n - 1})')
        return tuple(sorted(set(out)))

    def _parse_attn_cfg(self, attn_cfg) -> List[Optional[Dict]]:
        """One attention config per stage: ``attn_cfg`` (default SOFT
        attention) for the SOFT stages, None for the others."""
        n, kinds = self.num_stages, self.stage_types
        takes = [k == 'SOFTStage' for k in kinds]
        if attn_cfg is None:
            attn_cfg = dict(type='SOFTAttention')
        if isinstance(attn_cfg, (list, tuple)):
            self._soft_only('attn_cfg', 'attn_cfg', attn_cfg,
                            f'attn_cfg=[<your {len(attn_cfg)} dicts>, None]',
                            TypeError)
        attn_cfg = _per_stage('attn_cfg', attn_cfg, n)
        for i, (t, c) in enumerate(zip(takes, attn_cfg)):
            if t and c is None:
                raise TypeError(f'SOFT: attn_cfg[{i}] is None, but stage '
                                f'{i + 1} ({kinds[i]}) needs an attention '
                                f'dict')
        return [dict(c) if t else None for t, c in zip(takes, attn_cfg)]

    def _parse_stage_cfgs(self, stage_cfgs) -> List[Dict]:
        """The user's extra config of each stage: one dict for all stages
        (each stage takes the keys its type has) or a list of one dict per
        stage (every key a setting of that stage's type)."""
        n, computed = self.num_stages, self.stage_cfgs
        if isinstance(stage_cfgs, Mapping):
            _check_stage_keys('stage_cfgs', stage_cfgs, computed)
            return [{
                k: copy.deepcopy(v)
                for k, v in stage_cfgs.items() if k in cfg
            } for cfg in computed]
        if not isinstance(stage_cfgs, (list, tuple)) or \
                len(stage_cfgs) != n or \
                not all(isinstance(c, Mapping) for c in stage_cfgs):
            raise ValueError(f'SOFT: stage_cfgs must be a dict (for every '
                             f'stage) or a list of {n} dicts (one per '
                             f'stage), got {stage_cfgs!r}')
        for i, (user, cfg) in enumerate(zip(stage_cfgs, computed)):
            _check_stage_keys(f'stage_cfgs[{i}]', user, [cfg])
        return [copy.deepcopy(dict(c)) for c in stage_cfgs]

    @classmethod
    def arch_presets(cls) -> Tuple[str, ...]:
        """Each preset of :attr:`arch_zoo` once, by its full name."""
        names: Dict[int, str] = {}
        for name, spec in cls.arch_zoo.items():
            names.setdefault(id(spec), name)
        return tuple(names.values())

    @property
    def out_channels(self) -> List[int]:
        """Channels of each requested output (for necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    # ------------------------------------------------------- checkpoints
    @classmethod
    def upgrade_state_dict(cls,
                           state_dict: Mapping,
                           prefix: str = '') -> 'Dict':
        """Rename version-1 and -2 keys under ``prefix`` to version 3
        (:func:`mmsoft.models.converters.upgrade_legacy_state_dict`); other
        keys are kept as they are, in their order."""
        return upgrade_legacy_state_dict(state_dict, prefix, cls.num_stages)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict,
                              missing_keys, unexpected_keys, error_msgs):
        version = local_metadata.get('version', None)
        if version is None or version < 3:
            upgraded = self.upgrade_state_dict(state_dict, prefix)
            if list(upgraded) != list(state_dict):
                state_dict.clear()
                state_dict.update(upgraded)
        super()._load_from_state_dict(state_dict, prefix, local_metadata,
                                      strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------ init
    def init_weights(self):
        """Pretrained weights if ``init_cfg`` names a checkpoint, otherwise
        the official initialisation (truncated normal 0.02 for linear layers
        and embeddings). ``init_cfg=dict(type='Pretrained', checkpoint=None)``
        is accepted and means "no weights yet" (configs set it so that
        ``--cfg-options model.backbone.init_cfg.checkpoint=...`` works).

        ``Pretrained`` loads any layout (mmsoft, a whole classifier /
        detector / segmentor, the authors' ``soft_*`` / ``soft_norm_*``
        files) strictly, through :mod:`mmsoft.models.loading`
        (:func:`~mmsoft.models.loading.pretrained_init_cfg`): tensors that
        do not match the backbone raise
        :class:`mmsoft.utils.strict_load.CheckpointMismatchError`;
        ``strict=False`` allows intended partial loads (the rest keeps the
        official initialisation).
        """
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

    # ------------------------------------------------------------ freeze
    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        if self.frozen_stages == 0:  # the stem alone
            frozen = [self.stages[0].patch_embed]
            params = [self.stages[0].pos_embed]
        else:
            frozen = list(self.stages[:self.frozen_stages])
            params = []
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

    # ------------------------------------------------------------ forward
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f'SOFT expects a (B, C, H, W) tensor, got a '
                            f'{type(x).__name__}; stack the images first '
                            f'(torch.stack)')
        if x.dim() != 4:
            raise ValueError(f'SOFT expects (B, C, H, W) images, got shape '
                             f'{tuple(x.shape)}')
        if x.shape[0] == 0:
            return self._empty_outputs(x)
        outs = []
        for i in range(self.out_indices[-1] + 1):  # later stages unneeded
            try:
                x, cls = self.stages[i](x)
            except ValueError as e:
                if 'Expected more than 1 value per channel' not in str(e):
                    raise
                raise ValueError(_one_value_per_channel(i, x)) from None
            if i in self.out_indices:
                use_cls = cls is not None and self.out_type == 'cls_token'
                outs.append(cls if use_cls else x)
        return tuple(outs)

    def _empty_outputs(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """The outputs for an empty batch: every conv of the patch
        embeddings has kernel 3, stride 2 (the stem's middle conv stride
        1) and padding 1, so each stage has ceil(H_prev / 2) rows."""
        H, W = x.shape[2:]
        outs = []
        for i, cfg in enumerate(self.stage_cfgs):
            for _ in range(2 if cfg['stem'] else 1):
                H, W = (H + 1) // 2, (W + 1) // 2
            if i in self.out_indices:
                C = self.embed_dims[i]
                cls = self.stages[i].num_extra_tokens > 0 and \
                    self.out_type == 'cls_token'
                outs.append(x.new_zeros((0, C) if cls else (0, C, H, W)))
        return tuple(outs)

    # ----------------------------------------------------- NR diagnostics
    def set_nr_diagnostics(self, enabled: bool = True) -> None:
        """Switch the NR convergence recording of every SOFT attention."""
        for m in self.modules():
            if hasattr(m, 'last_nr_stats'):
                m.nr_diagnostics = enabled
                if not enabled:
                    m.last_nr_stats = None

    @torch.no_grad()
    def nr_stats(self) -> Dict[str, Dict[str, float]]:
        """NR convergence of the last forward, per SOFT stage.

        ``{'stage1': {'residual': ..., 'unconverged': ...}, ...}``: the
        largest ||A A_T A - A||_2 / ||A||_2 (paper Fig. 4) and the largest
        fraction of A's numerical rank with ``|1 - l v_T(l)| > 0.5`` over the
        matrices (samples, heads, blocks) of the stage. Empty unless
        ``nr_diagnostics`` is on (see :meth:`set_nr_diagnostics`).
        """
        out: Dict[str, Dict[str, float]] = {}
        for i, stage in enumerate(self.stages):
            per_key: Dict[str, List[torch.Tensor]] = {}
            for m in stage.modules():
                for k, v in (getattr(m, 'last_nr_stats', None) or {}).items():
                    per_key.setdefault(k, []).append(v.amax())
            if per_key:
                out[f'stage{i + 1}'] = {
                    k: float(torch.stack(v).amax())
                    for k, v in per_key.items()
                }
        return out


#: the stage settings that ``arch`` (or the backbone) defines: not
#: ``stage_cfgs`` keys
_FROM_ARCH = dict(
    type='the stage types',
    in_channels='the previous stage',
    embed_dims="arch['embed_dims']",
    num_heads="arch['num_heads']",
    depth="arch['depths']",
    num_extra_tokens='the stage type')


def _check_stage_keys(name: str, user: Mapping, cfgs: List[Dict]) -> None:
    """``user`` (a ``stage_cfgs`` entry) may set the keys of the computed
    stage configs ``cfgs``, less those of ``arch``."""
    for key in user:
        if key in _FROM_ARCH:
            raise ValueError(f'SOFT: {name} sets {key!r}, which comes from '
                             f'{_FROM_ARCH[key]}; set it there')
    valid = set().union(*cfgs) - set(_FROM_ARCH)
    unknown = set(user) - valid
    if unknown:
        kinds = '/'.join(dict.fromkeys(c['type'] for c in cfgs))
        raise ValueError(f'SOFT: {name} has unknown keys {sorted(unknown)}; '
                         f'a {kinds} takes {", ".join(sorted(valid))}')


def _per_stage(name: str, value, n: int) -> List[Optional[Dict]]:
    """One config (or None: the stage default) per stage, from one dict /
    None for all stages or a list of ``n``."""
    if value is None or isinstance(value, Mapping):
        return [copy.deepcopy(value) for _ in range(n)]
    if isinstance(value, (list, tuple)) and len(value) == n and all(
            v is None or isinstance(v, Mapping) for v in value):
        return [copy.deepcopy(v) for v in value]
    raise TypeError(f'SOFT: {name} must be a dict or a list of {n} '
                    f'dicts / None (one per stage), got {value!r}')


def _one_value_per_channel(i: int, x: torch.Tensor) -> str:
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
