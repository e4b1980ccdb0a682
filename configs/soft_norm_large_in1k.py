# IJCV 2024 SOFT-Large with attention normalisation on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py). ImageNet weights:
#   --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_large.pth
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='large', attn_cfg=dict(type='SOFTAttention', attn_norm=True)))
