"""Hand-written mutations: the bugs that mutmut (``run_mutmut.py``) cannot
generate, which the suite must still catch: device / precision / compile
(mutmut's mutants of those lines change nothing on a CPU), module-level data
(the NR constants, ``arch_zoo``'s key table, the shipped configs' recipes),
code run as a script or not in Python, and the tools' helpers outside the
groups. ``run_mutmut.py --hand`` applies each alone (``old``, found exactly
once in ``path``, becomes ``new``) and runs its ``tests`` (selectors from
the repository root), which must fail.
"""
import dataclasses
from typing import Tuple

__all__ = ['Mutation', 'MUTATIONS', 'by_name']

REF = ('tests/test_models/test_backbones/test_official_reference.py::'
       'test_logits_match_official_reference')
REF_NORM = REF + '[soft_norm-m12]'
STRICT = 'tests/test_tools/test_strict_load_tools.py::'
NR_SOFT = ('tests/test_models/test_layers/test_pinv.py::'
           'test_soft_rule_matches_official')
AMP = 'tests/test_models/test_device_amp.py::'
GK = 'tests/test_models/test_layers/test_soft_attention.py::'
CLI = 'tests/test_tools/test_tool_cli.py::'
SAFE_CONV = 'tests/test_models/test_layers/test_safe_conv.py::'
CARD = ('tests/test_configs/test_recipe_card.py::'
        'test_config_matches_recipe_card')
TOOLC = 'tests/test_tools/test_tool_contracts.py::'


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str
    old: str
    new: str
    tests: Tuple[str, ...]  # one selector may be given as a string

    def __post_init__(self):
        if isinstance(self.tests, str):
            object.__setattr__(self, 'tests', (self.tests, ))


