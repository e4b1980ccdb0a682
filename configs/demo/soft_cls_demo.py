# Demo (the README's main job): an mmpretrain ImageClassifier - a small SOFT
# backbone whose stage-4 cls token feeds a linear classifier - on the
# synthetic ImageNet-layout data set of tools/misc/make_demo_data.py
# (64 x 64 images, 5 classes by dominant shape), trained from scratch on the
# CPU in a few minutes. Evaluated with mmpretrain's Accuracy (top-1).
_base_ = ['mmpretrain::_base_/default_runtime.py', '../_base_/demo_common.py']

data_root = 'data/demo/imagenet/'
classes = ('circle', 'square', 'triangle', 'star', 'cross')
img_size = 64

model = dict(
    type='ImageClassifier',
    data_preprocessor=dict(
        num_classes=len(classes),
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        to_rgb=True),
    backbone=dict(
        type='mmsoft.SOFT',
        # soft_arch (_base_/demo_common.py): token maps 16, 8, 4, 2 at 64 x 64;
        # bottlenecks of 16, 16, 4 tokens
        arch=_base_.soft_arch,
        attn_cfg=dict(type='SOFTAttention', attn_norm=False),
        out_indices=(3, ),
        out_type='cls_token',
        pretrain_img_size=img_size,
        init_cfg=None),  # from scratch on the demo data: no ImageNet file
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=len(classes),
        in_channels=_base_.soft_arch.embed_dims[3],
        loss=dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        topk=(1, )))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='RandomFlip',
        prob=[0.25, 0.25, 0.25],
        direction=['horizontal', 'vertical', 'diagonal']),
    dict(type='PackInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='PackInputs'),
]
# mmpretrain's ImageNet dataset class: split 'train' / 'val' reads
# <data_root>/meta/<split>.txt ("<class>/<file> <label>") under <split>/
dataset_type = 'ImageNet'
metainfo = dict(classes=classes)
train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        split='train',
        metainfo=metainfo,
        pipeline=train_pipeline))
val_dataloader = dict(
    train_dataloader,
    batch_size=64,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        train_dataloader['dataset'], split='val', pipeline=test_pipeline))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

max_epochs = 4
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict()
test_cfg = dict()
optim_wrapper = dict(_base_.demo_optim_wrapper, clip_grad=dict(max_norm=5.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=50),
    dict(
        type='CosineAnnealingLR',
        by_epoch=True,
        begin=0,
        end=max_epochs,
        T_max=max_epochs,
        eta_min=1e-5,
        convert_to_iter_based=True),
]
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(
        type='SafeCheckpointHook', interval=max_epochs, max_keep_ckpts=1))
log_processor = dict(window_size=10)
