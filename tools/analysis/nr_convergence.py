"""Newton-Raphson convergence on real images (NeurIPS / IJCV Fig. 4).

For every image, every SOFT layer and head of stages 1-3, the bottleneck
matrix A = exp(Q~ (-) Q~) the model builds is taken (a forward hook on the
bottleneck sampler), and the convergence metric of the papers

    ||A A_k A - A||_2 / ||A||_2,     k = 0 .. T

(:func:`projects.nr_diagnostics.pinv_convergence`, with the model's own
alpha initialisation) is recorded.
The plot shows, per stage, the mean over
images x layers x heads (line) and the min-max band, one panel per image
set (Fig. 4 of the IJCV paper: ImageNet, COCO, ADE20K).

    python tools/analysis/nr_convergence.py --model soft_tiny_norm \\
        --checkpoint weights/soft_tiny_norm.pth --images data/imagenet/val
    python tools/analysis/nr_convergence.py --images coco=data/coco/val2017 \\
        ade=data/ade/images/validation --num-images 100
    python tools/analysis/nr_convergence.py   # demo data / synthetic scenes

Images: any folders (searched recursively for jpg / png / bmp), optionally
named ``name=DIR``; by default the demo data sets under ``data/demo`` (see
``tools/misc/make_demo_data.py``) if present, else synthetic scenes drawn in
memory. Without ``--checkpoint`` the model is randomly initialised (the
metric then describes an untrained model; a warning is printed).
Checkpoints in mmsoft format (convert official ones with
``tools/model_converters/soft2mmsoft.py``); ``backbone.`` prefixes are
stripped. Writes ``nr_convergence.csv``, ``.md`` and ``.png`` to ``--out``.
"""
import argparse
import io
import os.path as osp
import sys
import time
from collections import defaultdict

import torch

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (add_hw_argument, add_model_arguments, build_model,
                             image_sets, load_rgb, make_parser, pyplot,
                             soft_attention_modules, to_tensor, write_results)


def batches(items, size, batch_size):
    for i in range(0, len(items), batch_size):
        chunk = items[i:i + batch_size]
        yield i, torch.stack([to_tensor(load_rgb(it), size) for it in chunk])


@torch.no_grad()
def collect(model, images, size, iters, batch_size, label=''):
    """{stage: tensor (num_matrices, iters + 1)} of convergence metrics."""
    from mmsoft.models.layers import gaussian_kernel
    from projects.nr_diagnostics import pinv_convergence  # the checkout's
    mods = soft_attention_modules(model)
    if not mods:
        raise ValueError("the model has no SOFT attention (attn_cfg type "
                         "must be 'SOFTAttention')")
    per_stage = defaultdict(list)
    handles = []
    for stage, _, attn in mods:

        def hook(mod, args, out, stage=stage, attn=attn):
            lm = out.double()
            A = gaussian_kernel(lm, lm)
            res = pinv_convergence(A, iters, attn.nr_init)
            per_stage[stage].append(res.reshape(-1, iters + 1).float())

        handles.append(attn.sampler.register_forward_hook(hook))
    t0 = time.time()
    try:
        for i, x in batches(images, size, batch_size):
            model(x)
            done = min(i + batch_size, len(images))
            print(
                f'  {label} {done}/{len(images)} images '
                f'({time.time() - t0:.0f}s)',
                flush=True)
    finally:
        for h in handles:
            h.remove()
    return {s: torch.cat(v) for s, v in sorted(per_stage.items())}


# ------------------------------------------------------------------ output
def summarise(results, iters):
    rows = []
    for ds, stages in results.items():
        for s, M in stages.items():
            for k in range(iters + 1):
                col = M[:, k]
                rows.append(
                    dict(
                        dataset=ds,
                        stage=s + 1,
                        k=k,
                        mean=col.mean().item(),
                        min=col.min().item(),
                        max=col.max().item(),
                        matrices=M.shape[0]))
    return rows


