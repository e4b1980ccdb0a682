"""Eager vs ``torch.compile`` SOFT backbone: forward and train-step times.

For each size (``HxW:batch``) and mode (``forward``: no_grad inference;
``train``: forward, backward of the mean of the outputs and one SGD step)
the backbone runs eagerly and compiled (``torch.compile``, default backend
inductor); the compiled model's first call (tracing + code generation) is
reported as ``compile s``, the times are medians over ``--repeats`` calls
after one warm-up. Prints a markdown table (size, batch, mode, eager ms,
compiled ms, speed-up, compile s) and writes ``<out-dir>/benchmark_compile
.csv`` and ``.md`` atomically.

Examples::

    python tools/analysis/benchmark_compile.py             # SOFT-Small-Norm
    python tools/analysis/benchmark_compile.py --arch soft_tiny \\
        --sizes 224x224:8 --repeats 5
    python tools/analysis/benchmark_compile.py --smoke     # tiny, seconds

Model names as the other tools (``soft_small_norm`` = SOFT-Small with the
normalised attention, the backbone's default). Runs on CUDA when available
(``--device``).
"""
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis import common as analysis

FIELDS = ('size', 'batch', 'mode', 'eager_ms', 'compiled_ms', 'speedup',
          'compile_s')
HEADER = ('| size | batch | mode | eager ms | compiled ms | speed-up | '
          'compile s |')
#: the tiny backbone and sizes of ``--smoke``
SMOKE_ARCH = dict(
    embed_dims=[16, 32, 32, 64], num_heads=[1, 1, 1, 2], depths=[1, 1, 1, 1])
SMOKE_SIZES = '64x64:2'


def parse_sizes(text):
    """``'224x224:8,800x1216:1'`` -> ``[(224, 224, 8), (800, 1216, 1)]``."""
    out = []
    for item in text.split(','):
        try:
            hw, batch = item.split(':')
            h, w = hw.lower().split('x')
            out.append((int(h), int(w), int(batch)))
        except ValueError:
            raise SystemExit(f'--sizes: cannot read {item!r}; use '
                             f'HxW:BATCH[,HxW:BATCH...], e.g. 224x224:8')
    return out


def parse_args(argv=None):
    p = analysis.make_parser(__doc__)
    p.add_argument(
        '--arch',
        default='soft_small_norm',
        help='model name, e.g. soft_small_norm (default), soft_tiny')
    p.add_argument(
        '--sizes',
        default='224x224:8,800x1216:1',
        help='HxW:BATCH list (default 224x224:8,800x1216:1)')
    p.add_argument(
        '--modes',
        default='forward,train',
        help='forward and/or train (default both)')
    p.add_argument('--backend', default='inductor')
    analysis.add_timing_arguments(p, repeats=3)
    p.add_argument(
        '--smoke',
        action='store_true',
        help=f'tiny arch at {SMOKE_SIZES}, one repeat (a quick check)')
    p.add_argument('--out-dir', default='work_dirs/benchmark_compile')
    args = p.parse_args(argv)
    modes = args.modes.split(',')
    if not set(modes) <= {'forward', 'train'} or not modes:
        p.error(f'--modes: {args.modes!r}; use forward, train or both')
    args.modes = modes
    if args.repeats < 1:
        p.error('--repeats must be >= 1')
    if args.smoke:
        args.sizes, args.repeats = SMOKE_SIZES, 1
    args.sizes = parse_sizes(args.sizes)
    return args


def build(args):
    from mmsoft.models.backbones import SOFT
    if args.smoke:
        return SOFT(arch=dict(SMOKE_ARCH))
    return SOFT(**analysis.soft_model_kwargs(args.arch))


def make_step(model, x, mode):
    import torch
    if mode == 'forward':
        model.eval()

        def step():
            with torch.no_grad():
                model(x)

        return step
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9)

    def step():
        out = model(x)
        loss = sum(o.float().mean() for o in out)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def timed(step, repeats, device):
    """(first call s, median of ``repeats`` later calls in ms)."""
    t0 = time.perf_counter()
    step()
    analysis.sync_device(device)
    first = time.perf_counter() - t0
    res = analysis.measure_step(step, device=device, repeats=repeats)
    return first, res['time_ms']


def run_one(args, h, w, batch, mode, device):
    import copy

    import torch
    torch.manual_seed(0)
    base = build(args).to(device)
    x = torch.randn(batch, 3, h, w, device=device)
    _, eager_ms = timed(make_step(base, x, mode), args.repeats, device)
    torch._dynamo.reset()
    model = copy.deepcopy(base)
    compiled = torch.compile(model, backend=args.backend)
    first, comp_ms = timed(make_step(compiled, x, mode), args.repeats, device)
    torch._dynamo.reset()
    # the speed-up of the printed times, so that the table checks itself
    eager_ms, comp_ms = round(eager_ms, 2), round(comp_ms, 2)
    return dict(
        size=f'{h}x{w}',
        batch=batch,
        mode=mode,
        eager_ms=eager_ms,
        compiled_ms=comp_ms,
        speedup=round(eager_ms / comp_ms, 3),
        compile_s=round(max(first - comp_ms / 1e3, 0.0), 2))


def markdown(rows):
    lines = [HEADER, '|' + '---|' * len(FIELDS)]
    for r in rows:
        lines.append('| ' + ' | '.join(str(r[f]) for f in FIELDS) + ' |')
    return '\n'.join(lines) + '\n'


def main(argv=None):
    args = parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device or ('cuda' if torch.cuda.is_available() else 'cpu')
    rows = []
    arch = 'smoke (tiny arch)' if args.smoke else args.arch
    title = (f'# torch.compile vs eager: {arch}, {device}, backend '
             f'{args.backend}, torch {torch.__version__}\n\n')
    for h, w, batch in args.sizes:
        for mode in args.modes:
            rows.append(run_one(args, h, w, batch, mode, device))
            print(markdown(rows[-1:]).splitlines()[-1], flush=True)
            # after every row (atomically): a run cut short keeps its rows
            analysis.write_csv(
                osp.join(args.out_dir, 'benchmark_compile.csv'), rows,
                list(FIELDS))
            analysis.write_text(
                osp.join(args.out_dir, 'benchmark_compile.md'),
                title + markdown(rows))
    print(title + markdown(rows))
    print(f'wrote {args.out_dir}/benchmark_compile.{{csv,md}}')
    return rows


if __name__ == '__main__':
    main()
    sys.exit(0)
