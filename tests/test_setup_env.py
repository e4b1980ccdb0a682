"""tools/setup_env.sh: when mmcv's ops are built with their CUDA kernels.

The decision functions of the script (``want_cuda_ops``,
``mmcv_has_cuda_ops``, ``cuda_ops_ok``) run in bash against a fake
``nvidia-smi`` and a fake Python whose answers the test sets: a CPU machine
never asks torch and keeps the CPU-only build; a GPU machine with a
CPU-only mmcv is not up to date (the ops are rebuilt with CUDA);
``MMSOFT_MMCV_CUDA`` forces either way.
"""
import os
import re
import subprocess

import pytest
from conftest import ROOT

SCRIPT = os.path.join(ROOT, 'tools', 'setup_env.sh')
FUNCS = ('want_cuda_ops', 'mmcv_has_cuda_ops', 'cuda_ops_ok')

# a Python that answers the two questions from the environment and logs
# every call (a CPU machine must not import torch at all)
FAKE_PY = r'''#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
case "$*" in
    *torch.cuda.is_available*) exit "$FAKE_CUDA" ;;
    *get_compiling_cuda_version*) exit "$FAKE_OPS" ;;
esac
exit 3
'''


def functions():
    """The bodies of the decision functions, as the script defines them."""
    with open(SCRIPT) as f:
        text = f.read()
    out = []
    for name in FUNCS:
        m = re.search(rf'^{name}\(\) {{.*?^}}', text, re.S | re.M)
        assert m, f'{name} not defined in setup_env.sh'
        out.append(m.group(0))
    return '\n'.join(out)


@pytest.fixture
def run(tmp_path):
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    py = tmp_path / 'python'
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    log = tmp_path / 'calls.log'

    def _run(call, gpu, cuda=0, ops=1, force=None):
        smi = bin_dir / 'nvidia-smi'
        if gpu:
            smi.write_text('#!/bin/sh\nexit 0\n')
            smi.chmod(0o755)
        elif smi.exists():
            smi.unlink()
        log.write_text('')
        env = dict(
            PATH=f'{bin_dir}:/usr/bin:/bin',
            PY=str(py),
            FAKE_LOG=str(log),
            FAKE_CUDA=str(cuda),
            FAKE_OPS=str(ops))
        if force is not None:
            env['MMSOFT_MMCV_CUDA'] = force
        proc = subprocess.run(['bash', '-c', f'{functions()}\n{call}'],
                              env=env,
                              capture_output=True,
                              text=True)
        return proc.returncode, log.read_text().splitlines()

    return _run


def test_cpu_machine_keeps_cpu_ops_without_importing_torch(run):
    assert run('want_cuda_ops', gpu=False) == (1, [])
    assert run('cuda_ops_ok', gpu=False) == (0, [])


def test_gpu_machine_wants_cuda_ops(run):
    rc, calls = run('want_cuda_ops', gpu=True, cuda=0)
    assert rc == 0 and 'torch.cuda.is_available' in calls[0]
    # a driver but torch sees no GPU (e.g. a CPU torch): CPU-only ops
    assert run('want_cuda_ops', gpu=True, cuda=1)[0] == 1


def test_cpu_only_mmcv_on_a_gpu_machine_is_rebuilt(run):
    # ops without CUDA ('not available'): not up to date
    assert run('cuda_ops_ok', gpu=True, cuda=0, ops=1)[0] == 1
    # ops with CUDA: up to date
    assert run('cuda_ops_ok', gpu=True, cuda=0, ops=0)[0] == 0
    # no CUDA for torch: the CPU-only ops are fine
    assert run('cuda_ops_ok', gpu=True, cuda=1, ops=1)[0] == 0


def test_forced_either_way(run):
    assert run('want_cuda_ops', gpu=False, force='1') == (0, [])
    assert run('cuda_ops_ok', gpu=False, force='1', ops=1)[0] == 1
    assert run('want_cuda_ops', gpu=True, force='0') == (1, [])
    assert run('cuda_ops_ok', gpu=True, force='0', ops=1) == (0, [])
