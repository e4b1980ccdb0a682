# UperNet with a SOFT backbone on ADE20K (150 classes), 512 x 512 crops,
# 160k iterations, batch 16 (8 GPUs x 2 images). IJCV 2024 Sec. 4.3 /
# Table 6: AdamW with lr 6e-4, no multi-scale training, no test-time
# augmentation (single-scale whole-image inference, short side 512).
# mIoU from mmseg's IoUMetric (per-class table + aAcc / mIoU / mAcc).
# Composed from mmseg's shipped UperNet / ADE20K / 160k configs; children
# set the arch and the heads' in_channels (SOFT.arch_zoo[arch]).
#
# Children also name the authors' ImageNet file of their arch
# (checkpoints/soft_norm_<size>.pth, as downloaded from
# https://github.com/fudan-zvg/SOFT#main-results); tools/train.py stops with
# one line when it is missing.
_base_ = [
    'mmseg::_base_/models/upernet_r50.py',
    'mmseg::_base_/datasets/ade20k.py',
    'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_160k.py',
    './soft_dense.py',
]

# atomic checkpoints with RNG states; --resume takes the newest
# complete one (mmsoft.engine.SafeCheckpointHook)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))

crop_size = (512, 512)
data_preprocessor = dict(size=crop_size)
model = dict(
    data_preprocessor=data_preprocessor,
    pretrained=None,
    backbone={{_base_.soft_backbone}},
    decode_head=dict(in_channels=[64, 128, 320, 512], num_classes=150),
    auxiliary_head=dict(in_channels=320, num_classes=150))

# "Multi-scale training and test time augmentation are not used" (IJCV
# Sec. 4.3): a fixed short side of 512 instead of mmseg's 0.5-2.0 random
# rescaling, then the usual 512 x 512 crop, flip and photometric jitter.
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='Resize', scale=(2048, 512), keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=2,  # x 8 GPUs = 16
    dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(batch_size=1)
test_dataloader = val_dataloader

# the detection configs' AdamW (soft_dense.py) with lr 6e-4
optim_wrapper = dict(
    _base_.soft_optim_wrapper,
    optimizer=dict(_base_.soft_optim_wrapper.optimizer, lr=6e-4))

param_scheduler = [
    dict(
        type='LinearLR', start_factor=1e-6, by_epoch=False, begin=0, end=1500),
    dict(
        type='PolyLR',
        eta_min=0.0,
        power=1.0,
        begin=1500,
        end=160000,
        by_epoch=False,
    )
]
