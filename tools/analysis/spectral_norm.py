"""Spectral norm of A^+ with and without normalisation (IJCV Fig. 5b).

For bottleneck lengths m, it compares

    ||A^+||_2                   (NeurIPS SOFT; Prop. 5: O(m^2))
    ||D^-1/2 A^+ D^-1/2||_2     (IJCV SOFT, D = diag(A 1_m); Prop. 6: O(m))

where A = exp(Q~ (-) Q~) is the m x m bottleneck matrix and A^+ the
Newton-Raphson pseudo-inverse each model uses (``nr_init`` 'soft' and
'soft_norm_per_sample' respectively, ``--iters`` iterations; solid lines)
and with the exact pseudo-inverse (:func:`torch.linalg.pinv`; dotted
lines). 20 NR iterations only invert the eigenvalues of A above about
sqrt(2^-20 / alpha), so the NR norms stay bounded where the exact ones
explode. The CSV also has the
largest eigenvalue of A (Fig. 5a).

Landmarks (``--source``):

* ``field`` (default): the m = g x g landmarks are a smooth random field
  sampled on a g x g grid of the unit square (random Fourier features of
  bandwidth ``--bandwidth`` cycles, d = ``--dims`` channels, scaled so that
  independent points have ||x - y||^2 / 2 = ``--spread`` on average), like
  the bottleneck tokens of one image at growing resolution: the longer the
  bottleneck, the closer (more similar) neighbouring landmarks.
* ``model``: the landmarks a SOFT model computes on real images, in the
  first layer of stage ``--stage``; each m = g^2 is obtained by feeding
  images of the size that gives a g x g bottleneck grid in that stage (one
  sample per image and head). Use it with ``--checkpoint``.

    python tools/analysis/spectral_norm.py
    python tools/analysis/spectral_norm.py --lengths 49 196 784 --samples 20
    python tools/analysis/spectral_norm.py --source model --model \\
        soft_tiny_norm --checkpoint w.pth --images data/coco/val2017

Writes ``spectral_norm.csv``, ``.md`` and ``.png`` to ``--out``.
"""
import io
import math
import os.path as osp
import sys
import time

import torch

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (add_model_arguments, add_stage_argument,
                             make_parser, pyplot, write_results)


# ------------------------------------------------------------------ sources
def field_landmarks(g: int, dims: int, spread: float, bandwidth: float,
                    features: int, generator: torch.Generator) -> torch.Tensor:
    """(g*g, dims) samples of a smooth random field on a g x g grid."""
    u = (torch.arange(g, dtype=torch.float64) + 0.5) / g
    grid = torch.stack(torch.meshgrid(u, u, indexing='ij'), -1).reshape(-1, 2)
    omega = torch.randn(
        features, 2, generator=generator,
        dtype=torch.float64) * bandwidth * 2 * math.pi
    phase = torch.rand(
        features, generator=generator, dtype=torch.float64) * 2 * math.pi
    R = torch.randn(dims, features, generator=generator, dtype=torch.float64)
    # each channel has unit variance: E||x - y||^2 / 2 = dims for
    # independent points; rescale to ``spread``
    phi = math.sqrt(2.0 / features) * torch.cos(grid @ omega.T + phase)
    return (phi @ R.T) * math.sqrt(spread / dims)


def model_landmarks(args, g: int):
    """[(m, d) landmarks] from a SOFT model on images sized for a g x g
    bottleneck grid in stage ``args.stage``."""
    from analysis.common import (build_model, image_sets, load_rgb,
                                 soft_attention_modules, to_tensor)
    if not hasattr(model_landmarks, 'cache'):
        model_landmarks.cache = build_model(
            args.model,
            args.config,
            args.checkpoint,
            out_indices=(args.stage, ))
    model = model_landmarks.cache
    mods = [
        a for s, i, a in soft_attention_modules(model)
        if s == args.stage and i == 0
    ]
    attn = mods[0]
    size = g * attn.sampler.ratio * 4 * 2**args.stage
    items = image_sets(args.images, args.samples)[0][1]
    got = []
    h = attn.sampler.register_forward_hook(
        lambda mod, a, out: got.append(out.detach().double()))
    try:
        with torch.no_grad():
            for it in items:
                model(to_tensor(load_rgb(it), (size, size))[None])
    finally:
        h.remove()
    out = []
    for lm in got:  # (1, h, m, d)
        out += [t for t in lm[0]]
    return out, size


# ------------------------------------------------------------------ norms
@torch.no_grad()
def norms(L: torch.Tensor, iters: int) -> dict:
    """Spectral norms of the (normalised) NR / exact pseudo-inverses."""
    from mmsoft.models.layers import NRConfig, gaussian_kernel
    A = gaussian_kernel(L, L)
    d = A.sum(-1).rsqrt()
    plain = NRConfig(iters, 'soft').inverse(A)
    normed = NRConfig(iters, 'soft_norm_per_sample').inverse(A)
    normed = d[:, None] * normed * d[None, :]
    exact = torch.linalg.pinv(A, hermitian=True)

    def two(M):  # all these matrices are symmetric: ||M||_2 = max |eig|
        return torch.linalg.eigvalsh(0.5 * (M + M.T)).abs().max().item()

    return dict(
        pinv=two(plain),
        norm_pinv=two(normed),
        exact_pinv=two(exact),
        exact_norm_pinv=two(d[:, None] * exact * d[None, :]),
        lambda_max=torch.linalg.eigvalsh(A)[-1].item())


KEYS = ('pinv', 'norm_pinv', 'exact_pinv', 'exact_norm_pinv', 'lambda_max')