M = Mutation
MUTATIONS = (
    # tools/test.py
    M('test_main_returns_none',
      'tools/test.py main() returns None instead of the metrics',
      'tools/test.py', '(gloo can abort)\n    return metrics\n',
      '(gloo can abort)\n', STRICT + 'test_matching_checkpoint_is_tested'),
    M('partial_load_not_passed',
      ('--partial-load is not passed to StrictLoadHook (a partial '
       'checkpoint is refused)'), 'tools/test.py',
      'cli.set_partial_load(cfg, args.partial_load)',
      'cli.set_partial_load(cfg, False)', STRICT + 'test_partial_load_opt_in'),
    M('det_dump_replaces_metrics',
      ('mmdet --out: the dump metric replaces the COCO metric instead of '
       'being added (no bbox mAP)'), 'tools/test.py',
      ('                '
       'runner.test_evaluator.metrics.append(dump_metric(scope, out))'),
      ('                runner.test_evaluator.metrics = '
       '[dump_metric(scope, out)]'),
      ('tests/test_tools/test_chain.py::'
       'test_test_tool_on_trained_checkpoint[det-keys0]')),
    # Newton-Raphson
    M('nr_soft_shift',
      "the 'soft' NR rule iterates on A + 0.1 I instead of A + 0.01 I",
      'mmsoft/models/layers/nr_iteration.py', '_SOFT_SHIFT = 0.01\n',
      '_SOFT_SHIFT = 0.1\n', NR_SOFT + '[iterative-12]'),
    M('nr_soft_scale',
      ("the 'soft' NR rule starts from alpha = 2 / ||A||_1^2 (scale 1.0, "
       'not 0.9)'), 'mmsoft/models/layers/nr_iteration.py',
      '_SOFT_SCALE = 0.9\n', '_SOFT_SCALE = 1.0\n',
      NR_SOFT + '[iterative-12]'),
    # converter (arch_zoo's key table)
    M('convert_swap_norms',
      ('converter: official norm1 / norm2 of the SOFT blocks swapped '
       '(both directions: still round-trips)'), 'mmsoft/models/arch_zoo.py',
      ("    ('att.norm1.', 'norm1.'),\n    ('att.ff1.', "
       "'ffn.layers.0.0.'),  # mmcv FFN: fc1\n    ('att.ff2.', "
       "'ffn.layers.1.'),  # fc2\n    ('att.norm2.', 'norm2.'),\n"),
      ("    ('att.norm1.', 'norm2.'),\n    ('att.ff1.', "
       "'ffn.layers.0.0.'),  # mmcv FFN: fc1\n    ('att.ff2.', "
       "'ffn.layers.1.'),  # fc2\n    ('att.norm2.', 'norm1.'),\n"), REF_NORM),
    M('convert_swap_qv',
      ('converter: official W_q / W_v swapped (both directions: still '
       'round-trips)'), 'mmsoft/models/arch_zoo.py',
      ("    ('att.mha.W_q.', 'attn.q.'),\n    ('att.mha.W_v.', "
       "'attn.v.'),\n"),
      ("    ('att.mha.W_q.', 'attn.v.'),\n    ('att.mha.W_v.', "
       "'attn.q.'),\n"), REF_NORM),
    # device / AMP / compile
    M('device_arange_cpu',
      'NR alpha search: torch.arange without device= (lands on the CPU)',
      'mmsoft/models/layers/nr_iteration.py',
      ('n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, '
       'dtype=A.dtype)'),
      'n = torch.arange(_NORM_MAX_HALVINGS + 1, dtype=A.dtype)',
      AMP + 'test_creates_tensors_only_on_the_input_device[norm-train]'),
    M('dtype_arange_float32',
      ('NR alpha search: torch.arange without dtype= (float32 in a '
       'float64 model)'), 'mmsoft/models/layers/nr_iteration.py',
      ('n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device, '
       'dtype=A.dtype)'),
      'n = torch.arange(_NORM_MAX_HALVINGS + 1, device=A.device)',
      AMP + 'test_float64_model_computes_in_float64[cpu-norm]'),
    M(
        'kernel_autocast_cuda_only',
        ("Gaussian kernel: autocast disabled for 'cuda' only (CPU autocast "
         'stays on inside the kernel)'),
        'mmsoft/models/layers/soft_attention.py',
        '    with autocast_off(x.device.type):\n',
        "    with torch.autocast(device_type='cuda', enabled=False):\n",
        AMP + ('test_kernel_and_pinv_run_in_fp32_under_autocast'
               '[cpu-iterative-exact-bfloat16]')),
    M(
        'nr_autocast_cuda_only',
        ("NR pseudo-inverse: autocast disabled for 'cuda' only (the "
         'iterations run under CPU autocast)'),
        'mmsoft/models/layers/nr_autograd.py',
        '    with autocast_off(A.device.type), tf32_off(A.device.type):\n',
        ("    with torch.autocast(device_type='cuda', enabled=False), "
         'tf32_off(A.device.type):\n'),
        AMP + ('test_pinv_alone_runs_in_fp32_under_autocast'
               '[cpu-iterative-bfloat16]')),
    M(
        'nr_no_fp32_upcast',
        'NR pseudo-inverse: half-precision A / W are not cast to float32',
        'mmsoft/models/layers/nr_autograd.py',
        '    A = A.to(dtype)\n    W = None if W is None else W.to(dtype)\n',
        '', AMP + ('test_pinv_alone_runs_in_fp32_under_autocast'
                   '[cpu-iterative-bfloat16]')),
    M('fused_products_uncentered',
      ('inference without P: the tokens are not translated by the mean '
       'landmark (the norms no longer cancel in float32)'),
      'mmsoft/models/layers/soft_attention.py',
      '            c = landmarks.float().mean(-2, keepdim=True)\n',
      '            c = landmarks.float()[..., :1, :] * 0\n',
      GK + 'test_fused_products_equal_the_formed_kernel[True]'),
    M('fused_products_unnormalised',
      ('inference without P: the fused attention output taken as K w (the '
       'quotient by 1 / (1 + sum K) dropped)'),
      'mmsoft/models/layers/soft_attention.py',
      '    return out[..., :e] / out[..., e:e + 1]\n',
      '    return out[..., :e]\n',
      GK + 'test_kernel_product_without_the_kernel[0.0-1.0]'),
    M('compile_graph_break',
      ('soft_attention validates its queries with a data-dependent Python '
       'branch (a graph break)'), 'mmsoft/models/layers/soft_attention.py',
      '    with autocast_off(v.device.type):\n        if fused:',
      ('    if not torch.isfinite(q).all():\n        raise '
       "ValueError('soft_attention: non-finite queries')\n    with "
       'autocast_off(v.device.type):\n        if fused:'),
      ('tests/test_models/test_compile.py::'
       'test_training_forward_is_one_graph')),
    # launch, data, deployment
    M('dist_test_not_distributed',
      ('tools/dist_test.sh starts test.py with --launcher none (every '
       'process tests everything; the launch body tools/launch.sh)'),
      'tools/launch.sh', '--launcher pytorch "${options[@]}"',
      '--launcher none "${options[@]}"', ('tests/test_tools/test_launch.py::'
                                          'test_dist_test_sh_exits_cleanly')),
    M('data_check_skip_any_value',
      'MMSOFT_SKIP_DATA_CHECK=0 skips the data check too',
      'tools/mmsoft_tools/data_check.py',
      ("    if os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', "
       "'0'):\n"), "    if os.environ.get('MMSOFT_SKIP_DATA_CHECK'):\n",
      'tests/test_tools/test_data_check.py::test_rank_and_skip'),
    M('deploy_init_log',
      ('pytorch2onnx with random weights: init_weights logs every tensor '
       '(the error line is buried)'), 'tools/mmsoft_tools/deploy.py',
      '        launch.quiet_init_weights(model)\n',
      '        model.init_weights()\n',
      ('tests/test_tools/test_deploy.py::'
       'test_error_is_all_the_output_with_random_weights')),
    # tables and rows
    M('benchmark_attention_fwd_cells',
      ('benchmark_attention table: the fwd+bwd columns show the forward '
       'row'), 'tools/analysis/benchmark_attention.py',
      'f\'{fmt(b, "time_ms")} | {fmt(b, "peak_mb")} |\')',
      'f\'{fmt(f, "time_ms")} | {fmt(f, "peak_mb")} |\')',
      CLI + 'test_benchmark_attention_tiny_run'),
    M('benchmark_onnx_ratio_inverted',
      "benchmark_onnx table: 'torch / ort' column is ort / torch",
      'tools/deployment/benchmark_onnx.py',
      'f"{r[\'torch_ms\'] / r[\'ort_ms\']:.2f}x"',
      'f"{r[\'ort_ms\'] / r[\'torch_ms\']:.2f}x"',
      CLI + 'test_benchmark_onnx_tiny_run'),
    M('nr_backward_compare_key',
      ('nr_backward_compare: the mAP@0.5 column reads a misspelt metric '
       'key (NaN)'), 'tools/analysis/nr_backward_compare.py',
      "m.get('coco/bbox_mAP_50', float('nan'))",
      "m.get('coco/bbox_mAP50', float('nan'))",
      CLI + 'test_nr_backward_compare_train_demo'),
    M('nr_backward_compare_swap',
      'nr_backward_compare: the mAP and mAP@0.5 columns swapped',
      'tools/analysis/nr_backward_compare.py',
      ("        rows.append((b, m.get('coco/bbox_mAP', float('nan')),\n   "
       "                  m.get('coco/bbox_mAP_50', float('nan')),"),
      ("        rows.append((b, m.get('coco/bbox_mAP_50', "
       "float('nan')),\n                     m.get('coco/bbox_mAP', "
       "float('nan')),"), CLI + 'test_nr_backward_compare_train_demo'),
    M('scalar_recurrence_inlined',
      ('the spectral scalar NR recurrence as plain pointwise ops '
       '(inductor inlines 20 steps: compile time ~3^20)'),
      'mmsoft/models/layers/nr_iteration.py',
      "if hasattr(torch.library, 'custom_op'):", 'if False:',
      ('tests/test_models/test_compile.py::'
       'test_spectral_recurrence_is_one_opaque_op')),
    M('half_conv_probe_trusts',
      ('CPU half conv guard: the probe trusts every kernel (the AMX bf16 '
       'conv bug computes a wrong sampler under --amp)'),
      'mmsoft/models/layers/amp.py',
      '    ok = _verdicts[key] = bool(err <= PROBE_RTOL[dtype])\n',
      '    ok = _verdicts[key] = True\n',
      SAFE_CONV + 'test_broken_half_kernel_is_detected_and_bypassed'),
    M('half_conv_fallback_autocast',
      ('CPU half conv guard: the float32 fallback leaves autocast on for '
       "'cuda' only (it runs in the broken half kernel again)"),
      'mmsoft/models/layers/amp.py',
      "    with autocast_off('cpu'):\n        out = _raw_conv2d(",
      "    with autocast_off('cuda'):\n        out = _raw_conv2d(",
      SAFE_CONV + 'test_broken_half_kernel_is_detected_and_bypassed'),
    M('amp_wrapper_unguarded',
      ('--amp on the CPU does not put the neck / head convs under the '
       'half conv guard'), 'mmsoft/engine/optimizers/cpu_amp_optim_wrapper.py',
      'dtype=self.cast_dtype), CheckedConvs():',
      'dtype=self.cast_dtype), contextlib.nullcontext():',
      SAFE_CONV + 'test_cpu_amp_wrapper_guards_every_conv_of_the_model'),
    M('demo_value_unscaled',
      ("demo: the reported value is the evaluator's metric without its "
       'scale (a percentage, not a fraction)'),
      'tools/mmsoft_tools/demo_tasks.py',
      "        value=None if value is None else value * spec['scale'],\n",
      '        value=value,\n', ('tests/test_configs/test_demo_configs.py::'
                                 'test_short_training_run[seg]')),
    # issue 30: recipes
    M('dense_norm_eval_off',
      ('detection / segmentation: the patch-embedding BatchNorms update '
       'their statistics on 2 images per GPU (norm_eval off)'),
      'configs/_base_/soft_dense.py', '    norm_eval=True,\n',
      '    norm_eval=False,\n', CARD + '[retinanet_soft_tiny_1x]'),
    M('dense_norms_decay',
      ('detection / segmentation: the norms get weight decay (the norm '
       'exemption dropped)'), 'configs/_base_/soft_dense.py',
      '        norm_decay_mult=0.0,\n', '',
      CARD + '[mask_rcnn_soft_small_1x]'),
    M('dense_3x_warmup_in_epochs',
      ('3x schedule: the 500-iteration warm-up written by epoch (500 '
       'epochs: the whole training warms up)'), 'configs/_base_/soft_dense.py',
      'start_factor=0.001, by_epoch=False, begin=0, end=500',
      'start_factor=0.001, by_epoch=True, begin=0, end=500',
      CARD + '[atss_soft_small_3x_ms]'),
    M('dense_residual_drop_path',
      ('detection / segmentation: stages 1-3 use stochastic depth instead '
       'of the official element-wise residual dropout'),
      'configs/_base_/soft_dense.py', "    residual_drop='dropout',\n",
      "    residual_drop='drop_path',\n", CARD + '[gfl_soft_small_3x_ms]'),
    M('in1k_warmup_per_epoch',
      ('ImageNet: the warm-up steps once per epoch (10 plateaus, the '
       'first epoch at lr 1e-6) instead of every iteration'),
      'configs/_base_/soft_in1k.py',
      '        end=10,\n        convert_to_iter_based=True),\n',
      '        end=10),\n', CARD + '[soft_tiny_in1k]'),
    M('in1k_ema_timm_convention',
      ("ImageNet: the EMA momentum in timm's convention (0.99996: "
       'mmengine then keeps 0.004 % of the average per step)'),
      'configs/_base_/soft_in1k.py', "dict(type='EMAHook', momentum=4e-5,",
      "dict(type='EMAHook', momentum=0.99996,",
      CARD + '[soft_norm_small_in1k]'),
    M('in1k_no_clip_grad', 'ImageNet: the gradient clipping at 1.0 dropped',
      'configs/_base_/soft_in1k.py', '    clip_grad=dict(max_norm=1.0),\n',
      '    clip_grad=None,\n', CARD + '[soft_small_in1k]'),
    M('seg_poly_power_09',
      ("ADE20K: mmseg's ResNet poly power 0.9 instead of the Swin / SOFT "
       "recipe's 1.0"), 'configs/_base_/upernet_soft_512x512_160k_ade20k.py',
      '        power=1.0,\n', '        power=0.9,\n',
      CARD + '[upernet_soft_small_512x512_160k_ade20k]'),
    # issue 30: tools
    M('tta_vertical_flip', '--tta flips the images vertically',
      'tools/test.py', "                dict(type='RandomFlip', prob=1.),",
      ("                dict(type='RandomFlip', prob=1., "
       "direction='vertical'),"), TOOLC + 'test_tta_flip_views'),
    M('tta_det_no_flip_meta',
      ('--tta on detectors packs no flip meta (DetTTAModel cannot unflip '
       'the boxes)'), 'tools/test.py',
      "'scale_factor', 'flip', 'flip_direction'))", "'scale_factor'))",
      TOOLC + 'test_tta_flip_views[mask_rcnn_soft_tiny_1x]'),
    M('export_seg_shape_swapped',
      'segmentation export resizes the logits to W x H',
      'tools/mmsoft_tools/deploy.py',
      'dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W))',
      'dict(img_shape=(W, H), ori_shape=(W, H), pad_shape=(W, H))',
      TOOLC + 'test_export_non_square[demo/upernet_soft_demo]'),
    M('export_input_transposed', 'the ONNX graph is traced on a W x H input',
      'tools/mmsoft_tools/deploy.py',
      '    x = torch.zeros(batch, 3, *wrapper.shape)\n',
      '    x = torch.zeros(batch, 3, *wrapper.shape[::-1])\n',
      TOOLC + 'test_export_non_square[demo/soft_cls_demo]'),
    # issue 36: nothing lost
    M('image_demo_reads_its_outputs',
      'demo/image_demo.py searches its own --out-dir for inputs',
      'demo/image_demo.py',
      '            and osp.realpath(osp.join(dirpath, d)) not in skip)', ')',
      ('tests/test_demo/test_image_demo.py::'
       'test_out_dir_inside_input_is_not_input')),
)


def by_name():
    """{name: mutation}; names are unique."""
    out = {m.name: m for m in MUTATIONS}
    assert len(out) == len(MUTATIONS), 'duplicate mutation names'
    return out
