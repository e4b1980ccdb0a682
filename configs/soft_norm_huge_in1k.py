# IJCV 2024 SOFT-Huge with attention normalisation on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py), from scratch:
#   tools/dist_train.sh configs/soft_norm_huge_in1k.py 8
# The authors publish no soft_norm_huge file
# (https://github.com/fudan-zvg/SOFT#main-results): this config
# is the way to ImageNet weights of this model.
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='huge', attn_cfg=dict(type='SOFTAttention', attn_norm=True)))
