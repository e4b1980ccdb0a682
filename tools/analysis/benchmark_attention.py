"""Time and peak memory of SOFT attention vs softmax attention (Fig. 1b).

One attention layer with d = 384, 12 heads, a bottleneck of m = 49 tokens,
and n = 784 * p tokens (a 28 x 28p token map), p = 1..8, as in Fig. 1b of the
NeurIPS paper. Both layers have the same projections (q / v or q / k / v and
the output projection); SOFT uses the Gaussian kernel + Newton-Raphson
pseudo-inverse of :func:`mmsoft.models.layers.soft_attention` with its
bottleneck taken by 2-D average pooling to 7 x 7 (so m stays 49 for any n),
``softmax`` uses ``torch.nn.functional.scaled_dot_product_attention`` (a
fused, memory-efficient kernel on recent PyTorch, so its memory is linear in n
too) and ``softmax_naive`` materialises the n x n attention matrix as the
Transformer baseline of the paper does (quadratic memory).

Each (method, n, mode) runs in a fresh subprocess so that peak memory is
measurable on CPU (growth of the process's peak RSS over its state right
before the measured call); on CUDA ``torch.cuda.max_memory_allocated`` is
used. Times are the median of ``--repeats`` runs after one warm-up.

    python tools/analysis/benchmark_attention.py            # CPU (+CUDA)
    python tools/analysis/benchmark_attention.py --max-p 4 --batch 1 \
        --out work_dirs/bench_attention

Writes ``results.csv``, ``results.md`` and ``memory_time_vs_tokens.png``.
``--plot CSV`` only redraws the figure from such a CSV (the docs' figure,
in seconds)::

    python tools/analysis/benchmark_attention.py \
        --plot docs/en/benchmarks/benchmark_attention.csv
"""
import argparse
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (make_parser, measure_step, print_result, pyplot,
                             run_isolated, write_results)

METHODS = ('soft', 'soft_norm', 'softmax', 'softmax_naive')
MODES = ('forward', 'forward_backward')


def build_layer(method, dims=384, heads=12, m_side=7):
    import torch.nn as nn
    import torch.nn.functional as F

    from mmsoft.models.layers import soft_attention

    class Layer(nn.Module):

        def __init__(self):
            super().__init__()
            self.h, self.hd = heads, dims // heads
            self.q = nn.Linear(dims, dims)
            self.v = nn.Linear(dims, dims)
            if method.startswith('softmax'):
                self.k = nn.Linear(dims, dims)
            self.proj = nn.Linear(dims, dims)

        def split(self, x):
            B, N, _ = x.shape
            return x.view(B, N, self.h, self.hd).transpose(1, 2)

        def forward(self, x, hw):
            B, N, C = x.shape
            q, v = self.split(self.q(x)), self.split(self.v(x))
            if method == 'softmax':
                out = F.scaled_dot_product_attention(q, self.split(self.k(x)),
                                                     v)
            elif method == 'softmax_naive':  # the n x n matrix, materialised
                k = self.split(self.k(x))
                attn = (q @ k.transpose(-1, -2)) * self.hd**-0.5
                out = attn.softmax(-1) @ v
            else:
                q = q * self.hd**-0.25
                grid = q.reshape(B * self.h, *hw, self.hd).permute(0, 3, 1, 2)
                lm = F.adaptive_avg_pool2d(grid, m_side).flatten(2)
                lm = lm.transpose(1, 2).reshape(B, self.h, -1, self.hd)
                out = soft_attention(q, lm, v, attn_norm=method == 'soft_norm')
            return self.proj(out.transpose(1, 2).reshape(B, N, C))

    return Layer()


def measure(method, p, mode, device, batch, repeats):
    """Run in a subprocess: returns dict(time_ms, min_ms, peak_mb)."""
    import torch
    torch.manual_seed(0)
    layer = build_layer(method).to(device)
    hw = (28, 28 * p)
    x = torch.randn(
        batch,
        hw[0] * hw[1],
        384,
        device=device,
        requires_grad=mode == 'forward_backward')

    def step():
        if mode == 'forward':
            with torch.no_grad():
                layer(x, hw)
        else:
            layer(x, hw).sum().backward()
            layer.zero_grad(set_to_none=True)
            x.grad = None

    def warmup():  # a small input, so the measured peak is the layer's own
        with torch.no_grad():
            layer(torch.randn(1, 784, 384, device=device), (28, 28))

    return measure_step(step, device, repeats, warmup)


def run_child(args):
    print_result(
        measure(args.method, args.p, args.mode, args.device, args.batch,
                args.repeats))


#: legend names of the methods and their line colours
LABELS = {
    'soft': ('SOFT', 'tab:blue'),
    'soft_norm': ('SOFT (normalised)', 'tab:green'),
    'softmax': ('softmax, fused SDPA', 'tab:orange'),
    'softmax_naive': ('softmax, n × n matrix', 'tab:red'),
}


