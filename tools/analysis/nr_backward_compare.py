"""Eq. 16 vs the exact gradient of the Newton-Raphson iterations (issue 14).

For a SOFT backbone (default SOFT-Small-Norm, random initialisation: no
trained weights offline) on a natural-looking synthetic image (a rendered
scene of :mod:`demo_synthetic`: textured background,
clutter and shaded objects) at each ``--sizes`` entry, prints

* the NR convergence per stage (``projects.nr_diagnostics.NRRecorder``: the
  paper's ||A A_T A - A||_2 / ||A||_2 and the unconverged fraction of A's
  rank);
* the relative error ||g_eq16 - g_exact|| / ||g_exact|| and the cosine of
  the whole-backbone parameter gradient, Eq. 16 (``nr_backward='eq16'``)
  vs the exact gradient of the 20 iterations (``'exact'``), for a fixed
  random upstream gradient on the four output maps, and the same per
  stage;
* forward and backward times of both (CPU seconds of the process, robust
  to other jobs on a shared machine; median of ``--repeats``, measured
  alternately in one process) and the ratio exact / Eq. 16;
* with ``--parity``: max |out - ref| / max |ref| of the default rule
  (``'soft_norm_per_sample'``, float32 and float64) and of
  ``'soft_norm_per_matrix'`` (float32) against a float64 reference of the
  official rule per sample (the official alpha loop with the explicit
  residual I - alpha A A; the 20 iterations evaluated on the float64
  eigenvalues, which equals the explicit iterations to ~1e-9, see
  tests/test_models/test_layers/test_pinv.py).

* with ``--train-demo``: trains the demo detection task
  (``configs/demo/retinanet_soft_demo.py``, RetinaNet + a small SOFT on the
  synthetic COCO-format data of ``make demo``) twice, same seed and
  iterations, with ``nr_backward='eq16'`` and ``'exact'``, and prints bbox
  mAP and training time of both (and the NR convergence the
  ``projects.nr_diagnostics.NRResidualHook`` logged).

  ``--smoke``: 3 iterations on 16 + 8 images (a plumbing check, as
  ``tools/demo.py --smoke``).

    python tools/analysis/nr_backward_compare.py --threads 2
    python tools/analysis/nr_backward_compare.py --sizes 224x224 --parity
    python tools/analysis/nr_backward_compare.py --sizes --train-demo
"""
import argparse
import os.path as osp
import statistics
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (add_timing_arguments, attn_cfg_of, demo_data_root,
                             make_parser, normalize)

#: ``--smoke`` demo data (images per split), as ``tools/demo.py --smoke``
SMOKE_DATA = dict(num_train=16, num_val=8)


def hw_size(text):
    """``HxW`` -> (H, W)."""
    try:
        h, w = (int(s) for s in text.lower().split('x'))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not HxW (e.g. 224x224)') from None
    return h, w


def parse_args(argv=None):
    p = make_parser(__doc__)
    p.add_argument(
        '--arch', default='small', help='a SOFT preset (SOFT.arch_zoo)')
    p.add_argument(
        '--sizes',
        nargs='*',
        type=hw_size,
        default=[(224, 224), (800, 1216)],
        help='HxW input sizes (none: skip the gradient part)')
    add_timing_arguments(p, repeats=2, with_device=False)
    p.add_argument('--seed', type=int, default=0)
    p.add_argument('--nr-method', default='auto')
    p.add_argument(
        '--no-grad-compare',
        action='store_true',
        help='skip the gradient / timing part (e.g. with '
        '--parity only)')
    p.add_argument(
        '--parity',
        action='store_true',
        help='also compare the forward with a float64 reference '
        'of the official per-sample rule')
    p.add_argument(
        '--train-demo',
        action='store_true',
        help='train the demo detection task with both backward '
        'passes and print bbox mAP')
    p.add_argument(
        '--smoke',
        action='store_true',
        help='with --train-demo: 3 iterations on 16 + 8 images (data in '
        '<data>-smoke)')
    p.add_argument(
        '--data',
        default=None,
        help='demo data root, generated if missing (default: data/demo of '
        'the checkout, else of the working directory)')
    p.add_argument('--work-dir', default='work_dirs/nr_backward')
    args = p.parse_args(argv)
    if args.data is None:
        args.data = demo_data_root()
    return args


