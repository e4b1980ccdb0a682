# Mask R-CNN, SOFT-Small (attention-normalised), FPN, COCO 2017, 3x schedule
# (36 epochs, lr x0.1 at epochs 27 and 33) with multi-scale training: the
# shorter side is drawn from 480..800 (step 32, longer side <= 1333).
# IJCV 2024 Sec. 4.2; AdamW lr 1e-4, weight decay 0.01, 8 GPUs x 2 images.
#   tools/dist_train.sh configs/mask_rcnn_soft_small_3x_ms.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_small.pth
_base_ = './_base_/mask_rcnn_soft_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='small'),
    neck=dict(in_channels=[64, 128, 320, 512]))  # SOFT.arch_zoo['small']

train_pipeline = {{_base_.ms_mask_train_pipeline}}
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
train_cfg = dict(max_epochs=36)
param_scheduler = {{_base_.schedule_3x}}
