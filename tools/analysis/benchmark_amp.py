"""Train-step time with bfloat16 autocast (AMP) vs float32, side by side.

One process, two copies of the same backbone (same initial weights), each
with its own AdamW: one stepped by mmengine's ``OptimWrapper`` (float32),
one by the AMP wrapper that ``tools/train.py --amp`` uses (on the CPU
mmsoft's ``CPUAmpOptimWrapper``: bfloat16 autocast, no loss scaling; on
CUDA mmengine's ``AmpOptimWrapper`` with ``dtype='bfloat16'``). A train
step = zero_grad, forward (under the wrapper's ``optim_context``), a loss
on all four outputs, backward, AdamW step (``update_params``). After
``--warmup`` steps each, the two alternate step by step for ``--repeats``
rounds (interleaved, so load changes hit both alike); the median times are
compared. SOFT's kernel and pseudo-inverse run in float32 under autocast
either way; the speed-up comes from the projections, FFNs and convs.

    python tools/analysis/benchmark_amp.py             # soft_small_norm
    python tools/analysis/benchmark_amp.py --sizes 224x224x8 --repeats 10
    python tools/analysis/benchmark_amp.py --smoke     # seconds: plumbing

Model names as ``benchmark.py`` (``soft_small_norm`` = SOFT-Small with the
IJCV normalisation, the default ``attn_cfg`` of the backbone).
Sizes: ``HxWxB``. Prints a markdown table (ms per step, img/s, bf16 speed-up
= fp32 time / bf16 time) and writes ``<out>/results_amp.{csv,md}``
atomically.
"""
import copy
import os
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (add_timing_arguments, make_parser,
                             soft_model_kwargs, write_results)

DEFAULT_SIZES = ['224x224x8', '800x1216x1']
SMOKE = dict(model='soft_tiny_norm', sizes=['64x64x2'], repeats=2, warmup=1)


def parse_size(text):
    parts = text.split('x')
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise ValueError(f'size {text!r} is not HxWxB, e.g. 224x224x8')
    return tuple(int(p) for p in parts)


def build_wrappers(model_name, device):
    """{'fp32': (model, wrapper), 'bf16': (model, wrapper)}: two copies of
    one randomly initialised backbone (train mode)."""
    import torch
    from mmengine.optim import AmpOptimWrapper, OptimWrapper

    from analysis.common import quiet_init_weights
    from mmsoft.engine.optimizers import CPUAmpOptimWrapper
    from mmsoft.models.backbones import SOFT
    torch.manual_seed(0)
    model = SOFT(**soft_model_kwargs(model_name))
    quiet_init_weights(model)
    model.to(device).train()
    out = {}
    for kind in ('fp32', 'bf16'):
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.05)
        if kind == 'fp32':
            wrapper = OptimWrapper(opt)
        elif device == 'cpu':
            wrapper = CPUAmpOptimWrapper(optimizer=opt)
        else:
            wrapper = AmpOptimWrapper(optimizer=opt, dtype='bfloat16')
        out[kind] = (m, wrapper)
    return out


def make_step(model, wrapper, x):
    """One training step of ``model`` on ``x``; returns the loss."""

    def step():
        with wrapper.optim_context(model):
            outs = model(x)
        # mean of squares of every output: all four stages get gradients
        loss = sum(o.float().square().mean() for o in outs)
        wrapper.update_params(loss)
        return float(loss.detach())

    return step


