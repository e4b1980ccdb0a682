# Copyright (c) mmsoft contributors. Adapted from the OpenMMLab test tools.
"""Test (evaluate) a SOFT model with mmpretrain, mmdet or mmseg.

The codebase is picked from the config's ``default_scope``::

    python tools/test.py configs/retinanet_soft_small_1x.py ckpt.pth
    tools/dist_test.sh configs/upernet_soft_small_512x512_160k_ade20k.py \
        ckpt.pth 8 --cfg-options test_dataloader.dataset.data_root=data/ade

The metrics of the config's ``test_evaluator`` are printed. ``--out``:
mmdet and mmpretrain dump the predictions to a pickle file, mmseg saves
the label maps as PNGs to that directory (as their own tools/test.py do).
Expected failures end in one line (docs/en/faq.md lists them).
"""
import contextlib
import copy
import os.path as osp
import sys
import warnings

# mmengine 0.10's pkg_resources import, repeated per codebase import
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

from mmengine.config import ConfigDict  # noqa: E402
from mmengine.dist import is_main_process  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmsoft.utils.atomic import atomic_path  # noqa: E402
from mmsoft_tools import cli, data_check, launch  # noqa: E402


def parse_args(argv=None):
    parser = cli.runner_parser(
        'Test (and eval) a SOFT model (mmpretrain / mmdet / mmseg config)',
        dict(config='test config file path', checkpoint='checkpoint file'),
        work_dir_help='the directory to save the file containing evaluation '
        'metrics',
        checkpoint='a checkpoint')
    parser.add_argument(
        '--out',
        help='mmdet / mmpretrain: dump predictions to a pickle file; mmseg: '
        'directory to save the predicted segmentation maps')
    parser.add_argument(
        '--show', action='store_true', help='show prediction results')
    parser.add_argument(
        '--wait-time', type=float, default=2, help='the interval of show (s)')
    parser.add_argument(
        '--show-dir',
        help='directory where painted images will be saved. '
        'If specified, it will be automatically saved '
        'to the work_dir/timestamp/show_dir')
    parser.add_argument(
        '--tta', action='store_true', help='test time augmentation')
    return cli.parse_runner_args(parser, argv)


def trigger_visualization_hook(cfg, args, scope):
    default_hooks = cfg.get('default_hooks', ConfigDict())
    if 'visualization' not in default_hooks:
        raise RuntimeError(
            'VisualizationHook must be included in default_hooks. '
            'refer to usage "visualization=dict(type=\'VisualizationHook\')"')
    hook = default_hooks['visualization']
    if scope == 'mmpretrain':
        hook['enable'] = True
        hook['show'] = args.show
        hook['wait_time'] = args.wait_time
        if args.show_dir:
            hook['out_dir'] = args.show_dir
    else:
        hook['draw'] = True
        if args.show:
            hook['show'] = True
            hook['wait_time'] = args.wait_time
        if args.show_dir:
            if scope == 'mmdet':
                hook['test_out_dir'] = args.show_dir
            else:  # mmseg
                cfg.visualizer['save_dir'] = args.show_dir
    return cfg


def enable_tta(cfg, scope):
    """``--tta``: the codebase's TTA model on ``tta_pipeline``; as in each
    codebase's own tools, mmpretrain / mmdet configs without them get a
    flip TTA (2 views: flipped, then as it is; scores averaged, or boxes
    unflipped and merged by NMS 0.5). The views of the configs' own TTA:
    docs/en/user_guides/train_test.md."""
    if 'tta_model' not in cfg:
        if scope == 'mmpretrain':
            cfg.tta_model = dict(type='mmpretrain.AverageClsScoreTTA')
        elif scope == 'mmdet':
            cfg.tta_model = dict(
                type='DetTTAModel',
                tta_cfg=dict(
                    nms=dict(type='nms', iou_threshold=0.5), max_per_img=100))
    if 'tta_pipeline' not in cfg and scope in ('mmpretrain', 'mmdet'):
        test_data_cfg = cfg.test_dataloader.dataset
        while 'dataset' in test_data_cfg:
            test_data_cfg = test_data_cfg['dataset']
        cfg.tta_pipeline = copy.deepcopy(test_data_cfg.pipeline)
        pack = cfg.tta_pipeline[-1]
        if scope == 'mmdet':
            pack = dict(
                type='PackDetInputs',
                meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                           'scale_factor', 'flip', 'flip_direction'))
        cfg.tta_pipeline[-1] = dict(
            type='TestTimeAug',
            transforms=[[
                dict(type='RandomFlip', prob=1.),
                dict(type='RandomFlip', prob=0.)
            ], [pack]])
    if 'tta_model' not in cfg or 'tta_pipeline' not in cfg:
        raise RuntimeError('--tta needs `tta_model` and `tta_pipeline` in '
                           'the config')
    cfg.model = ConfigDict(**cfg.tta_model, module=cfg.model)
    cfg.test_dataloader.dataset.pipeline = cfg.tta_pipeline


