"""The CUDA checks of a fresh clone, in one command (``make gpu-check``).

On a CUDA machine (after ``make env``) it runs, and reports on:

1. ``device tests``: pytest of the device-parametrised tests (the test
   files whose tests take the ``device`` fixture) with
   ``MMSOFT_TEST_DEVICE=cuda``;
2. ``training steps``: one fp32, one fp16-AMP and one bf16-AMP training
   step of every shipped config (``configs/*.py``; the model built from the
   config with mmengine ``Config`` + its codebase's registry, random
   weights, a tiny batch): finite loss and gradients, time;
3. ``recipe iterations``: the paper recipes of RetinaNet, Mask R-CNN,
   UperNet and the classifiers at their own batch per GPU and input size
   (fp32, the config's optimizer, random data): seconds per iteration and
   peak memory, written row by row into ``--recipe-csv`` (default
   ``<out-dir>/recipe_gpu.csv``; ``docs/en/benchmarks/recipe_gpu.csv``
   makes the model zoo's "time on 8 GPUs" and "memory per GPU" estimates,
   after ``python docs/gen_tables.py``);
4. ``NR methods``: the iterative, spectral and Lanczos paths
   (``attn_cfg.nr_method``) on the same bottleneck matrices (up to stage 3
   at 800 x 1216: 20 matrices, m = 950, d = 32): relative difference of
   A_T W and of the exact gradient against the iterations, time of the
   forward and of a training step of each;
5. ``backbones``: SOFT-Tiny/Small(-Norm) (the default dispatch, the
   iterations forced, and the no-inverse floor) vs PVTv2-b1/b2 and Swin-T
   img/s and peak memory, inference and training step, at 224 batch 64,
   512 batch 8 and 800x1216 batch 2 (``benchmark.py``);
6. ``SOFT vs softmax``: SOFT-Tiny vs the softmax attention in the same
   architecture, train / inference img/s and their ratio (the paper's
   Table 1).

Writes ``<out-dir>/gpu_check.md`` (the report) and ``gpu_check.csv`` (one
row per measurement) atomically; exits 1 if a check failed.

Without CUDA it runs a CPU subset at tiny sizes (fp32 and bf16-autocast
steps of the classification configs, the NR agreement, SOFT-Tiny vs
softmax at 64x64), prints ``CUDA part NOT run: no CUDA device`` and exits 0
when that subset passes. ``--smoke`` (the test): one config, tiny sizes,
one repeat. ``--dry-run`` rehearses the recipe iterations on the CPU
(two 64 x 64 images, one iteration; the gpu column says it was no GPU).

    make gpu-check
    python tools/analysis/gpu_check.py --out-dir work_dirs/gpu_check
    python tools/analysis/gpu_check.py --smoke
    python tools/analysis/gpu_check.py --sections recipe \\
        --recipe-csv docs/en/benchmarks/recipe_gpu.csv  # on the GPU
    python tools/analysis/gpu_check.py --dry-run --sections recipe \\
        --configs retinanet_soft_tiny_1x soft_tiny_in1k
"""
import contextlib
import glob
import math
import os
import os.path as osp
import re
import subprocess
import sys
import time
import traceback
import warnings

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis import common as analysis

# mmengine imports pkg_resources once per codebase (one warning each)
warnings.filterwarnings('ignore', message='pkg_resources is deprecated')

NOT_RUN = 'CUDA part NOT run: '
SECTIONS = ('device tests', 'training steps', 'recipe iterations',
            'NR methods', 'backbones', 'SOFT vs softmax')
#: --sections names, in SECTIONS' order
SECTION_KEYS = ('tests', 'steps', 'recipe', 'nr', 'backbones', 'softmax')
BACKBONES = [
    'soft_tiny', 'soft_tiny_norm', 'soft_small', 'soft_small_norm',
    'soft_small_norm_iterative', 'soft_small_norm_floor', 'pvtv2_b1',
    'pvtv2_b2', 'swin_t'
]
#: classification, segmentation and detection inputs (H x W x batch)
CUDA_SIZES = ['224x224x64', '512x512x8', '800x1216x2']
CPU_SIZES = ['64x64x1']
#: where the shipped configs are: a checkout's configs/ or the installed
#: mmsoft/.mim/configs
DEFAULT_SMOKE_CONFIG = 'soft_norm_tiny_in1k'