def natural_image(h, w, seed=0):
    """(1, 3, h, w) normalised float image of a rendered synthetic scene."""
    import numpy as np

    import demo_synthetic
    render_scene = demo_synthetic.render_scene
    side = max(h, w)
    scale = side / 160
    rng = np.random.default_rng(seed)
    img, _, _ = render_scene(
        rng, side, objects=(4, 9), radius=(10 * scale, 38 * scale))
    return normalize(img[:h, :w, ::-1])[None]  # BGR -> RGB, crop


def build(arch, seed, **attn_options):
    """SOFT-Norm ``arch`` with seeded weights and SOFT-attention options."""
    import torch

    from analysis.common import quiet_init_weights
    from mmsoft.models.backbones import SOFT
    torch.manual_seed(seed)
    model = SOFT(arch, attn_cfg=dict(attn_cfg_of('soft_norm'), **attn_options))
    quiet_init_weights(model)
    return model.eval()


def param_groups(model):
    """name -> list of parameters of stage i (patch embedding + blocks)."""
    groups = {}
    for name, p in model.named_parameters():
        key = f'stage{int(name.split(".")[1]) + 1}'  # stages.<i>.*
        groups.setdefault(key, []).append(p)
    return groups


def run_grad(model, x, upstream):
    """(forward s, backward s, {group: flat grad}) of one training step.

    Times are CPU seconds of this process (``time.process_time``): on a
    shared machine they do not count the time other jobs hold the cores
    (wall-clock times are printed too)."""
    import torch
    model.zero_grad(set_to_none=True)
    w0, t0 = time.perf_counter(), time.process_time()
    outs = model(x)
    w1, t1 = time.perf_counter(), time.process_time()
    loss = sum((o * u).sum() for o, u in zip(outs, upstream))
    loss.backward()
    w2, t2 = time.perf_counter(), time.process_time()
    grads = {
        k: torch.cat([p.grad.flatten() for p in ps])
        for k, ps in param_groups(model).items()
    }
    return t1 - t0, t2 - t1, grads, (w1 - w0, w2 - w1)


def official_alpha(A):
    """The official alpha loop on one sample's (h, m, m) stack."""
    import torch
    eye = torch.eye(A.shape[-1], dtype=A.dtype)
    AA = A @ A
    alpha = 2 / A.sum(-1).max()**2
    n = 0
    while (eye - alpha * AA).abs().sum(-2).max() > 1.01 and n < 10:
        alpha, n = alpha * 0.5, n + 1
    return alpha


def official_reference(iters):
    """An NR setting (:class:`~mmsoft.models.layers.nr.NRConfig`) whose
    ``apply`` is the float64 official rule per sample: alpha from the
    official loop, A_T W from the T iterations on the eigenvalues of A.
    Built into a model's SOFT attentions (``nr=``), it makes the model the
    reference of :func:`parity` (``attn_norm`` applies D^-1/2 around
    it, as for any setting)."""
    from mmsoft.models.layers.nr import NRConfig

    class OfficialReference(NRConfig):

        def apply(self, A, W):
            import torch
            A, W = A.double(), W.double()
            out = []
            for b in range(A.shape[0]):
                P = A[b]
                alpha = official_alpha(P)
                lam, U = torch.linalg.eigh(P)
                v = alpha * lam
                for _ in range(self.iters):
                    v = 2 * v - v * v * lam
                out.append(U @ (v[..., None] * (U.mT @ W[b])))
            return torch.stack(out)

    return OfficialReference(iters=iters)


def parity(args, x):
    import torch
    rows = []
    with torch.no_grad():
        outs = {}
        for rule in ('soft_norm_per_sample', 'soft_norm_per_matrix'):
            outs[f'{rule} (float32)'] = build(
                args.arch, args.seed, nr_init=rule, nr_method=args.nr_method)(
                    x)
        # float64: separates the rule from float32 rounding
        outs['soft_norm_per_sample (float64)'] = build(
            args.arch, args.seed, nr_method=args.nr_method).double()(
                x.double())
        ref_model = build(args.arch, args.seed, nr=official_reference(20))
        ref = ref_model.double()(x.double())
    for rule, out in outs.items():
        errs = [((o.double() - r).abs().max() / r.abs().max()).item()
                for o, r in zip(out, ref)]
        rows.append((rule, max(errs)))
    return rows


