"""Every config under ``configs/`` (not ``_base_``): its settings, one
training step and one prediction with its own codebase on CPU, the SOFT arch
replaced by a tiny one (the real channels: ``test_common_settings``,
``test_real_backbone_feeds_neck``)."""
import copy
import glob
import importlib
import os.path as osp

import pytest
import torch
from conftest import CONFIGS as CONFIG_DIR
from conftest import save_classifier_checkpoint, tiny_arch
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmsoft.models import SOFT
from mmsoft_tools import launch
from mmsoft_tools.analysis import random_batch

ARCHS = ('tiny', 'small', 'medium', 'large', 'huge')
CLS = [f'soft_{n}{a}_in1k' for a in ARCHS for n in ('', 'norm_')]
SEG = [f'upernet_soft_{a}_512x512_160k_ade20k' for a in ('small', 'medium')]
DET = [f'{d}_soft_{a}_1x' for d in ('retinanet', 'mask_rcnn')
       for a in ARCHS[:4]] + [
           f'{d}_soft_small_3x_ms' for d in ('mask_rcnn', 'cascade_mask_rcnn',
                                             'atss', 'gfl', 'sparse_rcnn')
       ]  # yapf: disable
CONFIGS = sorted(
    osp.splitext(osp.basename(p))[0]
    for p in glob.glob(osp.join(CONFIG_DIR, '*.py')))
DATASETS = dict(
    mmpretrain='ImageNet', mmdet='CocoDataset', mmseg='ADE20KDataset')
TINY_ARCH = tiny_arch()
SIZE = 64
#: detector widths -> test widths (FPN / head channels 256, FC layers)
NARROW = {256: 64, 1024: 64, 2048: 64}
CHANNEL_KEYS = ('in_channels', 'out_channels', 'feat_channels',
                'conv_out_channels', 'fc_out_channels', 'feedforward_channels',
                'proposal_feature_channel')
_CFG_CACHE = {}


def load(name):
    if name not in _CFG_CACHE:
        _CFG_CACHE[name] = Config.fromfile(osp.join(CONFIG_DIR, name + '.py'))
    return copy.deepcopy(_CFG_CACHE[name])


def scope_of(name):
    return 'mmpretrain' if name in CLS else 'mmseg' if name in SEG else 'mmdet'


def registry(scope, name='MODELS'):
    return getattr(importlib.import_module(f'{scope}.registry'), name)


def test_expected_configs_exist():
    assert sorted(CLS + DET + SEG) == CONFIGS


@pytest.mark.parametrize('name', CONFIGS)
def test_common_settings(name):
    """What the recipe card does not compare; the real channels (the
    ImageNet weights: test_official_files.py)."""
    cfg, scope = load(name), scope_of(name)
    assert cfg.default_scope == launch.codebase_of(cfg) == scope
    assert cfg.custom_imports == dict(
        imports=['mmsoft'], allow_failed_imports=False)
    assert cfg.optim_wrapper.type == 'OptimWrapper'
    assert cfg.train_dataloader.dataset.type == DATASETS[scope]
    if name in SEG:
        assert cfg.train_cfg.type == 'IterBasedTrainLoop'
        assert tuple(cfg.model.data_preprocessor.size) == (512, 512)
    else:  # the total batch the lr refers to, for --auto-scale-lr
        assert cfg.auto_scale_lr.base_batch_size == \
            8 * cfg.train_dataloader.batch_size
    bb, m = cfg.model.backbone, cfg.model
    dims = list(SOFT.arch_zoo[bb.arch]['embed_dims'])
    assert bb.type == 'SOFT' and bb.arch in ARCHS and bb.arch in name
    if name in CLS:
        assert bb.attn_cfg.attn_norm == name.startswith('soft_norm_')
        assert bb.out_type == 'cls_token' and tuple(bb.out_indices) == (3, )
        assert m.head.in_channels == dims[3] and m.head.num_classes == 1000
    else:
        assert bb.attn_cfg.attn_norm is True and bb.out_type == 'featmap'
        assert tuple(bb.out_indices) == (0, 1, 2, 3)
    if name in SEG:
        assert list(m.decode_head.in_channels) == dims
        assert m.auxiliary_head.in_channels == dims[m.auxiliary_head.in_index]
        assert m.decode_head.num_classes == m.auxiliary_head.num_classes == 150
    elif name not in CLS:
        assert list(m.neck.in_channels) == dims


def test_real_backbone_feeds_neck():
    """The real SOFT-Medium backbone + FPN of a config run end to end."""
    cfg = load('retinanet_soft_medium_1x')
    launch.import_codebase(cfg)
    with DefaultScope.overwrite_default_scope('mmdet'):
        backbone, neck = map(
            registry('mmdet').build, (cfg.model.backbone, cfg.model.neck))
    assert backbone.out_channels == list(cfg.model.neck.in_channels)
    backbone.eval()
    with torch.no_grad():
        feats = backbone(torch.randn(1, 3, SIZE, SIZE))
        assert [f.shape[1] for f in feats] == backbone.out_channels
        assert len(neck(feats)) == cfg.model.neck.num_outs


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
    """cfg.model with a tiny SOFT and matching neck / head channels; a
    detector with tens of proposals / RoIs and score_thr 0 (random
    detectors predict)."""
    m = copy.deepcopy(cfg.model)
    if 'data_preprocessor' not in m and cfg.get('data_preprocessor'):
        m.data_preprocessor = copy.deepcopy(cfg.data_preprocessor)
    m.backbone.arch = copy.deepcopy(TINY_ARCH)
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
    if train.get('rpn_proposal'):
        train.rpn_proposal.update(nms_pre=200, max_per_img=50)
    rcnn = train.get('rcnn') or []
    for stage in rcnn if isinstance(rcnn, list) else [rcnn]:
        if 'num' in stage.get('sampler', {}):
            stage.sampler.num = 32
    if test.get('rpn'):
        test.rpn.update(nms_pre=100, max_per_img=20)
    if 'rcnn' in test:
        test.rcnn.update(score_thr=0.0, max_per_img=10)
    elif test:  # one-stage
        test.update(nms_pre=100, max_per_img=10)
    if m.get('rpn_head', {}).get('type') == 'EmbeddingRPNHead':  # Sparse
        m.rpn_head.num_proposals = 10
    return m


