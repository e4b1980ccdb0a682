# Smoke config of the main job: mmdet's RetinaNet with a SOFT-Tiny backbone
# (IJCV attention normalization), inherited from the config mmdet ships.
_base_ = 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py'

custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

model = dict(
    backbone=dict(
        _delete_=True,
        type='mmsoft.SOFT',
        arch='tiny',
        attn_norm=True,
        out_indices=(1, 2, 3),
        init_cfg=None),
    neck=dict(in_channels=[128, 320, 512], start_level=0))
