# Pieces shared by the SOFT detection / segmentation configs.
#
# `custom_imports` and `custom_hooks` are top-level keys: no mmdet / mmseg
# config defines them. Everything else is a variable, pulled in with
# {{_base_.<name>}}: the children also inherit an mmdet / mmseg config that
# defines `model`, `optim_wrapper`, `train_pipeline`, ... and mmengine
# refuses two bases that define the same key.

custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# mmsoft.engine hooks: StrictLoadHook checks load_from / --resume against
# the model (another architecture, the authors' unconverted file, a weights
# file given to --resume: one error naming the fix, for the host codebases'
# own tools too); NonFiniteLossHook stops at the first non-finite loss,
# before it is saved
custom_hooks = [dict(type='StrictLoadHook'), dict(type='NonFiniteLossHook')]

# SOFT-*-Norm backbone with four feature maps; children set `arch` (the
# neck's in_channels = SOFT.arch_zoo[arch]['embed_dims']).
soft_backbone = dict(
    _delete_=True,
    type='SOFT',
    arch='small',
    attn_cfg=dict(type='SOFTAttention', attn_norm=True),
    out_indices=(0, 1, 2, 3),
    out_type='featmap',
    drop_path_rate=0.1,
    # the official recipe: stages 1-3 apply that rate as an element-wise
    # dropout of their residual branches ('drop_path': stochastic depth)
    residual_drop='dropout',
    # BatchNorm of the conv patch embeddings keeps its ImageNet
    # statistics (2 images per GPU are too few to update them)
    norm_eval=True,
    # the authors' ImageNet file of the arch, as downloaded (children name
    # theirs; a missing file stops training with one line naming where to
    # get it, SOFTPretrained; docs/en/user_guides/official_weights.md)
    init_cfg=dict(
        type='Pretrained',
        checkpoint='checkpoints/soft_norm_small.pth',
        prefix='backbone.'))
# the FPN of that default arch: in_channels = SOFT.arch_zoo['small']
soft_neck = dict(in_channels=[64, 128, 320, 512])

# IJCV 2024 Sec. 4.2: AdamW lr 1e-4, weight decay 0.01; no decay on norms,
# position embeddings and the cls token.
soft_optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=1e-4, betas=(0.9, 0.999), weight_decay=0.01),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        custom_keys={
            '.pos_embed': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0),
        }))

# 3x multi-scale training: shorter side 480..800 (step 32), longer <= 1333
ms_train_scales = [(1333, s) for s in range(480, 801, 32)]
# its COCO training pipeline (images from the local disk, as mmdet's
# backend_args=None), with boxes; ms_mask_train_pipeline: also the masks
ms_train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='RandomChoiceResize', scales=ms_train_scales, keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
ms_mask_train_pipeline = [
    dict(step, with_mask=True) if step['type'] == 'LoadAnnotations' else step
    for step in ms_train_pipeline
]

# 3x schedule: 36 epochs, lr x0.1 at epochs 27 and 33, 500-iter warm-up
schedule_3x = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(
        type='MultiStepLR',
        begin=0,
        end=36,
        by_epoch=True,
        milestones=[27, 33],
        gamma=0.1)
]
