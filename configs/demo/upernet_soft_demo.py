# Demo (the README's main job): UperNet with a small SOFT backbone on the
# synthetic ADE20K-layout data set of tools/misc/make_demo_data.py
# (160 x 160 images), trained from scratch on the CPU in a few minutes.
# The label PNGs use ADE20K's indices: 0 = "other" (ignored through
# reduce_zero_label), background = 'wall' (1), circles = 'ball' (120),
# squares = 'box' (42), triangles = 'tent' (115); the metainfo below selects
# these 4 of the 150 classes (ADE20KDataset's label map -> 0..3).
# Composed from mmseg's shipped UperNet and ADE20K configs; the heads keep
# their types and are only narrowed.
# Evaluated with mmseg's IoUMetric (mIoU).
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    '../_base_/demo_common.py',
]

data_root = 'data/demo/ade/'
classes = ('wall', 'ball', 'box', 'tent')
metainfo = dict(
    classes=classes,
    palette=[[90, 90, 90], [220, 20, 60], [0, 130, 255], [0, 200, 80]])
img_size = 160
crop_size = (img_size, img_size)
norm_cfg = dict(type='BN', requires_grad=True)  # single process: no SyncBN

model = dict(
    data_preprocessor=dict(size=crop_size),
    pretrained=None,
    backbone=dict(
        _delete_=True,
        type='mmsoft.SOFT',
        arch=_base_.soft_arch,
        attn_cfg=dict(type='SOFTAttention', attn_norm=True),
        out_indices=(0, 1, 2, 3),
        out_type='featmap',
        pretrain_img_size=img_size,
        init_cfg=None),  # from scratch on the demo data: no ImageNet file
    decode_head=dict(
        in_channels=_base_.soft_arch.embed_dims,
        channels=64,
        num_classes=len(classes),
        norm_cfg=norm_cfg),
    auxiliary_head=dict(
        in_channels=_base_.soft_arch.embed_dims[2],
        channels=32,
        num_classes=len(classes),
        norm_cfg=norm_cfg))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),  # reduce_zero_label: from the dataset
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='RandomFlip', prob=0.5, direction='vertical'),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),  # reduce_zero_label: from the dataset
    dict(type='PackSegInputs'),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root, metainfo=metainfo, pipeline=train_pipeline))
val_dataloader = dict(
    train_dataloader,
    dataset=dict(train_dataloader['dataset'], pipeline=test_pipeline))
test_dataloader = val_dataloader

# iteration-based, as mmseg's schedules (500 iterations = 8 epochs of 500)
max_iters = 500
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
optim_wrapper = dict(
    type='OptimWrapper',
    **_base_.demo_optim_wrapper,
    clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(
        type='CosineAnnealingLR',
        by_epoch=False,
        begin=0,
        end=max_iters,
        T_max=max_iters,
        eta_min=1e-5),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10, log_metric_by_epoch=False),
    checkpoint=dict(
        type='SafeCheckpointHook',
        by_epoch=False,
        interval=max_iters,
        max_keep_ckpts=1))
log_processor = dict(by_epoch=False, window_size=10)
