# Copyright (c) mmsoft contributors. Adapted from the OpenMMLab train tools.
"""Train a SOFT model with mmpretrain, mmdet or mmseg.

The codebase is picked from the config's ``default_scope``::

    python tools/train.py configs/retinanet_soft_small_1x.py
    tools/dist_train.sh configs/retinanet_soft_small_1x.py 8
    python tools/train.py configs/upernet_soft_small_512x512_160k_ade20k.py \
        --cfg-options \
        model.backbone.init_cfg.checkpoint=/data/soft_norm_small.pth

The guarantees come from the hooks the shipped configs name (the checkpoint
files: ``SafeCheckpointHook``, ``StrictLoadHook``), as with the host
codebases' own ``tools/train.py`` (docs/en/advanced_guides/
fault_tolerance.md). This tool adds a pre-flight of its arguments, one run
per work dir, the data check, CPU distributed runs, ``--amp`` on CPU
(:mod:`mmsoft_tools.launch`) and expected failures as one line
(docs/en/faq.md).
"""
import os
import warnings

# mmengine 0.10's pkg_resources import, repeated per codebase import
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmsoft_tools import cli, data_check, launch  # noqa: E402


def parse_args(argv=None):
    parser = cli.runner_parser(
        'Train a SOFT model (mmpretrain / mmdet / mmseg config)',
        dict(config='train config file path'),
        work_dir_help='the dir to save logs and models',
        checkpoint='a load_from checkpoint')
    parser.add_argument(
        '--amp',
        action='store_true',
        default=False,
        help='enable automatic-mixed-precision training (bfloat16 autocast '
        'on CPU)')
    parser.add_argument(
        '--auto-scale-lr',
        action='store_true',
        help='enable automatically scaling LR with the total batch size')
    parser.add_argument(
        '--resume',
        nargs='?',
        type=str,
        const='auto',
        help='If specify checkpoint path, resume from it, while if not '
        'specify, try to auto resume from the latest checkpoint '
        'in the work directory.')
    return cli.parse_runner_args(parser, argv)


def build_cfg(args):
    cfg = cli.apply_runner_args(cli.load_config(args.config), args)

    if args.amp:
        launch.enable_amp(cfg)

    if args.auto_scale_lr:
        if 'auto_scale_lr' in cfg and \
                'enable' in cfg.auto_scale_lr and \
                'base_batch_size' in cfg.auto_scale_lr:
            cfg.auto_scale_lr.enable = True
        else:
            raise RuntimeError('Can not find "auto_scale_lr" or '
                               '"auto_scale_lr.enable" or '
                               '"auto_scale_lr.base_batch_size" in your'
                               ' configuration file.')

    # resume is determined in this priority: resume from > auto_resume
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    cli.set_partial_load(cfg, args.partial_load)  # the config's hook
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = build_cfg(args)
    refusal = launch.amp_refusal(cfg)  # fp16 AMP without a GPU
    if refusal:
        raise cli.ToolError(refusal)
    cli.check_work_dir(cfg.work_dir)  # a file, read-only?
    data_check.exit_if_missing(cfg, 'train', args.launcher)  # data on disk?
    cli.check_init_checkpoints(cfg)  # init_cfg: a folder, damaged, offline?
    if os.environ.get('MMSOFT_PREFLIGHT', '0') not in ('', '0'):
        # tools/dist_train.sh: these checks once, before torchrun starts
        # the ranks; and the ImageNet file (each rank's init_weights)
        skip = os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', '0')
        problem = None if skip else data_check.pretrained_message(
            cfg, args.resume)
        if problem:
            raise cli.ToolError(problem)
        return 0
    # one run per work dir (rank 0 holds the lock until the run ends)
    lock = launch.lock_work_dir(cfg, args.launcher)
    try:
        launch.prepare_cfg(cfg, args.launcher)  # codebase, init, CPU dist

        if 'runner_type' not in cfg:
            runner = Runner.from_cfg(cfg)
        else:
            runner = RUNNERS.build(cfg)
        try:
            runner.train()  # wrong weights, full disk: run_main's one line
        finally:
            launch.shutdown_dist()  # not left to atexit (gloo can abort)
    finally:
        if lock is not None:
            lock.release()


if __name__ == '__main__':
    cli.run_main(main)  # expected failures: one line (cli.EXPECTED)
