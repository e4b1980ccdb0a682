"""Every config of ``configs/`` against the recipe card
(``tests/reference/recipe_card.py``, issue 30), comparing EFFECTIVE values
built by the real machinery: the optimizer constructor's param groups, the
Runner's schedulers stepped as ``ParamSchedulerHook`` does, the EMAHook, a
tiny model (norms, frozen parameters, drops, augments, loss), the pipelines
(``TRANSFORMS``) and the metric (``METRICS``)."""
import copy
import math
import types

import pytest
import torch
from mmengine.registry import DefaultScope
from reference.recipe_card import FAMILIES, family_of
from test_shipped_configs import CONFIGS, _registry, load, tiny_model_cfg

from mmsoft_tools import launch

#: epoch length of the simulated schedules (> the 500-iteration warm-up)
EPOCH_LEN = {'cls_in1k': 20}
DEFAULT_EPOCH_LEN = 600


# ------------------------------------------------------------ helpers
def category(backbone, name):
    """The weight-decay category of a backbone parameter (see the card)."""
    if name.endswith('pos_embed'):
        return 'pos_embed'
    if name.endswith('cls_token'):
        return 'cls_token'
    owner = backbone.get_submodule(name.rsplit('.', 1)[0])
    if isinstance(owner, (torch.nn.LayerNorm, torch.nn.GroupNorm,
                          torch.nn.modules.batchnorm._BatchNorm)):
        return 'norm'
    if name.endswith('.bias'):
        return 'bias'
    return 'weight'


def effective_decay(model, wrapper, base_wd):
    """(categories without decay, those with another / mixed decay)."""
    decay = {}
    for group in wrapper.optimizer.param_groups:
        for p in group['params']:
            decay[id(p)] = group['weight_decay']
    per_cat = {}
    for name, p in model.backbone.named_parameters():
        per_cat.setdefault(category(model.backbone, name),
                           set()).add(decay[id(p)])
    exempt = frozenset(c for c, v in per_cat.items() if v == {0.0})
    odd = {c: v for c, v in per_cat.items() if v not in ({0.0}, {base_wd})}
    return exempt, odd


def build_schedulers(cfg, wrapper, epoch_len):
    """The config's parameter schedulers, built by the Runner's method."""
    from mmengine.runner import Runner
    fake = types.SimpleNamespace(
        _train_loop=None, train_dataloader=range(epoch_len))
    return Runner._build_param_scheduler(fake, cfg.param_scheduler, wrapper)


_LR_CACHE = {}


def lr_curve(cfg, base_lr, epoch_len, total):
    """The lr of every iteration, stepped as ``ParamSchedulerHook`` does."""
    key = (repr(cfg.param_scheduler), base_lr, epoch_len, total)
    if key in _LR_CACHE:
        return _LR_CACHE[key]
    from mmengine.optim import OptimWrapper
    param = torch.nn.Parameter(torch.zeros(1))
    wrapper = OptimWrapper(torch.optim.SGD([param], lr=base_lr))
    scheds = build_schedulers(cfg, wrapper, epoch_len)
    lrs = []
    group = wrapper.optimizer.param_groups[0]
    for it in range(total):
        lrs.append(group['lr'])
        for s in scheds:
            if not s.by_epoch:
                s.step()
        if (it + 1) % epoch_len == 0:
            for s in scheds:
                if s.by_epoch:
                    s.step()
    _LR_CACHE[key] = lrs
    return lrs