def bench_size(model_name, size, device, repeats, warmup):
    """Per-kind {median_ms, min_ms, loss} of interleaved train steps."""
    import torch
    H, W, B = size
    pair = build_wrappers(model_name, device)
    x = torch.randn(B, 3, H, W, generator=torch.Generator().manual_seed(0))
    x = x.to(device)
    steps = {k: make_step(m, w, x) for k, (m, w) in pair.items()}
    sync = torch.cuda.synchronize if device.startswith('cuda') else (
        lambda: None)
    for _ in range(warmup):
        for step in steps.values():
            step()
    times = {k: [] for k in steps}
    losses = {}
    for _ in range(repeats):
        for kind, step in steps.items():
            sync()
            t0 = time.perf_counter()
            losses[kind] = step()
            sync()
            times[kind].append((time.perf_counter() - t0) * 1e3)
    res = {}
    for kind, ts in times.items():
        ts = sorted(ts)
        res[kind] = dict(
            median_ms=ts[len(ts) // 2], min_ms=ts[0], loss=losses[kind])
    return res


def load_average():
    try:
        return os.getloadavg()
    except (AttributeError, OSError):
        return (float('nan'), ) * 3


def format_table(rows, model_name, device, threads):
    load = ' '.join(f'{v:.2f}' for v in load_average())
    lines = [
        f'AMP train step, {model_name} on {device} ({threads} thread(s); '
        f'load average after: {load})', '',
        '| input HxWxB | fp32 ms | bf16 ms | fp32 img/s | bf16 img/s | '
        'bf16 speed-up |', '|---|---|---|---|---|---|'
    ]
    for r in rows:
        lines.append(f'| {r["size"]} | {r["fp32_ms"]:.1f} | '
                     f'{r["bf16_ms"]:.1f} | {r["fp32_img_s"]:.2f} | '
                     f'{r["bf16_img_s"]:.2f} | {r["speedup"]:.2f}x |')
    return '\n'.join(lines) + '\n'


def main(argv=None):
    p = make_parser(__doc__)
    p.add_argument('--model', default='soft_small_norm')
    p.add_argument('--sizes', nargs='+', default=DEFAULT_SIZES)
    add_timing_arguments(
        p,
        repeats=5,
        warmup=1,
        helps=dict(
            repeats='interleaved timed steps per kind (default 5)',
            warmup='untimed steps per kind'))
    p.add_argument('--out', default='work_dirs/benchmark_amp')
    p.add_argument(
        '--smoke',
        action='store_true',
        help=f'a tiny run ({SMOKE["model"]}, {SMOKE["sizes"][0]}, '
        f'{SMOKE["repeats"]} repeats): plumbing only')
    args = p.parse_args(argv)
    if args.smoke:
        args.model, args.sizes = SMOKE['model'], SMOKE['sizes']
        args.repeats, args.warmup = SMOKE['repeats'], SMOKE['warmup']
    try:
        sizes = [parse_size(s) for s in args.sizes]
    except ValueError as e:
        p.error(str(e))
    if args.repeats < 1:
        p.error(f'--repeats must be >= 1, got {args.repeats}')
    soft_model_kwargs(args.model)  # a clear error for a bad name, early
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    rows = []
    for text, size in zip(args.sizes, sizes):
        t0 = time.time()
        res = bench_size(args.model, size, device, args.repeats, args.warmup)
        B = size[2]
        f32, b16 = res['fp32']['median_ms'], res['bf16']['median_ms']
        rows.append(
            dict(
                model=args.model,
                size=text,
                device=device,
                threads=torch.get_num_threads(),
                repeats=args.repeats,
                fp32_ms=f32,
                bf16_ms=b16,
                fp32_min_ms=res['fp32']['min_ms'],
                bf16_min_ms=res['bf16']['min_ms'],
                fp32_img_s=B * 1e3 / f32,
                bf16_img_s=B * 1e3 / b16,
                speedup=f32 / b16,
                fp32_loss=res['fp32']['loss'],
                bf16_loss=res['bf16']['loss']))
        print(
            f'{args.model} {text}: fp32 {f32:.1f} ms, bf16 {b16:.1f} ms '
            f'({f32 / b16:.2f}x; {time.time() - t0:.0f} s)',
            flush=True)
    table = format_table(rows, args.model, device, torch.get_num_threads())
    write_results(args.out, 'results_amp', rows, None, table)
    return rows


if __name__ == '__main__':
    main()
