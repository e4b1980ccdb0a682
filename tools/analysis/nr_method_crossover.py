"""When is the spectral pseudo-inverse faster than the NR iterations?

Times :meth:`mmsoft.models.layers.nr.NRConfig.apply` (A^+ W, the
product SOFT attention needs) with ``method='iterative'`` (2T batched
m x m products) and ``method='spectral'`` (one ``eigh`` and a scalar
recurrence) for a range of bottleneck sizes m, on one device, and prints the
smallest m from which spectral wins at every larger size measured: the value
for :data:`mmsoft.models.layers.nr.SPECTRAL_MIN_M` (the ``'auto'``
rule)
on that machine. Both methods compute the same function; only speed
differs.

    python tools/analysis/nr_method_crossover.py --threads 2
    python tools/analysis/nr_method_crossover.py --device cuda --backward

Matrices are Gaussian-kernel Gram matrices of random landmarks (the
bottleneck matrices SOFT builds), ``--batch`` of them (batch x heads),
right-hand sides of width ``--head-dims``. Writes nothing; prints a table.
"""
import argparse
import os.path as osp
import statistics
import sys
import time

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import add_timing_arguments

METHODS = ('iterative', 'spectral')


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument(
        '--ms',
        type=int,
        nargs='+',
        default=[49, 64, 81, 100, 128, 196, 256, 400])
    p.add_argument(
        '--batch',
        type=int,
        default=16,
        help='matrices per call (batch x heads)')
    p.add_argument('--head-dims', type=int, default=32)
    p.add_argument('--iters', type=int, default=20)
    add_timing_arguments(p, repeats=5, device='cpu')
    p.add_argument(
        '--backward',
        action='store_true',
        help='time forward + backward (training) instead of '
        'forward only')
    return p.parse_args(argv)


def _sync(device):
    import torch
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_method(A, W, method, iters, backward, repeats):
    """Median seconds of one ``NRConfig.apply`` call (+ backward)."""
    import torch

    from mmsoft.models.layers.nr import NRConfig
    nr = NRConfig(iters, 'soft_norm_per_sample', method)

    def call():
        if backward:
            a = A.clone().requires_grad_()
            w = W.clone().requires_grad_()
            nr.apply(a, w).sum().backward()
        else:
            with torch.no_grad():
                nr.apply(A, W)

    call()  # warm-up (allocations, LAPACK / cuSOLVER handles)
    times = []
    for _ in range(repeats):
        _sync(A.device)
        t = time.perf_counter()
        call()
        _sync(A.device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def crossover(rows):
    """Smallest m from which spectral is faster at every larger m, or None.

    ``rows``: (m, iterative_s, spectral_s) sorted by m.
    """
    best = None
    for m, t_it, t_sp in reversed(rows):
        if t_sp < t_it:
            best = m
        else:
            break
    return best


def main(argv=None):
    args = parse_args(argv)
    import torch

    from mmsoft.models.layers import gaussian_kernel
    from mmsoft.models.layers.nr import SPECTRAL_MIN_M
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if min(args.ms) < 2:
        raise SystemExit('--ms: bottleneck sizes must be >= 2')
    g = torch.Generator().manual_seed(0)
    mode = 'forward + backward' if args.backward else 'forward'
    print(f'NRConfig.apply, {mode}, {args.batch} matrices per call, '
          f'd = {args.head_dims}, T = {args.iters}, device {device}, '
          f'{torch.get_num_threads()} threads')
    print('| m | iterative ms | spectral ms | iterative / spectral |')
    print('|---|---|---|---|')
    rows = []
    for m in sorted(args.ms):
        lm = torch.randn(args.batch, m, args.head_dims, generator=g)
        lm = (lm / args.head_dims**0.25).to(device)
        A = gaussian_kernel(lm, lm)
        W = torch.randn(args.batch, m, args.head_dims, generator=g).to(device)
        t = {
            meth: time_method(A, W, meth, args.iters, args.backward,
                              args.repeats)
            for meth in METHODS
        }
        rows.append((m, t['iterative'], t['spectral']))
        print(
            f'| {m} | {t["iterative"] * 1e3:.2f} | '
            f'{t["spectral"] * 1e3:.2f} | '
            f'{t["iterative"] / t["spectral"]:.2f} |',
            flush=True)
    best = crossover(rows)
    if best is None:
        print(f'spectral is not faster at the largest m measured on '
              f'{device}: keep the iterative method here '
              f"(nr_method='iterative').")
    else:
        print(f'spectral wins from m = {best} on (SPECTRAL_MIN_M is '
              f'{SPECTRAL_MIN_M}; the auto rule uses spectral only on the '
              f'CPU).')
    return rows, best


if __name__ == '__main__':
    main()