@pytest.mark.parametrize('name', CONFIGS)
def test_train_step_and_predict(name):
    from mmengine.model import revert_sync_batchnorm
    from mmengine.optim import build_optim_wrapper
    cfg = load(name)
    cfg.model.backbone.init_cfg = None  # a tiny arch: no ImageNet file
    scope = launch.import_codebase(cfg)
    with DefaultScope.overwrite_default_scope(scope):
        model = revert_sync_batchnorm(
            registry(scope).build(tiny_model_cfg(cfg, scope)))
        model.init_weights()
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
        torch.manual_seed(0)
        model.train()
        data = model.data_preprocessor(random_batch(scope, name, SIZE), True)
        losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
        assert torch.isfinite(loss), losses
        optim_wrapper.backward(loss)
        grads = {
            n: p.grad
            for n, p in model.backbone.named_parameters() if p.requires_grad
        }
        assert [n for n, g in grads.items() if g is None] == []
        assert all(torch.isfinite(g).all() for g in grads.values())
        stem = model.backbone.stages[0].patch_embed.proj[0].conv.weight.grad
        assert stem.abs().sum() > 0  # gradients reach the first conv
        optim_wrapper.step()
        optim_wrapper.zero_grad()
        model.eval()
        with torch.no_grad():
            preds = model.test_step(random_batch(scope, name, SIZE, 1))
    assert len(preds) == 1
    pred = preds[0]
    if scope == 'mmpretrain':
        assert pred.pred_score.shape == (1000, )
        assert torch.isfinite(pred.pred_score).all()
    elif scope == 'mmdet':
        inst = pred.pred_instances
        assert inst.bboxes.shape[1] == 4 and torch.isfinite(inst.scores).all()
        if 'mask_rcnn' in name:
            assert len(inst) > 0
            assert inst.masks.shape == (len(inst), SIZE, SIZE)
    else:
        assert pred.pred_sem_seg.data.shape == (1, SIZE, SIZE)
        assert pred.seg_logits.data.shape == (150, SIZE, SIZE)


@pytest.mark.parametrize('name', [
    'soft_norm_tiny_in1k', 'retinanet_soft_tiny_1x',
    'upernet_soft_small_512x512_160k_ade20k'
])
def test_pretrained_override_loads_weights(name, tmp_path):
    """``model.backbone.init_cfg.checkpoint=PATH`` loads ``backbone.*``."""
    cfg = load(name)
    scope = launch.import_codebase(cfg)
    src = SOFT(arch=copy.deepcopy(TINY_ARCH))
    src.init_weights()
    ckpt = str(tmp_path / 'soft_tiny.pth')
    save_classifier_checkpoint(ckpt, src, meta=dict())
    cfg.merge_from_dict({'model.backbone.init_cfg.checkpoint': ckpt})
    model_cfg = tiny_model_cfg(cfg, scope)
    assert model_cfg.backbone.init_cfg.checkpoint == ckpt
    with DefaultScope.overwrite_default_scope(scope):
        model = registry(scope).build(model_cfg)
        model.init_weights()
    got = model.backbone.state_dict()
    for k, v in src.state_dict().items():
        assert torch.equal(got[k], v), k


@pytest.mark.parametrize(
    'name',
    CONFIGS + [f'demo/{n}_demo' for n in ('retinanet_soft', 'upernet_soft',
                                          'soft_cls')])  # yapf: disable
def test_no_decay_keys_reach_the_backbone_parameters(name):
    """Every ``custom_keys`` entry names real SOFT parameters; the position
    embeddings / cls token get no weight decay."""
    from mmengine.optim import DefaultOptimWrapperConstructor
    cfg = load(name)
    keys = cfg.optim_wrapper.get('paramwise_cfg', {}).get('custom_keys', {})
    assert keys, f'{name}: no custom_keys'
    bb = dict(cfg.model.backbone, arch=TINY_ARCH, init_cfg=None)
    bb.pop('type')
    bb.pop('_delete_', None)
    model = torch.nn.Module()
    model.backbone = SOFT(**bb)
    names = [f'backbone.{n}' for n, _ in model.backbone.named_parameters()]
    for key in keys:
        assert any(key in n for n in names), f'{name}: {key!r} matches none'
    optimizer = dict(cfg.optim_wrapper.optimizer, type='AdamW')
    wrapper = DefaultOptimWrapperConstructor(
        dict(type='OptimWrapper', optimizer=optimizer),
        cfg.optim_wrapper.get('paramwise_cfg'))(model)  # yapf: disable
    decay = {
        id(p): g['weight_decay']
        for g in wrapper.optimizer.param_groups
        for p in g['params']
    }
    bb = model.backbone
    assert [decay[id(s.pos_embed)] for s in bb.stages] == [0] * 4
    assert decay[id(bb.stages[3].cls_token)] == 0
    assert decay[id(bb.stages[0].blocks[0].attn.q.weight)] > 0