def exit_if_no_checkpoint(path):
    """A local checkpoint path that is not there (or is a directory): one
    line and exit 1, before the config is loaded."""
    if '://' not in path and not osp.exists(path):
        sys.exit(f'error: checkpoint {path!r} not found: give the path of a '
                 'trained model (work_dirs/<config>/epoch_N.pth or '
                 'iter_N.pth); mmsoft releases no trained weights (the '
                 "authors' ImageNet classifiers, converted: "
                 'docs/en/user_guides/official_weights.md)')
    if osp.isdir(path):
        sys.exit(f'error: {cli.checkpoint_problem(path)}')


def build_cfg(args):
    cfg = cli.apply_runner_args(cli.load_config(args.config), args)
    cfg.load_from = args.checkpoint
    cli.set_partial_load(cfg, args.partial_load)  # the config's hook
    return cfg


def exit_if_bad_out(out, scope):
    """``--out`` that cannot be written: one line before inference."""
    if out is None:
        return
    if scope != 'mmseg' and not out.endswith(('.pkl', '.pickle')):
        sys.exit(f'error: --out {out}: the dump file must end with .pkl')
    problem = cli.unwritable_reason(out, directory=scope == 'mmseg')
    if problem:
        sys.exit(f'error: --out {out}: {problem}')


def dump_metric(scope, path):
    """The codebase's dump metric (mmdet: ``DumpDetResults``, else
    mmengine's ``DumpResults``) writing ``path`` (a temporary name) without
    logging it: :func:`main` logs the final name once the file is there."""
    if scope == 'mmdet':
        from mmdet.evaluation import DumpDetResults as Dump
    else:
        from mmengine.evaluator import DumpResults as Dump

    class Quiet(Dump):
        default_prefix = 'dump'  # it adds no metric

        def compute_metrics(self, results):
            from mmengine.evaluator import metric  # DumpResults' dump
            metric.dump(results, self.out_file_path)
            return {}

    return Quiet(out_file_path=path)


def main(argv=None):
    """Test the model; returns the metrics of ``test_evaluator`` (a dict,
    e.g. ``{'accuracy/top1': ...}``; every rank gets them). Bad input
    (missing data, a checkpoint that does not match the model) stops it
    with one line (:func:`mmsoft_tools.cli.run_main`)."""
    args = parse_args(argv)
    exit_if_no_checkpoint(args.checkpoint)  # before the config and Runner
    cfg = build_cfg(args)
    cli.check_work_dir(cfg.work_dir)  # a file, read-only?
    data_check.exit_if_missing(cfg, 'test', args.launcher)  # data on disk?
    problem = cli.checkpoint_problem(args.checkpoint)  # damaged, offline?
    if problem:
        sys.exit(f'error: {problem}')
    scope = launch.prepare_cfg(cfg, args.launcher)
    exit_if_bad_out(args.out, scope)

    if args.show or args.show_dir:
        cfg = trigger_visualization_hook(cfg, args, scope)
    if args.tta:
        enable_tta(cfg, scope)
    if args.out is not None and scope == 'mmseg':
        cfg.test_evaluator['output_dir'] = args.out
        cfg.test_evaluator['keep_results'] = True

    if 'runner_type' not in cfg:
        runner = Runner.from_cfg(cfg)
    else:
        runner = RUNNERS.build(cfg)

    # --out is replaced only by a complete file (written next to it)
    dump = args.out is not None and scope != 'mmseg'
    try:
        with atomic_path(args.out, suffix='.pkl', makedirs=True,
                         missing_ok=True) if dump else \
                contextlib.nullcontext() as out:
            if dump:
                runner.test_evaluator.metrics.append(dump_metric(scope, out))
            metrics = runner.test()
        if dump and is_main_process():  # rank 0 wrote it
            runner.logger.info(
                f'Results has been saved to {osp.abspath(args.out)}.')
    finally:
        launch.shutdown_dist()  # not left to atexit (gloo can abort)
    return metrics


if __name__ == '__main__':
    cli.run_main(main)  # expected failures: one line (cli.EXPECTED)
