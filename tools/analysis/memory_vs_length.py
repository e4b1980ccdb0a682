"""Peak memory vs token count for the attention zoo (NeurIPS Fig. 1b).

The setting of Sec. 4.2 ("second setting"): a ViT-like stack of 12 SOFT
layers (post-norm attention + FFN blocks of :class:`SOFTBlock`), hidden
size d = 384, 12 heads, bottleneck / landmark / reduced length m = 49, batch
1, and n = 784 x p tokens (p = 1..8), laid out as a 28 x 28p token map. Each
attention is the zoo module (same block otherwise); the attentions with a
reduced token set (SOFT, Linformer, Nystromformer) use a fixed 7 x 7 grid
(their option ``landmark_hw``: the r = 4 strided grid, adaptively
average-pooled to 7 x 7), so m = 49 at every n as in the paper.

Entries: the zoo names (soft, soft_norm, softmax, linformer, performer,
nystromformer, sima) and ``softmax:math``: softmax attention forced onto
the math SDPA backend, which materialises the n x n matrix as the paper's
Transformer did (torch's default CPU / GPU kernels are fused and need
O(n) memory, so plain ``softmax`` is *not* quadratic in memory, only in
time).

Each (entry, n, mode) runs in a fresh process; the peak memory of one step
is the growth of peak RSS on the CPU (``torch.cuda.max_memory_allocated``
on GPUs), see ``analysis.measure_step``. Modes: ``forward`` (eval, no
autograd) and ``forward_backward`` (a training step). Runs whose estimated
n x n memory exceeds ``--max-mem-gb`` are skipped and marked as such.

    python tools/analysis/memory_vs_length.py
    python tools/analysis/memory_vs_length.py --modes forward forward_backward
    python tools/analysis/memory_vs_length.py --attns soft softmax:math \\
        --p 1 2 4 --layers 2 --dims 96 --heads 3   # quick look

Writes ``memory.csv``, ``memory.md`` and ``memory.png`` to ``--out``.
"""
import argparse
import io
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (ATTENTION_NAMES, add_timing_arguments,
                             attn_cfg_of, make_parser, measure_step,
                             print_result, pyplot, run_isolated, write_results)

DEFAULT_ATTNS = [
    'soft', 'soft_norm', 'softmax', 'softmax:math', 'linformer', 'performer',
    'nystromformer', 'sima'
]
MODES = ('forward', 'forward_backward')
BASE_SIDE = 28  # n = 784 p = 28 x 28p

# ------------------------------------------------------------------ model
#: the attentions with a reduced token set (their ``landmark_hw`` option)
REDUCED = ('soft', 'soft_norm', 'linformer', 'nystromformer')


def build_stack(attn: str, layers: int, dims: int, heads: int, landmarks: int,
                ratio: int):
    """12 (``layers``) post-norm SOFT layers with the given attention."""
    import torch.nn as nn

    from mmsoft.models.backbones.soft import SOFTBlock

    g = int(round(landmarks**0.5))
    if g * g != landmarks:
        raise ValueError(f'--landmarks must be a square, got {landmarks}')
    attn_type = attn.split(':')[0]
    cfg = attn_cfg_of(attn_type)
    if attn_type in REDUCED:
        cfg['landmark_hw'] = (g, g)

    class Stack(nn.Module):

        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(
                SOFTBlock(dims, heads, ratio, attn_cfg=cfg)
                for _ in range(layers))

        def forward(self, x, hw):
            for blk in self.blocks:
                x = blk(x, hw)
            return x

    return Stack()


def estimate_quadratic_gb(attn, n, heads, layers, mode) -> float:
    """Memory of the materialised n x n matrices (softmax:math only)."""
    if attn != 'softmax:math':
        return 0.0
    one = heads * n * n * 4 / 2**30
    return (3 * one) if mode == 'forward' else (2 * layers + 2) * one


def child(args):
    import contextlib

    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dev = args.device
    model = build_stack(args.attn, args.layers, args.dims, args.heads,
                        args.landmarks, args.ratio).to(dev)
    hw = (BASE_SIDE, BASE_SIDE * args.p_value)
    x = torch.randn(1, hw[0] * hw[1], args.dims, device=dev)

    def ctx():  # softmax:math materialises the n x n matrix
        if args.attn == 'softmax:math':
            from analysis.common import sdpa_math
            return sdpa_math()
        return contextlib.nullcontext()

    def run(inp, shape, train):
        with ctx():
            if train:
                model.train()
                model(inp, shape).sum().backward()
                model.zero_grad(set_to_none=True)
            else:
                model.eval()
                with torch.no_grad():
                    model(inp, shape)

    train = args.mode == 'forward_backward'
    # warm up (lazy initialisation, thread pools) on a tiny 8 x 8 map, so
    # that the measured growth of the peak is the step's own memory
    small = torch.randn(1, 64, args.dims, device=dev)
    res = measure_step(
        lambda: run(x, hw, train),
        dev,
        args.repeats,
        warmup=lambda: run(small, (8, 8), train))
    print_result(res)


# ------------------------------------------------------------------ output
FIELDS = ['attn', 'mode', 'p', 'n', 'm', 'peak_mb', 'time_ms', 'status']


