# IJCV 2024 SOFT-Medium with attention normalisation on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py), from scratch:
#   tools/dist_train.sh configs/soft_norm_medium_in1k.py 8
# The authors' file soft_norm_medium ('SOFT_Medium_norm' on
# https://github.com/fudan-zvg/SOFT#main-results), converted for
# tools/test.py (the backbone init_cfg reads it as downloaded):
#   python tools/model_converters/soft2mmsoft.py soft_norm_medium.pth \
#       weights/soft_norm_medium.pth --norm
#   tools/dist_test.sh configs/soft_norm_medium_in1k.py \
#       weights/soft_norm_medium.pth 8
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='medium', attn_cfg=dict(type='SOFTAttention', attn_norm=True)))
