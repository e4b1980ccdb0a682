# Pieces shared by the demo configs (configs/demo): the small SOFT that they
# train from scratch on the CPU, its optimizer, the mmsoft hooks.
#
# `custom_imports`, `soft_arch` and `custom_hooks` are top-level keys: no
# mmpretrain / mmdet / mmseg config defines them. `demo_optim_wrapper` is a
# variable each demo builds its `optim_wrapper` from (mmdet's RetinaNet config
# defines one, and mmengine refuses two bases that define the same key).

custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

# a narrow, shallow SOFT: token maps of 1/4, 1/8, 1/16 and 1/32 of the input
soft_arch = dict(
    embed_dims=[32, 64, 128, 192],
    num_heads=[1, 2, 4, 6],
    depths=[1, 1, 2, 1],
    sampling_ratios=[4, 2, 2, 1])

# AdamW without weight decay on norms, biases, position embeddings and the
# cls token; each demo adds its gradient clipping
demo_optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
    paramwise_cfg=dict(
        norm_decay_mult=0.0,
        bias_decay_mult=0.0,
        custom_keys={
            '.pos_embed': dict(decay_mult=0.0),
            '.cls_token': dict(decay_mult=0.0)
        }))

# mmsoft.engine hooks: StrictLoadHook checks load_from / --resume against
# the model (another architecture, the authors' unconverted file, a weights
# file given to --resume: one error naming the fix, for the host codebases'
# own tools too); NonFiniteLossHook stops at the first non-finite loss,
# before it is saved
custom_hooks = [dict(type='StrictLoadHook'), dict(type='NonFiniteLossHook')]