def grad_compare(args, x):
    """Convergence, gradient error and backward cost at one size."""
    import torch

    from projects.nr_diagnostics import NRRecorder
    models = {
        b:
        build(args.arch, args.seed, nr_backward=b, nr_method=args.nr_method)
        for b in ('eq16', 'exact')
    }
    g = torch.Generator().manual_seed(args.seed + 1)
    with torch.no_grad(), NRRecorder(models['eq16']) as rec:
        shapes = [o.shape for o in models['eq16'](x)]
    upstream = [torch.randn(s, generator=g) for s in shapes]
    for stage, v in rec.stats.items():
        print(
            f'{stage}: NR residual {v["residual"]:.2e}, unconverged '
            f'{v["unconverged"]:.1%} of the rank',
            flush=True)
    times = {b: ([], []) for b in models}
    grads = {}
    for r in range(args.repeats):
        for b in (('eq16', 'exact') if r % 2 == 0 else ('exact', 'eq16')):
            tf, tb, gr, wall = run_grad(models[b], x, upstream)
            times[b][0].append(tf)
            times[b][1].append(tb)
            grads[b] = gr
            print(
                f'  run {r}: {b:5s} forward {tf:.2f} s, backward '
                f'{tb:.2f} s CPU (wall {wall[0]:.2f} / {wall[1]:.2f} '
                f's)',
                flush=True)
    print('gradient, Eq. 16 vs exact (relative error, cosine):')
    flat = {b: torch.cat(list(grads[b].values())) for b in grads}
    for key in list(grads['exact']) + ['backbone']:
        ge = flat['exact'] if key == 'backbone' else grads['exact'][key]
        g16 = flat['eq16'] if key == 'backbone' else grads['eq16'][key]
        rel = ((g16 - ge).norm() / ge.norm()).item()
        cos = torch.nn.functional.cosine_similarity(g16.double(), ge.double(),
                                                    0).item()
        print(f'  {key:9s} rel. error {rel:.3e}  cosine {cos:.6f}')
    med = {
        b: (statistics.median(t[0]), statistics.median(t[1]))
        for b, t in times.items()
    }
    print(
        f'backward (CPU s): eq16 {med["eq16"][1]:.2f} s, exact '
        f'{med["exact"][1]:.2f} s, ratio '
        f'{med["exact"][1] / med["eq16"][1]:.2f}x (forward eq16 '
        f'{med["eq16"][0]:.2f} s, exact {med["exact"][0]:.2f} s)',
        flush=True)


def main(argv=None):
    args = parse_args(argv)
    import torch
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f'SOFT-{args.arch}-Norm, random init (seed {args.seed}), '
        f'{torch.get_num_threads()} threads, nr_method={args.nr_method}',
        flush=True)
    for h, w in args.sizes:
        x = natural_image(h, w, args.seed)
        print(f'\n== {h} x {w}', flush=True)
        if not args.no_grad_compare:
            grad_compare(args, x)
        if args.parity:
            for rule, err in parity(args, x):
                print(
                    f'parity vs float64 official per-sample rule: {rule} '
                    f'{err:.2e}',
                    flush=True)
    if args.train_demo:
        return train_demo(args)


def train_demo(args):
    """Demo detection, same seed, Eq. 16 vs exact backward; returns the
    rows (nr_backward, bbox mAP, bbox mAP@0.5, train s)."""
    import demo_synthetic
    import demo_tasks
    import projects.nr_diagnostics  # noqa: F401 (NRResidualHook)
    make_demo_data, T = demo_synthetic.make_demo_data, demo_tasks
    data = args.data + ('-smoke' if args.smoke else '')
    made = make_demo_data(
        data,
        seed=args.seed,
        tasks=('det', ),
        overrides=dict(det=dict(SMOKE_DATA)) if args.smoke else None)
    cfg = T.load_demo_config('det')
    if args.smoke:
        T.shrink_for_smoke(cfg)
    rows = []
    for b in ('eq16', 'exact'):
        print(f'\n== demo detection, nr_backward={b!r}', flush=True)
        res = T.run_task(
            'det',
            made['det']['path'],
            osp.join(args.work_dir, b),
            cfg=cfg,
            seed=args.seed,
            cfg_options={
                'model.backbone.attn_cfg.nr_backward': b,
                'custom_hooks': [dict(type='NRResidualHook', interval=100)]
            })
        m = res['metrics']
        rows.append((b, m.get('coco/bbox_mAP', float('nan')),
                     m.get('coco/bbox_mAP_50', float('nan')), res['train_s']))
    print('\n| nr_backward | bbox mAP | bbox mAP@0.5 | train s |')
    print('|---|---|---|---|')
    for b, ap, ap50, t in rows:
        print(f'| {b} | {ap:.3f} | {ap50:.3f} | {t:.0f} |')
    return rows


if __name__ == '__main__':
    main()
