# Copyright (c) mmsoft contributors. Adapted from the OpenMMLab train tools.
"""Train a SOFT model with mmpretrain, mmdet or mmseg.

The codebase is picked from the config's ``default_scope``::

    python tools/train.py configs/retinanet_soft_small_1x.py
    tools/dist_train.sh configs/retinanet_soft_small_1x.py 8
    python tools/train.py configs/upernet_soft_small_512x512_160k_ade20k.py \
        --cfg-options \
        model.backbone.init_cfg.checkpoint=/data/soft_norm_small.pth

The detection / segmentation configs name the authors' ImageNet file of
their backbone (``checkpoints/soft_norm_<size>.pth``); when it is missing
the tool stops with one line before anything is built
(:func:`mmsoft_tools.cli.exit_if_missing_weights`).

``--resume`` without a path resumes from the newest complete checkpoint of
the work dir (damaged newer ones are skipped with a warning), ``--resume
PATH`` from PATH; a config's plain ``CheckpointHook`` becomes mmsoft's
``SafeCheckpointHook`` (atomic writes, safe reads, RNG states). Without
CUDA, ``--launcher pytorch`` (``tools/dist_train.sh``) runs one CPU process
per "GPU" with the gloo backend (see :mod:`mmsoft_tools.launch`),
and ``--amp`` trains under bfloat16 autocast.

``load_from`` is loaded strictly (another architecture is an error naming
the keys; ``--partial-load`` loads the matching tensors and prints what was
skipped), ``--resume PATH`` must be a training checkpoint (checked before
anything is built), and one run at a time holds the work dir
(:mod:`mmsoft_tools.work_dir_lock`). Expected failures (wrong or damaged
files, a full disk, the non-finite stop, ...) end in one line
(:func:`mmsoft_tools.cli.run_main`; docs/en/faq.md lists them).
"""
import sys
import warnings

# mmengine 0.10 imports (and reloads) the deprecated pkg_resources at every
# codebase import: a warning the user cannot act on, repeated up to six
# times before the tool's own output (e.g. the data check's message)
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

# first: the tools' package quiets the stacks' import noise (its .quiet)
import mmsoft_tools  # noqa: E402,F401  # isort: skip
from mmengine.config import Config  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from mmsoft.engine import add_nonfinite_hook  # noqa: E402
from mmsoft.engine import use_safe_checkpoint_hook  # noqa: E402
from mmsoft.utils.checkpoint_io import CheckpointError  # noqa: E402
from mmsoft.utils.checkpoint_io import CheckpointRefused  # noqa: E402
from mmsoft.utils.checkpoint_io import CheckpointWriteError  # noqa: E402
from mmsoft.utils.strict_load import CheckpointMismatchError  # noqa: E402
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
    cfg = cli.apply_runner_args(Config.fromfile(args.config), args)

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

    # atomic checkpoints with RNG states, read safely (mmsoft's hook also
    # makes --resume take the newest complete checkpoint)
    use_safe_checkpoint_hook(cfg)
    # stop at the first non-finite loss (mmsoft.engine.NonFiniteLossHook)
    # unless the config configures that hook itself
    add_nonfinite_hook(cfg)

    # resume is determined in this priority: resume from > auto_resume
    if args.resume == 'auto':
        cfg.resume = True
        cfg.load_from = None
    elif args.resume is not None:
        cfg.resume = True
        cfg.load_from = args.resume
    # --resume: a training checkpoint (checked by mmsoft.engine's hook)
    cli.add_strict_load_hook(cfg, args.partial_load)
    return cfg


def main(argv=None):
    args = parse_args(argv)
    cfg = build_cfg(args)
    cli.check_work_dir(cfg.work_dir)  # a file, read-only?
    data_check.exit_if_missing(cfg, 'train', args.launcher)  # data on disk?
    launch.exit_if_legacy_backbone(cfg)  # attn options of mmsoft 0.1?
    launch.exit_if_not_resumable(cfg)  # --resume: a training ckpt of cfg?
    cli.exit_if_missing_weights(cfg)  # the backbone's ImageNet file?
    cli.check_init_checkpoints(cfg)  # init_cfg: a folder, damaged, offline?
    # one run per work dir (rank 0 holds the lock until the run ends)
    lock = launch.lock_work_dir(cfg, args.launcher)
    try:
        launch.prepare_cfg(cfg, args.launcher)  # codebase, init, CPU dist

        if 'runner_type' not in cfg:
            runner = Runner.from_cfg(cfg)
        else:
            runner = RUNNERS.build(cfg)
        try:
            runner.train()
        except (CheckpointMismatchError, CheckpointWriteError, CheckpointError,
                CheckpointRefused) as e:
            # wrong, damaged or unsafe weights, full disk: one message
            sys.exit(f'error: {e}')
        finally:
            # tear the process group down before interpreter exit: left to
            # atexit, gloo can abort ("terminate called without an active
            # exception") after a finished run
            launch.shutdown_dist()
    finally:
        if lock is not None:
            lock.release()


if __name__ == '__main__':
    cli.run_main(main)  # expected failures: one line (cli.EXPECTED)