def schedule_values(cfg, card, family):
    """Effective schedule values, keyed as the card."""
    base = cfg.optim_wrapper.optimizer.lr
    out = {}
    if 'max_iters' in card:
        E = 1
        total = cfg.train_cfg.max_iters
        out['max_iters'] = total
    else:
        E = EPOCH_LEN.get(family, DEFAULT_EPOCH_LEN)
        out['max_epochs'] = cfg.train_cfg.max_epochs
        total = out['max_epochs'] * E
    lrs = lr_curve(cfg, base, E, total)
    # the first iteration at the base lr (never: the whole run warms up)
    reach = next((i for i, lr in enumerate(lrs) if lr >= base * (1 - 1e-6)),
                 total)
    unit = card['warmup'].expected['unit']
    # a warm-up over iterations [0, L) reaches the base lr on its last
    # iteration, L - 1 (mmengine's LinearLR ends at end_factor there)
    out['warmup'] = dict(
        unit=unit,
        length=(reach + 1) / E if unit == 'epoch' else reach + 1,
        start_lr=lrs[0])
    assert max(lrs) <= base * (1 + 1e-6)  # never above the base lr
    out['final_lr'] = lrs[-1]
    if 'milestones' in card:
        drops = [
            i for i in range(reach + 1, total)
            if lrs[i] < lrs[i - 1] * (1 - 1e-6)
        ]
        assert all(i % E == 0 for i in drops), drops  # at epoch boundaries
        out['milestones'] = [i // E for i in drops]
        ratios = {round(lrs[i] / lrs[i - 1], 9) for i in drops}
        assert len(ratios) <= 1, ratios  # one decay factor
        out['gamma'] = ratios.pop() if ratios else None
    if 'mid_cosine_epoch' in card:
        mid = (base + card['final_lr'].expected) / 2
        i = next(
            (i for i in range(reach, total) if lrs[i] <= mid * (1 + 1e-9)),
            total)
        out['mid_cosine_epoch'] = i / E
    if 'poly_power' in card:
        begin = reach
        mid = begin + (total - begin) // 2
        frac = 1 - (mid - begin) / (total - begin)
        out['poly_power'] = math.log(lrs[mid] / base) / math.log(frac)
    return out


def ema_values(cfg):
    """The EMAHook's per-iteration momentum and horizon (1 / momentum)."""
    from mmengine.registry import HOOKS, MODELS
    hooks = [h for h in cfg.get('custom_hooks', []) if 'EMA' in h['type']]
    if not hooks:
        return dict(ema_momentum=None)
    assert len(hooks) == 1, hooks
    hook_cfg = copy.deepcopy(hooks[0])
    hook_cfg.pop('priority', None)  # Runner.register_hook takes it
    hook = HOOKS.build(hook_cfg)
    src = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(src.weight)
    ema = MODELS.build(hook.ema_cfg, default_args=dict(model=src))
    ema.update_parameters(src)  # the first update copies
    with torch.no_grad():
        src.weight.fill_(1.0)
    ema.update_parameters(src)
    m = float(ema.module.weight)  # (1 - m) * 0 + m * 1
    return dict(ema_momentum=m, ema_horizon_iters=round(1 / m))


def drop_values(backbone):
    """(max residual drop rate, 'dropout' / 'drop_path' of stages 1-3)."""
    rates, kinds = [], set()
    for i, stage in enumerate(backbone.stages):
        for blk in stage.blocks:
            m = blk.drop if i < 3 else blk.drop_path
            rate = getattr(m, 'p', getattr(m, 'drop_prob', 0.0))
            rates.append(rate)
            if i < 3 and rate > 0:
                kinds.add('dropout' if isinstance(m, torch.nn.Dropout
                                                  ) else 'drop_path')
    assert len(kinds) == 1, kinds
    return max(rates), kinds.pop()


def norm_values(model):
    """norm_eval of the backbone's BNs after train(); other norms train."""
    from torch.nn.modules.batchnorm import _BatchNorm
    model.train()
    bn = [m for m in model.backbone.modules() if isinstance(m, _BatchNorm)]
    modes = {m.training for m in bn}
    assert len(modes) == 1, 'mixed BatchNorm modes in the backbone'
    others = [
        n for n, m in model.named_modules()
        if isinstance(m, (_BatchNorm, torch.nn.LayerNorm,
                          torch.nn.GroupNorm)) and all(
                              m is not b for b in bn) and not m.training
    ]
    assert not others, f'norm layers in eval after train(): {others}'
    frozen = frozenset(n for n, p in model.named_parameters()
                       if not p.requires_grad)
    return dict(norm_eval=not modes.pop(), frozen=frozen)


def _attr(t, key):
    """A transform's setting, else that of its ``resize_cfg``."""
    if hasattr(t, key):
        return getattr(t, key)
    cfg = getattr(t, 'resize_cfg', None) or {}
    if key in cfg:
        return cfg[key]
    raise AttributeError(f'{type(t).__name__} has no {key}')


def _norm(v):
    if isinstance(v, (list, tuple)):
        return [_norm(x) for x in v]
    if isinstance(v, float):
        return round(v, 9)
    return v


def pipeline_values(pipeline, card_pipeline, scope):
    """[(type, {card key: value})] of the built transforms."""
    import importlib
    transforms = importlib.import_module(f'{scope}.registry').TRANSFORMS
    built = [transforms.build(copy.deepcopy(t)) for t in pipeline]
    out = []
    for i, t in enumerate(built):
        keys = card_pipeline[i][1] if i < len(card_pipeline) else {}
        vals = {k: _norm(_attr(t, k)) for k in keys}
        # a keep-ratio resize to (a, b) is one to (b, a): long, short
        for k in ('scale', 'scales'):
            keep = getattr(t, 'keep_ratio', None) or getattr(
                t, 'resize_cfg', {}).get('keep_ratio')
            if k in vals and isinstance(vals[k], list) and keep:
                pairs = vals[k] if k == 'scales' else [vals[k]]
                pairs = [sorted(p, reverse=True) for p in pairs]
                vals[k] = pairs if k == 'scales' else pairs[0]
        out.append((type(t).__name__, vals))
    return out


def metric_values(cfg, scope):
    import importlib
    metrics = importlib.import_module(f'{scope}.registry').METRICS
    ev = copy.deepcopy(cfg.test_evaluator)
    if scope == 'mmdet':
        ev['ann_file'] = None  # no COCO annotations here
    m = metrics.build(ev)
    if scope == 'mmpretrain':
        return (type(m).__name__, dict(topk=tuple(m.topk)))
    key = 'metric' if scope == 'mmdet' else 'iou_metrics'
    return (type(m).__name__, {key: list(m.metrics)})


def effective(name):
    """Every value of the card, as the machinery builds it for ``name``."""
    from mmengine.optim import build_optim_wrapper
    family = family_of(name)
    card = FAMILIES[family]
    cfg = load(name)
    scope = launch.import_codebase(cfg)
    out = {}
    with DefaultScope.overwrite_default_scope(scope):
        model = _registry(scope).build(tiny_model_cfg(cfg, scope))
        wrapper = build_optim_wrapper(model, copy.deepcopy(cfg.optim_wrapper))
        opt = wrapper.optimizer
        out['optimizer'] = type(opt).__name__
        lrs = {g['lr'] for g in opt.param_groups}
        assert len(lrs) == 1, lrs  # no lr multiplier anywhere
        out['lr'] = lrs.pop()
        out['betas'] = tuple(opt.defaults['betas'])
        if 'eps' in card:
            out['eps'] = opt.defaults['eps']
        out['weight_decay'] = opt.defaults['weight_decay']
        exempt, odd = effective_decay(model, wrapper, out['weight_decay'])
        assert not odd, f'{name}: categories with an unexpected decay {odd}'
        out['decay_exempt'] = exempt
        clip = getattr(wrapper, 'clip_grad_kwargs', None)
        if clip:
            assert clip.get('norm_type', 2) == 2, clip
        out['clip_grad'] = clip['max_norm'] if clip else None
        out.update(norm_values(model))
        out['drop_path_rate'], out['residual_drop'] = drop_values(
            model.backbone)
        if scope == 'mmpretrain':
            augs = model.data_preprocessor.batch_augments.augments
            alphas = {type(a).__name__: a.alpha for a in augs}
            out['mixup'], out['cutmix'] = alphas['Mixup'], alphas['CutMix']
            out['label_smoothing'] = model.head.loss_module.label_smooth_val
        if scope == 'mmseg':
            out['test_mode'] = model.test_cfg['mode']
        for split in ('train', 'test'):
            pipeline = cfg[f'{split}_dataloader'].dataset.pipeline
            out[f'{split}_pipeline'] = pipeline_values(
                pipeline, card[f'{split}_pipeline'].expected, scope)
        out['metric'] = metric_values(cfg, scope)
    out.update(schedule_values(cfg, card, family))
    out.update(ema_values(cfg))
    per_gpu = cfg.train_dataloader.batch_size
    out['batch_per_gpu'] = per_gpu
    # the total batch the lr refers to (auto_scale_lr, 8 GPUs)
    base_bs = cfg.get('auto_scale_lr', {}).get('base_batch_size')
    out['batch_size'] = base_bs if base_bs is not None else per_gpu * 8
    assert out['batch_size'] == per_gpu * 8, (name, out['batch_size'])
    return out


def _close(a, b):
    if isinstance(a, float) or isinstance(b, float):
        return b is not None and a is not None and \
            math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-8)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    return a == b


