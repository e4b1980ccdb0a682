# IJCV 2024 SOFT-Small with attention normalisation on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py). ImageNet weights:
#   --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_small.pth
# The official SOFT-Small models (fudan-zvg/SOFT) have depths
# [1, 3, 20, 4] (SOFT.arch_zoo['small-official']); load their weights with
#   --cfg-options model.backbone.arch=small-official
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='small', attn_cfg=dict(type='SOFTAttention', attn_norm=True)))
