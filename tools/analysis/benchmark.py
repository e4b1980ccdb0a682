"""Backbone speed and memory: SOFT vs PVTv2 vs Swin, classification and
detection resolutions (the Table 1 columns; issue "fast at detection").

For every model x input size x mode (``forward`` in eval mode without
autograd, ``forward_backward``: a training step's forward + backward of the
sum of all outputs; SOFT with its detection recipe's backbone settings,
``configs/_base_/soft_dense.py``: BatchNorms in eval mode, its drop path),
in a fresh subprocess each, it prints and records the
median / min time over ``--repeats`` runs, images per second and the peak
memory of the step. Then it prints each model's time relative to a baseline
(``--baseline``, default ``pvtv2_b1`` for tiny models and ``pvtv2_b2`` for
small ones, as they have the same parameter counts).

    python tools/analysis/benchmark.py
    python tools/analysis/benchmark.py --models soft_tiny_norm pvtv2_b1 \
        --sizes 224x224x8 --modes forward
    python tools/analysis/benchmark.py --config configs/soft_tiny_in1k.py

``--alternate`` builds all models in one process and times them in turn,
round after round (the ratios of the docs; no memory figures).

Models: soft_{tiny,small,...}[_norm][_iterative|_spectral|_lanczos][_ml<N>]
[_floor] (SOFT backbone, all four outputs; ``_iterative`` / ``_spectral`` /
``_lanczos`` force the pseudo-inverse method, ``_ml<N>`` sets
``max_landmarks=N``, ``_floor`` replaces A_T W by W: the network without
its pseudo-inverse; see
:func:`analysis.common.parse_model_name`),
{softmax,linformer,performer,nystromformer,sima}_<arch> (the attention zoo in
the SOFT architecture, Table 1), pvtv2_b0..b2 (mmdet
PyramidVisionTransformerV2), swin_t (mmdet SwinTransformer), or ``--config``
files (their ``model.backbone``).
Sizes: ``HxWxB``. Writes results.csv / results.md / benchmark.png.
``--plot CSV`` only redraws the figure from such a CSV (the docs' figure,
in seconds)::

    python tools/analysis/benchmark.py \
        --plot docs/en/benchmarks/benchmark_backbones.csv
"""
import argparse
import os
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (add_timing_arguments, make_parser, measure_step,
                             print_result, pyplot, run_isolated,
                             soft_model_kwargs, write_results)

DEFAULT_MODELS = [
    'soft_tiny', 'soft_tiny_norm', 'soft_small', 'soft_small_norm', 'pvtv2_b1',
    'pvtv2_b2', 'swin_t'
]
DEFAULT_SIZES = ['224x224x8', '800x1216x1']
MODES = ('forward', 'forward_backward')
PVT = {
    'pvtv2_b0': (32, [2, 2, 2, 2]),
    'pvtv2_b1': (64, [2, 2, 2, 2]),
    'pvtv2_b2': (64, [3, 4, 6, 3])
}

#: what a training step takes from the detection recipe's backbone
RECIPE_KEYS = ('norm_eval', 'drop_path_rate', 'residual_drop')


def recipe_settings() -> dict:
    """The SOFT detection / segmentation configs' :data:`RECIPE_KEYS`
    (``configs/_base_/soft_dense.py``): a training step with BatchNorms in
    train mode (batch statistics of one image) is not the recipe's, and
    its features need 1.5-2x the Krylov dimensions."""
    from mmengine.config import Config

    from mmsoft.configs import configs_root
    cfg = Config.fromfile(osp.join(configs_root(), '_base_', 'soft_dense.py'))
    return {k: cfg.soft_backbone[k] for k in RECIPE_KEYS}


def build_backbone(name: str, train: bool = False):
    """A backbone module from a model name or a config path (``train``: a
    SOFT model name with :func:`recipe_settings`)."""
    if name.endswith('.py'):
        from mmengine.config import Config
        from mmengine.registry import DefaultScope, init_default_scope
        cfg = Config.fromfile(name)
        scope = cfg.get('default_scope', 'mmdet')
        init_default_scope(scope)
        import importlib
        reg = importlib.import_module(f'{scope}.registry').MODELS
        import mmsoft  # noqa: F401
        with DefaultScope.overwrite_default_scope(scope):
            return reg.build(cfg.model.backbone)
    if name in PVT:
        from mmdet.models.backbones import PyramidVisionTransformerV2
        dims, layers = PVT[name]
        return PyramidVisionTransformerV2(embed_dims=dims, num_layers=layers)
    if name == 'swin_t':
        from mmdet.models.backbones import SwinTransformer
        return SwinTransformer(
            embed_dims=96,
            depths=[2, 2, 6, 2],
            num_heads=[3, 6, 12, 24],
            window_size=7)
    floor = name.endswith('_floor')
    try:
        kwargs = soft_model_kwargs(name[:-len('_floor')] if floor else name)
    except ValueError as e:
        raise ValueError(f'{e}; or one of {", ".join(PVT)}, swin_t or a '
                         'config path') from None
    from mmsoft.models.backbones import SOFT
    model = SOFT(**kwargs, **(recipe_settings() if train else {}))
    return without_inverse(model) if floor else model