def to_markdown(rows, iters):
    ks = sorted({0, 1, 5, 10, 15, 20, iters} & set(range(iters + 1)))
    out = io.StringIO()
    out.write('| data | stage | ' + ' | '.join(f'k={k}' for k in ks) +
              ' | max at k=' + str(iters) + ' |\n')
    out.write('|---|---|' + '---|' * (len(ks) + 1) + '\n')
    keyed = {(r['dataset'], r['stage'], r['k']): r for r in rows}
    for ds, st in sorted({(r['dataset'], r['stage']) for r in rows}):
        cells = [f"{keyed[(ds, st, k)]['mean']:.2e}" for k in ks]
        out.write(f'| {ds} | {st} | ' + ' | '.join(cells) +
                  f" | {keyed[(ds, st, iters)]['max']:.2e} |\n")
    out.write('\nmean of ||A A_k A - A||_2 / ||A||_2 over images x layers '
              'x heads.\n')
    return out.getvalue()


def plot(rows, title):
    sets = list(dict.fromkeys(r['dataset'] for r in rows))  # given order
    # at most 3 panels a row, 8 in wide: legible at the docs' page width
    ncol = min(3, len(sets))
    nrow = -(-len(sets) // ncol)
    fig, axes = pyplot().subplots(
        nrow, ncol, figsize=(8, 3.4 * nrow + 0.5), squeeze=False, sharey=True)
    for ax in axes.flat[len(sets):]:
        ax.axis('off')
    for ax, ds in zip(axes.flat, sets):
        for st in sorted({r['stage'] for r in rows if r['dataset'] == ds}):
            rs = sorted(
                (r for r in rows if r['dataset'] == ds and r['stage'] == st),
                key=lambda r: r['k'])
            k = [r['k'] for r in rs]
            floor = 1e-17
            ax.plot(
                k, [max(r['mean'], floor) for r in rs], label=f'stage {st}')
            ax.fill_between(
                k, [max(r['min'], floor) for r in rs],
                [max(r['max'], floor) for r in rs],
                alpha=0.25)
        ax.set_yscale('log')
        ax.set_xlabel('NR iteration k', fontsize=10)
        ax.set_title(f'{ds}', fontsize=10.5)
        ax.tick_params(labelsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    for row in axes:
        row[0].set_ylabel(r'$\|A A_k A - A\|_2\,/\,\|A\|_2$', fontsize=10)
    fig.suptitle(title, fontsize=11)
    return fig


def parse_args(argv=None):
    p = make_parser(__doc__)
    add_model_arguments(
        p,
        'soft_tiny_norm',
        helps=dict(model='soft_<arch>[_norm] (default soft_tiny_norm)'))
    p.add_argument('--num-images', type=int, default=100)
    add_hw_argument(p)
    p.add_argument('--iters', type=int, default=20)
    p.add_argument('--batch-size', type=int, default=8)
    p.add_argument(
        '--arch', default=None,
        help=argparse.SUPPRESS)  # dict arch for tests (json)
    p.add_argument('--out', default='work_dirs/nr_convergence')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.manual_seed(0)
    overrides = dict(out_indices=(2, ))  # stages 1-3 hold SOFT attention
    if args.arch:
        import json
        overrides['arch'] = json.loads(args.arch)
    model = build_model(args.model, args.config, args.checkpoint, **overrides)
    sets = image_sets(args.images, args.num_images)
    print(
        f'{sum(len(v) for _, v in sets)} images in {len(sets)} set(s), '
        f'{args.size[0]}x{args.size[1]}, T={args.iters}',
        flush=True)
    results = {}
    for name, items in sets:
        results[name] = collect(model, items, tuple(args.size), args.iters,
                                args.batch_size, name)
    rows = summarise(results, args.iters)
    label = args.config or args.model
    ck = (
        osp.basename(args.checkpoint)
        if args.checkpoint else 'RANDOM WEIGHTS, untrained')
    fig = plot(rows, f'{label} ({ck}), {args.size[0]}x{args.size[1]}')
    write_results(args.out, 'nr_convergence', rows,
                  ['dataset', 'stage', 'k', 'mean', 'min', 'max', 'matrices'],
                  to_markdown(rows, args.iters), fig)
    return rows


if __name__ == '__main__':  # a refused file: one line
    from mmsoft_tools.cli import run_main
    run_main(main)
