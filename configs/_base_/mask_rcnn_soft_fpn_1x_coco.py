# Mask R-CNN with a SOFT backbone on COCO 2017, 1x schedule (12 epochs).
# IJCV 2024 Sec. 4.2 / Table 4: AdamW, lr 1e-4, weight decay 0.01, batch 16
# (8 GPUs x 2 images), shorter side 800 (longer <= 1333).
# Inherits mmdet's shipped Mask R-CNN-R50-FPN 1x config; children set the
# arch and the neck's in_channels (= SOFT.arch_zoo[arch]['embed_dims']).
#
# ImageNet weights of the soft_norm_* backbone (mmpretrain format):
#   --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_small.pth
# Without it (checkpoint=None) the backbone is randomly initialised.
_base_ = 'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py'

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
    neck=dict(in_channels=[64, 128, 320, 512]))

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16

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
