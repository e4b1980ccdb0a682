# RetinaNet with a SOFT backbone on COCO 2017, 1x schedule (12 epochs).
# IJCV 2024 Sec. 4.2 / Table 4: AdamW, lr 1e-4, weight decay 0.01, batch 16
# (8 GPUs x 2 images), shorter side 800 (longer <= 1333).
# Inherits mmdet's shipped RetinaNet-R50-FPN 1x config; children set the
# arch and the neck's in_channels (= SOFT.arch_zoo[arch]['embed_dims']).
#
# Children also name the authors' ImageNet file of their arch
# (checkpoints/soft_norm_<size>.pth, as downloaded from
# https://github.com/fudan-zvg/SOFT#main-results); tools/train.py stops with
# one line when it is missing.
_base_ = ['mmdet::retinanet/retinanet_r50_fpn_1x_coco.py', './soft_dense.py']

# atomic checkpoints with RNG states; --resume takes the newest
# complete one (mmsoft.engine.SafeCheckpointHook)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))

model = dict(backbone={{_base_.soft_backbone}}, neck={{_base_.soft_neck}})

train_dataloader = dict(batch_size=2)  # x 8 GPUs = 16

optim_wrapper = {{_base_.soft_optim_wrapper}}