def plot(rows):
    """Peak memory and time vs n, one row of two panels per device: legible
    at the docs' page width (8 in wide, 10-11 pt text)."""
    devices = sorted({r['device'] for r in rows})
    # a last row of its own for the legend (kept clear of the curves)
    fig, grid = pyplot().subplots(
        len(devices) + 1,
        2,
        figsize=(8, 3.9 * len(devices) + 1.1),
        squeeze=False,
        gridspec_kw=dict(height_ratios=[3.9] * len(devices) + [0.9]))
    axes = grid[:-1]
    for di, dev in enumerate(devices):
        for ci, (key, label) in enumerate([('peak_mb', 'peak memory (MiB)'),
                                           ('time_ms', 'time (ms)')]):
            ax = axes[di][ci]
            for method in METHODS:
                name, color = LABELS[method]
                for mode, ls in zip(MODES, ('--', '-')):
                    pts = sorted(
                        (r['n'], r[key]) for r in rows if r['device'] == dev
                        and r['method'] == method and r['mode'] == mode)
                    if pts:
                        ax.plot(
                            *zip(*pts),
                            ls,
                            color=color,
                            marker='o',
                            label=name if mode == MODES[1] else None)
            ax.set_xlabel('tokens n', fontsize=10.5)
            ax.set_ylabel(label, fontsize=10.5)
            ax.set_title(f'{dev}: {label}', fontsize=11)
            ax.tick_params(labelsize=9.5)
            ax.grid(alpha=.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in grid[-1]:
        ax.axis('off')
    legend = grid[-1][0].legend(
        handles,
        labels,
        loc='center',
        bbox_to_anchor=(1.05, 0.4),
        ncol=2,
        fontsize=9.5,
        title='solid: forward + backward, dashed: forward',
        title_fontsize=9.5,
        frameon=False)
    legend.set_in_layout(False)  # centred under both panels
    fig.suptitle(
        'One attention layer (d = 384, m = 49): linear vs quadratic',
        fontsize=11.5)
    return fig


def read_rows(path):
    """The rows of a CSV this tool wrote (``--plot``), numbers as floats."""
    import csv
    with open(path, newline='') as f:
        rows = list(csv.DictReader(f))
    for r in rows:
        for k in ('n', 'time_ms', 'peak_mb'):
            r[k] = float(r[k])
    return rows


def main(argv=None):
    parser = make_parser(__doc__)
    parser.add_argument(
        '--max-p', type=int, default=8, help='n = 784 * p for p = 1..max-p')
    parser.add_argument('--batch', type=int, default=1)
    parser.add_argument('--repeats', type=int, default=3)
    parser.add_argument(
        '--devices',
        nargs='+',
        default=None,
        help='default: cpu, plus cuda when available')
    parser.add_argument(
        '--methods', nargs='+', default=list(METHODS), choices=METHODS)
    parser.add_argument('--out', default='work_dirs/benchmark_attention')
    parser.add_argument('--threads', type=int, default=None)
    # child mode
    parser.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    parser.add_argument('--method', help=argparse.SUPPRESS)
    parser.add_argument('--p', type=int, help=argparse.SUPPRESS)
    parser.add_argument('--mode', help=argparse.SUPPRESS)
    parser.add_argument('--device', help=argparse.SUPPRESS)
    parser.add_argument(
        '--plot',
        metavar='CSV',
        help='only redraw the figure from a CSV this tool wrote (e.g. '
        'docs/en/benchmarks/benchmark_attention.csv) to --figure; no '
        'measurement (seconds)')
    parser.add_argument(
        '--figure',
        default='tools/analysis/figures/attention_scaling.png',
        help='the PNG that --plot writes')
    args = parser.parse_args(argv)
    if args.plot:
        from analysis.common import save_figure
        save_figure(plot(read_rows(args.plot)), args.figure)
        print(f'wrote {args.figure}')
        return []
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    if args.child:
        return run_child(args)

    devices = args.devices
    if devices is None:
        import torch
        devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])
    jobs = [(dev, p, method, mode) for dev in devices
            for p in range(1, args.max_p + 1) for method in args.methods
            for mode in MODES]
    rows = []
    t_start = time.time()
    for i, (dev, p, method, mode) in enumerate(jobs, 1):
        cmd = [
            osp.abspath(__file__), '--child', '--method', method, '--p',
            str(p), '--mode', mode, '--device', dev, '--batch',
            str(args.batch), '--repeats',
            str(args.repeats)
        ]
        try:
            res = run_isolated(cmd, args.threads)
        except RuntimeError as e:
            print(
                f'[{i}/{len(jobs)}] {dev} n={784 * p} {method} {mode}: '
                f'FAILED ({e})',
                flush=True)
            continue
        rows.append(
            dict(device=dev, n=784 * p, method=method, mode=mode, **res))
        print(
            f'[{i}/{len(jobs)}] {dev} n={784 * p:5d} {method:9s} '
            f'{mode:16s} {res["time_ms"]:9.1f} ms {res["peak_mb"]:8.1f} '
            f'MiB  ({time.time() - t_start:.0f}s)',
            flush=True)

    lines = [
        '| device | n | method | fwd ms | fwd MiB | fwd+bwd ms | '
        'fwd+bwd MiB |', '|---|---|---|---|---|---|---|'
    ]
    for dev in devices:
        for p in range(1, args.max_p + 1):
            for method in args.methods:
                get = {
                    r['mode']: r
                    for r in rows if r['device'] == dev and r['n'] == 784 *
                    p and r['method'] == method
                }
                f, b = get.get('forward'), get.get('forward_backward')
                fmt = lambda r, k: f'{r[k]:.1f}' if r else 'n/a'  # noqa
                lines.append(f'| {dev} | {784 * p} | {method} | '
                             f'{fmt(f, "time_ms")} | {fmt(f, "peak_mb")} | '
                             f'{fmt(b, "time_ms")} | {fmt(b, "peak_mb")} |')
    write_results(args.out, 'results', rows, [
        'device', 'n', 'method', 'mode', 'time_ms', 'min_ms', 'peak_mb'
    ], '\n'.join(lines) + '\n',
                  plot(rows) if rows else None, 'memory_time_vs_tokens.png')
    return rows


if __name__ == '__main__':
    main()