def to_markdown(rows, lengths) -> str:
    out = io.StringIO()
    out.write('| m | samples | ||A^+||_2 | ||D^-1/2 A^+ D^-1/2||_2 | '
              'exact ||A^+||_2 | exact normalised | lambda_max(A) |\n')
    out.write('|---|---|---|---|---|---|---|\n')
    for m in lengths:
        rs = [r for r in rows if r['m'] == m]
        if not rs:
            continue
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in KEYS}
        out.write(f"| {m} | {len(rs)} | {mean['pinv']:.3g} | "
                  f"{mean['norm_pinv']:.3g} | {mean['exact_pinv']:.3g} | "
                  f"{mean['exact_norm_pinv']:.3g} | "
                  f"{mean['lambda_max']:.3g} |\n")
    out.write('\nmeans over samples; A^+ by Newton-Raphson as in the models '
              "(init 'soft' without, 'soft_norm_per_sample' with "
              "normalisation).\n")
    return out.getvalue()


def plot(rows, lengths, title):
    fig, ax = pyplot().subplots(figsize=(7, 5))  # legible at page width
    series = (('pinv', r'$\|A^+\|_2$ (no normalisation)', 'C0', '-', '+'),
              ('norm_pinv', r'$\|D^{-1/2}A^+D^{-1/2}\|_2$', 'C1', '-', '+'),
              ('exact_pinv', 'exact pinv, no normalisation', 'C0', ':', 'x'),
              ('exact_norm_pinv', 'exact pinv, normalised', 'C1', ':', 'x'))
    for key, label, c, ls, mk in series:
        xs = [r['m'] for r in rows]
        ax.scatter(xs, [r[key] for r in rows], marker=mk, c=c, alpha=0.5, s=18)
        ms = [m for m in lengths if any(r['m'] == m for r in rows)]
        means = [
            sum(r[key] for r in rows if r['m'] == m) /
            sum(1 for r in rows if r['m'] == m) for m in ms
        ]
        ax.plot(ms, means, ls, c=c, label=label)
    ax.set_xscale('log')
    ax.set_yscale('log')
    ax.set_xlabel('bottleneck length m', fontsize=10)
    ax.set_ylabel('spectral norm', fontsize=10)
    ax.set_title(title, fontsize=10)
    ax.tick_params(labelsize=9.5)
    ax.grid(alpha=0.3, which='both')
    ax.legend(fontsize=9.5)
    return fig


def parse_args(argv=None):
    p = make_parser(__doc__)
    p.add_argument('--source', choices=['field', 'model'], default='field')
    p.add_argument(
        '--lengths',
        nargs='+',
        type=int,
        default=[16, 49, 100, 196, 400, 784, 1024],
        help='bottleneck lengths m (squares)')
    p.add_argument(
        '--samples',
        type=int,
        default=5,
        help='samples (fields, or images) per length')
    p.add_argument(
        '--iters', type=int, default=20, help='Newton-Raphson iterations')
    p.add_argument('--dims', type=int, default=32, help='field: channels d')
    p.add_argument(
        '--spread',
        type=float,
        default=4.0,
        help='field: mean ||x - y||^2 / 2 of independent points')
    p.add_argument(
        '--bandwidth',
        type=float,
        default=2.0,
        help='field: frequency scale (cycles per image)')
    p.add_argument(
        '--features',
        type=int,
        default=64,
        help='field: random Fourier features')
    p.add_argument('--seed', type=int, default=0)
    add_model_arguments(p, 'soft_tiny_norm')
    add_stage_argument(p, 2, 'model: stage (0-based) whose bottleneck is used')
    p.add_argument('--out', default='work_dirs/spectral_norm')
    args = p.parse_args(argv)
    for m in args.lengths:
        if int(round(m**0.5))**2 != m:
            p.error(f'bottleneck length {m} is not a square')
    return args


def main(argv=None):
    args = parse_args(argv)
    gen = torch.Generator().manual_seed(args.seed)
    rows, t0 = [], time.time()
    for m in args.lengths:
        g = int(round(m**0.5))
        if args.source == 'field':
            Ls = [
                field_landmarks(g, args.dims, args.spread, args.bandwidth,
                                args.features, gen)
                for _ in range(args.samples)
            ]
            where = 'field'
        else:
            Ls, size = model_landmarks(args, g)
            where = f'{size}x{size} images'
        for j, L in enumerate(Ls):
            rows.append(dict(m=m, sample=j, **norms(L, args.iters)))
        rs = rows[-len(Ls):]
        print(
            f'm={m:5d} ({where}, {len(Ls)} samples): '
            f'||A^+|| {sum(r["pinv"] for r in rs) / len(rs):10.3g}   '
            f'||D^-1/2 A^+ D^-1/2|| '
            f'{sum(r["norm_pinv"] for r in rs) / len(rs):10.3g}   '
            f'({time.time() - t0:.0f}s)',
            flush=True)
    if args.source == 'field':
        title = (f'smooth random-field landmarks (d={args.dims}, '
                 f'spread={args.spread}, bandwidth={args.bandwidth})')
    else:
        ck = osp.basename(args.checkpoint) if args.checkpoint else \
            'random init'
        title = f'{args.config or args.model} ({ck}), stage {args.stage + 1}'
    write_results(args.out, 'spectral_norm',
                  rows, ['m', 'sample'] + list(KEYS),
                  to_markdown(rows, args.lengths),
                  plot(rows, args.lengths, title))
    return rows


if __name__ == '__main__':
    from mmsoft_tools.cli import run_main
    run_main(main)  # expected failures (a config's syntax error): one line
