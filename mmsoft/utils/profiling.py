"""Small helpers for the benchmark scripts: timing and peak memory.

Peak memory on the CPU is the growth of the process's peak RSS during the
measured call, so each measurement should run in a fresh process
(:func:`run_isolated`); on CUDA it is ``torch.cuda.max_memory_allocated``.
"""
import json
import os
import os.path as osp
import resource
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch

from .paths import import_root

__all__ = ['measure_step', 'run_isolated', 'atomic_write', 'RESULT_PREFIX']

RESULT_PREFIX = 'RESULT '
# the folder holding this mmsoft package (a checkout or site-packages), so
# that the child imports the same mmsoft
_ROOT = import_root()


def _sync(device: str):
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def measure_step(step: Callable[[], None],
                 device: str = 'cpu',
                 repeats: int = 3,
                 warmup: Optional[Callable] = None) -> Dict[str, float]:
    """Peak memory of the first ``step()`` and median/min time of the next.

    ``warmup`` (e.g. the step on a small input) runs first so that lazy
    initialisation is not counted as the step's memory.
    """
    if warmup is not None:
        warmup()
    _sync(device)
    if device.startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    step()
    _sync(device)
    first = (time.perf_counter() - t0) * 1e3
    if device.startswith('cuda'):
        peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss -
                   base) / 1024
    times: List[float] = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        step()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    if not times:
        times = [first]
    times.sort()
    return dict(
        time_ms=times[len(times) // 2],
        min_ms=times[0],
        peak_mb=max(peak_mb, 0.0))


def run_isolated(argv: List[str]) -> Dict:
    """Run ``python argv...`` in a fresh process; parse its RESULT line.

    Raises RuntimeError with the child's last error line on failure.
    """
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join(
        [_ROOT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    proc = subprocess.run(
        [sys.executable] + argv, capture_output=True, text=True, env=env)
    lines = [
        ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)
    ]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ['no output'])[-1]
        raise RuntimeError(err)
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def atomic_write(path: str, text: str):
    """Write text to path through a temporary file and os.replace."""
    d = osp.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
        f.write(text)
    os.replace(tmp, path)
