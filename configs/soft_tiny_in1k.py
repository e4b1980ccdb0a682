# NeurIPS 2021 SOFT-Tiny (no attention normalisation) on ImageNet-1k
# (recipe: configs/_base_/soft_in1k.py), from scratch:
#   tools/dist_train.sh configs/soft_tiny_in1k.py 8
# The authors' file soft_tiny ('SOFT_Tiny' on
# https://github.com/fudan-zvg/SOFT#main-results), converted for
# tools/test.py (the backbone init_cfg reads it as downloaded):
#   python tools/model_converters/soft2mmsoft.py soft_tiny.pth \
#       weights/soft_tiny.pth
#   tools/dist_test.sh configs/soft_tiny_in1k.py \
#       weights/soft_tiny.pth 8
_base_ = './_base_/soft_in1k.py'

model = dict(
    backbone=dict(
        arch='tiny', attn_cfg=dict(type='SOFTAttention', attn_norm=False)))
