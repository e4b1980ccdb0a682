# RetinaNet, SOFT-Medium (attention-normalised), FPN, COCO 2017, 1x.
# Starts from the authors' ImageNet file soft_norm_medium ('SOFT_Medium_norm'
# on https://github.com/fudan-zvg/SOFT#main-results, as downloaded) at
# checkpoints/soft_norm_medium.pth; without it training stops and says so.
#   tools/dist_train.sh configs/retinanet_soft_medium_1x.py 8
#   tools/dist_test.sh configs/retinanet_soft_medium_1x.py \
#       work_dirs/retinanet_soft_medium_1x/epoch_12.pth 8
# Another file: --cfg-options model.backbone.init_cfg.checkpoint=PATH;
# from scratch on purpose: --cfg-options model.backbone.init_cfg=None
#   model.backbone.norm_eval=False
_base_ = './_base_/retinanet_soft_fpn_1x_coco.py'

model = dict(
    backbone=dict(
        arch='medium',
        init_cfg=dict(checkpoint='checkpoints/soft_norm_medium.pth')),
    neck=dict(in_channels=[64, 128, 288, 512]))  # SOFT.arch_zoo['medium']