def without_inverse(model):
    """``model`` with every SOFT attention's A_T W replaced by W: the
    network without the pseudo-inverse (``<name>_floor``, the cost it can
    not go below)."""
    import dataclasses

    from mmsoft.models.layers import NRConfig, SOFTAttention

    class NoInverse(NRConfig):

        def apply(self, A, W):
            return W.to(A.dtype)

    for mod in model.modules():
        if isinstance(mod, SOFTAttention):
            mod._nr = NoInverse(**dataclasses.asdict(mod.nr))
    return model


def make_input(kind, B, H, W, device):
    """(B, 3, H, W): a natural-looking image (the SOFT inverse's cost
    depends on the data: block Lanczos stops when converged) or noise."""
    import torch
    if kind == 'noise':
        return torch.randn(B, 3, H, W, device=device)
    from analysis.common import image_sets, load_rgb, to_tensor
    x = to_tensor(load_rgb(image_sets([], 1)[0][1][0]), (H, W))
    return x[None].expand(B, -1, -1, -1).contiguous().to(device)


def alternate(models, size, mode, repeats, device, threads, kind='natural'):
    """{model: [ms of each round]}: all models built in this process and
    timed in turn, round after round (a load change hits all alike)."""
    import statistics

    import torch
    if threads:
        torch.set_num_threads(threads)
    H, W, B = (int(v) for v in size.split('x'))
    steps = {}
    for name in models:
        torch.manual_seed(0)
        model = build_backbone(name, mode != 'forward').to(device)
        model.train(mode != 'forward')
        x = make_input(kind, B, H, W, device)

        def step(model=model, x=x):
            if mode == 'forward':
                with torch.no_grad():
                    model(x)
            else:
                sum(o.float().sum() for o in model(x)).backward()
                model.zero_grad(set_to_none=True)

        step()  # warm-up
        steps[name] = step
    times = {name: [] for name in models}
    for r in range(repeats):
        for name, step in steps.items():
            if device != 'cpu':
                torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            if device != 'cpu':
                torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t) * 1e3)
        print(
            f'  round {r + 1}/{repeats}: ' +
            ', '.join(f'{n} {times[n][-1]:.0f}' for n in models),
            flush=True)
    return {n: statistics.median(t) for n, t in times.items()}, times


def child(args):
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_backbone(args.model, args.mode != 'forward').to(args.device)
    H, W, B = (int(v) for v in args.size.split('x'))
    x = make_input(args.input, B, H, W, args.device)
    if args.mode == 'forward':
        model.eval()

        def step():
            with torch.no_grad():
                model(x)
    else:
        model.train()

        def step():
            outs = model(x)
            sum(o.float().sum() for o in outs).backward()
            model.zero_grad(set_to_none=True)

    def warmup():
        with torch.no_grad():
            model.eval()
            model(torch.randn(1, 3, 64, 64, device=args.device))
            model.train(args.mode != 'forward')

    res = measure_step(step, args.device, args.repeats, warmup)
    res['img_per_s'] = B * 1e3 / res['time_ms']
    res['params_m'] = sum(p.numel() for p in model.parameters()) / 1e6
    print_result(res)


def baseline_for(model, names, explicit):
    if explicit:
        return explicit
    if 'tiny' in model and 'pvtv2_b1' in names:
        return 'pvtv2_b1'
    if 'small' in model and 'pvtv2_b2' in names:
        return 'pvtv2_b2'
    return None


