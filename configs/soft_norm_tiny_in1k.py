# IJCV 2024 SOFT-Tiny with attention normalisation on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py). ImageNet weights:
#   --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_tiny.pth
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='tiny', attn_cfg=dict(type='SOFTAttention', attn_norm=True)))
