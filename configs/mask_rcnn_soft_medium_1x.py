# Mask R-CNN, SOFT-Medium (attention-normalised), FPN, COCO 2017, 1x.
#   tools/dist_train.sh configs/mask_rcnn_soft_medium_1x.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_medium.pth
_base_ = './_base_/mask_rcnn_soft_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='medium'),
    neck=dict(in_channels=[64, 128, 288, 512]))  # SOFT.arch_zoo['medium']
