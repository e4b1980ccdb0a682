"""Each pseudo-inverse method against the official function, per layer.

Runs a SOFT backbone (default SOFT-Small-Norm; random weights, or
``--checkpoint``) on a natural-looking image at each ``--sizes`` entry,
records the inputs (q, landmarks, v) of every SOFT attention, and for each
layer and method (``--methods``; ``auto`` is the default dispatch) prints

* ``out``: max |out - ref| / max |ref| of the attention output P A^+_n P^T V
  in float32 against a float64 evaluation of the official 20 steps
  (``method='iterative'`` in float64: the authors' ``newton_inv``), by the
  training path (with a gradient: ``KernelAttention``);
* ``eval``: the same for the output without a gradient (inference: P
  never formed above ``FUSED_MIN_ENTRIES``);
* ``grad``: the same for the gradient of <G, out> (G fixed random) with
  respect to q, landmarks and v, against float64 autograd through the 20
  steps with alpha differentiated as in the official code (the default
  ``nr_backward`` of the Norm variant, ``'exact'``; ``--backward eq16``
  measures Eq. 16 instead);
* the Krylov dimension of block Lanczos (the most of any matrix) and
  the time of one forward.

    python tools/analysis/nr_accuracy.py --sizes 224x224 512x512 800x1216
    python tools/analysis/nr_accuracy.py --sizes 800x1216 --layers 0 4 \\
        --methods auto lanczos spectral --out work_dirs/nr_accuracy
    python tools/analysis/nr_accuracy.py --config CFG --checkpoint CKPT

Writes ``<out>/nr_accuracy.csv`` / ``.md`` with ``--out``. The issue's
bounds: out <= 1e-5, grad <= 1e-4 (docs/en/benchmarks.md).
"""
import os.path as osp
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (build_model, image_sets, load_rgb, make_parser,
                             to_tensor, write_results)

FIELDS = [
    'size', 'layer', 'm', 'matrices', 'method', 'resolved', 'krylov',
    'out_err', 'eval_err', 'grad_err', 'ms'
]


def parse_args(argv=None):
    p = make_parser(__doc__)
    p.add_argument('--model', default='soft_small_norm')
    p.add_argument('--checkpoint', default=None)
    p.add_argument(
        '--config',
        default=None,
        help='take the backbone of this config instead of --model (e.g. '
        'a demo work dir\'s config, with its --checkpoint)')
    p.add_argument('--sizes', nargs='+', default=['224x224', '512x512'])
    p.add_argument(
        '--methods',
        nargs='+',
        default=['auto', 'lanczos', 'spectral', 'iterative'],
        choices=['auto', 'lanczos', 'spectral', 'iterative'])
    p.add_argument('--backward', default='exact', choices=['exact', 'eq16'])
    p.add_argument(
        '--layers',
        type=int,
        nargs='*',
        default=None,
        help='layer indices (default: all)')
    p.add_argument('--no-grad', action='store_true', help='outputs only')
    p.add_argument('--threads', type=int, default=None)
    p.add_argument('--out', default=None)
    return p.parse_args(argv)


def record_inputs(model, x):
    """[(attention, q, landmarks, v)] of every SOFT attention's forward."""
    import importlib

    import torch
    sa = importlib.import_module('mmsoft.models.layers.soft_attention')
    seen, orig = [], sa.soft_attention

    def spy(q, landmarks, v, attn_norm=True, nr=None):
        seen.append(
            (attn_norm, nr, q.detach(), landmarks.detach(), v.detach()))
        return orig(q, landmarks, v, attn_norm, nr)

    sa.soft_attention = spy
    try:
        with torch.no_grad():
            model(x)
    finally:
        sa.soft_attention = orig
    return seen


def evaluate(inputs, attn_norm, nr, G, grad):
    """(out, grads of <G, out> w.r.t. the inputs or None, seconds)."""
    import torch

    from mmsoft.models.layers.soft_attention import soft_attention
    ins = [t.clone().requires_grad_(grad) for t in inputs]
    t0 = time.perf_counter()
    with torch.set_grad_enabled(grad):
        out = soft_attention(*ins, attn_norm, nr)
    seconds = time.perf_counter() - t0
    grads = torch.autograd.grad((out * G.to(out.dtype)).sum(), ins) \
        if grad else None
    return out.detach(), grads, seconds


def rel(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


def main(argv=None):
    args = parse_args(argv)
    import torch

    from mmsoft.models.layers import gaussian_kernel
    from mmsoft.models.layers.nr import (nr_init_alpha, nr_iteration_matrix,
                                         resolve_method)
    from mmsoft.models.layers.nr_spectral import krylov_basis
    if args.threads:
        torch.set_num_threads(args.threads)
    model = build_model(
        None if args.config else args.model,
        config=args.config,
        checkpoint=args.checkpoint)
    rgb = load_rgb(image_sets([], 1)[0][1][0])
    rows = []
    for size in args.sizes:
        hw = tuple(int(s) for s in size.lower().split('x'))
        x = to_tensor(rgb, hw)[None]
        layers = record_inputs(model, x)
        for i, (attn_norm, nr, q, lm, v) in enumerate(layers):
            if args.layers is not None and i not in args.layers:
                continue
            g = torch.Generator().manual_seed(i)
            G = torch.randn(q.shape[:-1] + v.shape[-1:], generator=g)
            ref_nr = nr.replace(method='iterative', backward='exact')
            ref, ref_grads, _ = evaluate([t.double() for t in (q, lm, v)],
                                         attn_norm, ref_nr, G,
                                         not args.no_grad)
            A = gaussian_kernel(lm, lm)
            m = A.shape[-1]
            W = gaussian_kernel(q, lm).transpose(-1, -2) @ v  # P^T V
            if attn_norm:
                W = A.sum(-1, keepdim=True).rsqrt() * W  # D^-1/2 P^T V
            for method in args.methods:
                run = nr.replace(method=method, backward=args.backward)
                resolved = resolve_method(method, A)
                basis = krylov_basis(
                    nr_iteration_matrix(A, nr.init).reshape(-1, m, m),
                    W.reshape(-1, m, v.shape[-1]),
                    nr_init_alpha(A, nr.init).reshape(-1),
                    nr.iters) if resolved == 'lanczos' else None
                out, grads, sec = evaluate([q, lm, v], attn_norm, run, G,
                                           not args.no_grad)
                inference = evaluate([q, lm, v], attn_norm, run, G, False)[0]
                row = dict(
                    size=size,
                    layer=i,
                    m=m,
                    matrices=A[..., 0, 0].numel(),
                    method=method,
                    resolved=resolved,
                    krylov=basis.Q.shape[-1] if basis else '',
                    out_err=f'{rel(out, ref):.2e}',
                    eval_err=f'{rel(inference, ref):.2e}',
                    grad_err=
                    f'{max(rel(a, b) for a, b in zip(grads, ref_grads)):.2e}'  # noqa: E501
                    if grads else '',
                    ms=f'{sec * 1e3:.0f}')
                rows.append(row)
                print(' '.join(f'{k}={v}' for k, v in row.items()), flush=True)
    if args.out:
        header = '| ' + ' | '.join(FIELDS) + ' |\n|' + '---|' * len(FIELDS)
        md = '\n'.join([header] + [
            '| ' + ' | '.join(str(r[f]) for f in FIELDS) + ' |' for r in rows
        ]) + '\n'
        for path in write_results(args.out, 'nr_accuracy', rows, FIELDS, md):
            print(f'wrote {path}')
    return 0


if __name__ == '__main__':  # a refused file: one line
    from mmsoft_tools.cli import run_main
    run_main(main)
