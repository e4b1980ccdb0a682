# NeurIPS 2021 SOFT-Small (no attention normalisation) on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py), from scratch:
#   tools/dist_train.sh configs/soft_small_in1k.py 8
# The authors publish no soft_small file
# (https://github.com/fudan-zvg/SOFT#main-results): this config
# is the way to ImageNet weights of this model.
# The authors' code builds soft_small with depths [1, 3, 20, 4] (38.9M,
# arch='small-official'); their README and the paper list Small at
# 24M (arch='small', used here). A file of the other arch stops with
# one line naming it and the fix:
#   --cfg-options model.backbone.arch=small-official
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='small', attn_cfg=dict(type='SOFTAttention', attn_norm=False)))
