"""The SOFT recipes of the papers / official repository as data (issue 30;
test_recipe_card.py). Warm-up ``length`` in its ``unit``; EMA ``momentum``:
mmengine's (``1 - decay`` of timm's ``ModelEma``)."""
from typing import Any, NamedTuple

_SAME = object()
NEURIPS = 'NeurIPS 2021 Sec. 4.1 (Implementation details)'
IJCV_DET = 'IJCV 2024 Sec. 4.2 (Implementation details)'
IJCV_SEG = 'IJCV 2024 Sec. 4.3 (Implementation details)'
MAIN = 'fudan-zvg/SOFT master: main.py'
YAML = 'fudan-zvg/SOFT master: config/SOFT_*.yaml'
TIMM_OPT = (f'{MAIN} -> timm 0.3.2 create_optimizer (1-D parameters and '
            '.bias skip decay) + no_weight_decay() = {cls_token}')
MMDET_PVT = 'mmdet configs/pvt/retinanet_pvt-t_fpn_1x_coco.py'
MMDET_1X = 'mmdet configs/_base_/schedules/schedule_1x.py'
MMDET_DATA = 'mmdet configs/_base_/datasets/coco_detection.py'
MMDET_SPARSE = ('mmdet configs/sparse_rcnn/'
                'sparse-rcnn_r50_fpn_ms-480-800-3x_coco.py')
MMSEG_SWIN = ('mmseg configs/swin/swin-tiny-patch4-window7-in1k-pre_'
              'upernet_8xb2-160k_ade20k-512x512.py')
MMSEG_DATA = 'mmseg configs/_base_/datasets/ade20k.py'
MMSEG_R50 = 'mmseg configs/_base_/models/upernet_r50.py'


class V(NamedTuple):
    """A recipe value, its source; where mmsoft differs: ours and why."""
    value: Any
    source: str
    ours: Any = _SAME
    why: str = ''

    expected = property(lambda v: v.value if v.ours is _SAME else v.ours)
    deviates = property(lambda v: v.ours is not _SAME)


#: the official ImageNet augmentations (timm) in mmpretrain's steps: scale
#: (0.08, 1), ratio (3/4, 4/3); rand-m9-mstd0.5-inc1; --reprob 0.25
_IN1K_AUGMENT = [
    ('RandomResizedCrop',
     dict(scale=(224, 224), crop_ratio_range=(0.08, 1.0),
          aspect_ratio_range=(3. / 4., 4. / 3.))),
    ('RandomFlip', dict(prob=0.5, direction='horizontal')),
    ('RandAugment',
     dict(num_policies=2, magnitude_level=9, magnitude_std=0.5,
          total_level=10)),
]  # yapf: disable
_IN1K_ERASE = ('RandomErasing', dict(erase_prob=0.25, mode='rand'))

CLS_IN1K = dict(
    optimizer=V('AdamW', f'{NEURIPS}; {MAIN} --opt adamw'),
    lr=V(1e-3, f'{YAML} lr: 1e-3 (main.py: x batch/1024)'),
    betas=V((0.9, 0.999), f'{MAIN} --opt-betas None -> AdamW default'),
    eps=V(1e-8, f'{MAIN} --opt-eps 1e-8'),
    weight_decay=V(0.05, f'{NEURIPS}; {MAIN} --weight-decay 0.05'),
    decay_exempt=V(
        frozenset({'norm', 'bias', 'cls_token'}),
        TIMM_OPT,
        ours=frozenset({'norm', 'bias', 'cls_token', 'pos_embed'}),
        why='position embeddings exempt as in PVT / DeiT / Swin / ViT'),
    clip_grad=V(1.0, f'{YAML} clip_grad: 1.0 (timm: clip_grad_norm_, L2)'),
    batch_size=V(1024, f'{NEURIPS}; {YAML} batch_size: 128 x 8 GPUs'),
    batch_per_gpu=V(128, f'{YAML} batch_size: 128'),
    max_epochs=V(
        300,
        f'{NEURIPS}; {YAML} epochs: 300 (+ 10 cool-down in timm)',
        ours=300,
        why='timm\'s 10 cool-down epochs left out (papers: 300)'),
    warmup=V(
        dict(unit='epoch', length=10, start_lr=1e-6),
        f'{NEURIPS} (10 epochs linear); {YAML} warmup_epochs: 10; '
        'main.py --warmup-lr 1e-6'),
    final_lr=V(5e-5, f'{YAML} min_lr: 5e-5 (cosine: {NEURIPS})'),
    mid_cosine_epoch=V(
        150,
        'timm 0.3.2 CosineLRScheduler(t_initial=300): midpoint 150',
        ours=155,
        why='mmpretrain\'s cosine after the warm-up: midpoint 155'),
    ema_momentum=V(4e-5, f'{MAIN} --model-ema-decay 0.99996 (per iter)'),
    ema_horizon_iters=V(25000, 'from ema_momentum: 1 / 4e-5 iterations'),
    norm_eval=V(False, f'{MAIN} (patch-embedding BatchNorms train)'),
    frozen=V(frozenset(), f'{MAIN} (every parameter trains)'),
    drop_path_rate=V(0.1, f'{MAIN} --drop-path 0.1'),
    residual_drop=V('dropout', 'fudan-zvg/SOFT softmax_free_transformer.py'),
    label_smoothing=V(0.1, f'{NEURIPS}; {MAIN} --smoothing 0.1'),
    mixup=V(0.8, f'{NEURIPS}; {MAIN} --mixup 0.8'),
    cutmix=V(1.0, f'{NEURIPS}; {MAIN} --cutmix 1.0'),
    train_pipeline=V(
        [('LoadImageFromFile', {}), *_IN1K_AUGMENT,
         ('PackInputs', {}), _IN1K_ERASE],
        f'{NEURIPS}; {MAIN} (timm aug)',
        ours=[('LoadImageFromFile', {}), *_IN1K_AUGMENT, _IN1K_ERASE,
              ('PackInputs', {})],
        why='mmpretrain\'s order: erasing the uint8 image, then packing'),
    test_pipeline=V([
        ('LoadImageFromFile', {}),
        ('ResizeEdge', dict(scale=256, edge='short', interpolation='bicubic')),
        ('CenterCrop', dict(crop_size=(224, 224))), ('PackInputs', {})
    ], 'Table 3 caption (224 center crop of 256); timm crop_pct 0.875'),
    metric=V(('Accuracy', dict(topk=(1, 5))), f'{NEURIPS} Metrics'),
)