def cpu_name():
    """The CPU's model name (``/proc/cpuinfo``; else what ``platform``
    knows)."""
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('model name'):
                    return line.split(':', 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine() or 'unknown CPU'


def device_label(device, threads=None):
    """What a row was measured on (the CSV's ``device`` column, the
    figure's panel titles): the CUDA device's name, or
    ``'CPU: <model>, N threads'`` (``threads``: the children's intra-op
    threads, default torch's), with ``', memory reused'`` under
    ``--reuse-memory`` on the CPU."""
    import torch
    if device.startswith('cuda'):
        return torch.cuda.get_device_name(torch.device(device))
    n = threads or torch.get_num_threads()
    reused = ', memory reused' if memory_reused() else ''
    return f'CPU: {cpu_name()}, {n} thread{"s" if n != 1 else ""}{reused}'


def panel_device(rows, size):
    """The device(s) of ``size``'s rows, for its panel's title."""
    names = list(
        dict.fromkeys(
            r.get('device') or '' for r in rows if r['size'] == size))
    if not any(names):
        return 'a device the CSV does not name'
    return ' / '.join(n or 'a device the CSV does not name' for n in names)


def plot(rows, sizes):
    """Time per step of each model, one panel per input size (stacked),
    horizontal bars with the model names at 10 pt: legible at the docs'
    page width (8 in wide); each panel's title names the device its rows
    were measured on (their ``device`` column)."""
    import numpy as np
    n_models = max(
        len({r['model']
             for r in rows if r['size'] == size}) for size in sizes)
    fig, axes = pyplot().subplots(
        len(sizes),
        1,
        figsize=(8, (0.27 * n_models * len(MODES) + 1.2) * len(sizes)),
        squeeze=False)
    for ax, size in zip(axes[:, 0], sizes):
        models = [
            r['model'] for r in rows
            if r['size'] == size and r['mode'] == MODES[0]
        ]
        ys = np.arange(len(models))
        for k, mode in enumerate(MODES):
            vals = {
                r['model']: r['time_ms']
                for r in rows if r['size'] == size and r['mode'] == mode
            }
            bars = ax.barh(
                ys + (k - 0.5) * 0.4, [vals.get(m, 0) for m in models],
                0.4,
                label=mode.replace('_', ' + '))
            ax.bar_label(bars, fmt='%.0f', padding=2, fontsize=9)
        ax.set_yticks(ys, models, fontsize=10)
        ax.invert_yaxis()  # the first model on top
        ax.set_xlabel('ms per step (shorter is faster)', fontsize=10)
        ax.set_title(
            f'input {size} (H x W x batch) on {panel_device(rows, size)}',
            fontsize=11)
        ax.tick_params(axis='x', labelsize=9.5)
        ax.margins(x=0.12)
        ax.grid(axis='x', alpha=.3)
        ax.legend(fontsize=9.5, loc='upper right')
    return fig


def read_rows(path):
    """The rows of a CSV this tool wrote (``--plot``), times as floats."""
    import csv
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        r['time_ms'] = float(r['time_ms'])
    return rows


#: glibc malloc settings that keep freed memory for reuse (no mmap per
#: large tensor, no trimming): what a caching allocator gives a GPU run
REUSE_MEMORY = {
    'MALLOC_MMAP_THRESHOLD_': str(2**32),
    'MALLOC_TRIM_THRESHOLD_': str(2**36),
    'MALLOC_TOP_PAD_': str(2**30)
}


def memory_reused() -> bool:
    """Whether this process runs with :data:`REUSE_MEMORY`."""
    return all(os.environ.get(k) == v for k, v in REUSE_MEMORY.items())


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument('--models', nargs='+', default=None)
    p.add_argument(
        '--config',
        nargs='+',
        default=[],
        help='config files whose model.backbone to benchmark')
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES)
    p.add_argument('--modes', nargs='+', default=list(MODES), choices=MODES)
    add_timing_arguments(p, repeats=3)
    p.add_argument('--baseline', default=None)
    p.add_argument('--out', default='work_dirs/benchmark')
    p.add_argument(
        '--alternate',
        action='store_true',
        help='time the models in turn in this process, round after round '
        '(ratios robust to the load); writes alternate.csv / .md, no '
        'memory')
    p.add_argument(
        '--input',
        default='natural',
        choices=['natural', 'noise'],
        help='a natural-looking image (default) or Gaussian noise: the '
        'cost of SOFT\'s block Lanczos depends on the data (noise needs '
        'larger Krylov spaces)')
    p.add_argument(
        '--reuse-memory',
        action='store_true',
        help='run with glibc malloc keeping freed memory for reuse '
        '(%s): without it every large tensor is a fresh mmap whose '
        'page faults cost PVTv2-b2 half its 800 x 1216 CPU time; '
        'the rows say which' % ' '.join(f'{k}={v}'
                                        for k, v in REUSE_MEMORY.items()))
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--model', help=argparse.SUPPRESS)
    p.add_argument('--size', help=argparse.SUPPRESS)
    p.add_argument('--mode', help=argparse.SUPPRESS)
    p.add_argument(
        '--plot',
        metavar='CSV',
        help='only redraw the figure from a CSV this tool wrote (e.g. '
        'docs/en/benchmarks/benchmark_backbones.csv) to --figure; no '
        'measurement (seconds)')
    p.add_argument(
        '--figure',
        default='tools/analysis/figures/benchmark.png',
        help='the PNG that --plot writes')
    args = p.parse_args(argv)
    if args.reuse_memory and not memory_reused():
        import subprocess
        return subprocess.call(
            [sys.executable, osp.abspath(__file__)] +
            list(sys.argv[1:] if argv is None else argv),
            env={
                **os.environ,
                **REUSE_MEMORY
            })
    if args.plot:
        from analysis.common import save_figure
        rows = read_rows(args.plot)
        sizes = list(dict.fromkeys(r['size'] for r in rows))
        save_figure(plot(rows, sizes), args.figure)
        print(f'wrote {args.figure}')
        return 0
    if args.device is None:
        import torch
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.child:
        return child(args)
    if args.alternate:
        return main_alternate(args, p)
    for s in args.sizes:
        if len(s.split('x')) != 3 or not all(v.isdigit()
                                             for v in s.split('x')):
            p.error(f'size {s!r} is not HxWxB, e.g. 224x224x8')
    models = (args.models if args.models is not None else
              ([] if args.config else DEFAULT_MODELS)) + args.config
    jobs = [(m, s, mode) for s in args.sizes for m in models
            for mode in args.modes]
    rows, t0 = [], time.time()
    print(
        f'benchmarking {len(jobs)} runs on {args.device} '
        f'(each in a fresh process)',
        flush=True)
    for i, (model, size, mode) in enumerate(jobs, 1):
        argv = [
            osp.abspath(__file__), '--child', '--model', model, '--size', size,
            '--mode', mode, '--device', args.device, '--repeats',
            str(args.repeats), '--input', args.input
        ]
        try:
            res = run_isolated(argv, args.threads)
        except RuntimeError as e:
            print(
                f'[{i}/{len(jobs)}] {model} {size} {mode}: FAILED ({e})',
                flush=True)
            continue
        rows.append(dict(model=model, size=size, mode=mode, **res))
        print(
            f'[{i}/{len(jobs)}] {model:20s} {size:12s} {mode:16s} '
            f'{res["time_ms"]:9.1f} ms (min {res["min_ms"]:.1f}) '
            f'{res["img_per_s"]:7.2f} img/s {res["peak_mb"]:8.1f} MiB '
            f'({time.time() - t0:.0f}s)',
            flush=True)

    label = device_label(args.device, args.threads)
    for r in rows:
        r['device'] = label
    get = {(r['model'], r['size'], r['mode']): r for r in rows}
    md = [
        '| model | params | input | mode | ms | img/s | peak MiB | '
        'x baseline |', '|---|---|---|---|---|---|---|---|'
    ]
    for (model, size, mode) in jobs:
        r = get.get((model, size, mode))
        if r is None:
            continue
        base = baseline_for(model, models, args.baseline)
        rb = get.get((base, size, mode)) if base else None
        ratio = (f'{r["time_ms"] / rb["time_ms"]:.2f}x {base}'
                 if rb and base != model else '')
        md.append(f'| {model} | {r["params_m"]:.1f}M | {size} | {mode} | '
                  f'{r["time_ms"]:.1f} | {r["img_per_s"]:.2f} | '
                  f'{r["peak_mb"]:.0f} | {ratio} |')
    table = '\n'.join(md) + '\n'
    write_results(args.out, 'results', rows, None, table,
                  plot(rows, args.sizes) if rows else None, 'benchmark.png')