def parse_args(argv=None):
    p = analysis.make_parser(__doc__)
    p.add_argument('--out-dir', default='work_dirs/gpu_check')
    p.add_argument(
        '--configs',
        nargs='+',
        default=None,
        help='config names (stems of configs/*.py; default: all)')
    p.add_argument('--repeats', type=int, default=3)
    p.add_argument(
        '--sections',
        nargs='+',
        choices=SECTION_KEYS,
        default=None,
        help='run these sections only, in this order (default: all; the '
        'report is rewritten after each one, so a run cut short keeps '
        'what it measured)')
    p.add_argument(
        '--cpu',
        action='store_true',
        help='run the CPU subset even where CUDA is available')
    p.add_argument(
        '--smoke',
        action='store_true',
        help=f'CPU subset, {DEFAULT_SMOKE_CONFIG} only, one repeat')
    p.add_argument(
        '--recipe-csv',
        default=None,
        help='where the recipe iterations go (default: '
        '<out-dir>/recipe_gpu.csv); docs/en/benchmarks/recipe_gpu.csv '
        'fills the model zoo (then python docs/gen_tables.py); rows of '
        'other configs or GPUs are kept')
    p.add_argument(
        '--recipe-iters',
        type=int,
        default=5,
        help='timed iterations of each recipe, after one warm-up')
    p.add_argument(
        '--dry-run',
        action='store_true',
        help='rehearse the recipe iterations on the CPU (any machine): '
        f'two 64 x 64 images, one iteration, the GPU named '
        f'"{DRY_RUN_GPU}"; into <out-dir>/recipe_gpu.csv only')
    args = p.parse_args(argv)
    if args.repeats < 1 or args.recipe_iters < 1:
        p.error('--repeats and --recipe-iters must be >= 1')
    if args.dry_run and args.recipe_csv:
        p.error('--dry-run writes <out-dir>/recipe_gpu.csv only: its CPU '
                'rows are no GPU\'s estimates; leave --recipe-csv out')
    if args.recipe_csv is None:
        args.recipe_csv = osp.join(args.out_dir, 'recipe_gpu.csv')
    return args


def configs_dir():
    from mmsoft_tools import import_root
    root = import_root()
    for d in (osp.join(root,
                       'configs'), osp.join(root, 'mmsoft', '.mim',
                                            'configs')):
        if osp.isdir(d):
            return d
    raise SystemExit('gpu_check: no configs/ folder found; run it from a '
                     'checkout (or an install with mmsoft/.mim)')


def shipped_configs(names=None):
    folder = configs_dir()
    found = {
        osp.splitext(osp.basename(p))[0]: p
        for p in sorted(glob.glob(osp.join(folder, '*.py')))
    }
    if names is None:
        return found
    missing = [n for n in names if n not in found]
    if missing:
        raise SystemExit(f'--configs: unknown {missing}; choose from '
                         f'{sorted(found)}')
    return {n: found[n] for n in names}


# ----------------------------------------------------- 1. device tests
def device_test_files(root):
    pat = re.compile(r'def test_\w+\([^)]*\bdevice\b')
    files = []
    for path in sorted(
            glob.glob(
                osp.join(root, 'tests', '**', 'test_*.py'), recursive=True)):
        with open(path) as f:
            if pat.search(f.read()):
                files.append(path)
    return files