_DET_COMMON = dict(
    optimizer=V('AdamW', IJCV_DET),
    lr=V(1e-4, f'{IJCV_DET} (base learning rate 1x10^-4)'),
    betas=V((0.9, 0.999), f'{MMDET_PVT} (AdamW defaults)'),
    weight_decay=V(0.01, f'{IJCV_DET} (weight decay 0.01)'),
    decay_exempt=V(
        frozenset(),
        f'{IJCV_DET} (none named); {MMDET_PVT}',
        ours=frozenset({'norm', 'pos_embed', 'cls_token'}),
        why='not decayed in the pretraining either; biases decay (mmdet)'),
    clip_grad=V(None, f'{MMDET_PVT} (no clip_grad)'),
    batch_size=V(16, f'{IJCV_DET} (16 on 8 V100 GPUs)'),
    batch_per_gpu=V(2, f'{IJCV_DET} (16 on 8 GPUs)'),
    warmup=V(
        dict(unit='iter', length=500, start_lr=1e-7),
        f'{MMDET_1X} (LinearLR start_factor 0.001, 500 iterations)'),
    gamma=V(0.1, MMDET_1X),
    ema_momentum=V(None, f'{IJCV_DET} / {MMDET_PVT} (no EMA)'),
    norm_eval=V(True, 'mmdet configs/_base_/models/retinanet_r50_fpn.py'),
    frozen=V(frozenset(), f'{MMDET_PVT} (no frozen stages)'),
    drop_path_rate=V(0.1, f'{MMDET_PVT} (PVT default drop_path_rate)'),
    residual_drop=V('dropout', 'as the ImageNet pretraining'),
    test_pipeline=V([('LoadImageFromFile', {}),
                     ('Resize', dict(scale=(1333, 800), keep_ratio=True)),
                     ('LoadAnnotations', dict(with_bbox=True)),
                     ('PackDetInputs', {})],
                    f'{IJCV_DET} (800, <= 1333); {MMDET_DATA}'),
)


def _det(schedule, with_mask, extra=None):
    one_x = schedule == '1x'
    resize = ('Resize', dict(scale=(1333, 800), keep_ratio=True)) if one_x \
        else ('RandomChoiceResize',
              dict(scales=[(1333, s) for s in range(480, 801, 32)],
                   keep_ratio=True))
    train = [('LoadImageFromFile', {}),
             ('LoadAnnotations', dict(with_bbox=True, with_mask=with_mask)),
             resize, ('RandomFlip', dict(prob=0.5)), ('PackDetInputs', {})]
    src, epochs, steps = (MMDET_1X, 12, [8, 11]) if one_x else (MMDET_SPARSE,
                                                                36, [27, 33])
    return dict(
        _DET_COMMON,
        max_epochs=V(epochs, f'{IJCV_DET} ({schedule}); {src}'),
        milestones=V(steps, src),
        final_lr=V(1e-6, f'{src} (x0.1 at epochs {steps[0]}, {steps[1]})'),
        train_pipeline=V(
            train, f'{IJCV_DET}; {MMDET_DATA}' if one_x else
            f'{IJCV_DET} (shorter sides 480 to 800); {MMDET_SPARSE}'),
        metric=V(('CocoMetric',
                  dict(metric=['bbox', 'segm'] if with_mask else ['bbox'])),
                 f'{IJCV_DET} Table 4 / 5'),
        **(extra or {}))


