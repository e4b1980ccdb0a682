# UperNet, SOFT-Small (attention-normalised), ADE20K, 512 x 512, 160k iters.
#   tools/dist_train.sh configs/upernet_soft_small_512x512_160k_ade20k.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_small.pth
#   tools/dist_test.sh configs/upernet_soft_small_512x512_160k_ade20k.py \
#       work_dirs/upernet_soft_small_512x512_160k_ade20k/iter_160000.pth 8
_base_ = './_base_/upernet_soft_512x512_160k_ade20k.py'

model = dict(
    backbone=dict(arch='small'),
    # SOFT.arch_zoo['small']: all four stages / stage 3
    decode_head=dict(in_channels=[64, 128, 320, 512]),
    auxiliary_head=dict(in_channels=320))
