# Copyright (c) mmsoft contributors.
"""onnxruntime vs PyTorch CPU latency of exported SOFT models.

    python tools/deployment/benchmark_onnx.py [SPEC ...] [--threads 1] \\
        [--repeats 3] [--warmup 1] [--onnx-dir work_dirs/onnx] [--out F.md]

A SPEC is ``CONFIG:HxW``, CONFIG a file or a shipped config (default:
SOFT-Tiny and SOFT-Tiny-Norm classifiers at 224x224, UperNet SOFT-Small at
512x512, RetinaNet SOFT-Tiny at 800x1216). Each model is built with random
weights, exported (fixed shape, batch 1) to ``--onnx-dir`` (default: a temp
dir), and timed side by side in one process: PyTorch eval forward
(``nr_method`` as configured: ``auto`` uses the spectral pseudo-inverse on
the CPU for m >= 80), PyTorch with ``nr_method='iterative'`` (what the ONNX
graph computes) and onnxruntime (CPUExecutionProvider), each with
``--threads`` intra-op threads. The median of ``--repeats`` runs is printed
as a markdown table, with the relative error max |onnx - torch| / max
|torch| of the first output.
"""
import argparse
import os
import os.path as osp
import statistics
import sys
import tempfile
import time
import warnings

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import add_timing_arguments

DEFAULT_SPECS = [
    'configs/soft_tiny_in1k.py:224x224',
    'configs/soft_norm_tiny_in1k.py:224x224',
    'configs/upernet_soft_small_512x512_160k_ade20k.py:512x512',
    'configs/retinanet_soft_tiny_1x.py:800x1216',
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument(
        'specs',
        nargs='*',
        default=DEFAULT_SPECS,
        help='CONFIG:HxW (default: the README table)')
    add_timing_arguments(
        p,
        repeats=3,
        warmup=1,
        threads=1,
        with_device=False,
        helps=dict(threads='intra-op threads for torch and onnxruntime'))
    p.add_argument(
        '--onnx-dir',
        default=None,
        help='where to keep exported files (default: a temp dir)')
    p.add_argument(
        '--no-iterative',
        action='store_true',
        help='skip the PyTorch nr_method=iterative column')
    p.add_argument('--out', help='also write the markdown table here')
    return p.parse_args(argv)


def _time(fn, repeats, warmup):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return 1000 * statistics.median(ts)


def bench_one(spec, args, onnx_dir):
    import torch

    from deployment import deploy
    from mmsoft.configs import get_config_path
    from mmsoft.models.layers import with_nr
    config, _, size = spec.rpartition(':')
    if not osp.isfile(config):  # a shipped config, e.g. 'configs/x.py'
        config = get_config_path(config)
    H, W = (int(s) for s in size.lower().split('x'))
    torch.manual_seed(0)  # random weights, the same in torch and the file
    model, scope, cfg = deploy.build_model(config, None)
    shape = deploy.check_shape(scope, cfg, (H, W))
    wrapper = deploy.ExportWrapper(model, scope, shape)
    name = osp.splitext(osp.basename(config))[0]
    path = osp.join(onnx_dir, f'{name}_{H}x{W}.onnx')
    print(f'exporting {name} at {H}x{W} ...', flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        deploy.export_onnx(wrapper, path)
    sess = deploy.OnnxModel(path, threads=args.threads)
    x = torch.randn(1, 3, H, W, generator=torch.Generator().manual_seed(0))
    xn = x.numpy()
    torch.set_num_threads(args.threads)
    row = dict(model=name, input=f'{H}x{W}')
    with torch.no_grad():
        ref = wrapper(x)
        row['torch_ms'] = _time(lambda: wrapper(x), args.repeats, args.warmup)
        if not args.no_iterative:  # the same weights, built iterative
            iterative = with_nr(wrapper, method='iterative')
            row['torch_iter_ms'] = _time(lambda: iterative(x), args.repeats,
                                         args.warmup)
    out = sess(xn)
    row['err'] = max(deploy.relative_error(o, r) for o, r in zip(out, ref))
    row['ort_ms'] = _time(lambda: sess(xn), args.repeats, args.warmup)
    return row


def to_markdown(rows, iterative=True):
    head = ['model', 'input', 'torch ms']
    if iterative:
        head.append('torch iterative ms')
    head += ['onnxruntime ms', 'torch / ort', 'max rel. err']
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    for r in rows:
        cells = [r['model'], r['input'], f"{r['torch_ms']:.1f}"]
        if iterative:
            cells.append(f"{r['torch_iter_ms']:.1f}")
        cells += [
            f"{r['ort_ms']:.1f}", f"{r['torch_ms'] / r['ort_ms']:.2f}x",
            f"{r['err']:.1e}"
        ]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def main(argv=None):
    args = parse_args(argv)
    os.environ.setdefault('OMP_NUM_THREADS', str(args.threads))
    import mmsoft  # noqa: F401
    onnx_dir = args.onnx_dir or tempfile.mkdtemp(prefix='mmsoft_onnx_')
    os.makedirs(onnx_dir, exist_ok=True)
    rows = []
    for spec in args.specs:
        row = bench_one(spec, args, onnx_dir)
        rows.append(row)
        print(
            f"{row['model']} {row['input']}: torch {row['torch_ms']:.1f} "
            f"ms, onnxruntime {row['ort_ms']:.1f} ms, rel. err "
            f"{row['err']:.1e}",
            flush=True)
    table = to_markdown(rows, not args.no_iterative)
    load = os.getloadavg()[0] if hasattr(os, 'getloadavg') else float('nan')
    note = (f'\n{args.threads} thread(s), batch 1, median of {args.repeats}; '
            f'load average {load:.1f} at the end\n')
    print(table + note)
    if args.out:
        from mmsoft.utils.atomic import atomic_write
        atomic_write(args.out, table + note)
    return 0


if __name__ == '__main__':
    sys.exit(main())
