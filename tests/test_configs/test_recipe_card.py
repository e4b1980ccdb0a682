"""Every config of ``configs/`` built with a tiny SOFT: its EFFECTIVE values
against the recipe card (tests/reference); one step and one prediction per
distinct tiny model and optimizer."""
import copy
import functools
import glob
import importlib
import math
import os.path as osp
import types

import pytest
import torch
from conftest import CONFIGS as CONFIG_DIR
from conftest import check_hooks, tiny_arch
from mmengine.config import Config
from mmengine.registry import DefaultScope
from reference.recipe_card import FAMILIES, family_of
from torch.nn.modules.batchnorm import _BatchNorm

from analysis.common import random_batch
from mmsoft.models import SOFT
from mmsoft_tools import launch

CONFIGS = sorted(
    osp.splitext(osp.basename(p))[0]
    for p in glob.glob(osp.join(CONFIG_DIR, '*.py')))
DATASETS = dict(
    mmpretrain='ImageNet', mmdet='CocoDataset', mmseg='ADE20KDataset')
TINY_ARCH, SIZE = tiny_arch(), 64
#: detector widths -> test widths (FPN / head channels 256, FC layers)
NARROW = {256: 64, 1024: 64, 2048: 64}
CHANNEL_KEYS = ('in_channels', 'out_channels', 'feat_channels',
                'conv_out_channels', 'fc_out_channels', 'feedforward_channels',
                'proposal_feature_channel')
EPOCH_LEN = {'cls_in1k': 20}  # simulated epochs (> the 500-iter warm-up)
NORMS = (_BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm)
pytestmark = pytest.mark.usefixtures('metafiles_read_once')


def scope_of(name):
    return 'mmpretrain' if name.endswith('_in1k') else \
        'mmseg' if name.startswith('upernet_') else 'mmdet'


def registry(scope, name='MODELS'):
    return getattr(importlib.import_module(f'{scope}.registry'), name)


def _narrow(node):
    """Narrow a detector's FPN and heads (types, wiring: the config's)."""
    items = node.items() if isinstance(node, dict) else enumerate(node) \
        if isinstance(node, (list, tuple)) else ()
    for key, val in items:
        if key in CHANNEL_KEYS and isinstance(val, int):
            node[key] = NARROW.get(val, val)
        elif key != 'backbone':
            _narrow(val)


def tiny_model_cfg(cfg, scope):
    """cfg.model with a tiny SOFT, matching channels, few proposals."""
    m = copy.deepcopy(cfg.model)
    if 'data_preprocessor' not in m and cfg.get('data_preprocessor'):
        m.data_preprocessor = copy.deepcopy(cfg.data_preprocessor)
    m.backbone.update(arch=copy.deepcopy(TINY_ARCH), init_cfg=None)
    dims = TINY_ARCH['embed_dims']
    if scope == 'mmpretrain':
        m.head.in_channels = dims[3]
        return m
    if scope == 'mmseg':
        m.decode_head.update(in_channels=list(dims), channels=32)
        m.auxiliary_head.update(
            in_channels=dims[m.auxiliary_head.in_index], channels=16)
        m.data_preprocessor.size = (SIZE, SIZE)
        return m
    _narrow(m)
    m.neck.in_channels = list(dims)
    train, test = m.get('train_cfg') or {}, m.get('test_cfg') or {}
    for part, key, pre, most in ((train, 'rpn_proposal', 200, 50),
                                 (test, 'rpn', 100, 20)):
        if part.get(key):
            part[key].update(nms_pre=pre, max_per_img=most)
    rcnn = train.get('rcnn') or []
    for stage in rcnn if isinstance(rcnn, list) else [rcnn]:
        if 'num' in stage.get('sampler', {}):
            stage.sampler.num = 32
    if 'rcnn' in test:
        test.rcnn.update(score_thr=0.0, max_per_img=10)
    elif test:  # one-stage
        test.update(nms_pre=100, max_per_img=10)
    if m.get('rpn_head', {}).get('type') == 'EmbeddingRPNHead':  # Sparse
        m.rpn_head.num_proposals = 10
    return m


