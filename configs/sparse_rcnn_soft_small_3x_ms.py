# Sparse R-CNN, SOFT-Small (attention-normalised), FPN, COCO 2017, 3x schedule
# (36 epochs, lr x0.1 at epochs 27 and 33) with multi-scale training: the
# shorter side is drawn from 480..800 (step 32, longer side <= 1333).
# IJCV 2024 Sec. 4.2 / Table 5: AdamW lr 1e-4, weight decay 0.01, batch 16
# (8 GPUs x 2 images). Inherits mmdet's shipped
# sparse_rcnn/sparse-rcnn_r50_fpn_ms-480-800-3x_coco.py.
# Starts from the authors' ImageNet file soft_norm_small ('SOFT_Small_norm'
# on https://github.com/fudan-zvg/SOFT#main-results, as downloaded) at
# checkpoints/soft_norm_small.pth; without it training stops and says so.
#   tools/dist_train.sh configs/sparse_rcnn_soft_small_3x_ms.py 8
#   tools/dist_test.sh configs/sparse_rcnn_soft_small_3x_ms.py \
#       work_dirs/sparse_rcnn_soft_small_3x_ms/epoch_36.pth 8
# Another file: --cfg-options model.backbone.init_cfg.checkpoint=PATH;
# from scratch on purpose: --cfg-options model.backbone.init_cfg=None
#   model.backbone.norm_eval=False
# The authors' code builds soft_norm_small with depths [1, 3, 20, 4]
# (38.9M, arch='small-official'); their README and the paper list
# Small at 24M (arch='small', used here). A file of the other arch
# stops with one line naming it and the fix:
#   --cfg-options model.backbone.arch=small-official
_base_ = [
    'mmdet::sparse_rcnn/sparse-rcnn_r50_fpn_ms-480-800-3x_coco.py',
    './_base_/soft_dense.py'
]

# atomic checkpoints with RNG states; --resume takes the newest
# complete one (mmsoft.engine.SafeCheckpointHook)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))

model = dict(
    # soft_dense.py: arch='small', checkpoints/soft_norm_small.pth
    backbone={{_base_.soft_backbone}},
    neck={{_base_.soft_neck}})

# mmdet's config already trains 36 epochs (milestones 27, 33) on shorter
# sides 480..800; 8 GPUs x 2 images:
train_dataloader = dict(batch_size=2)

# with the gradient clipping of mmdet's Sparse R-CNN recipe
optim_wrapper = dict(
    _base_.soft_optim_wrapper, clip_grad=dict(max_norm=1, norm_type=2))