def _seg_train(resize):
    """mmseg's ADE20K training pipeline with the ``resize`` step."""
    return [('LoadImageFromFile', {}),
            ('LoadAnnotations', dict(reduce_zero_label=True)), resize,
            ('RandomCrop', dict(crop_size=(512, 512), cat_max_ratio=0.75)),
            ('RandomFlip', dict(prob=0.5)), ('PhotoMetricDistortion', {}),
            ('PackSegInputs', {})]


SEG_160K = dict(
    optimizer=V('AdamW', IJCV_SEG),
    lr=V(6e-4, f'{IJCV_SEG} (AdamW, 6x10^-4)'),
    betas=V((0.9, 0.999), MMSEG_SWIN),
    weight_decay=V(0.01, f'{MMSEG_SWIN} (the paper gives none)'),
    decay_exempt=V(
        frozenset({'norm', 'pos_embed'}),
        f'{MMSEG_SWIN} (decay_mult 0)',
        ours=frozenset({'norm', 'pos_embed', 'cls_token'}),
        why='the unused stage-4 cls token exempt as in the ImageNet recipe'),
    clip_grad=V(None, f'{MMSEG_SWIN} (no clip_grad)'),
    batch_size=V(16, f'{MMSEG_SWIN} (8xb2)'),
    batch_per_gpu=V(2, MMSEG_SWIN),
    max_iters=V(160000, f'{IJCV_SEG} (160k iterations)'),
    warmup=V(
        dict(unit='iter', length=1500, start_lr=6e-4 * 1e-6),
        f'{MMSEG_SWIN} (LinearLR start_factor 1e-6, 1500 iterations)'),
    final_lr=V(0.0, f'{MMSEG_SWIN} (PolyLR power 1.0, eta_min 0)'),
    poly_power=V(1.0, MMSEG_SWIN),
    ema_momentum=V(None, f'{IJCV_SEG} / {MMSEG_SWIN} (no EMA)'),
    norm_eval=V(
        False,
        f'{MMSEG_R50} (with SyncBN)',
        ours=True,
        why='2 images per GPU without SyncBN: keep ImageNet statistics'),
    frozen=V(frozenset(), f'{MMSEG_SWIN} (no frozen stages)'),
    drop_path_rate=V(
        0.3,
        f'{MMSEG_SWIN} (Swin-T)',
        ours=0.1,
        why='every dense config (soft_dense.py): 0.1 as mmdet\'s PVT'),
    residual_drop=V('dropout', 'as the ImageNet pretraining'),
    train_pipeline=V(
        _seg_train(
            ('RandomResize',
             dict(scale=(2048, 512), keep_ratio=True,
                  ratio_range=(0.5, 2.0)))),
        MMSEG_DATA,
        ours=_seg_train(('Resize', dict(scale=(2048, 512), keep_ratio=True))),
        why=f'{IJCV_SEG}: no multi-scale training: a fixed short side 512'),
    test_pipeline=V([('LoadImageFromFile', {}),
                     ('Resize', dict(scale=(2048, 512), keep_ratio=True)),
                     ('LoadAnnotations', dict(reduce_zero_label=True)),
                     ('PackSegInputs', {})], f'{MMSEG_DATA}; {IJCV_SEG}'),
    test_mode=V('whole', f'{MMSEG_R50} (test_cfg mode whole)'),
    metric=V(('IoUMetric', dict(iou_metrics=['mIoU'])), f'{IJCV_SEG} Table 6'),
)

#: configuration family -> its card
FAMILIES = dict(
    cls_in1k=CLS_IN1K,
    det_1x=_det('1x', with_mask=False),
    det_mask_1x=_det('1x', with_mask=True),
    det_3x_ms=_det('3x', with_mask=False),
    det_mask_3x_ms=_det('3x', with_mask=True),
    det_sparse_3x_ms=_det('3x', False, dict(clip_grad=V(1.0, MMDET_SPARSE))),
    seg_160k=SEG_160K,
)


def family_of(name):
    """The card of a config of ``configs/`` (by its file name)."""
    if name.startswith('soft_') and name.endswith('_in1k'):
        return 'cls_in1k'
    if name.startswith('upernet_') and '160k_ade20k' in name:
        return 'seg_160k'
    mask = '_mask' if 'mask_rcnn' in name else ''
    if name.endswith('_1x'):
        return f'det{mask}_1x'
    if name.endswith('_3x_ms'):
        return 'det_sparse_3x_ms' if name.startswith('sparse_rcnn') \
            else f'det{mask}_3x_ms'
    raise KeyError(f'{name}: no recipe card for this config; add its '
                   f'family to tests/reference/recipe_card.py')