def to_markdown(rows, modes, attns, ps) -> str:
    out = io.StringIO()
    for mode in modes:
        out.write(f'\n**{mode}**: peak memory (MiB) by n = 784 p\n\n')
        out.write('| attention | ' + ' | '.join(f'{784 * p}'
                                                for p in ps) + ' |\n')
        out.write('|---|' + '---|' * len(ps) + '\n')
        for a in attns:
            cells = []
            for p in ps:
                r = next(
                    (r for r in rows
                     if r['attn'] == a and r['mode'] == mode and r['p'] == p),
                    None)
                if r is None:
                    cells.append('')
                elif r['status'] != 'ok':
                    cells.append(r['status'])
                else:
                    cells.append(f"{r['peak_mb']:.0f}")
            out.write(f'| {a} | ' + ' | '.join(cells) + ' |\n')
    return out.getvalue()


def plot(rows, modes, attns, title):
    fig, axes = pyplot().subplots(
        2, len(modes), figsize=(6.5 * len(modes), 8), squeeze=False)
    for j, mode in enumerate(modes):
        for a in attns:
            pts = sorted((r['n'], r['peak_mb'], r['time_ms']) for r in rows
                         if r['attn'] == a and r['mode'] == mode
                         and r['status'] == 'ok')
            if not pts:
                continue
            style = '--' if a.startswith('softmax') else '-'
            axes[0][j].plot([p[0] for p in pts], [p[1] for p in pts],
                            style,
                            marker='o',
                            ms=3,
                            label=a)
            axes[1][j].plot([p[0] for p in pts], [p[2] for p in pts],
                            style,
                            marker='o',
                            ms=3,
                            label=a)
        axes[0][j].set_title(f'{title} - {mode}')
        axes[0][j].set_ylabel('peak memory (MiB)')
        axes[1][j].set_ylabel('time per step (ms)')
        for ax in axes[:, j]:
            ax.set_xlabel('tokens n')
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    return fig


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument('--attns', nargs='+', default=DEFAULT_ATTNS)
    p.add_argument(
        '--p',
        nargs='+',
        type=int,
        default=list(range(1, 9)),
        help='n = 784 p tokens')
    p.add_argument('--modes', nargs='+', default=['forward'], choices=MODES)
    p.add_argument('--layers', type=int, default=12)
    p.add_argument('--dims', type=int, default=384)
    p.add_argument('--heads', type=int, default=12)
    p.add_argument(
        '--landmarks',
        type=int,
        default=49,
        help='m of the reduced attentions (a square)')
    p.add_argument(
        '--ratio',
        type=int,
        default=4,
        help='sampling ratio before pooling to the m grid')
    p.add_argument(
        '--max-mem-gb',
        type=float,
        default=6.0,
        help='skip runs whose n x n matrices would exceed this')
    add_timing_arguments(
        p,
        repeats=0,
        helps=dict(repeats='timed repeats after the memory-measuring step'))
    p.add_argument('--out', default='work_dirs/memory_vs_length')
    p.add_argument('--child', action='store_true', help=argparse.SUPPRESS)
    p.add_argument('--attn', help=argparse.SUPPRESS)
    p.add_argument('--p-value', type=int, help=argparse.SUPPRESS)
    p.add_argument('--mode', help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.device is None:
        import torch
        args.device = 'cuda' if torch.cuda.is_available() else 'cpu'
    if args.child:
        return child(args)
    known = list(ATTENTION_NAMES) + ['softmax:math']
    for a in args.attns:
        if a not in known:
            p.error(f'unknown attention {a!r}; choose from {known}')
    jobs = [(a, pv, mode) for mode in args.modes for a in args.attns
            for pv in args.p]
    print(
        f'{len(jobs)} runs on {args.device}, {args.layers} layers, '
        f'd={args.dims}, {args.heads} heads, m={args.landmarks}; each in '
        f'a fresh process',
        flush=True)
    rows, t0 = [], time.time()
    for i, (a, pv, mode) in enumerate(jobs, 1):
        n = 784 * pv
        m = '' if a.startswith(('softmax', 'performer', 'sima')) \
            else args.landmarks
        row = dict(
            attn=a,
            mode=mode,
            p=pv,
            n=n,
            m=m,
            peak_mb='',
            time_ms='',
            status='ok')
        est = estimate_quadratic_gb(a, n, args.heads, args.layers, mode)
        if est > args.max_mem_gb:
            row['status'] = f'skipped (~{est:.0f} GiB)'
        else:
            argv = [
                osp.abspath(__file__), '--child', '--attn', a, '--p-value',
                str(pv), '--mode', mode, '--layers',
                str(args.layers), '--dims',
                str(args.dims), '--heads',
                str(args.heads), '--landmarks',
                str(args.landmarks), '--ratio',
                str(args.ratio), '--device', args.device, '--repeats',
                str(args.repeats)
            ]
            try:
                res = run_isolated(argv, args.threads)
                row.update(peak_mb=res['peak_mb'], time_ms=res['time_ms'])
            except RuntimeError as e:
                row['status'] = f'failed: {str(e)[:60]}'
        rows.append(row)
        shown = (f"{row['peak_mb']:8.1f} MiB {row['time_ms']:9.1f} ms"
                 if row['status'] == 'ok' else row['status'])
        print(
            f'[{i}/{len(jobs)}] {a:14s} {mode:16s} n={n:5d} {shown}  '
            f'({time.time() - t0:.0f}s)',
            flush=True)
    fig = plot(
        rows, args.modes, args.attns, f'{args.layers} layers, d={args.dims}, '
        f'm={args.landmarks}, {args.device}')
    write_results(args.out, 'memory', rows, FIELDS,
                  to_markdown(rows, args.modes, args.attns, args.p), fig)
    return rows


if __name__ == '__main__':
    main()
