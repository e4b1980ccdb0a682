"""The SOFT backbone family (NeurIPS 2021 Table 2, IJCV 2024 Table 2)."""
import copy
import inspect
import math
from typing import Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint as cp
from mmengine.logging import print_log
from mmengine.model import BaseModule
from mmengine.model.weight_init import trunc_normal_
from torch.nn.modules.batchnorm import _BatchNorm

from ..layers import checks
from ..layers.blocks import ConvPatchEmbed, SOFTBlock, SoftmaxBlock
from ..layers.soft_attention import SAMPLING_MODES

__all__ = ['SOFT']


def _arch(embed_dims, num_heads, depths):
    return dict(embed_dims=embed_dims, num_heads=num_heads, depths=depths)


class SOFT(BaseModule):
    """SOFT: softmax-free vision transformer with a 4-stage pyramid.

    Stages 1-3 stack :class:`SOFTBlock` (linear-complexity softmax-free
    attention with a bottleneck of m = 49 tokens at 224 x 224); stage 4 is a
    pre-norm softmax-attention stage with a cls token. Outputs are at strides
    4 / 8 / 16 / 32.

    Args:
        arch (str | dict): a preset of :attr:`arch_zoo` (``'tiny'``,
            ``'small'``, ``'medium'``, ``'large'``, ``'huge'``, and
            ``'small-official'``, the depths [1, 3, 20, 4] of the official
            ``soft_small`` weights), or a dict with ``embed_dims``,
            ``num_heads``, ``depths`` (4 entries each) and optionally
            ``sampling_ratios`` (default [8, 4, 2, 1]), ``mlp_ratios``
            (default [4, 4, 4, 4]) and ``dw_kernel_sizes`` (default [9, 5, 3]).
        in_channels: image channels.
        attn_norm: IJCV symmetric attention normalisation (Eq. 25). True is
            the ``soft_norm_*`` family used for dense prediction.
        sampling: bottleneck sampling f_s: 'conv' (default), 'avgpool',
            'random' or 'biased' (Table 4b / 8).
        nr_iters: Newton-Raphson iterations for A^+.
        nr_init: alpha rule of the Newton-Raphson iterations. None (default)
            picks the official rule of the variant: with ``attn_norm``
            'soft_norm_per_sample' (the official search, one alpha shared by
            the heads of a sample: the official model at batch size 1, and
            batch-independent), else 'soft'. 'soft_norm_per_matrix' searches
            alpha for each matrix alone (the default before; old name
            'soft_norm'); 'soft_norm_per_batch' is the official code's rule
            for a whole batch (old name 'soft_norm_global'; outputs then
            depend on the batch, for bit-level comparisons only).
        nr_method: evaluation of the NR iterations: 'auto' (spectral for
            large bottlenecks on the CPU), 'iterative' or 'spectral'; all
            compute the same function.
        nr_backward: backward of the pseudo-inverse: 'eq16' (default, the
            papers' closed form, the gradient of the exact pseudo-inverse)
            or 'exact' (the gradient of the T iterations as computed, alpha
            held fixed; differs from Eq. 16 where they have not converged,
            e.g. at detection resolution).
        nr_diagnostics: record the NR convergence of every forward (see
            :meth:`nr_stats` and :class:`mmsoft.engine.NRResidualHook`).
        max_landmarks: opt-in cap on the bottleneck size m of every SOFT
            stage (e.g. 49 = the 224 x 224 value): the strided bottleneck
            grid is adaptively pooled down to at most this many tokens, so
            cost stays linear in the number of tokens at any resolution.
            It changes the function at sizes where the cap binds (larger
            than the 224 x 224 pretraining size for 49), so use it for
            training from scratch, not with official weights.
        attn_type: the token mixer of stages 1-3: 'soft' (default; with
            ``attn_norm``), 'soft_norm' (forces the normalization) or another
            attention of the zoo (:mod:`mmsoft.models.layers.attention_zoo`),
            with the rest of the architecture unchanged (Table 1).
        out_indices: stages (0-3) whose outputs are returned.
        out_type: ``'featmap'`` - (B, C, H/s, W/s) maps, for mmdet / mmseg;
            ``'cls_token'`` - stage 4 returns the normalised (B, C) cls token,
            for mmpretrain classifiers (other stages still return maps).
        pretrain_img_size: image size the position embeddings were learned
            at (their grids are size/4, /8, /16, /32); they are bilinearly
            interpolated to any input size.
        drop_rate: dropout after position embeddings and in stage-4 MLPs.
        drop_path_rate: stochastic depth rate, linearly increasing over all
            blocks.
        residual_drop: how stages 1-3 apply that rate: 'dropout' (the
            official element-wise dropout) or 'drop_path'.
        frozen_stages: -1 freezes nothing, 0 the stem, k >= 1 the stem and
            stages 1..k (patch embedding, position embedding, blocks; stage 4
            includes the cls token and final norm).
        norm_eval: keep BatchNorm layers in eval mode while training.
        with_cp: gradient checkpointing of every block.
        init_cfg: mmengine init config, e.g. ``dict(type='Pretrained',
            checkpoint='soft_tiny.pth', prefix='backbone.')``.

    Sizes that are not multiples of 32: every down-sampling conv has kernel
    3, stride 2, padding 1, so each stage has ceil(H_prev / 2) rows; the
    bottleneck grid of a stage is ``max(1, H // r) x max(1, W // r)`` (see
    :func:`mmsoft.models.layers.landmark_grid`).
    """

    arch_zoo = {
        'tiny':
        _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 2, 3, 2]),
        'small':
        _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 3, 7, 4]),
        'medium':
        _arch([64, 128, 288, 512], [2, 4, 9, 16], [1, 3, 29, 5]),
        'large':
        _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 3, 40, 5]),
        'huge':
        _arch([64, 128, 352, 512], [2, 4, 11, 16], [1, 5, 49, 5]),
        'small-official':
        _arch([64, 128, 320, 512], [2, 4, 10, 16], [1, 3, 20, 4]),
    }
    arch_defaults = dict(
        sampling_ratios=[8, 4, 2, 1],
        mlp_ratios=[4, 4, 4, 4],
        dw_kernel_sizes=[9, 5, 3])
    num_stages = 4
    OUT_TYPES = ('featmap', 'cls_token')

    def __init__(self,
                 arch: Union[str, Dict] = 'tiny',
                 in_channels: int = 3,
                 attn_norm: bool = True,
                 sampling: str = 'conv',
                 nr_iters: int = 20,
                 nr_init: Optional[str] = None,
                 nr_method: str = 'auto',
                 max_landmarks: Optional[int] = None,
                 attn_type: str = 'soft',
                 nr_backward: str = 'eq16',
                 nr_diagnostics: bool = False,
                 out_indices: Union[int, Sequence[int]] = (0, 1, 2, 3),
                 out_type: str = 'featmap',
                 pretrain_img_size: int = 224,
                 qkv_bias: bool = True,
                 drop_rate: float = 0.,
                 attn_drop_rate: float = 0.,
                 drop_path_rate: float = 0.,
                 residual_drop: str = 'dropout',
                 frozen_stages: int = -1,
                 norm_eval: bool = False,
                 with_cp: bool = False,
                 init_cfg: Optional[Union[Dict, List[Dict]]] = None):
        super().__init__(init_cfg=init_cfg)
        self._check_args({
            k: v
            for k, v in locals().items() if k not in ('self', '__class__')
        })
        self.arch_settings = self._parse_arch(arch)
        if sampling not in SAMPLING_MODES:
            raise ValueError(f'unknown sampling {sampling!r}; choose one of '
                             f'{SAMPLING_MODES}')
        if out_type not in self.OUT_TYPES:
            raise ValueError(f'unknown out_type {out_type!r}; choose one of '
                             f'{self.OUT_TYPES}')
        self.out_indices = self._parse_out_indices(out_indices)
        if not -1 <= frozen_stages <= self.num_stages:
            raise ValueError(f'frozen_stages must be in [-1, 4], got '
                             f'{frozen_stages}')
        a = self.arch_settings
        self.embed_dims = a['embed_dims']
        self.num_heads = a['num_heads']
        self.depths = a['depths']
        self.attn_norm = attn_norm
        self.out_type = out_type
        self.frozen_stages = frozen_stages
        self.norm_eval = norm_eval
        self.with_cp = with_cp
        self.pretrain_img_size = pretrain_img_size

        dpr = torch.linspace(0, drop_path_rate, sum(self.depths)).tolist()
        self.patch_embeds = nn.ModuleList()
        self.pos_embeds = nn.ParameterList()
        self.stages = nn.ModuleList()
        prev = in_channels
        cur = 0
        for i in range(self.num_stages):
            dims, heads, depth = (self.embed_dims[i], self.num_heads[i],
                                  self.depths[i])
            self.patch_embeds.append(ConvPatchEmbed(prev, dims, stem=i == 0))
            grid = pretrain_img_size // (4 * 2**i)
            n_pos = grid * grid + (1 if i == 3 else 0)
            self.pos_embeds.append(nn.Parameter(torch.zeros(1, n_pos, dims)))
            if i < 3:
                blocks = [
                    SOFTBlock(
                        dims,
                        heads,
                        a['sampling_ratios'][i],
                        mlp_ratio=a['mlp_ratios'][i],
                        drop_rate=dpr[cur + j],
                        residual_drop=residual_drop,
                        sampling=sampling,
                        dw_kernel_size=a['dw_kernel_sizes'][i],
                        attn_norm=attn_norm,
                        nr_iters=nr_iters,
                        nr_init=nr_init,
                        nr_method=nr_method,
                        max_landmarks=max_landmarks,
                        attn_type=attn_type,
                        qkv_bias=qkv_bias,
                        nr_backward=nr_backward,
                        nr_diagnostics=nr_diagnostics) for j in range(depth)
                ]
            else:
                blocks = [
                    SoftmaxBlock(
                        dims,
                        heads,
                        mlp_ratio=a['mlp_ratios'][i],
                        qkv_bias=qkv_bias,
                        drop_rate=drop_rate,
                        attn_drop_rate=attn_drop_rate,
                        drop_path_rate=dpr[cur + j]) for j in range(depth)
                ]
            self.stages.append(nn.ModuleList(blocks))
            cur += depth
            prev = dims
        self.pos_drop = nn.Dropout(drop_rate) if drop_rate > 0 \
            else nn.Identity()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dims[3]))
        self.norm = nn.LayerNorm(self.embed_dims[3], eps=1e-6)
        self._freeze_stages()

    # ------------------------------------------------------------ config
    @classmethod
    def _check_args(cls, args: Dict) -> None:
        """Validate the constructor arguments (one error naming the option).
        ``arch`` is checked by :meth:`_parse_arch`, ``out_indices`` by
        :meth:`_parse_out_indices`."""
        checks.check_int('SOFT: in_channels', args['in_channels'])
        checks.check_int('SOFT: nr_iters', args['nr_iters'])
        checks.check_int(
            'SOFT: max_landmarks', args['max_landmarks'], allow_none=True)
        checks.check_int(
            'SOFT: pretrain_img_size', args['pretrain_img_size'], minimum=32)
        for key in ('drop_rate', 'attn_drop_rate', 'drop_path_rate'):
            checks.check_rate(f'SOFT: {key}', args[key])
        defaults = {
            k: p.default
            for k, p in inspect.signature(cls.__init__).parameters.items()
        }
        checks.check_ignored_attn_options(args['attn_type'], args, defaults)

    @classmethod
    def _parse_arch(cls, arch) -> Dict:
        if isinstance(arch, str):
            key = arch.lower()
            if key not in cls.arch_zoo:
                raise ValueError(f'unknown SOFT arch {arch!r}; valid presets: '
                                 f'{sorted(cls.arch_zoo)} (or pass a dict)')
            settings = copy.deepcopy(cls.arch_zoo[key])
        elif isinstance(arch, dict):
            settings = dict(copy.deepcopy(arch))
            for key in ('embed_dims', 'num_heads', 'depths'):
                if key not in settings:
                    raise ValueError(f'SOFT arch dict is missing {key!r}; it '
                                     f'needs embed_dims, num_heads, depths')
        else:
            raise TypeError(f'SOFT arch must be a str or dict, got '
                            f'{type(arch).__name__}')
        for k, v in cls.arch_defaults.items():
            settings.setdefault(k, list(v))
        unknown = set(settings) - {
            'embed_dims', 'num_heads', 'depths', *cls.arch_defaults
        }
        if unknown:
            raise ValueError(f'SOFT arch dict has unknown keys '
                             f'{sorted(unknown)}; valid keys are embed_dims, '
                             f'num_heads, depths, '
                             f'{", ".join(cls.arch_defaults)}')
        lengths = dict(
            embed_dims=4,
            num_heads=4,
            depths=4,
            sampling_ratios=4,
            mlp_ratios=4,
            dw_kernel_sizes=3)
        for key, n in lengths.items():
            val = settings[key]
            if not isinstance(val, (list, tuple)) or len(val) != n:
                raise ValueError(f'SOFT arch[{key!r}] must be a list of {n} '
                                 f'values, got {val!r}')
        for i, (c, h) in enumerate(
                zip(settings['embed_dims'], settings['num_heads'])):
            if h <= 0 or c % h != 0:
                raise ValueError(f'SOFT arch: num_heads[{i}]={h} does not '
                                 f'divide embed_dims[{i}]={c}')
        if any(d < 1 for d in settings['depths']):
            raise ValueError(f'SOFT arch: every depth must be >= 1, got '
                             f'{settings["depths"]}')
        for i, k in enumerate(settings['dw_kernel_sizes']):
            checks.check_kernel_size(f'SOFT arch: dw_kernel_sizes[{i}]', k)
        for i, r in enumerate(settings['sampling_ratios']):
            checks.check_int(f'SOFT arch: sampling_ratios[{i}]', r)
        return settings

    def _parse_out_indices(self, out_indices) -> Tuple[int, ...]:
        if isinstance(out_indices, int):
            out_indices = [out_indices]
        out = []
        for idx in out_indices:
            j = idx + self.num_stages if idx < 0 else idx
            if not 0 <= j < self.num_stages:
                raise ValueError(f'out_indices entry {idx} is out of range; '
                                 f'SOFT has stages 0..{self.num_stages - 1}')
            out.append(j)
        if not out:
            raise ValueError('out_indices is empty; SOFT needs at least one '
                             'output stage (0-3)')
        return tuple(sorted(set(out)))

    @property
    def out_channels(self) -> List[int]:
        """Channels of each requested output (for necks' in_channels)."""
        return [self.embed_dims[i] for i in self.out_indices]

    # ------------------------------------------------------------ init
    def init_weights(self):
        """Pretrained weights if ``init_cfg`` names a checkpoint, otherwise
        the official initialisation (truncated normal 0.02 for linear layers
        and embeddings). ``init_cfg=dict(type='Pretrained', checkpoint=None)``
        is accepted and means "no weights yet" (configs set it so that
        ``--cfg-options model.backbone.init_cfg.checkpoint=...`` works).

        Pretrained loading is strict: a checkpoint whose tensors (under
        ``prefix``) do not match the backbone - missing, unexpected or
        mis-shaped keys, an unconverted official checkpoint - raises
        :class:`mmsoft.utils.strict_load.CheckpointMismatchError`.
        ``init_cfg=dict(type='Pretrained', ..., strict=False)`` allows
        intended partial loads (the rest keeps the official initialisation).
        """
        pretrained = isinstance(self.init_cfg, dict) and \
            self.init_cfg.get('type') == 'Pretrained'
        if pretrained and self.init_cfg.get('checkpoint') is not None:
            from mmsoft.utils.strict_load import load_pretrained
            cfg = dict(self.init_cfg)
            if cfg.get('strict', True) is False:
                self.init_cfg = None
                self.init_weights()  # official init for what is not loaded
                self.init_cfg = cfg
            load_pretrained(
                self,
                cfg['checkpoint'],
                prefix=cfg.get('prefix'),
                map_location=cfg.get('map_location', 'cpu'),
                strict=cfg.get('strict', True),
                opt_in="set model.backbone.init_cfg.strict=False")
            self._is_init = True
            return
        if pretrained:
            print_log(
                'SOFT: init_cfg has no checkpoint; using random '
                'initialisation',
                logger='current')
            self.init_cfg = None
        for m in self.modules():
            if isinstance(m, nn.Linear):
                trunc_normal_(m.weight, std=.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
            elif isinstance(m, nn.LayerNorm):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for p in self.pos_embeds:
            trunc_normal_(p, std=.02)
        trunc_normal_(self.cls_token, std=.02)
        super().init_weights()

    # ------------------------------------------------------------ freeze
    def _freeze_stages(self):
        if self.frozen_stages < 0:
            return
        frozen = [self.patch_embeds[0]]
        params = list(self.patch_embeds[0].parameters()) + \
            [self.pos_embeds[0]]
        for i in range(self.frozen_stages):
            frozen += [self.patch_embeds[i], self.stages[i]]
            params += list(self.patch_embeds[i].parameters())
            params += [self.pos_embeds[i]]
            params += list(self.stages[i].parameters())
            if i == 3:
                frozen.append(self.norm)
                params += [self.cls_token] + list(self.norm.parameters())
        for m in frozen:
            m.eval()
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

    # ------------------------------------------------------- diagnostics
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
        fraction of A's numerical rank with |1 - l v_T(l)| > 0.5 over the
        matrices (samples, heads, blocks) of the stage. Empty unless
        ``nr_diagnostics`` is on (see :meth:`set_nr_diagnostics`).
        """
        out: Dict[str, Dict[str, float]] = {}
        for i, stage in enumerate(self.stages):
            per_key: Dict[str, List[torch.Tensor]] = {}
            for m in stage.modules():
                stats = getattr(m, 'last_nr_stats', None)
                for k, v in (stats or {}).items():
                    per_key.setdefault(k, []).append(v.amax())
            if per_key:
                out[f'stage{i + 1}'] = {
                    k: float(torch.stack(v).amax())
                    for k, v in per_key.items()
                }
        return out

    # ------------------------------------------------------------ forward
    def _pos_embed(self, i: int, hw: Tuple[int, int]) -> torch.Tensor:
        pos = self.pos_embeds[i]
        cls_pos = None
        if i == 3:
            cls_pos, pos = pos[:, :1], pos[:, 1:]
        g = int(math.isqrt(pos.shape[1]))
        if g * g != pos.shape[1]:
            raise ValueError(f'pos_embeds[{i}] has {pos.shape[1]} tokens, '
                             f'not a square grid')
        if (g, g) != tuple(hw):
            grid = pos.reshape(1, g, g, -1).permute(0, 3, 1, 2)
            grid = F.interpolate(
                grid, size=hw, mode='bilinear', align_corners=False)
            pos = grid.flatten(2).transpose(1, 2)
        if cls_pos is not None:
            pos = torch.cat([cls_pos, pos], dim=1)
        return pos

    def _run_block(self, blk, x, hw):
        if self.with_cp and x.requires_grad:
            return cp.checkpoint(blk, x, hw, use_reentrant=False)
        return blk(x, hw)

    def _empty_outputs(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        """Outputs of an empty batch (B = 0): every conv of the patch
        embeddings has kernel 3, stride 2 (the stem's middle conv stride 1)
        and padding 1, so each stage has ceil(H_prev / 2) rows."""
        H, W = x.shape[2:]
        outs = []
        for i in range(self.num_stages):
            for _ in range(2 if i == 0 else 1):
                H, W = (H + 1) // 2, (W + 1) // 2
            if i in self.out_indices:
                shape = (0, self.embed_dims[i]) if (
                    i == 3
                    and self.out_type == 'cls_token') else (0,
                                                            self.embed_dims[i],
                                                            H, W)
                outs.append(x.new_zeros(shape))
        return tuple(outs)

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f'SOFT expects a (B, C, H, W) tensor, got a '
                            f'{type(x).__name__}; stack the images first '
                            f'(torch.stack)')
        if x.dim() != 4:
            raise ValueError(f'SOFT expects (B, C, H, W) images, got shape '
                             f'{tuple(x.shape)}')
        B = x.shape[0]
        if B == 0:
            return self._empty_outputs(x)
        outs = []
        for i in range(self.num_stages):
            x, hw = self.patch_embeds[i](x)
            if i == 3:
                x = torch.cat([self.cls_token.expand(B, -1, -1), x], dim=1)
            x = self.pos_drop(x + self._pos_embed(i, hw))
            for blk in self.stages[i]:
                x = self._run_block(blk, x, hw)
            if i == 3:
                x = self.norm(x)
                if i in self.out_indices:
                    if self.out_type == 'cls_token':
                        outs.append(x[:, 0])
                    else:
                        outs.append(x[:, 1:].transpose(1,
                                                       2).reshape(B, -1, *hw))
            else:
                x = x.transpose(1, 2).reshape(B, -1, *hw)
                if i in self.out_indices:
                    outs.append(x)
            if i == self.out_indices[-1]:
                break  # later stages are not needed
        return tuple(outs)
