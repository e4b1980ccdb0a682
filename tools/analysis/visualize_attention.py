"""Attention heatmaps of a query patch, per head, for the zoo (Fig. 3).

For each model, the tokens entering the attention of one layer (``--stage``,
``--layer``) are captured, and the row of the query token (``--query``, the
cross) is computed with ``AttentionBase.attention_row``: the weights with
which the query mixes all H x W value tokens (SOFT: row i of P A_n^+ P^T,
computed in O(n m) without the n x n matrix; Linformer: its weights over
the reduced tokens spread over their cells). Each head's row is upsampled
to the image and overlaid on it.

    python tools/analysis/visualize_attention.py --image cat.jpg \\
        --models softmax_tiny performer_tiny nystromformer_tiny \\
        soft_tiny_norm --checkpoints soft_tiny_norm=weights/soft_tiny.pth
    python tools/analysis/visualize_attention.py --models sima_small \\
        --stage 2 --query 0.3 0.6 --heads 4

Model names as in ``get_flops.py`` (``<attn>_<arch>[_norm]``); without a
checkpoint a model is randomly initialised (the maps then show the
untrained inductive bias only). Colours are min-max normalised per panel
(SOFT and SimA weights may be negative); the CSV / markdown give raw
statistics per head: sum, min, max, weight at the query, argmax position,
entropy of |w| / sum |w| and the |w|-weighted mean distance to the query
(in tokens). Writes ``attention.png``, ``attention.csv``, ``attention.md``
and the raw rows ``attention_rows.npz`` to ``--out``.
"""
import io
import math
import os.path as osp
import sys
import time

import numpy as np
import torch

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (add_hw_argument, add_stage_argument, make_parser,
                             pyplot, write_results)

DEFAULT_MODELS = [
    'softmax_tiny', 'performer_tiny', 'nystromformer_tiny', 'soft_tiny_norm'
]


def capture_row(model, img: torch.Tensor, stage: int, layer: int, query_rel):
    """(row (h, H, W) numpy, hw, (qy, qx)) for one image (1, 3, H, W)."""
    blk = model.stages[stage].blocks[layer]
    got = {}

    def pre_hook(mod, args):
        got['x'], got['hw'] = args[0].detach(), tuple(args[1])

    h = blk.attn.register_forward_pre_hook(pre_hook)
    try:
        with torch.no_grad():
            model(img)
    finally:
        h.remove()
    H, W = got['hw']
    qy = min(H - 1, max(0, int(query_rel[0] * H)))
    qx = min(W - 1, max(0, int(query_rel[1] * W)))
    row = blk.attn.attention_row(got['x'], (H, W), (qy, qx))
    return row[0].reshape(-1, H, W).double().numpy(), (H, W), (qy, qx)


def head_stats(w: np.ndarray, q):
    """Statistics of one head's (H, W) row."""
    H, W = w.shape
    a = np.abs(w)
    p = a / max(a.sum(), 1e-30)
    ent = float(-(p[p > 0] * np.log(p[p > 0])).sum())
    yy, xx = np.mgrid[0:H, 0:W]
    dist = float((p * np.hypot(yy - q[0], xx - q[1])).sum())
    am = np.unravel_index(int(np.argmax(w)), w.shape)
    return dict(
        sum=float(w.sum()),
        min=float(w.min()),
        max=float(w.max()),
        at_query=float(w[q]),
        argmax_y=int(am[0]),
        argmax_x=int(am[1]),
        entropy=ent,
        uniform_entropy=math.log(H * W),
        mean_dist=dist)


def overlay(ax, rgb, w, q, hw, title):
    import cv2
    Hi, Wi = rgb.shape[:2]
    lo, hi = float(w.min()), float(w.max())
    norm = (w - lo) / (hi - lo) if hi > lo else np.zeros_like(w)
    heat = cv2.resize(
        norm.astype(np.float32), (Wi, Hi), interpolation=cv2.INTER_LINEAR)
    ax.imshow(rgb)
    ax.imshow(heat, cmap='jet', alpha=0.5, vmin=0, vmax=1)
    H, W = hw
    ax.plot(
        (q[1] + 0.5) * Wi / W, (q[0] + 0.5) * Hi / H,
        '+',
        c='w',
        ms=14,
        mew=2.5)
    ax.set_title(title, fontsize=9)
    ax.axis('off')


