"""Hand-written mutations: bugs mutmut (``run_mutmut.py``) cannot generate
or whose tests lie outside its groups (device / precision / compile,
module-level data, scripts, configs, the tools outside the groups).
``run_mutmut.py --hand`` applies each alone (``old``, found once in
``path``, becomes ``new``) and runs its ``tests``, which must fail."""
import dataclasses
from typing import Tuple

__all__ = ['Mutation', 'MUTATIONS', 'by_name']

REF_NORM = ('tests/test_models/test_backbones/test_official_reference.py::'
            'test_logits_match_official_reference[soft_norm-m12]')
STRICT = 'tests/test_tools/test_strict_load_tools.py::'
NR_SOFT = ('tests/test_models/test_layers/test_pinv.py::'
           'test_soft_rule_matches_official[iterative-12]')
AMP = 'tests/test_models/test_device_amp.py::'
CLI = 'tests/test_tools/test_tool_cli.py::'
SAFE_CONV = 'tests/test_models/test_layers/test_safe_conv.py::'
CARD = ('tests/test_configs/test_recipe_card.py::'
        'test_config_matches_recipe_card')
TOOLC = 'tests/test_tools/test_tool_contracts.py::'
COMPILE = 'tests/test_models/test_compile.py::'
NRI = 'mmsoft/models/layers/nr_iteration.py'
SOFT_ATTN = 'mmsoft/models/layers/soft_attention.py'
NR_AUTOGRAD = 'mmsoft/models/layers/nr_autograd.py'
DENSE = 'configs/_base_/soft_dense.py'
IN1K = 'configs/_base_/soft_in1k.py'
DEPLOY = 'tools/mmsoft_tools/deploy.py'
NRB = 'tools/analysis/nr_backward_compare.py'


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
    M('test_main_returns_none', 'tools/test.py main() returns None',
      'tools/test.py', '(gloo can abort)\n    return metrics\n',
      '(gloo can abort)\n', STRICT + 'test_partial_load_opt_in'),
    M('partial_load_not_passed', '--partial-load not passed to the hook',
      'tools/test.py', 'cli.set_partial_load(cfg, args.partial_load)',
      'cli.set_partial_load(cfg, False)', STRICT + 'test_partial_load_opt_in'),
    M('det_dump_replaces_metrics',
      'mmdet --out: dump replaces the COCO metric', 'tools/test.py',
      '    runner.test_evaluator.metrics.append(dump_metric(scope, out))',
      '    runner.test_evaluator.metrics = [dump_metric(scope, out)]',
      ('tests/test_tools/test_chain.py::'
       'test_test_tool_on_trained_checkpoint[det-keys0]')),
    M('nr_soft_shift', "'soft' NR rule on A + 0.1 I, not A + 0.01 I", NRI,
      '_SOFT_SHIFT = 0.01\n', '_SOFT_SHIFT = 0.1\n', NR_SOFT),
    M('nr_soft_scale', "'soft' NR rule starts from scale 1.0, not 0.9", NRI,
      '_SOFT_SCALE = 0.9\n', '_SOFT_SCALE = 1.0\n', NR_SOFT),
    M('convert_swap_norms', 'converter: norm1 / norm2 swapped (round-trips)',
      'mmsoft/models/arch_zoo.py',
      ("    ('att.norm1.', 'norm1.'),\n    ('att.ff1.', "
       "'ffn.layers.0.0.'),  # mmcv FFN: fc1\n    ('att.ff2.', "
       "'ffn.layers.1.'),  # fc2\n    ('att.norm2.', 'norm2.'),\n"),
      ("    ('att.norm1.', 'norm2.'),\n    ('att.ff1.', "
       "'ffn.layers.0.0.'),  # mmcv FFN: fc1\n    ('att.ff2.', "
       "'ffn.layers.1.'),  # fc2\n    ('att.norm2.', 'norm1.'),\n"), REF_NORM),
    M('convert_swap_qv', 'converter: W_q / W_v swapped (round-trips)',
      'mmsoft/models/arch_zoo.py',
      "    ('att.mha.W_q.', 'attn.q.'),\n    ('att.mha.W_v.', 'attn.v.'),\n",
      "    ('att.mha.W_q.', 'attn.v.'),\n    ('att.mha.W_v.', 'attn.q.'),\n",
      REF_NORM),
    M(
        'kernel_autocast_cuda_only', "kernel: autocast off for 'cuda' only",
        SOFT_ATTN, '    with autocast_off(x.device.type):\n',
        "    with torch.autocast(device_type='cuda', enabled=False):\n",
        AMP + ('test_kernel_and_pinv_run_in_fp32_under_autocast'
               '[cpu-iterative-exact-bfloat16]')),
    M(
        'nr_autocast_cuda_only', "NR pinv: autocast off for 'cuda' only",
        NR_AUTOGRAD,
        '    with autocast_off(A.device.type), tf32_off(A.device.type):\n',
        ("    with torch.autocast(device_type='cuda', enabled=False), "
         'tf32_off(A.device.type):\n'),
        AMP + 'test_pinv_alone_runs_in_fp32_under_autocast'
        '[cpu-iterative-bfloat16]'),
    M(
        'nr_no_fp32_upcast', 'NR pinv: half A / W not cast to float32',
        NR_AUTOGRAD,
        '    A = A.to(dtype)\n    W = None if W is None else W.to(dtype)\n',
        '', AMP + 'test_pinv_alone_runs_in_fp32_under_autocast'
        '[cpu-iterative-bfloat16]'),
    M(
        'fused_products_uncentered', 'fused products: tokens not centred',
        SOFT_ATTN,
        '            c = landmarks.float().mean(-2, keepdim=True)\n',
        '            c = landmarks.float()[..., :1, :] * 0\n',
        'tests/test_models/test_layers/test_soft_attention.py::'
        'test_fused_products_equal_the_formed_kernel[True]'),
    M('compile_graph_break', 'soft_attention: a data-dependent branch',
      SOFT_ATTN, '    with autocast_off(v.device.type):\n        if fused:',
      ('    if not torch.isfinite(q).all():\n        raise '
       "ValueError('soft_attention: non-finite queries')\n    with "
       'autocast_off(v.device.type):\n        if fused:'),
      COMPILE + 'test_training_forward_is_one_graph'),
    M('scalar_recurrence_inlined', 'spectral NR recurrence inlined (3^20)',
      NRI, "if hasattr(torch.library, 'custom_op'):", 'if False:',
      COMPILE + 'test_spectral_recurrence_is_one_opaque_op'),
    M('dist_test_not_distributed', 'dist_test.sh: --launcher none',
      'tools/launch.sh', '--launcher pytorch "${options[@]}"',
      '--launcher none "${options[@]}"',
      'tests/test_tools/test_launch.py::test_dist_test_sh_exits_cleanly'),
    M('data_check_skip_any_value', 'MMSOFT_SKIP_DATA_CHECK=0 skips too',
      'tools/mmsoft_tools/data_check.py',
      ("    if os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', "
       "'0'):\n"), "    if os.environ.get('MMSOFT_SKIP_DATA_CHECK'):\n",
      'tests/test_tools/test_data_check.py::test_rank_and_skip'),
    M(
        'deploy_init_log', 'pytorch2onnx: init_weights logs every tensor',
        DEPLOY, '        launch.quiet_init_weights(model)\n',
        '        model.init_weights()\n', 'tests/test_tools/test_deploy.py::'
        'test_error_is_all_the_output_with_random_weights'),
    M('benchmark_attention_fwd_cells', 'fwd+bwd columns show the forward',
      'tools/analysis/benchmark_attention.py',
      'f\'{fmt(b, "time_ms")} | {fmt(b, "peak_mb")} |\')',
      'f\'{fmt(f, "time_ms")} | {fmt(f, "peak_mb")} |\')',
      CLI + 'test_benchmark_attention_tiny_run'),
    M('benchmark_onnx_ratio_inverted', "'torch / ort' column is ort / torch",
      'tools/deployment/benchmark_onnx.py',
      'f"{r[\'torch_ms\'] / r[\'ort_ms\']:.2f}x"',
      'f"{r[\'ort_ms\'] / r[\'torch_ms\']:.2f}x"',
      CLI + 'test_benchmark_onnx_tiny_run'),
    M('nr_backward_compare_key', 'mAP@0.5 column reads a misspelt key', NRB,
      "m.get('coco/bbox_mAP_50', float('nan'))",
      "m.get('coco/bbox_mAP50', float('nan'))",
      CLI + 'test_nr_backward_compare_train_demo'),
    M('nr_backward_compare_swap', 'mAP and mAP@0.5 columns swapped', NRB,
      ("        rows.append((b, m.get('coco/bbox_mAP', float('nan')),\n   "
       "                  m.get('coco/bbox_mAP_50', float('nan')),"),
      ("        rows.append((b, m.get('coco/bbox_mAP_50', "
       "float('nan')),\n                     m.get('coco/bbox_mAP', "
       "float('nan')),"), CLI + 'test_nr_backward_compare_train_demo'),
    M('half_conv_probe_trusts', 'CPU half conv probe trusts every kernel',
      'mmsoft/models/layers/amp.py',
      '    ok = _verdicts[key] = bool(err <= PROBE_RTOL[dtype])\n',
      '    ok = _verdicts[key] = True\n',
      SAFE_CONV + 'test_broken_half_kernel_is_detected_and_bypassed'),
    M('half_conv_fallback_autocast', "fp32 fallback: autocast off for 'cuda'",
      'mmsoft/models/layers/amp.py',
      "    with autocast_off('cpu'):\n        out = _raw_conv2d(",
      "    with autocast_off('cuda'):\n        out = _raw_conv2d(",
      SAFE_CONV + 'test_broken_half_kernel_is_detected_and_bypassed'),
    M('amp_wrapper_unguarded', '--amp on the CPU: neck / head convs unguarded',
      'mmsoft/engine/optimizers/cpu_amp_optim_wrapper.py',
      'dtype=self.cast_dtype), CheckedConvs():',
      'dtype=self.cast_dtype), contextlib.nullcontext():',
      SAFE_CONV + 'test_cpu_amp_wrapper_guards_every_conv_of_the_model'),
    M('demo_value_unscaled', 'demo: the metric reported without its scale',
      'tools/mmsoft_tools/demo_tasks.py',
      "        value=None if value is None else value * spec['scale'],\n",
      '        value=value,\n',
      'tests/test_configs/test_demo_configs.py::test_short_training_run[seg]'),
    M('dense_norm_eval_off', 'dense: patch-embedding BNs update (norm_eval)',
      DENSE, '    norm_eval=True,\n', '    norm_eval=False,\n',
      CARD + '[retinanet_soft_tiny_1x]'),
    M('dense_norms_decay', 'dense: the norms get weight decay', DENSE,
      '        norm_decay_mult=0.0,\n', '',
      CARD + '[mask_rcnn_soft_small_1x]'),
    M('dense_3x_warmup_in_epochs', '3x: the 500-step warm-up by epoch', DENSE,
      'start_factor=0.001, by_epoch=False, begin=0, end=500',
      'start_factor=0.001, by_epoch=True, begin=0, end=500',
      CARD + '[atss_soft_small_3x_ms]'),
    M('dense_residual_drop_path', 'dense: drop_path, not residual dropout',
      DENSE, "    residual_drop='dropout',\n",
      "    residual_drop='drop_path',\n", CARD + '[gfl_soft_small_3x_ms]'),
    M('in1k_warmup_per_epoch', 'ImageNet: the warm-up steps per epoch', IN1K,
      '        end=10,\n        convert_to_iter_based=True),\n',
      '        end=10),\n', CARD + '[soft_tiny_in1k]'),
    M('in1k_ema_timm_convention', "ImageNet: EMA momentum in timm's sense",
      IN1K, "dict(type='EMAHook', momentum=4e-5,",
      "dict(type='EMAHook', momentum=0.99996,",
      CARD + '[soft_norm_small_in1k]'),
    M('in1k_no_clip_grad', 'ImageNet: gradient clipping dropped', IN1K,
      '    clip_grad=dict(max_norm=1.0),\n', '    clip_grad=None,\n',
      CARD + '[soft_small_in1k]'),
    M('seg_poly_power_09', 'ADE20K: poly power 0.9, not 1.0',
      'configs/_base_/upernet_soft_512x512_160k_ade20k.py',
      '        power=1.0,\n', '        power=0.9,\n',
      CARD + '[upernet_soft_small_512x512_160k_ade20k]'),
    M('tta_vertical_flip', '--tta flips vertically', 'tools/test.py',
      "                dict(type='RandomFlip', prob=1.),",
      ("                dict(type='RandomFlip', prob=1., "
       "direction='vertical'),"), TOOLC + 'test_tta_flip_views'),
    M('tta_det_no_flip_meta', '--tta on detectors: no flip meta',
      'tools/test.py', "'scale_factor', 'flip', 'flip_direction'))",
      "'scale_factor'))",
      TOOLC + 'test_tta_flip_views[mask_rcnn_soft_tiny_1x]'),
    M('export_seg_shape_swapped', 'seg export resizes to W x H', DEPLOY,
      'dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W))',
      'dict(img_shape=(W, H), ori_shape=(W, H), pad_shape=(W, H))',
      TOOLC + 'test_export_non_square[demo/upernet_soft_demo]'),
    M('export_input_transposed', 'ONNX traced on a W x H input', DEPLOY,
      '    x = torch.zeros(batch, 3, *wrapper.shape)\n',
      '    x = torch.zeros(batch, 3, *wrapper.shape[::-1])\n',
      TOOLC + 'test_export_non_square[demo/soft_cls_demo]'),
    M(
        'image_demo_reads_its_outputs', 'image_demo reads its own --out-dir',
        'demo/image_demo.py',
        '            and osp.realpath(osp.join(dirpath, d)) not in skip)', ')',
        'tests/test_demo/test_image_demo.py::'
        'test_out_dir_inside_input_is_not_input'),
)


def by_name():
    """{name: mutation}; names are unique."""
    out = {m.name: m for m in MUTATIONS}
    assert len(out) == len(MUTATIONS), 'duplicate mutation names'
    return out