def check_settings(name, cfg, scope):
    """What the card does not compare; the real channels."""
    assert cfg.default_scope == launch.codebase_of(cfg) == scope
    assert cfg.custom_imports == dict(
        imports=['mmsoft'], allow_failed_imports=False)
    assert cfg.optim_wrapper.type == 'OptimWrapper'
    check_hooks(cfg)
    assert cfg.train_dataloader.dataset.type == DATASETS[scope]
    bb, m = cfg.model.backbone, cfg.model
    dims = list(SOFT.arch_zoo[bb.arch]['embed_dims'])
    assert bb.type == 'SOFT' and bb.arch in name
    if scope == 'mmpretrain':
        assert bb.out_type == 'cls_token' and tuple(bb.out_indices) == (3, )
        assert m.head.in_channels == dims[3]
        return
    assert bb.out_type == 'featmap' and tuple(bb.out_indices) == (0, 1, 2, 3)
    if scope == 'mmseg':
        assert cfg.train_cfg.type == 'IterBasedTrainLoop'
        assert tuple(m.data_preprocessor.size) == (512, 512)
        assert m.auxiliary_head.in_channels == dims[m.auxiliary_head.in_index]
    assert list((m.get('neck') or m.decode_head).in_channels) == dims


def effective_decay(model, wrapper, base_wd):
    """(categories without decay, those with another / mixed decay)."""
    decay = {id(p): g['weight_decay'] for g in wrapper.optimizer.param_groups
             for p in g['params']}  # yapf: disable
    per_cat, bb = {}, model.backbone
    for name, p in bb.named_parameters():
        owner, leaf = name.rsplit('.', 1)
        cat = leaf if leaf in ('pos_embed', 'cls_token') else 'norm' \
            if isinstance(bb.get_submodule(owner), NORMS) else \
            'bias' if leaf == 'bias' else 'weight'
        per_cat.setdefault(cat, set()).add(decay[id(p)])
    exempt = frozenset(c for c, v in per_cat.items() if v == {0.0})
    return exempt, {c: v for c, v in per_cat.items()
                    if v not in ({0.0}, {base_wd})}  # yapf: disable


_LR_CACHE = {}


def lr_curve(cfg, base_lr, epoch_len, total):
    """The lr per iteration, schedulers stepped as ParamSchedulerHook."""
    key = (repr(cfg.param_scheduler), base_lr, epoch_len, total)
    if key in _LR_CACHE:
        return _LR_CACHE[key]
    from mmengine.optim import OptimWrapper
    from mmengine.runner import Runner
    wrapper = OptimWrapper(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=base_lr))
    fake = types.SimpleNamespace(
        _train_loop=None, train_dataloader=range(epoch_len))
    scheds = Runner._build_param_scheduler(fake, cfg.param_scheduler, wrapper)
    lrs = _LR_CACHE[key] = []
    for it in range(total):
        lrs.append(wrapper.optimizer.param_groups[0]['lr'])
        for s in sorted(scheds, key=lambda s: s.by_epoch):  # iters first
            if (it + 1) % (epoch_len if s.by_epoch else 1) == 0:
                s.step()
    return lrs


