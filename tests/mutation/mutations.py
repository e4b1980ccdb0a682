"""Hand-written mutations: the bugs that mutmut (``make mutations``,
``tests/mutation/run_mutmut.py``) cannot generate, which the suite must
still catch.

Issue 37 replaced the rest of this catalogue with generated mutants; what
stays is out of mutmut's reach, which mutates the bodies of functions in
the files of its groups only:

- device / precision / compile: a ``torch.arange`` without ``device=`` or
  in float32, the kernel or the pseudo-inverse left in half precision under
  autocast (the CUDA-only guards), a graph break, the CPU half-precision
  conv check; mutmut's mutants of these lines change nothing on a CPU;
- module-level data: the NR constants, the authors' key table
  (``arch_zoo``), the recipes of the shipped configs (issue 30);
- code that runs as a script (``tools/*.py``, ``demo/image_demo.py``, run
  as ``__main__``, which mutmut cannot name) or is not Python
  (``tools/launch.sh``), and the tools' helpers outside mutmut's groups.

``tests/mutation/run_mutations.py`` applies them one at a time to a copy of
the checkout and runs the tests named for each (not collected by pytest: no
``test_`` prefix).

Fields: ``name`` (short id), ``what`` (what is broken), ``path`` (relative
to the repository root), ``old`` (text that occurs exactly once in that
file), ``new`` (its replacement), ``tests`` (pytest selectors, relative to
the repository root, that must fail).
"""
import dataclasses
from typing import Tuple

__all__ = ['Mutation', 'MUTATIONS', 'by_name']

REF = ('tests/test_models/test_backbones/test_official_reference.py::'
       'test_logits_match_official_reference')
#: the whole-model parity with the official model, soft_norm_* at 96 x 128
REF_NORM = REF + '[soft_norm-m12]'
STRICT = 'tests/test_tools/test_strict_load_tools.py::'
NR_SOFT = ('tests/test_models/test_layers/test_pinv.py::'
           'test_soft_rule_matches_official')
AMP = 'tests/test_models/test_device_amp.py::'
GK = 'tests/test_models/test_layers/test_soft_attention.py::'
CLI = 'tests/test_tools/test_tool_cli.py::'
SAFE_CONV = 'tests/test_models/test_layers/test_safe_conv.py::'
#: issue 30: the effective recipe of a config against the recipe card
CARD = ('tests/test_configs/test_recipe_card.py::'
        'test_config_matches_recipe_card')
OPTS = 'tests/test_models/test_backbones/test_soft.py::'
TOOLC = 'tests/test_tools/test_tool_contracts.py::'
HOOK = 'tests/test_engine/test_hooks/test_checkpoint_hook.py::'


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: Tuple[str, ...]


M = Mutation

