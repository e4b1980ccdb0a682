# UperNet, SOFT-Medium (attention-normalised), ADE20K, 512 x 512, 160k iters.
# Starts from the authors' ImageNet file soft_norm_medium ('SOFT_Medium_norm'
# on https://github.com/fudan-zvg/SOFT#main-results, as downloaded) at
# checkpoints/soft_norm_medium.pth; without it training stops and says so.
#   tools/dist_train.sh configs/upernet_soft_medium_512x512_160k_ade20k.py 8
#   tools/dist_test.sh configs/upernet_soft_medium_512x512_160k_ade20k.py \
#       work_dirs/upernet_soft_medium_512x512_160k_ade20k/iter_160000.pth 8
# Another file: --cfg-options model.backbone.init_cfg.checkpoint=PATH;
# from scratch on purpose: --cfg-options model.backbone.init_cfg=None
#   model.backbone.norm_eval=False
_base_ = './_base_/upernet_soft_512x512_160k_ade20k.py'

model = dict(
    backbone=dict(
        arch='medium',
        init_cfg=dict(checkpoint='checkpoints/soft_norm_medium.pth')),
    # SOFT.arch_zoo['medium']: all four stages / stage 3
    decode_head=dict(in_channels=[64, 128, 288, 512]),
    auxiliary_head=dict(in_channels=288))