def main_alternate(args, parser):
    models = args.models or DEFAULT_MODELS
    rows = []
    for size in args.sizes:
        for mode in args.modes:
            load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else ''
            print(
                f'{size} {mode} (load {load:.1f}'
                f'{", memory reused" if memory_reused() else ""}):',
                flush=True)
            med, _ = alternate(models, size, mode, args.repeats, args.device,
                               args.threads, args.input)
            for name in models:
                base = baseline_for(name, models, args.baseline)
                ratio = f'{med[name] / med[base]:.2f}' if base and \
                    base != name else ''
                rows.append(
                    dict(
                        model=name,
                        size=size,
                        mode=mode,
                        time_ms=f'{med[name]:.1f}',
                        ratio=ratio,
                        baseline=base if ratio else '',
                        load=f'{load:.1f}'))
                print(
                    f'  {name:28s} {med[name]:9.1f} ms  {ratio}x {base}'
                    if ratio else f'  {name:28s} {med[name]:9.1f} ms',
                    flush=True)
    label = device_label(args.device, args.threads)
    for r in rows:
        r['device'] = label
    fields = [
        'model', 'size', 'mode', 'time_ms', 'ratio', 'baseline', 'load',
        'device'
    ]
    md = '\n'.join(
        ['| ' + ' | '.join(fields) + ' |', '|' + '---|' * len(fields)] +
        ['| ' + ' | '.join(str(r[f]) for f in fields) + ' |' for r in rows])
    write_results(args.out, 'alternate', rows, fields, md + '\n')
    return 0


if __name__ == '__main__':
    main()
