"""The main job of the README (`make demo`): SOFT end to end on the CPU.

No COCO, ADE20K or ImageNet needed. One command:

1. checks the environment (runs ``tools/setup_env.sh`` and restarts itself
   in ``.venv`` if mmdet / mmseg / mmpretrain cannot be imported);
2. generates the synthetic data sets into ``data/demo`` in the real on-disk
   formats (``tools/misc/make_demo_data.py``; seconds; skipped when up to
   date);
3. trains from scratch, with mmengine's Runner and the codebases' own
   datasets, heads and metrics, one after another:

   * det - RetinaNet + SOFT on COCO instances: bbox mAP (pycocotools)
   * seg - UperNet + SOFT on the ADE20K layout: mIoU
   * cls - SOFT + linear classifier on the ImageNet layout: top-1

4. draws predictions on validation images into
   ``work_dirs/demo/<task>/<task>_predictions.png``;
5. prints the results table (task, metric, value, target, pass/fail) and
   writes it to ``work_dirs/demo/results.{json,md}``.

Progress: one line every 10 iterations per task (loss, eta); the full
mmengine logs are in ``work_dirs/demo/<task>/<timestamp>/``.

    python tools/demo.py                    # everything (~8 min, 2 cores)
    python tools/demo.py --tasks cls        # one task
    python tools/demo.py --smoke            # plumbing check: 3 iterations
    python tools/demo.py --verbose          # mmengine's full console logs
    python tools/demo.py --amp              # mixed precision, as train.py

``--amp`` trains as ``tools/train.py --amp`` does: bfloat16 autocast on the
CPU (``CPUAmpOptimWrapper``), float16 ``AmpOptimWrapper`` on CUDA; results
go to ``<work-dir>-amp`` so that they sit beside the float32 ones. SOFT's
kernel and pseudo-inverse stay float32 either way.

Exit status: 0 when every task ran and met its target, 1 when a target was
missed, 2 when a task failed with an error.
"""
import argparse
import importlib.util
import json
import logging
import os
import os.path as osp
import subprocess
import sys
import time
import traceback
import warnings

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))

ALL_TASKS = ('det', 'seg', 'cls')
SMOKE_DATA = dict(num_train=16, num_val=8)


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        '--tasks',
        nargs='+',
        default=list(ALL_TASKS),
        choices=ALL_TASKS,
        help='default: all three')
    p.add_argument(
        '--data',
        default=osp.join(ROOT, 'data', 'demo'),
        help='where the synthetic data sets are (generated if '
        'missing or stale)')
    p.add_argument(
        '--work-dir',
        default=osp.join(ROOT, 'work_dirs', 'demo'),
        help='logs, checkpoints, prediction PNGs, results')
    from mmsoft_tools.cli import seed_int  # 0 .. 2**32 - 1 (numpy)
    p.add_argument(
        '--seed', type=seed_int, default=0, help='data and training')
    p.add_argument(
        '--threads',
        type=int,
        default=0,
        help='torch CPU threads; 0 (default): the cores other '
        'processes leave idle (from the 1-minute load average), '
        'chosen again before each task')
    p.add_argument(
        '--smoke',
        action='store_true',
        help='a plumbing check: tiny data sets (in '
        '<data>-smoke), 3 training iterations per task')
    p.add_argument(
        '--amp',
        action='store_true',
        help='mixed precision as tools/train.py --amp (bfloat16 autocast '
        'on the CPU); work dir <work-dir>-amp')
    p.add_argument(
        '--no-setup', action='store_true', help='never run tools/setup_env.sh')
    p.add_argument(
        '--verbose',
        action='store_true',
        help="show mmengine's full console logs (env, config, "
        'parameter groups)')
    return p.parse_args(argv)


def log(msg=''):
    print(f'[demo] {msg}' if msg else '', flush=True)


# ---------------------------------------------------------------- env
def _stack_importable():
    try:
        import mmcv.ops  # noqa: F401
        import mmdet  # noqa: F401
        import mmpretrain  # noqa: F401
        import mmseg  # noqa: F401
        return True, ''
    except Exception as e:  # ImportError, or a broken mmcv build
        return False, f'{type(e).__name__}: {e}'