MUTATIONS = (
    # ------------------------------------------------------ tools/test.py
    M(name='test_main_returns_none',
      what='tools/test.py main() returns None instead of the metrics',
      path='tools/test.py',
      old='        launch.shutdown_dist()\n    return metrics\n',
      new='        launch.shutdown_dist()\n',
      tests=(STRICT + 'test_matching_checkpoint_is_tested', )),
    M(name='partial_load_not_passed',
      what=('--partial-load is not passed to StrictLoadHook (a partial '
            'checkpoint is refused)'),
      path='tools/test.py',
      old='cli.set_partial_load(cfg, args.partial_load)',
      new='cli.set_partial_load(cfg, False)',
      tests=(STRICT + 'test_partial_load_opt_in', )),
    M(name='det_dump_replaces_metrics',
      what=('mmdet --out: the dump metric replaces the COCO metric instead of '
            'being added (no bbox mAP)'),
      path='tools/test.py',
      old=('                runner.test_evaluator.metrics.append('
           'dump_metric(scope, out))'),
      new=('                runner.test_evaluator.metrics = ['
           'dump_metric(scope, out)]'),
      tests=('tests/test_tools/test_train_test.py::'
             'test_det_train_and_test_tools', )),
    # --------------------------------------------------- Newton-Raphson
    M(name='nr_soft_shift',
      what="the 'soft' NR rule iterates on A + 0.1 I instead of A + 0.01 I",
      path='mmsoft/models/layers/nr_iteration.py',
      old='_SOFT_SHIFT = 0.01\n',
      new='_SOFT_SHIFT = 0.1\n',
      tests=(NR_SOFT + '[iterative-12]', )),
    M(name='nr_soft_scale',
      what=("the 'soft' NR rule starts from alpha = 2 / ||A||_1^2 (scale 1.0, "
            'not 0.9)'),
      path='mmsoft/models/layers/nr_iteration.py',
      old='_SOFT_SCALE = 0.9\n',
      new='_SOFT_SCALE = 1.0\n',
      tests=(NR_SOFT + '[iterative-12]', )),
    # ------------------------------------ converter (arch_zoo's key table)
    M(name='convert_swap_norms',
      what=('converter: official norm1 / norm2 of the SOFT blocks swapped '
            '(both directions: still round-trips)'),
      path='mmsoft/models/arch_zoo.py',
      old=("    ('att.norm1.', 'norm1.'),\n"
           "    ('att.ff1.', 'ffn.layers.0.0.'),  # mmcv FFN: fc1\n"
           "    ('att.ff2.', 'ffn.layers.1.'),  # fc2\n"
           "    ('att.norm2.', 'norm2.'),\n"),
      new=("    ('att.norm1.', 'norm2.'),\n"
           "    ('att.ff1.', 'ffn.layers.0.0.'),  # mmcv FFN: fc1\n"
           "    ('att.ff2.', 'ffn.layers.1.'),  # fc2\n"
           "    ('att.norm2.', 'norm1.'),\n"),
      tests=(REF_NORM, )),
    M(name='convert_swap_qv',
      what=('converter: official W_q / W_v swapped (both directions: still '
            'round-trips)'),
      path='mmsoft/models/arch_zoo.py',
      old=("    ('att.mha.W_q.', 'attn.q.'),\n"
           "    ('att.mha.W_v.', 'attn.v.'),\n"),
      new=("    ('att.mha.W_q.', 'attn.v.'),\n"
           "    ('att.mha.W_v.', 'attn.q.'),\n"),
      tests=(REF_NORM, )),
    # ------------------------------------------------ device / AMP / compile
    M(name='device_arange_cpu',
      what='NR alpha search: torch.arange without device= (lands on the CPU)',
      path='mmsoft/models/layers/nr_iteration.py',
      old=('n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, '
           'dtype=A.dtype)'),
      new='n = torch.arange(_NORM_MAX_HALVINGS + 1, dtype=A.dtype)',
      tests=(AMP + 'test_creates_tensors_only_on_the_input_device'
             '[norm-train]', )),
    M(name='dtype_arange_float32',
      what=('NR alpha search: torch.arange without dtype= (float32 in a '
            'float64 model)'),
      path='mmsoft/models/layers/nr_iteration.py',
      old=('n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, '
           'dtype=A.dtype)'),
      new='n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device)',
      tests=(AMP + 'test_float64_model_computes_in_float64[cpu-norm]', )),
    M(name='kernel_autocast_cuda_only',
      what=("Gaussian kernel: autocast disabled for 'cuda' only (CPU autocast "
            'stays on inside the kernel)'),
      path='mmsoft/models/layers/soft_attention.py',
      old='    with autocast_off(x.device.type):\n',
      new="    with torch.autocast(device_type='cuda', enabled=False):\n",
      tests=(AMP + 'test_kernel_and_pinv_run_in_fp32_under_autocast'
             '[cpu-iterative-exact-bfloat16]', )),
    M(name='nr_autocast_cuda_only',
      what=("NR pseudo-inverse: autocast disabled for 'cuda' only (the "
            'iterations run under CPU autocast)'),
      path='mmsoft/models/layers/nr_autograd.py',
      old='    with autocast_off(A.device.type), tf32_off(A.device.type):\n',
      new=("    with torch.autocast(device_type='cuda', enabled=False), "
           'tf32_off(A.device.type):\n'),
      tests=(AMP + 'test_pinv_alone_runs_in_fp32_under_autocast'
             '[cpu-iterative-bfloat16]', )),
    M(name='nr_no_fp32_upcast',
      what='NR pseudo-inverse: half-precision A / W are not cast to float32',
      path='mmsoft/models/layers/nr_autograd.py',
      old='    A = A.to(dtype)\n    W = None if W is None else W.to(dtype)\n',
      new='',
      tests=(AMP + 'test_pinv_alone_runs_in_fp32_under_autocast'
             '[cpu-iterative-bfloat16]', )),
    M(name='fused_products_uncentered',
      what=('inference without P: the tokens are not translated by the '
            'mean landmark (the norms no longer cancel in float32)'),
      path='mmsoft/models/layers/soft_attention.py',
      old='            c = landmarks.float().mean(-2, keepdim=True)\n',
      new='            c = landmarks.float()[..., :1, :] * 0\n',
      tests=(GK + 'test_fused_products_equal_the_formed_kernel[True]', )),
    M(name='fused_products_unnormalised',
      what=('inference without P: the fused attention output taken as K w '
            '(the quotient by 1 / (1 + sum K) dropped)'),
      path='mmsoft/models/layers/soft_attention.py',
      old='    return out[..., :e] / out[..., e:e + 1]\n',
      new='    return out[..., :e]\n',
      tests=(GK + 'test_kernel_product_without_the_kernel[0.0-1.0]', )),
    M(name='compile_graph_break',
      what=('soft_attention validates its queries with a data-dependent '
            'Python branch (a graph break)'),
      path='mmsoft/models/layers/soft_attention.py',
      old=('    with autocast_off(v.device.type):\n'
           '        if fused:'),
      new=('    if not torch.isfinite(q).all():\n'
           "        raise ValueError('soft_attention: non-finite queries')\n"
           '    with autocast_off(v.device.type):\n'
           '        if fused:'),
      tests=('tests/test_models/test_compile.py::'
             'test_training_forward_is_one_graph', )),
    # ------------------------------------------ launch, data, deployment
    M(name='dist_test_not_distributed',
      what=("tools/dist_test.sh starts test.py with --launcher none (every "
            'process tests everything; the launch body tools/launch.sh)'),
      path='tools/launch.sh',
      old='--launcher pytorch "${options[@]}"',
      new='--launcher none "${options[@]}"',
      tests=('tests/test_tools/test_launch.py::'
             'test_dist_test_sh_exits_cleanly', )),
    M(name='data_check_skip_any_value',
      what='MMSOFT_SKIP_DATA_CHECK=0 skips the data check too',
      path='tools/mmsoft_tools/data_check.py',
      old=("    if os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', "
           "'0'):\n"),
      new="    if os.environ.get('MMSOFT_SKIP_DATA_CHECK'):\n",
      tests=('tests/test_tools/test_data_check.py::'
             'test_rank_and_skip', )),
    M(name='deploy_init_log',
      what=('pytorch2onnx with random weights: init_weights logs every tensor '
            '(the error line is buried)'),
      path='tools/mmsoft_tools/deploy.py',
      old='        launch.quiet_init_weights(model)\n',
      new='        model.init_weights()\n',
      tests=('tests/test_tools/test_deploy.py::'
             'test_error_is_all_the_output_with_random_weights', )),
    # ------------------------------------------------- tables and rows
    M(name='benchmark_attention_fwd_cells',
      what=('benchmark_attention table: the fwd+bwd columns show the forward '
            'row'),
      path='tools/analysis/benchmark_attention.py',
      old='''f'{fmt(b, "time_ms")} | {fmt(b, "peak_mb")} |')''',
      new='''f'{fmt(f, "time_ms")} | {fmt(f, "peak_mb")} |')''',
      tests=(CLI + 'test_benchmark_attention_tiny_run', )),
    M(name='benchmark_onnx_ratio_inverted',
      what="benchmark_onnx table: 'torch / ort' column is ort / torch",
      path='tools/deployment/benchmark_onnx.py',
      old='''f"{r['torch_ms'] / r['ort_ms']:.2f}x"''',
      new='''f"{r['ort_ms'] / r['torch_ms']:.2f}x"''',
      tests=(CLI + 'test_benchmark_onnx_tiny_run', )),
    M(name='nr_backward_compare_key',
      what=("nr_backward_compare: the mAP@0.5 column reads a misspelt metric "
            "key (NaN)"),
      path='tools/analysis/nr_backward_compare.py',
      old="m.get('coco/bbox_mAP_50', float('nan'))",
      new="m.get('coco/bbox_mAP50', float('nan'))",
      tests=(CLI + 'test_nr_backward_compare_train_demo', )),
    M(name='nr_backward_compare_swap',
      what=('nr_backward_compare: the mAP and mAP@0.5 columns swapped'),
      path='tools/analysis/nr_backward_compare.py',
      old=("        rows.append((b, m.get('coco/bbox_mAP', float('nan')),\n"
           "                     m.get('coco/bbox_mAP_50', float('nan')),"),
      new=("        rows.append((b, m.get('coco/bbox_mAP_50', float('nan')),\n"
           "                     m.get('coco/bbox_mAP', float('nan')),"),
      tests=(CLI + 'test_nr_backward_compare_train_demo', )),
    M(name='scalar_recurrence_inlined',
      what=('the spectral scalar NR recurrence as plain pointwise ops '
            '(inductor inlines 20 steps: compile time ~3^20)'),
      path='mmsoft/models/layers/nr_iteration.py',
      old="if hasattr(torch.library, 'custom_op'):",
      new='if False:',
      tests=('tests/test_models/test_compile.py::'
             'test_spectral_recurrence_is_one_opaque_op', )),
    M(name='half_conv_probe_trusts',
      what=('CPU half conv guard: the probe trusts every kernel (the AMX '
            'bf16 conv bug computes a wrong sampler under --amp)'),
      path='mmsoft/models/layers/amp.py',
      old='    ok = _verdicts[key] = bool(err <= PROBE_RTOL[dtype])\n',
      new='    ok = _verdicts[key] = True\n',
      tests=(SAFE_CONV +
             'test_broken_half_kernel_is_detected_and_bypassed', )),
    M(name='half_conv_fallback_autocast',
      what=("CPU half conv guard: the float32 fallback leaves autocast on "
            "for 'cuda' only (it runs in the broken half kernel again)"),
      path='mmsoft/models/layers/amp.py',
      old="    with autocast_off('cpu'):\n        out = _raw_conv2d(",
      new="    with autocast_off('cuda'):\n        out = _raw_conv2d(",
      tests=(SAFE_CONV +
             'test_broken_half_kernel_is_detected_and_bypassed', )),
    M(name='amp_wrapper_unguarded',
      what=('--amp on the CPU does not put the neck / head convs under the '
            'half conv guard'),
      path='mmsoft/engine/optimizers/cpu_amp_optim_wrapper.py',
      old="dtype=self.cast_dtype), CheckedConvs():",
      new='dtype=self.cast_dtype), contextlib.nullcontext():',
      tests=(SAFE_CONV +
             'test_cpu_amp_wrapper_guards_every_conv_of_the_model', )),
    M(name='demo_value_unscaled',
      what=("demo: the reported value is the evaluator's metric without its "
            'scale (a percentage, not a fraction)'),
      path='tools/mmsoft_tools/demo_tasks.py',
      old="        value=None if value is None else value * spec['scale'],\n",
      new='        value=value,\n',
      tests=('tests/test_configs/test_demo_configs.py::'
             'test_short_training_run[seg]', )),

    # ------------------------------------------- issue 30: recipes
    M(name='dense_norm_eval_off',
      what=('detection / segmentation: the patch-embedding BatchNorms '
            'update their statistics on 2 images per GPU (norm_eval off)'),
      path='configs/_base_/soft_dense.py',
      old='    norm_eval=True,\n',
      new='    norm_eval=False,\n',
      tests=(CARD + '[retinanet_soft_tiny_1x]', )),
    M(name='dense_norms_decay',
      what=('detection / segmentation: the norms get weight decay (the '
            'norm exemption dropped)'),
      path='configs/_base_/soft_dense.py',
      old='        norm_decay_mult=0.0,\n',
      new='',
      tests=(CARD + '[mask_rcnn_soft_small_1x]', )),
    M(name='dense_3x_warmup_in_epochs',
      what=('3x schedule: the 500-iteration warm-up written by epoch (500 '
            'epochs: the whole training warms up)'),
      path='configs/_base_/soft_dense.py',
      old="start_factor=0.001, by_epoch=False, begin=0, end=500",
      new="start_factor=0.001, by_epoch=True, begin=0, end=500",
      tests=(CARD + '[atss_soft_small_3x_ms]', )),
    M(name='dense_residual_drop_path',
      what=('detection / segmentation: stages 1-3 use stochastic depth '
            'instead of the official element-wise residual dropout'),
      path='configs/_base_/soft_dense.py',
      old="    residual_drop='dropout',\n",
      new="    residual_drop='drop_path',\n",
      tests=(CARD + '[gfl_soft_small_3x_ms]', )),
    M(name='in1k_warmup_per_epoch',
      what=('ImageNet: the warm-up steps once per epoch (10 plateaus, the '
            'first epoch at lr 1e-6) instead of every iteration'),
      path='configs/_base_/soft_in1k.py',
      old='        end=10,\n        convert_to_iter_based=True),\n',
      new='        end=10),\n',
      tests=(CARD + '[soft_tiny_in1k]', )),
    M(name='in1k_ema_timm_convention',
      what=("ImageNet: the EMA momentum in timm's convention (0.99996: "
            "mmengine then keeps 0.004 % of the average per step)"),
      path='configs/_base_/soft_in1k.py',
      old="dict(type='EMAHook', momentum=4e-5,",
      new="dict(type='EMAHook', momentum=0.99996,",
      tests=(CARD + '[soft_norm_small_in1k]', )),
    M(name='in1k_no_clip_grad',
      what='ImageNet: the gradient clipping at 1.0 dropped',
      path='configs/_base_/soft_in1k.py',
      old='    clip_grad=dict(max_norm=1.0),\n',
      new='    clip_grad=None,\n',
      tests=(CARD + '[soft_small_in1k]', )),
    M(name='seg_poly_power_09',
      what=("ADE20K: mmseg's ResNet poly power 0.9 instead of the Swin / "
            'SOFT recipe\'s 1.0'),
      path='configs/_base_/upernet_soft_512x512_160k_ade20k.py',
      old='        power=1.0,\n',
      new='        power=0.9,\n',
      tests=(CARD + '[upernet_soft_small_512x512_160k_ade20k]', )),
    # --------------------------------------------- issue 30: tools
    M(name='tta_vertical_flip',
      what='--tta flips the images vertically',
      path='tools/test.py',
      old="                dict(type='RandomFlip', prob=1.),",
      new="                dict(type='RandomFlip', prob=1., "
      "direction='vertical'),",
      tests=(TOOLC + 'test_tta_flip_views', )),
    M(name='tta_det_no_flip_meta',
      what=('--tta on detectors packs no flip meta (DetTTAModel cannot '
            'unflip the boxes)'),
      path='tools/test.py',
      old="'scale_factor', 'flip', 'flip_direction'))",
      new="'scale_factor'))",
      tests=(TOOLC + 'test_tta_flip_views[mask_rcnn_soft_tiny_1x]', )),
    M(name='export_seg_shape_swapped',
      what='segmentation export resizes the logits to W x H',
      path='tools/mmsoft_tools/deploy.py',
      old='dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W))',
      new='dict(img_shape=(W, H), ori_shape=(W, H), pad_shape=(W, H))',
      tests=(TOOLC + 'test_export_non_square[demo/upernet_soft_demo]', )),
    M(name='export_input_transposed',
      what='the ONNX graph is traced on a W x H input',
      path='tools/mmsoft_tools/deploy.py',
      old='    x = torch.zeros(batch, 3, *wrapper.shape)\n',
      new='    x = torch.zeros(batch, 3, *wrapper.shape[::-1])\n',
      tests=(TOOLC + 'test_export_non_square[demo/soft_cls_demo]', )),
    # ------------------------------------------- issue 36: nothing lost
    M(name='image_demo_reads_its_outputs',
      what='demo/image_demo.py searches its own --out-dir for inputs',
      path='demo/image_demo.py',
      old='            and osp.realpath(osp.join(dirpath, d)) not in skip)',
      new=')',
      tests=('tests/test_demo/test_image_demo.py::'
             'test_out_dir_inside_input_is_not_input', )),
)


def by_name():
    """{name: mutation}; names are unique."""
    out = {m.name: m for m in MUTATIONS}
    assert len(out) == len(MUTATIONS), 'duplicate mutation names'
    return out
