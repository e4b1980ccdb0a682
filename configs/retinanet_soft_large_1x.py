# RetinaNet, SOFT-Large (attention-normalised), FPN, COCO 2017, 1x.
#   tools/dist_train.sh configs/retinanet_soft_large_1x.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_large.pth
_base_ = './_base_/retinanet_soft_fpn_1x_coco.py'

model = dict(
    backbone=dict(arch='large'),
    neck=dict(in_channels=[64, 128, 320, 512]))  # SOFT.arch_zoo['large']