def ensure_environment(args, argv):
    """Set the environment up if the OpenMMLab stack is missing, then run
    this script again inside the project virtualenv."""
    ok, why = _stack_importable()
    if ok:
        return
    if args.no_setup:
        sys.exit(f'[demo] the OpenMMLab stack is not importable ({why}); '
                 'run `bash tools/setup_env.sh` (or `make demo`)')
    log(f'OpenMMLab stack not found ({why}): running tools/setup_env.sh')
    subprocess.run(['bash', osp.join(ROOT, 'tools', 'setup_env.sh')],
                   check=True)
    venv_py = osp.join(
        os.environ.get('MMSOFT_VENV', osp.join(ROOT, '.venv')), 'bin',
        'python')
    log(f'restarting in {venv_py}')
    os.execv(venv_py, [venv_py, osp.abspath(__file__), *argv, '--no-setup'])


def ensure_own_mmsoft(argv):
    """Run with this checkout's mmsoft: when Python would import another
    one (or none: not installed), run again with the checkout first on
    ``PYTHONPATH``, as ``tools/python.sh`` and the launch scripts do."""
    spec = importlib.util.find_spec('mmsoft')  # finds, does not import
    found = list(spec.submodule_search_locations or []) if spec else []
    own = osp.realpath(osp.join(ROOT, 'mmsoft'))
    paths = [
        p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p
    ]
    if (found and osp.realpath(found[0]) == own) or paths[:1] == [ROOT]:
        return  # (after a restart: the checkout is first, whatever spec says)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT] + paths))
    os.execve(sys.executable,
              [sys.executable, osp.abspath(__file__), *argv], env)


def load1():
    """The 1-minute load average (0 where the OS has none)."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return 0.0


def pick_threads(requested, own=0):
    """torch threads: ``requested``, or the cores that other processes
    leave idle. A core counts as busy once the load average says a whole
    core is taken: OpenMP threads fighting another process for a core are
    several times slower than one thread. ``own``: the threads this process
    kept busy over the last minute (part of the load average)."""
    ncpu = os.cpu_count() or 1
    if requested > 0:
        return requested
    others = max(0.0, load1() - own)
    return max(1, min(ncpu, ncpu - int(others)))


# ---------------------------------------------------------------- logging
class _ConsoleFilter(logging.Filter):
    """Console only: drop mmengine's multi-line dumps (environment, config,
    hook table, weight-init notes) and the per-parameter optimizer lines.
    They still go to the log file."""

    def filter(self, record):
        if record.levelno >= logging.WARNING:
            return 'init_weights' not in str(record.msg)
        msg = record.getMessage()
        return msg.count('\n') < 2 and not msg.startswith('paramwise_options')


def _quiet_runner_class():
    from mmengine.runner import Runner

    class DemoRunner(Runner):
        """mmengine's Runner with a concise console log."""

        def build_logger(self, *a, **kw):
            logger = super().build_logger(*a, **kw)
            for h in logger.handlers:
                if type(h) is logging.StreamHandler:
                    h.addFilter(_ConsoleFilter())
            return logger

    return DemoRunner