def run_device_tests(report):
    from mmsoft_tools import import_root
    root = import_root()
    files = device_test_files(root)
    if not files:
        report.add(
            'device tests',
            'pytest',
            'files',
            0,
            ok=False,
            note='no test takes the device fixture')
        return
    env = dict(os.environ, MMSOFT_TEST_DEVICE='cuda')
    env['PYTHONPATH'] = os.pathsep.join(
        p for p in (root, env.get('PYTHONPATH')) if p)
    t0 = time.time()
    proc = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider'] +
        files,
        cwd=root,
        env=env,
        capture_output=True,
        text=True)
    tail = (proc.stdout.strip().splitlines() or [''])[-1]
    report.add(
        'device tests',
        'pytest',
        'summary',
        tail,
        ok=proc.returncode == 0,
        note=f'{len(files)} files, {time.time() - t0:.0f} s')


# --------------------------------------------------- 2. training steps
def drop_pretrained(node):
    """Remove every ``init_cfg`` of type Pretrained under ``node`` (the
    paper configs' backbones start from the authors' ImageNet file)."""
    if isinstance(node, dict):
        init = node.get('init_cfg')
        if isinstance(init, dict) and init.get('type') == 'Pretrained':
            node['init_cfg'] = None
        for value in node.values():
            drop_pretrained(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            drop_pretrained(value)


def build_model(path, device, edit=None):
    """(cfg, scope, model): the config's model with random weights (no
    ImageNet file needed), SyncBN reverted, on ``device`` in train mode;
    ``edit(cfg)`` first, if given."""
    import importlib

    import torch
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import DefaultScope

    from mmsoft_tools import launch
    cfg = Config.fromfile(path)
    drop_pretrained(cfg.model)
    if edit is not None:
        edit(cfg)
    scope = launch.import_codebase(cfg)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    # as the Runner does: the top-level data_preprocessor of the config
    cfg.model.setdefault('data_preprocessor', cfg.get('data_preprocessor'))
    pre = cfg.model.data_preprocessor
    if scope == 'mmpretrain' and pre is not None and \
            'num_classes' not in pre:  # the mixup/cutmix one-hot labels
        pre.num_classes = cfg.model.head.num_classes
    torch.manual_seed(0)
    with DefaultScope.overwrite_default_scope(scope):
        model = revert_sync_batchnorm(registry.build(cfg.model))
        analysis.quiet_init_weights(model)  # no per-parameter INFO log
    return cfg, scope, model.to(device).train()


def train_step(path, name, precision, device, size):
    """One training step of the config's model; returns (loss, ms)."""
    import torch
    from mmengine.registry import DefaultScope

    from analysis.common import grad_scaler
    _, scope, model = build_model(path, device)
    with DefaultScope.overwrite_default_scope(scope):
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9)
        dtype = dict(fp16=torch.float16, bf16=torch.bfloat16).get(precision)
        # one step: no chance to back off from an overflowing default
        # scale (2^16 would make the first fp16 step non-finite)
        scaler = grad_scaler(
            device,
            init_scale=2.**10,
            enabled=precision == 'fp16' and device == 'cuda')
        data = model.data_preprocessor(
            analysis.random_batch(scope, name, size), True)
        analysis.sync_device(device)
        t0 = time.perf_counter()
        # fp32: no autocast context (torch 2.1's CPU autocast refuses a
        # float32 dtype even with enabled=False)
        with (contextlib.nullcontext() if dtype is None else torch.autocast(
                device_type=device, dtype=dtype)):
            losses = model(**data, mode='loss')
        loss, _ = model.parse_losses(losses)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        grads = [p.grad for p in params if p.grad is not None]
        finite = bool(torch.isfinite(loss)) and all(
            bool(torch.isfinite(g).all()) for g in grads)
        scaler.step(opt)
        scaler.update()
        analysis.sync_device(device)
        ms = (time.perf_counter() - t0) * 1e3
    if not finite:
        raise RuntimeError(f'non-finite loss or gradients (loss {loss:.4g})')
    if not grads:
        raise RuntimeError('no gradients')
    return float(loss.detach()), ms