def parse_args(argv=None):
    p = make_parser(__doc__)
    p.add_argument(
        '--image',
        default=None,
        help='image file (default: a synthetic demo scene)')
    p.add_argument('--models', nargs='+', default=DEFAULT_MODELS)
    p.add_argument(
        '--checkpoints',
        nargs='+',
        default=[],
        help='name=path pairs (models without one are random)')
    add_stage_argument(p, 1, 'stage (0-based) of the attention layer')
    p.add_argument(
        '--layer',
        type=int,
        default=-1,
        help='layer within the stage (default: last)')
    p.add_argument(
        '--query',
        nargs=2,
        type=float,
        default=[0.5, 0.5],
        metavar=('Y', 'X'),
        help='query position relative to the image, in [0, 1)')
    p.add_argument(
        '--heads', type=int, default=4, help='heads to show (the first ones)')
    add_hw_argument(p)
    p.add_argument(
        '--seed',
        type=int,
        default=0,
        help='random init / synthetic image seed')
    p.add_argument('--out', default='work_dirs/visualize_attention')
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from analysis.common import build_model, load_rgb, to_tensor
    from mmsoft.utils.atomic import atomic_path
    ckpts = {}
    for spec in args.checkpoints:
        name, sep, path = spec.partition('=')
        if not sep:
            raise SystemExit(f'--checkpoints takes name=path, got {spec!r}')
        ckpts[name] = path
    if args.image:
        rgb = load_rgb(args.image)
    else:
        import demo_synthetic
        render_scene = demo_synthetic.render_scene
        rgb = render_scene(np.random.default_rng([args.seed, 3]),
                           224)[0][..., ::-1].copy()
    import cv2
    rgb = cv2.resize(rgb, (args.size[1], args.size[0]))
    img = to_tensor(rgb, tuple(args.size))[None]
    rows, raw, t0 = [], {}, time.time()
    panels = []
    for i, name in enumerate(args.models, 1):
        torch.manual_seed(args.seed)
        model = build_model(
            name, checkpoint=ckpts.get(name), out_indices=(args.stage, ))
        w, hw, q = capture_row(model, img, args.stage, args.layer, args.query)
        raw[name] = w
        nh = min(args.heads, w.shape[0])
        for h in range(w.shape[0]):
            st = head_stats(w[h], q)
            rows.append(
                dict(
                    model=name,
                    stage=args.stage + 1,
                    layer=args.layer,
                    head=h,
                    query_y=q[0],
                    query_x=q[1],
                    map_h=hw[0],
                    map_w=hw[1],
                    checkpoint=ckpts.get(name, 'random init'),
                    **st))
        panels.append((name, w[:nh], hw, q))
        print(
            f'[{i}/{len(args.models)}] {name}: {w.shape[0]} heads on a '
            f'{hw[0]}x{hw[1]} map, query {q} ({time.time() - t0:.0f}s)',
            flush=True)
    ncol = 1 + max(p[1].shape[0] for p in panels)
    fig, axes = pyplot().subplots(
        len(panels),
        ncol,
        figsize=(2.2 * ncol, 2.4 * len(panels)),
        squeeze=False)
    for r, (name, w, hw, q) in enumerate(panels):
        ax = axes[r][0]
        ax.imshow(rgb)
        Hi, Wi = rgb.shape[:2]
        ax.plot(
            (q[1] + 0.5) * Wi / hw[1], (q[0] + 0.5) * Hi / hw[0],
            '+',
            c='r',
            ms=14,
            mew=2.5)
        tag = '' if name in ckpts else ' (random init)'
        ax.set_title(f'{name}{tag}', fontsize=9)
        ax.axis('off')
        for h in range(ncol - 1):
            if h < w.shape[0]:
                overlay(axes[r][h + 1], rgb, w[h], q, hw,
                        f'head {h}  [{w[h].min():.2g}, {w[h].max():.2g}]')
            else:
                axes[r][h + 1].axis('off')
    untrained = [p[0] for p in panels if p[0] not in ckpts]
    fig.suptitle(
        ('RANDOM WEIGHTS (untrained: what the tool draws, not what SOFT '
         'learns)\n' if untrained else '') +
        f'stage {args.stage + 1}, layer {args.layer}, query '
        f'(y, x) = ({args.query[0]:.2f}, {args.query[1]:.2f})',
        fontsize=11)
    fields = [
        'model', 'checkpoint', 'stage', 'layer', 'head', 'map_h', 'map_w',
        'query_y', 'query_x', 'sum', 'min', 'max', 'at_query', 'argmax_y',
        'argmax_x', 'entropy', 'uniform_entropy', 'mean_dist'
    ]
    md = io.StringIO()
    md.write('| model | head | sum | min | max | at query | argmax | '
             'entropy (uniform) | mean dist |\n')
    md.write('|---|---|---|---|---|---|---|---|---|\n')
    for r in rows:
        md.write(f"| {r['model']} | {r['head']} | {r['sum']:.3g} | "
                 f"{r['min']:.3g} | {r['max']:.3g} | {r['at_query']:.3g} | "
                 f"({r['argmax_y']}, {r['argmax_x']}) | {r['entropy']:.2f} "
                 f"({r['uniform_entropy']:.2f}) | {r['mean_dist']:.2f} |\n")
    write_results(args.out, 'attention', rows, fields, md.getvalue(), fig)
    npz = osp.join(args.out, 'attention_rows.npz')
    with atomic_path(npz, suffix='.npz') as tmp:  # np.savez adds no .npz
        np.savez_compressed(tmp, **raw)
    print(f'wrote {npz}')
    return rows


if __name__ == '__main__':  # a refused file: one line
    from mmsoft_tools.cli import run_main
    run_main(main)
