# Demo (the README's main job): RetinaNet with a small SOFT backbone on the
# synthetic COCO-format data set of tools/misc/make_demo_data.py
# (160 x 160 images, 3 shape classes), trained from scratch on the CPU in a
# few minutes. Inherits mmdet's shipped RetinaNet config; the head keeps its
# type and is only narrowed (64 channels, 2 stacked convs).
# Evaluated with mmdet's CocoMetric (pycocotools): bbox mAP.
_base_ = [
    'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', '../_base_/demo_common.py'
]

data_root = 'data/demo/coco/'
classes = ('circle', 'square', 'triangle')
metainfo = dict(
    classes=classes, palette=[(220, 20, 60), (0, 130, 255), (0, 200, 80)])
img_size = 160
fpn_channels = 64

model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    backbone=dict(
        _delete_=True,
        type='mmsoft.SOFT',
        # soft_arch (_base_/demo_common.py): the sampling ratios keep 25-100
        # bottleneck tokens per stage at 160 x 160 (token maps 40, 20, 10, 5)
        arch=_base_.soft_arch,
        attn_cfg=dict(type='SOFTAttention', attn_norm=True),
        out_indices=(1, 2, 3),
        out_type='featmap',
        pretrain_img_size=img_size,
        init_cfg=None),  # from scratch on the demo data: no ImageNet file
    neck=dict(
        in_channels=_base_.soft_arch.embed_dims[1:],
        start_level=0,
        out_channels=fpn_channels,
        num_outs=4),
    bbox_head=dict(
        num_classes=len(classes),
        in_channels=fpn_channels,
        feat_channels=fpn_channels,
        stacked_convs=2,
        # anchors 16..200 px at strides 8..64 (objects are 20-76 px)
        anchor_generator=dict(octave_base_scale=2, strides=[8, 16, 32, 64])),
    test_cfg=dict(nms_pre=500, max_per_img=50))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    # the shapes are symmetric under flips: 4x more distinct views
    dict(
        type='RandomFlip',
        prob=[0.25, 0.25, 0.25],
        direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor')),
]
train_dataloader = dict(
    batch_size=8,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    train_dataloader,
    dataset=dict(
        train_dataloader['dataset'],
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(
    ann_file=data_root + 'annotations/instances_val.json', metric='bbox')
test_evaluator = val_evaluator

max_epochs = 8
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    **_base_.demo_optim_wrapper,
    clip_grad=dict(max_norm=10.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=100),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=1e-5,
        convert_to_iter_based=True),
]
auto_scale_lr = dict(enable=False, base_batch_size=8)
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(
        type='SafeCheckpointHook', interval=max_epochs, max_keep_ckpts=1))
log_processor = dict(window_size=10)