def run_training_steps(report, configs, precisions, device, size):
    for name, path in configs.items():
        for precision in precisions:
            try:
                loss, ms = train_step(path, name, precision, device, size)
            except Exception as e:  # noqa: the report says what failed
                report.add(
                    'training steps',
                    f'{name} {precision}',
                    'loss',
                    'error',
                    ok=False,
                    note=f'{type(e).__name__}: {e}'.splitlines()[0][:200])
                continue
            report.add(
                'training steps',
                f'{name} {precision}',
                'loss',
                f'{loss:.4f}',
                note=f'{ms:.0f} ms')


# ----------------------------------------------- 3. recipe iterations
#: the task families whose paper recipes are timed (config name prefix or
#: suffix): RetinaNet, Mask R-CNN, UperNet, the classifiers
RECIPE_FAMILIES = (('retinanet_', ''), ('mask_rcnn_', ''), ('upernet_', ''),
                   ('', '_in1k'))
#: the detectors' training input: COCO images resized to at most 1333 x
#: 800 (the 3x recipes: the largest of their scales), as benchmark.py's
#: detection resolution
DET_INPUT = (800, 1216)
CLS_INPUT = (224, 224)  # RandomResizedCrop 224 (configs/_base_/soft_in1k.py)
#: the columns of docs/en/benchmarks/recipe_gpu.csv (docs/gen_tables.py)
RECIPE_FIELDS = ['config', 'gpu', 's_per_iter', 'peak_mib', 'date', 'note']
#: what --dry-run writes in the gpu column: never a GPU's name
DRY_RUN_GPU = 'dry run on the CPU (not a GPU)'


def recipe_configs(configs):
    """The configs of :data:`RECIPE_FAMILIES` among ``configs`` (what the
    section times unless ``--configs`` names others)."""
    return {
        n: p
        for n, p in configs.items() if any(
            n.startswith(pre) and n.endswith(suf)
            for pre, suf in RECIPE_FAMILIES)
    }


def recipe_input(cfg, scope):
    """(H, W, images per GPU) of a recipe's training iteration: its
    ``train_dataloader.batch_size`` at its training input size."""
    batch = cfg.train_dataloader.batch_size
    if scope == 'mmseg':
        return (*cfg.crop_size, batch)
    return (*(CLS_INPUT if scope == 'mmpretrain' else DET_INPUT), batch)


def recipe_batch(scope, name, hw, batch):
    """Random data samples of ``batch`` images of ``hw`` (H, W)."""
    if scope == 'mmdet':  # random_batch's images are square
        from mmdet.testing import demo_mm_inputs
        return demo_mm_inputs(
            batch_size=batch,
            image_shapes=[(3, *hw)] * batch,
            num_items=[7] * batch,  # about COCO's mean boxes per image
            num_classes=80,
            with_mask='mask' in name)
    return analysis.random_batch(scope, name, hw[0], batch_size=batch)


