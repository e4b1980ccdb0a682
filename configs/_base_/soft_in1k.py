# SOFT on ImageNet-1k with mmpretrain: the paper's recipe (NeurIPS 2021 /
# IJCV 2024, Sec. 4.1) and the official training script (fudan-zvg/SOFT,
# main.py + config/SOFT_*.yaml, a timm/DeiT recipe):
#   AdamW, lr 1e-3 for a total batch of 1024 (8 GPUs x 128), weight decay
#   0.05 (none on norms, biases and the cls token; mmsoft also exempts the
#   position embeddings, which the official model decays: see
#   tests/reference/recipe_card.py),
#   300 epochs, 10 linear warm-up epochs (from lr 1e-6), cosine decay to
#   5e-5, gradient clipping at 1.0, drop path 0.1, model EMA (0.99996);
#   RandomResizedCrop 224 + random flip + RandAugment (rand-m9-mstd0.5-inc1)
#   + random erasing 0.25, mixup 0.8 / cutmix 1.0, label smoothing 0.1;
#   test: bicubic resize of the short side to 256, 224 centre crop.
# The classifier reads SOFT's stage-4 cls token (out_type='cls_token'), as
# the official model does.
#
# Trains from a random initialisation (checkpoint=None: this is the
# ImageNet pretraining). To start from weights (the authors' file as
# downloaded, or an mmsoft one):
#   --cfg-options model.backbone.init_cfg.checkpoint=PATH
_base_ = [
    'mmpretrain::_base_/datasets/imagenet_bs64_swin_224.py',
    'mmpretrain::_base_/schedules/imagenet_bs1024_adamw_swin.py',
    'mmpretrain::_base_/default_runtime.py',
]

custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

model = dict(
    type='ImageClassifier',
    backbone=dict(
        type='SOFT',
        arch='tiny',
        attn_cfg=dict(type='SOFTAttention', attn_norm=False),
        out_indices=(3, ),
        out_type='cls_token',
        drop_path_rate=0.1,
        # the official recipe: stages 1-3 apply that rate as an element-wise
        # dropout of their residual branches ('drop_path': stochastic depth)
        residual_drop='dropout',
        init_cfg=dict(type='Pretrained', checkpoint=None, prefix='backbone.')),
    neck=None,
    head=dict(
        type='LinearClsHead',
        num_classes=1000,
        in_channels=512,  # stage-4 channels (SOFT.arch_zoo[arch])
        loss=dict(
            type='LabelSmoothLoss', label_smooth_val=0.1, mode='original'),
        init_cfg=[dict(type='TruncNormal', layer='Linear', std=.02, bias=0.)]),
    train_cfg=dict(augments=[
        dict(type='Mixup', alpha=0.8),
        dict(type='CutMix', alpha=1.0)
    ]),
)

# 8 GPUs x 128 images = 1024
train_dataloader = dict(batch_size=128)
val_dataloader = dict(batch_size=128)
test_dataloader = val_dataloader

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-3, weight_decay=0.05, eps=1e-8,
        betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        _delete_=True,
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        flat_decay_mult=0.0,
        custom_keys={
            '.pos_embed': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0),
        }),
    clip_grad=dict(max_norm=1.0),
)

param_scheduler = [
    dict(
        type='LinearLR',
        start_factor=1e-3,
        by_epoch=True,
        begin=0,
        end=10,
        convert_to_iter_based=True),
    dict(
        type='CosineAnnealingLR',
        T_max=290,
        eta_min=5e-5,
        by_epoch=True,
        begin=10,
        end=300,
        convert_to_iter_based=True),
]

train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=1)
auto_scale_lr = dict(base_batch_size=1024)

default_hooks = dict(
    checkpoint=dict(type='SafeCheckpointHook', interval=1, max_keep_ckpts=3))
# mmsoft.engine hooks: StrictLoadHook checks load_from / --resume against
# the model (another architecture, the authors' unconverted file, a weights
# file given to --resume: one error naming the fix, for the host codebases'
# own tools too); NonFiniteLossHook stops at the first non-finite loss,
# before it is saved
custom_hooks = [
    dict(type='EMAHook', momentum=4e-5, priority='ABOVE_NORMAL'),
    dict(type='StrictLoadHook'),
    dict(type='NonFiniteLossHook'),
]