def schedule_values(cfg, card, family):
    """Effective schedule values, keyed as the card."""
    base, out = cfg.optim_wrapper.optimizer.lr, {}
    if 'max_iters' in card:
        E = 1
        total = out['max_iters'] = cfg.train_cfg.max_iters
    else:
        E = EPOCH_LEN.get(family, 600)
        out['max_epochs'] = cfg.train_cfg.max_epochs
        total = out['max_epochs'] * E
    lrs = lr_curve(cfg, base, E, total)
    # the first iteration at the base lr (never: the whole run warms up)
    reach = next((i for i, lr in enumerate(lrs) if lr >= base * (1 - 1e-6)),
                 total)
    unit = card['warmup'].expected['unit']
    # a warm-up over iterations [0, L) reaches the base lr on L - 1
    out['warmup'] = dict(
        unit=unit,
        length=(reach + 1) / E if unit == 'epoch' else reach + 1,
        start_lr=lrs[0])
    assert max(lrs) <= base * (1 + 1e-6)  # never above the base lr
    out['final_lr'] = lrs[-1]
    if 'milestones' in card:
        drops = [i for i in range(reach + 1, total)
                 if lrs[i] < lrs[i - 1] * (1 - 1e-6)]  # yapf: disable
        assert all(i % E == 0 for i in drops), drops  # at epoch boundaries
        out['milestones'] = [i // E for i in drops]
        ratios = {round(lrs[i] / lrs[i - 1], 9) for i in drops}
        assert len(ratios) <= 1, ratios  # one decay factor
        out['gamma'] = ratios.pop() if ratios else None
    if 'mid_cosine_epoch' in card:
        mid = (base + card['final_lr'].expected) / 2
        out['mid_cosine_epoch'] = next(
            (i for i in range(reach, total) if lrs[i] <= mid *
             (1 + 1e-9)), total) / E
    if 'poly_power' in card:
        mid = reach + (total - reach) // 2
        frac = 1 - (mid - reach) / (total - reach)
        out['poly_power'] = math.log(lrs[mid] / base) / math.log(frac)
    return out


def ema_values(cfg):
    """The EMAHook's per-iteration momentum and horizon (1 / momentum)."""
    from mmengine.registry import HOOKS, MODELS
    hooks = [h for h in cfg.get('custom_hooks', []) if 'EMA' in h['type']]
    if not hooks:
        return dict(ema_momentum=None)
    assert len(hooks) == 1, hooks
    hook = HOOKS.build({k: v for k, v in hooks[0].items() if k != 'priority'})
    src = torch.nn.Linear(1, 1, bias=False).requires_grad_(False)
    ema = MODELS.build(hook.ema_cfg, default_args=dict(model=src))
    for value in (0.0, 1.0):  # the first update copies
        src.weight.fill_(value)
        ema.update_parameters(src)
    m = float(ema.module.weight)  # (1 - m) * 0 + m * 1
    return dict(ema_momentum=m, ema_horizon_iters=round(1 / m))


def model_values(model):
    """Drop rate and kind, BN norm_eval after train(), frozen parameters."""
    rates, kinds = [], set()
    for i, stage in enumerate(model.backbone.stages):
        for m in (b.drop if i < 3 else b.drop_path for b in stage.blocks):
            rates.append(getattr(m, 'p', getattr(m, 'drop_prob', 0.0)))
            if i < 3 and rates[-1] > 0:
                kinds.add('dropout' if isinstance(m, torch.nn.Dropout) else
                          'drop_path')  # yapf: disable
    assert len(kinds) == 1, kinds
    model.train()
    bn = [m for m in model.backbone.modules() if isinstance(m, _BatchNorm)]
    modes = {m.training for m in bn}
    assert len(modes) == 1, 'mixed BatchNorm modes in the backbone'
    others = [
        n for n, m in model.named_modules()
        if isinstance(m, NORMS) and not m.training and all(m is not b
                                                           for b in bn)
    ]
    assert not others, f'norm layers in eval after train(): {others}'
    return dict(drop_path_rate=max(rates), residual_drop=kinds.pop(),
                norm_eval=not modes.pop(),
                frozen=frozenset(n for n, p in model.named_parameters()
                                 if not p.requires_grad))  # yapf: disable


def pipeline_values(pipeline, card_pipeline, scope):
    """[(type, {card key: value})] of the built transforms."""
    out = []
    for i, p in enumerate(pipeline):
        t = registry(scope, 'TRANSFORMS').build(copy.deepcopy(p))
        keys = card_pipeline[i][1] if i < len(card_pipeline) else {}
        resize = getattr(t, 'resize_cfg', None) or {}
        for k in keys:
            assert hasattr(t, k) or k in resize, (type(t).__name__, k)
        vals = {k: getattr(t, k, resize.get(k)) for k in keys}
        # a keep-ratio resize to (a, b) is one to (b, a): long, short
        if getattr(t, 'keep_ratio', None) or resize.get('keep_ratio'):
            if isinstance(vals.get('scale'), (list, tuple)):
                vals['scale'] = sorted(vals['scale'], reverse=True)
            if 'scales' in vals:
                vals['scales'] = [sorted(p, reverse=True)
                                  for p in vals['scales']]  # yapf: disable
        out.append((type(t).__name__, vals))
    return out


def metric_values(cfg, scope):
    ev = copy.deepcopy(cfg.test_evaluator)
    if scope == 'mmdet':
        ev['ann_file'] = None  # no COCO annotations here
    m = registry(scope, 'METRICS').build(ev)
    if scope == 'mmpretrain':
        return (type(m).__name__, dict(topk=tuple(m.topk)))
    key = 'metric' if scope == 'mmdet' else 'iou_metrics'
    return (type(m).__name__, {key: list(m.metrics)})


def effective(name, cfg, scope, model, wrapper):
    """Every value of the card, as the machinery builds it for ``name``."""
    family = family_of(name)
    card, opt = FAMILIES[family], wrapper.optimizer
    lrs = {g['lr'] for g in opt.param_groups}
    assert len(lrs) == 1, lrs  # no lr multiplier anywhere
    out = dict(optimizer=type(opt).__name__, lr=lrs.pop(),
               betas=tuple(opt.defaults['betas']), eps=opt.defaults['eps'],
               weight_decay=opt.defaults['weight_decay'])  # yapf: disable
    exempt, odd = effective_decay(model, wrapper, out['weight_decay'])
    assert not odd, f'{name}: categories with an unexpected decay {odd}'
    out['decay_exempt'] = exempt
    clip = getattr(wrapper, 'clip_grad_kwargs', None)
    assert not clip or clip.get('norm_type', 2) == 2, clip
    out['clip_grad'] = clip['max_norm'] if clip else None
    out.update(model_values(model))
    if scope == 'mmpretrain':
        augs = model.data_preprocessor.batch_augments.augments
        alphas = {type(a).__name__: a.alpha for a in augs}
        out['mixup'], out['cutmix'] = alphas['Mixup'], alphas['CutMix']
        out['label_smoothing'] = model.head.loss_module.label_smooth_val
    if scope == 'mmseg':
        out['test_mode'] = model.test_cfg['mode']
    for split in ('train', 'test'):
        out[f'{split}_pipeline'] = pipeline_values(
            cfg[f'{split}_dataloader'].dataset.pipeline,
            card[f'{split}_pipeline'].expected, scope)
    out['metric'] = metric_values(cfg, scope)
    out.update(schedule_values(cfg, card, family))
    out.update(ema_values(cfg))
    out['batch_per_gpu'] = per_gpu = cfg.train_dataloader.batch_size
    # the total batch the lr refers to (auto_scale_lr, 8 GPUs)
    base_bs = cfg.get('auto_scale_lr', {}).get('base_batch_size')
    out['batch_size'] = base_bs if base_bs is not None else per_gpu * 8
    assert out['batch_size'] == per_gpu * 8, (name, out['batch_size'])
    return out


def _close(a, b):
    """Equal; floats to 1e-6; lists and tuples alike."""
    if isinstance(a, float) or isinstance(b, float):
        return None not in (a, b) and math.isclose(
            a, b, rel_tol=1e-6, abs_tol=1e-8)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(map(_close, a, b))
    return a == b


def compare_with_the_card(name, got):
    """Every value (the cosine midpoint to one simulated iteration)."""
    card = FAMILIES[family_of(name)]
    assert not set(card) - set(got), f'{name}: no effective value'
    tol = 1 / EPOCH_LEN.get(family_of(name), 600)
    bad = [
        f'{key}: card {v.expected!r}, effective {got[key]!r}'
        for key, v in card.items()
        if not (abs(got[key] - v.expected) <= tol if key ==
                'mid_cosine_epoch' else _close(v.expected, got[key]))
    ]
    assert not bad, f'{name} differs from the recipe card ' + '; '.join(bad)
    n = sum(1 + len(p) for k, v in card.items() if k.endswith('_pipeline')
            for _, p in v.expected) + len(card)
    assert n >= 30, n  # every value compared


def train_step_and_predict(name, scope, model, wrapper):
    """Finite loss and gradients, a step; a prediction of the task's shape."""
    torch.manual_seed(0)
    model.train()
    data = model.data_preprocessor(random_batch(scope, name, SIZE), True)
    losses = model(**data, mode='loss')
    loss, _ = model.parse_losses(losses)
    assert torch.isfinite(loss), losses
    wrapper.backward(loss)
    grads = {n: p.grad for n, p in model.backbone.named_parameters()
             if p.requires_grad}  # yapf: disable
    assert [n for n, g in grads.items() if g is None] == []
    assert all(torch.isfinite(g).all() for g in grads.values())
    stem = model.backbone.stages[0].patch_embed.proj[0].conv.weight.grad
    assert stem.abs().sum() > 0
    wrapper.step()
    wrapper.zero_grad()
    model.eval()
    with torch.no_grad():
        pred, = model.test_step(random_batch(scope, name, SIZE, 1))
    if scope == 'mmpretrain':
        score = pred.pred_score
        assert score.shape == (1000, ) and torch.isfinite(score).all()
    elif scope == 'mmdet':
        inst = pred.pred_instances
        assert inst.bboxes.shape[1] == 4 and torch.isfinite(inst.scores).all()
        assert 'mask_rcnn' not in name or len(inst) > 0 and \
            inst.masks.shape == (len(inst), SIZE, SIZE)
    else:
        assert pred.pred_sem_seg.data.shape == (1, SIZE, SIZE)
        assert pred.seg_logits.data.shape == (150, SIZE, SIZE)


@functools.lru_cache(None)
def stepped_configs():
    """The first config of each distinct tiny model and optimizer."""
    first = {}
    for name in CONFIGS:
        cfg = load_config(name)
        key = repr((tiny_model_cfg(cfg, scope_of(name)), cfg.optim_wrapper))
        first.setdefault(key, name)
    return set(first.values())


@functools.lru_cache(None)
def load_config(name):
    return Config.fromfile(osp.join(CONFIG_DIR, name + '.py'))


def test_every_config_has_a_card_citing_a_source_for_every_value():
    assert {family_of(n) for n in CONFIGS} == set(FAMILIES)
    for family, card in FAMILIES.items():
        for key, v in card.items():
            assert v.source.strip(), (family, key)
            assert not v.deviates or len(v.why) > 20, (family, key)


@pytest.mark.parametrize('name', CONFIGS)
def test_config_matches_recipe_card(name):
    """Every ``custom_keys`` entry names real SOFT parameters."""
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper
    step = name in stepped_configs()  # before this test touches its cfg
    cfg, scope = load_config(name), scope_of(name)
    check_settings(name, cfg, scope)
    launch.import_codebase(cfg)
    with DefaultScope.overwrite_default_scope(scope):
        model = revert_sync_batchnorm(
            registry(scope).build(tiny_model_cfg(cfg, scope)))
        model.init_weights()
        wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
        names = [f'backbone.{n}' for n, _ in model.backbone.named_parameters()]
        keys = cfg.optim_wrapper.paramwise_cfg.custom_keys
        assert [k for k in keys if not any(k in n for n in names)] == []
        compare_with_the_card(name, effective(name, cfg, scope, model,
                                              wrapper))
        if step:
            train_step_and_predict(name, scope, model, wrapper)
