# ATSS, SOFT-Small (attention-normalised), FPN, COCO 2017, 3x schedule
# (36 epochs, lr x0.1 at epochs 27 and 33) with multi-scale training: the
# shorter side is drawn from 480..800 (step 32, longer side <= 1333).
# IJCV 2024 Sec. 4.2 / Table 5: AdamW lr 1e-4, weight decay 0.01, batch 16
# (8 GPUs x 2 images). Inherits mmdet's shipped
# atss/atss_r50_fpn_1x_coco.py.
#   tools/dist_train.sh configs/atss_soft_small_3x_ms.py 8 \
#       --cfg-options model.backbone.init_cfg.checkpoint=weights/soft_norm_small.pth
# Without the checkpoint (None) the backbone is randomly initialised.
_base_ = ['mmdet::atss/atss_r50_fpn_1x_coco.py', './_base_/soft_dense.py']

# atomic, checksummed checkpoints with RNG states; --resume takes the newest
# complete one (mmsoft.engine.SafeCheckpointHook)
default_hooks = dict(checkpoint=dict(type='SafeCheckpointHook'))

model = dict(backbone={{_base_.soft_backbone}}, neck={{_base_.soft_neck}})

train_pipeline = {{_base_.ms_train_pipeline}}
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
train_cfg = dict(max_epochs=36)
param_scheduler = {{_base_.schedule_3x}}

optim_wrapper = {{_base_.soft_optim_wrapper}}