def recipe_iteration(path, name, device, iters, override=None):
    """Seconds per training iteration of a config's recipe (the model's
    forward, backward and the config's optimizer step on one GPU's batch,
    random data, no data loading: the median of ``iters`` iterations after
    one warm-up; 0: the one iteration, the dry run's) and its peak memory
    in MiB (CUDA: max allocated; the CPU: the process's peak RSS).
    ``override``: (H, W, batch) instead of the recipe's (the dry run; a
    segmentor's padding to its crop follows). Returns (s_per_iter,
    peak_mib, (H, W, B))."""
    import resource

    import torch
    from mmengine.logging import MMLogger
    from mmengine.optim import build_optim_wrapper
    from mmengine.registry import DefaultScope

    def pad_to_override(cfg):  # a segmentor pads its batch to the crop
        for pre in (cfg.get('data_preprocessor'),
                    cfg.model.get('data_preprocessor')):
            if pre is not None and pre.get('size') is not None:
                pre.size = tuple(override[:2])

    cfg, scope, model = build_model(path, device,
                                    pad_to_override if override else None)
    h, w, batch = override or recipe_input(cfg, scope)
    with DefaultScope.overwrite_default_scope(scope):
        logger = MMLogger.get_current_instance()
        level = logger.level
        logger.setLevel('WARNING')  # not a line per parameter group
        try:
            optim = build_optim_wrapper(model, cfg.optim_wrapper)
        finally:
            logger.setLevel(level)
        raw = recipe_batch(scope, name, (h, w), batch)
        if device.startswith('cuda'):
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(1 + iters):
            analysis.sync_device(device)
            t0 = time.perf_counter()
            data = model.data_preprocessor(raw, True)
            loss, _ = model.parse_losses(model(**data, mode='loss'))
            optim.update_params(loss)
            analysis.sync_device(device)
            times.append(time.perf_counter() - t0)
            if not torch.isfinite(loss):
                raise RuntimeError(f'non-finite loss {float(loss):.4g}')
    if device.startswith('cuda'):
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    timed = sorted(times[1:] or times)  # iters=0: the one iteration
    return timed[len(timed) // 2], peak, (h, w, batch)


def merge_recipe_rows(path, rows):
    """Write ``rows`` into the recipe CSV ``path`` (atomically): a row of
    the same config and GPU is replaced, the others are kept."""
    import csv
    old = []
    if osp.exists(path):
        with open(path, newline='') as f:
            reader = csv.DictReader(f)
            if reader.fieldnames != RECIPE_FIELDS:
                raise SystemExit(
                    f'gpu_check: {path} has the columns '
                    f'{reader.fieldnames}, not {RECIPE_FIELDS}: name '
                    f'another --recipe-csv')
            old = list(reader)
    new = {(r['config'], r['gpu']) for r in rows}
    kept = [r for r in old if (r['config'], r['gpu']) not in new]
    analysis.write_csv(path, kept + rows, RECIPE_FIELDS)


def run_recipes(report, configs, device, gpu, iters, csv_path, override=None):
    """Time each recipe's iteration; each row goes into ``csv_path`` as
    soon as it is measured (a run cut short keeps it)."""
    import datetime

    import torch
    if not configs:
        report.add(
            'recipe iterations',
            'configs',
            'count',
            0,
            ok=False,
            note='no config to time')
        return
    for name, path in configs.items():
        try:
            s, peak, (h, w, b) = recipe_iteration(path, name, device, iters,
                                                  override)
        except torch.cuda.OutOfMemoryError:
            # a fact about the recipe on this GPU, not a failed check
            total = torch.cuda.get_device_properties(0).total_memory
            report.add(
                'recipe iterations',
                name,
                's/iter',
                'out of memory',
                note=f'one GPU\'s batch does not fit {gpu} '
                f'({total / 2**30:.0f} GiB) in fp32; no row written')
            continue
        except Exception as e:  # noqa: the report says what failed
            report.add(
                'recipe iterations',
                name,
                's/iter',
                'error',
                ok=False,
                note=f'{type(e).__name__}: {e}'.splitlines()[0][:200])
            continue
        finally:
            if device.startswith('cuda'):
                torch.cuda.empty_cache()
        timed = (f'median of {iters} iterations after 1 warm-up'
                 if iters else 'one iteration, no warm-up')
        note = (f'fp32, {b} x {h}x{w} per GPU, {timed}; model, loss, '
                f'backward and optimizer step on random data (no data '
                f'loading); torch {torch.__version__}')
        report.add(
            'recipe iterations',
            name,
            's/iter',
            f'{s:.3f}',
            note=f'{b} x {h}x{w}')
        report.add('recipe iterations', name, 'peak MiB', f'{peak:.0f}')
        merge_recipe_rows(csv_path, [
            dict(
                config=name,
                gpu=gpu,
                s_per_iter=f'{s:.4f}',
                peak_mib=f'{peak:.0f}',
                date=datetime.date.today().isoformat(),
                note=note)
        ])


# ------------------------------------------------------- 4. NR methods
NR_METHODS = ('iterative', 'spectral', 'lanczos')


def run_nr_methods(report, device, shapes, repeats):
    """Each method's A_T W (forward, and forward + backward with the Norm
    default, the exact gradient) against the iterative one, per shape
    (batch x heads, m, d); m = 950, d = 32: stage 3 at 800 x 1216."""
    import torch

    from mmsoft.models.layers import gaussian_kernel
    from mmsoft.models.layers.nr import NRConfig

    def timed(fn):
        fn()  # warm-up
        ts = []
        for _ in range(repeats):
            analysis.sync_device(device)
            t0 = time.perf_counter()
            out = fn()
            analysis.sync_device(device)
            ts.append((time.perf_counter() - t0) * 1e3)
        return out, sorted(ts)[len(ts) // 2]

    for batch, m, d in shapes:
        g = torch.Generator().manual_seed(0)
        landmarks = torch.randn(batch, m, d, generator=g).to(device)
        landmarks = landmarks * d**-0.25
        A = gaussian_kernel(landmarks, landmarks)
        W = torch.randn(batch, m, d, generator=g).to(device)
        out, times, grads = {}, {}, {}
        for method in NR_METHODS:
            nr = NRConfig(method=method)

            def train(nr=nr):
                a = A.clone().requires_grad_()
                w = W.clone().requires_grad_()
                nr.apply(a, w).square().sum().backward()
                return a.grad

            with torch.no_grad():
                out[method], times[method] = timed(lambda: nr.apply(A, W))
            grads[method], times[method + ' train'] = timed(train)
        item = f'B={batch} m={m} d={d}'
        ref, gref = out['iterative'], grads['iterative']
        for method in NR_METHODS[1:]:
            rel = float((out[method] - ref).abs().max() / ref.abs().max())
            grel = float((grads[method] - gref).abs().max() / gref.abs().max())
            report.add(
                'NR methods',
                item,
                f'{method} vs iterative: max rel diff (out / grad)',
                f'{rel:.2e} / {grel:.2e}',
                ok=math.isfinite(rel) and rel < 1e-4 and grel < 1e-3)
        for method in NR_METHODS:
            report.add(
                'NR methods', item, f'{method} ms (fwd / train)',
                f'{times[method]:.3f} / '
                f'{times[method + " train"]:.3f}')


# ------------------------------------------- 5./6. backbones, softmax
def run_benchmark(models, sizes, repeats, device, out, modes=None):
    """benchmark.py's rows for ``models`` x ``sizes`` x modes."""
    import csv

    import benchmark
    argv = ['--models'] + models + ['--sizes'] + sizes + [
        '--repeats',
        str(repeats), '--device', device, '--out', out
    ]
    if modes:
        argv += ['--modes'] + modes
    benchmark.main(argv)
    with open(osp.join(out, 'results.csv')) as f:
        return list(csv.DictReader(f))


MODE_NAMES = dict(forward='inference', forward_backward='train')


def run_backbones(report, models, sizes, repeats, device, out, modes=None):
    rows = run_benchmark(models, sizes, repeats, device, out, modes)
    got = {(r['model'], r['size'], r['mode']) for r in rows}
    for r in rows:
        item = f'{r["model"]} {r["size"]} {MODE_NAMES[r["mode"]]}'
        report.add('backbones', item, 'img/s', f'{float(r["img_per_s"]):.2f}')
        report.add('backbones', item, 'peak MiB', f'{float(r["peak_mb"]):.0f}')
    for m in models:
        for s in sizes:
            for mode in modes or MODE_NAMES:
                if (m, s, mode) not in got:
                    report.add(
                        'backbones',
                        f'{m} {s} {MODE_NAMES[mode]}',
                        'img/s',
                        'failed',
                        ok=False)


def run_softmax(report, sizes, repeats, device, out, modes=None):
    rows = run_benchmark(['soft_tiny', 'softmax_tiny'], sizes, repeats, device,
                         out, modes)
    ips = {
        (r['model'], r['size'], r['mode']): float(r['img_per_s'])
        for r in rows
    }
    for s in sizes:
        for mode in modes or MODE_NAMES:
            soft = ips.get(('soft_tiny', s, mode))
            softmax = ips.get(('softmax_tiny', s, mode))
            item = f'{s} {MODE_NAMES[mode]}'
            if soft is None or softmax is None:
                report.add(
                    'SOFT vs softmax', item, 'ratio', 'failed', ok=False)
                continue
            report.add('SOFT vs softmax', item, 'SOFT img/s', f'{soft:.2f}')
            report.add('SOFT vs softmax', item, 'softmax img/s',
                       f'{softmax:.2f}')
            report.add('SOFT vs softmax', item, 'SOFT / softmax',
                       f'{soft / softmax:.2f}')


# ------------------------------------------------------------ report
class Report:
    """Rows (section, item, metric, value, ok, note) and their markdown."""

    def __init__(self):
        self.rows = []
        self.skipped = {}

    def add(self, section, item, metric, value, ok=True, note=''):
        self.rows.append(
            dict(
                section=section,
                item=item,
                metric=metric,
                value=value,
                ok=ok,
                note=note))

    def skip(self, section, why):
        self.skipped[section] = why

    @property
    def failed(self):
        return [r for r in self.rows if not r['ok']]

    def markdown(self, title):
        lines = [f'# {title}', '']
        for section in SECTIONS:
            lines += [f'## {section}', '']
            rows = [r for r in self.rows if r['section'] == section]
            if section in self.skipped:
                lines += [f'not run: {self.skipped[section]}', '']
            if not rows:
                continue
            lines += [
                '| item | metric | value | ok | note |', '|---|---|---|'
                '---|---|'
            ]
            for r in rows:
                ok = 'yes' if r['ok'] else 'FAIL'
                lines.append(f'| {r["item"]} | {r["metric"]} | {r["value"]} '
                             f'| {ok} | {r["note"]} |')
            lines.append('')
        status = ('all checks passed' if not self.failed else
                  f'{len(self.failed)} check(s) FAILED')
        lines.append(f'**{status}**')
        return '\n'.join(lines) + '\n'


def guarded(report, section, fn, *args, **kwargs):
    """Run one section; an exception becomes a failed row."""
    try:
        fn(report, *args, **kwargs)
    except Exception as e:  # noqa: the report says what failed
        traceback.print_exc()
        report.add(
            section,
            'section',
            'error',
            'error',
            ok=False,
            note=f'{type(e).__name__}: {e}'.splitlines()[0][:200])


def environment(torch, cuda):
    """One line: torch / CUDA / device / whether mmcv's ops have CUDA."""
    parts = [f'torch {torch.__version__}']
    if cuda:
        parts += [
            f'CUDA {torch.version.cuda}',
            torch.cuda.get_device_name(), f'{torch.cuda.device_count()} GPU'
        ]
    try:
        from mmcv.ops import get_compiling_cuda_version
        ops = get_compiling_cuda_version()
        parts.append('mmcv ops: CPU only' if ops ==
                     'not available' else f'mmcv ops: CUDA {ops}')
    except Exception as e:  # noqa: reported, not fatal
        parts.append(f'mmcv ops: not importable ({type(e).__name__})')
    return ', '.join(parts)


def main(argv=None):
    args = parse_args(argv)
    import torch
    cuda = torch.cuda.is_available() and not (args.cpu or args.smoke
                                              or args.dry_run)
    repeats = 1 if args.smoke else args.repeats
    names = args.configs
    if names is None and args.smoke:
        names = [DEFAULT_SMOKE_CONFIG]
    configs = shipped_configs(names)
    # the recipe section: the configs named, else the four task families
    recipes = configs if names else recipe_configs(configs)
    if not cuda and names is None:
        configs = {n: p for n, p in configs.items() if n.endswith('_in1k')}
    bench_dir = osp.join(args.out_dir, 'benchmark')
    report = Report()
    t0 = time.time()
    if cuda:
        device = 'cuda'
        title = f'mmsoft GPU check: {torch.cuda.get_device_name()}'
        plan = dict(
            tests=(run_device_tests, ),
            steps=(run_training_steps, configs, ('fp32', 'fp16', 'bf16'),
                   device, 128),
            recipe=(run_recipes, recipes, device, torch.cuda.get_device_name(),
                    args.recipe_iters, args.recipe_csv),
            nr=(run_nr_methods, device, [(64 * 2, 49, 64), (2, 196, 64),
                                         (2 * 10, 950, 32)], repeats),
            backbones=(run_backbones, BACKBONES, CUDA_SIZES, repeats, device,
                       osp.join(bench_dir, 'backbones')),
            softmax=(run_softmax, CUDA_SIZES[:1], repeats, device,
                     osp.join(bench_dir, 'softmax')))
    else:
        device = 'cpu'
        title = ('mmsoft GPU check: dry run on the CPU' if args.dry_run else
                 'mmsoft GPU check: CPU subset (no CUDA device)')
        report.skip('device tests', 'no CUDA device (the CPU suite runs '
                    'them on the CPU)')
        plan = dict(
            steps=(run_training_steps, configs, ('fp32', 'bf16'), device, 64),
            recipe=(run_recipes, recipes, device, DRY_RUN_GPU, 0,
                    args.recipe_csv, (64, 64, 2)),
            nr=(run_nr_methods, device, [(2, 49, 32), (2, 256, 32)], repeats),
            softmax=(run_softmax, CPU_SIZES, repeats, device,
                     osp.join(bench_dir,
                              'softmax'), ['forward'] if args.smoke else None))
        if not args.dry_run:
            del plan['recipe']
            report.skip(
                'recipe iterations', 'no CUDA device (a recipe\'s '
                'iteration needs a GPU; --dry-run rehearses it on the CPU)')
        if args.smoke:
            report.skip('backbones', 'skipped by --smoke')
        else:
            plan['backbones'] = (run_backbones, ['soft_tiny', 'pvtv2_b1'],
                                 CPU_SIZES, repeats, device,
                                 osp.join(bench_dir, 'backbones'))
    env = environment(torch, cuda)
    print(env, flush=True)
    not_run = ''
    if not cuda:
        not_run = NOT_RUN + ('no CUDA device' if not torch.cuda.is_available()
                             else '--cpu, --smoke or --dry-run given')
    keys = [k for k in (args.sections or SECTION_KEYS) if k in plan]
    if args.sections:
        for k in SECTION_KEYS:
            if k not in args.sections and k in plan:
                report.skip(SECTIONS[SECTION_KEYS.index(k)],
                            'not selected (--sections)')

    def write(pending):
        md = report.markdown(title)
        md += f'\n{env}; {time.time() - t0:.0f} s\n'
        if pending:
            md += (f'\nPARTIAL: still to run when this was written: '
                   f'{", ".join(pending)}\n')
        if not_run:
            md += f'\n{not_run}\n'
        analysis.write_text(osp.join(args.out_dir, 'gpu_check.md'), md)
        analysis.write_csv(
            osp.join(args.out_dir, 'gpu_check.csv'), report.rows,
            ['section', 'item', 'metric', 'value', 'ok', 'note'])
        return md

    for i, k in enumerate(keys):
        section = SECTIONS[SECTION_KEYS.index(k)]
        fn, *fn_args = plan[k]
        t1 = time.time()
        print(f'gpu_check: {section} ...', flush=True)
        guarded(report, section, fn, *fn_args)
        print(
            f'gpu_check: {section} done in {time.time() - t1:.0f} s',
            flush=True)
        write(keys[i + 1:])
    md = write([])
    print(md)
    print(f'wrote {args.out_dir}/gpu_check.{{md,csv}}')
    if 'recipe' in keys and osp.exists(args.recipe_csv):
        print(f'wrote {args.recipe_csv}')
    if not_run:
        print(not_run)
    return 1 if report.failed else 0


if __name__ == '__main__':
    sys.exit(main())
