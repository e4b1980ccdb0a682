# UperNet, SOFT-Small (attention-normalised), ADE20K, 512 x 512, 160k iters.
# Starts from the authors' ImageNet file soft_norm_small ('SOFT_Small_norm'
# on https://github.com/fudan-zvg/SOFT#main-results, as downloaded) at
# checkpoints/soft_norm_small.pth; without it training stops and says so.
#   tools/dist_train.sh configs/upernet_soft_small_512x512_160k_ade20k.py 8
#   tools/dist_test.sh configs/upernet_soft_small_512x512_160k_ade20k.py \
#       work_dirs/upernet_soft_small_512x512_160k_ade20k/iter_160000.pth 8
# Another file: --cfg-options model.backbone.init_cfg.checkpoint=PATH;
# from scratch on purpose: --cfg-options model.backbone.init_cfg=None
#   model.backbone.norm_eval=False
# The authors' code builds soft_norm_small with depths [1, 3, 20, 4]
# (38.9M, arch='small-official'); their README and the paper list
# Small at 24M (arch='small', used here). A file of the other arch
# stops with one line naming it and the fix:
#   --cfg-options model.backbone.arch=small-official
_base_ = './_base_/upernet_soft_512x512_160k_ade20k.py'

model = dict(
    backbone=dict(
        arch='small',
        init_cfg=dict(checkpoint='checkpoints/soft_norm_small.pth')),
    # SOFT.arch_zoo['small']: all four stages / stage 3
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
