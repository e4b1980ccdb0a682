"""Generate the synthetic demo data sets (COCO / ADE20K / ImageNet layouts).

    python tools/misc/make_demo_data.py                 # -> data/demo
    python tools/misc/make_demo_data.py --out /tmp/demo --seed 1 --force
    python tools/misc/make_demo_data.py --tasks det --num-train 50 --num-val 10

Writes ``<out>/coco`` (mmdet CocoDataset), ``<out>/ade`` (mmseg
ADE20KDataset) and ``<out>/imagenet`` (mmpretrain CustomDataset / ImageNet);
see :mod:`demo_synthetic` for the formats.
Deterministic for a given seed; data sets whose manifest already matches are
skipped (``--force`` regenerates).
"""
import argparse
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

import demo_synthetic
from mmsoft_tools.cli import check_work_dir, run_main

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    in_checkout = osp.isfile(osp.join(ROOT, 'mmsoft', '__init__.py'))
    p.add_argument(
        '--out',
        default=osp.join(ROOT if in_checkout else '.', 'data', 'demo'),
        help='output root (default: data/demo)')
    p.add_argument('--seed', type=int, default=0)
    p.add_argument(
        '--tasks',
        nargs='+',
        default=['det', 'seg', 'cls'],
        choices=['det', 'seg', 'cls'])
    p.add_argument(
        '--num-train',
        type=int,
        default=None,
        help='training images per data set (default: per task)')
    p.add_argument(
        '--num-val',
        type=int,
        default=None,
        help='validation images per data set')
    p.add_argument(
        '--workers',
        type=int,
        default=None,
        help='rendering processes (default: CPU count, <= 4)')
    p.add_argument(
        '--force',
        action='store_true',
        help='regenerate even if the data is up to date')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    check_work_dir(args.out, '--out')  # a file, read-only: one line
    overrides = {}
    for task in args.tasks:
        o = {}
        if args.num_train is not None:
            o['num_train'] = args.num_train
        if args.num_val is not None:
            o['num_val'] = args.num_val
        overrides[task] = o
    t0 = time.perf_counter()
    demo_synthetic.make_demo_data(
        args.out,
        seed=args.seed,
        tasks=args.tasks,
        force=args.force,
        overrides=overrides,
        workers=args.workers,
        log=lambda msg: print(f'[data] {msg}', flush=True))
    print(
        f'[data] done in {time.perf_counter() - t0:.1f} s -> {args.out}',
        flush=True)
    return 0


if __name__ == '__main__':
    run_main(main)  # expected failures (full disk ...): one line
