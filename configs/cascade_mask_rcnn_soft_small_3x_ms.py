# Cascade Mask R-CNN, SOFT-Small (attention-normalised), FPN, COCO 2017,
# 3x schedule (36 epochs, lr x0.1 at epochs 27 and 33) with multi-scale
# training: the shorter side is drawn from 480..800 (step 32, longer side
# <= 1333).
# IJCV 2024 Sec. 4.2 / Table 5: AdamW lr 1e-4, weight decay 0.01, batch 16
# (8 GPUs x 2 images). Inherits mmdet's shipped
# cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py.
#   tools/dist_train.sh configs/cascade_mask_rcnn_soft_small_3x_ms.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_small.pth
# Without the checkpoint (None) the backbone is randomly initialised.
_base_ = 'mmdet::cascade_rcnn/cascade-mask-rcnn_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='SOFT',
        arch='small',
        attn_norm=True,
        out_indices=(0, 1, 2, 3),
        out_type='featmap',
        drop_path_rate=0.1,
        # BatchNorm of the conv patch embeddings keeps its ImageNet
        # statistics (2 images per GPU are too few to update them)
        norm_eval=True,
        init_cfg=dict(type='Pretrained', checkpoint=None,
                      prefix='backbone.')),
    neck=dict(in_channels=[64, 128, 320, 512]))  # SOFT.arch_zoo['small']

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args={{_base_.backend_args}}),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='RandomChoiceResize',
        scales=[(1333, 480), (1333, 512), (1333, 544), (1333, 576),
                (1333, 608), (1333, 640), (1333, 672), (1333, 704),
                (1333, 736), (1333, 768), (1333, 800)],
        keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))

max_epochs = 36
train_cfg = dict(type='EpochBasedTrainLoop', max_epochs=max_epochs)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[27, 33],
        gamma=0.1)
]

optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        custom_keys={
            '.pos_embeds': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0),
        }))

auto_scale_lr = dict(enable=False, base_batch_size=16)
