"""The main job of the README (`make demo`): SOFT end to end on the CPU.

Generates the synthetic data sets (``data/demo``, skipped when up to date),
trains RetinaNet + SOFT (bbox mAP), UperNet + SOFT (mIoU) and a SOFT
classifier (top-1) from scratch with the codebases' own datasets, heads
and metrics (:mod:`demo_tasks`), draws validation predictions
(``work_dirs/demo/<task>/<task>_predictions.png``) and prints the results
table (``work_dirs/demo/results.{json,md}``); the logs are in
``work_dirs/demo/<task>/<timestamp>/``. ``--tasks cls``: one task;
``--smoke``: 3 iterations on tiny data; ``--amp``: as ``tools/train.py
--amp``, into ``<work-dir>-amp``. Exit status 0 when every target is met,
1 when one is missed, 2 when a task failed.
"""
import argparse
import json
import os
import os.path as osp
import sys
import time
import traceback
import warnings

from mmsoft_tools.cli import seed_int  # 0 .. 2**32 - 1 (numpy)

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
ALL = ['det', 'seg', 'cls']
ROW = ('task', 'metric', 'value', 'target')  # of the results table


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--tasks', nargs='+', default=ALL, choices=ALL)
    p.add_argument('--data', default=osp.join(ROOT, 'data', 'demo'))
    p.add_argument('--work-dir', default=osp.join(ROOT, 'work_dirs', 'demo'))
    p.add_argument('--seed', type=seed_int, default=0)
    p.add_argument('--threads', type=int, default=0, help='0: the idle cores')
    p.add_argument('--smoke', action='store_true', help='3 iterations')
    p.add_argument('--amp', action='store_true', help='as train.py --amp')
    p.add_argument('--verbose', action='store_true', help='full logs')
    return p.parse_args(argv)


def log(msg=''):
    print(f'[demo] {msg}' if msg else '', flush=True)


def main(argv=None):
    args = parse_args(argv)
    t_start = time.perf_counter()
    # mmengine 0.10 imports the deprecated pkg_resources at every import
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
    import torch
    from mmengine.runner import Runner
    load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else 0
    torch.set_num_threads(args.threads or max(1, os.cpu_count() - int(load)))
    import demo_synthetic as S
    import demo_tasks as T
    from mmsoft.utils.atomic import atomic_write
    from mmsoft_tools.launch import enable_amp
    log(f'tasks {" ".join(args.tasks)}; torch {torch.__version__}, '
        f'{torch.get_num_threads()} thread(s), {os.cpu_count()} CPU cores')

    suffix = ('-smoke' if args.smoke else '') + ('-amp' if args.amp else '')
    data_dir = args.data + ('-smoke' if args.smoke else '')
    work_dir = args.work_dir + suffix
    tiny = {t: dict(num_train=16, num_val=8) for t in ALL}
    data = S.make_demo_data(
        data_dir,
        args.seed,
        args.tasks,
        overrides=tiny if args.smoke else None,
        log=lambda msg: log(f'data {msg}'))
    data_s = time.perf_counter() - t_start

    rows, results = [], {}
    for k, task in enumerate(args.tasks, 1):
        spec = T.TASKS[task]
        cfg = T.load_demo_config(task)
        if args.smoke:
            T.shrink_for_smoke(cfg)
        if args.amp:
            enable_amp(cfg)
        path, t0 = data[task]['path'], time.perf_counter()
        log(f'\n[demo] ({k}/{len(args.tasks)}) {spec["name"]}: '
            f'{spec["model"]} on {path} [{spec["config"]}]')
        rows.append(
            dict(
                zip(ROW, (spec['name'], spec['label'], None, spec['target']))))
        try:
            r = results[task] = T.run_task(
                task,
                path,
                osp.join(work_dir, task),
                cfg=cfg,
                seed=args.seed,
                runner_cls=Runner if args.verbose else None)
        except Exception:
            traceback.print_exc()
            log(f'{task}: FAILED (traceback above)')
            results[task] = dict(error=traceback.format_exc())
            continue
        finally:
            rows[-1]['seconds'] = time.perf_counter() - t0
        r['optim_wrapper'] = cfg.optim_wrapper.get('type', 'OptimWrapper')
        rows[-1]['value'] = r['value']
        log(f'{task}: {spec["label"]} {r["value"]}; train {r["train_s"]:.0f} '
            f's, test {r["test_s"]:.0f} s')
        rows += [
            dict(
                zip(ROW, (spec['name'], label, r['metrics'][k] * scale, None)))
            for k, label, scale in spec['extra'] if k in r['metrics']
        ]

    total = time.perf_counter() - t_start
    table = T.format_table(rows)
    os.makedirs(work_dir, exist_ok=True)
    atomic_write(
        osp.join(work_dir, 'results.json'),
        json.dumps(dict(vars(args), seconds=total, results=results), indent=2))
    atomic_write(osp.join(work_dir, 'results.md'), table + '\n')
    kind = 'smoke run: 3 iterations, not meaningful' if args.smoke else \
        'synthetic validation sets'
    print('\n' + '=' * 72 + f'\nmmsoft demo results ({kind}' +
          (', mixed precision (--amp))' if args.amp else ')'))
    print(f'{table}\ntotal {total / 60:.1f} min (data {data_s:.0f} s)')
    for task in args.tasks:
        if results[task].get('png'):
            print(f'predictions: {results[task]["png"]}')
    print(f'results: {osp.join(work_dir, "results.json")}\n' + '=' * 72)
    if any('error' in r for r in results.values()):
        return 2
    return int(not args.smoke
               and any(r['target'] is not None and r['value'] < r['target']
                       for r in rows))


if __name__ == '__main__':
    sys.exit(main())