# ---------------------------------------------------------------- main
def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    t_start = time.perf_counter()
    c_start = time.process_time()
    ncpu = os.cpu_count()
    log(f'mmsoft demo: tasks {" ".join(args.tasks)}; {ncpu} CPU cores, '
        f'load average {load1():.1f}')

    # 1. environment -------------------------------------------------
    ensure_environment(args, argv)
    ensure_own_mmsoft(argv)
    # mmengine 0.10.7 imports pkg_resources (deprecated) on every import
    warnings.filterwarnings('ignore', message='pkg_resources is deprecated')
    import torch
    threads = pick_threads(args.threads)
    torch.set_num_threads(threads)
    import mmsoft  # noqa: F401  (registers SOFT everywhere)
    from mmsoft_tools import demo_synthetic, demo_tasks
    make_demo_data = demo_synthetic.make_demo_data
    T = demo_tasks
    from mmsoft.utils.atomic import atomic_write
    from mmsoft_tools.launch import enable_amp
    log(f'torch {torch.__version__}, {threads} thread(s); environment OK '
        f'({time.perf_counter() - t_start:.0f} s)')

    # 2. data --------------------------------------------------------
    data_dir = args.data + ('-smoke' if args.smoke else '')
    suffix = ('-smoke' if args.smoke else '') + ('-amp' if args.amp else '')
    work_dir = args.work_dir + suffix
    overrides = {t: dict(SMOKE_DATA) for t in ALL_TASKS} if args.smoke \
        else None
    t0 = time.perf_counter()
    gen_tasks = list(
        dict.fromkeys(T.TASKS[t]['data_task'] for t in args.tasks))
    data = make_demo_data(
        data_dir,
        seed=args.seed,
        tasks=gen_tasks,
        overrides=overrides,
        log=lambda msg: log(f'data {msg}'))
    data_s = time.perf_counter() - t0
    log(f'data ready in {data_s:.1f} s: {data_dir}')

    # 3-4. train, evaluate, draw ----------------------------------------
    runner_cls = None if args.verbose else _quiet_runner_class()
    rows, results, pngs = [], {}, []
    errors = 0
    for k, task in enumerate(args.tasks, 1):
        spec = T.TASKS[task]
        data_path = data[spec['data_task']]['path']
        cfg = T.load_demo_config(task)
        if args.smoke:
            T.shrink_for_smoke(cfg)
        if args.amp:
            enable_amp(cfg)
        if k > 1:
            new = pick_threads(args.threads, own=threads)
            if new != threads:
                threads = new
                torch.set_num_threads(threads)
                log(f'load average {load1():.1f}: now {threads} thread(s)')
        log()
        log(f'({k}/{len(args.tasks)}) {spec["name"]}: {spec["model"]} on '
            f'{data_path} [{spec["config"]}]')
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            r = T.run_task(
                task,
                data_path,
                osp.join(work_dir, task),
                cfg=cfg,
                seed=args.seed,
                runner_cls=runner_cls)
        except Exception:
            errors += 1
            traceback.print_exc()
            log(f'{task}: FAILED (traceback above)')
            rows.append(
                dict(
                    task=spec['name'],
                    metric=spec['label'],
                    value=None,
                    target=spec['target'],
                    seconds=time.perf_counter() - t0))
            results[task] = dict(error=traceback.format_exc())
            continue
        r['seconds'] = time.perf_counter() - t0
        r['cpu_seconds'] = time.process_time() - c0
        r['threads'] = threads
        r['optim_wrapper'] = cfg.optim_wrapper.get('type', 'OptimWrapper')
        results[task] = r
        target = 'no target' if spec['target'] is None else \
            f'target {spec["target"]}'
        value = '-' if r['value'] is None else f'{r["value"]:.3f}'
        log(f'{task}: {spec["label"]} = {value} ({target}); train '
            f'{r["train_s"]:.0f} s, test {r["test_s"]:.0f} s; predictions: '
            f'{r["png"]}')
        rows.append(
            dict(
                task=spec['name'],
                metric=spec['label'],
                value=r['value'],
                target=spec['target'],
                seconds=r['seconds']))
        for key, (label, scale) in spec['extra'].items():
            if key in r['metrics']:
                rows.append(
                    dict(
                        task=spec['name'],
                        metric=label,
                        value=r['metrics'][key] * scale,
                        target=None))
        if r['png']:
            pngs.append(r['png'])

    # 5. report ---------------------------------------------------------
    total = time.perf_counter() - t_start
    table = T.format_table(rows)
    task_threads = ' '.join(f'{t}={results[t].get("threads", "-")}'
                            for t in args.tasks)
    missed = sum(1 for row in rows if row['target'] is not None
                 and row['value'] is not None and row['value'] < row['target'])
    os.makedirs(work_dir, exist_ok=True)
    summary = dict(
        tasks=args.tasks,
        smoke=args.smoke,
        amp=args.amp,
        seed=args.seed,
        cpu_count=ncpu,
        load_average_end=load1(),
        data_seconds=data_s,
        total_seconds=total,
        cpu_seconds=time.process_time() - c_start,
        results=results,
        table=table)
    atomic_write(
        osp.join(work_dir, 'results.json'), json.dumps(summary, indent=2))
    atomic_write(osp.join(work_dir, 'results.md'), table + '\n')
    print(flush=True)
    print('=' * 72)
    kind = 'smoke run: 3 iterations, not meaningful' if args.smoke else \
        'synthetic validation sets'
    if args.amp:
        kind += ', mixed precision (--amp)'
    print(f'mmsoft demo results ({kind})')
    print(table)
    print(f'total {total / 60:.1f} min (data {data_s:.0f} s), torch '
          f'threads per task: {task_threads}, load average now '
          f'{load1():.1f}')
    for png in pngs:
        print(f'predictions: {png}')
    print(f'results: {osp.join(work_dir, "results.json")}')
    print('=' * 72, flush=True)
    if errors:
        return 2
    return 1 if missed and not args.smoke else 0


if __name__ == '__main__':
    sys.exit(main())