def compare(name):
    """[(key, card, effective)] of the mismatches; the values compared."""
    card = FAMILIES[family_of(name)]
    got = effective(name)
    bad, n = [], 0
    for key, v in card.items():
        assert key in got, f'{name}: no effective value for {key!r}'
        want = v.expected
        if key == 'mid_cosine_epoch':
            E = EPOCH_LEN.get(family_of(name), DEFAULT_EPOCH_LEN)
            ok = abs(got[key] - want) <= 1 / E
        elif key.endswith('_pipeline'):
            ok = [t for t, _ in got[key]] == [t for t, _ in want] and all(
                _close(_norm(p), g) for (_, p), (_, g) in zip(want, got[key]))
        else:
            ok = _close(want, got[key])
        n += sum(1 + len(p)
                 for _, p in want) if key.endswith('_pipeline') else 1
        if not ok:
            bad.append((key, want, got[key]))
    return bad, n


# --------------------------------------------------------------- tests
def test_every_config_has_a_card():
    assert {family_of(n) for n in CONFIGS} == set(FAMILIES)


def test_card_cites_a_source_for_every_value():
    for family, card in FAMILIES.items():
        for key, v in card.items():
            assert v.source.strip(), (family, key)
            if v.deviates:  # a deliberate difference says why
                assert len(v.why) > 20, (family, key)


@pytest.mark.parametrize('name', CONFIGS)
def test_config_matches_recipe_card(name):
    bad, n = compare(name)
    assert not bad, f'{name} differs from the recipe card ' + '; '.join(
        f'{k}: card {w!r}, effective {g!r}' for k, w, g in bad)
    # every value of the card compared (pipelines: each step and setting)
    assert n >= 30, n
