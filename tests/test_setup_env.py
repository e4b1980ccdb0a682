"""tools/setup_env.sh: which torch build, and when mmcv's ops are built with
their CUDA kernels. The script's decision functions run in bash against a
fake ``nvidia-smi`` and a fake Python (a CPU machine never asks torch), or a
real Python with fake distributions / modules first on its path."""
import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = os.path.join(ROOT, 'tools', 'setup_env.sh')
# a Python that answers from the environment and logs every call
FAKE_PY = r'''#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG"
case "$*" in
    *get_compiling_cuda_version*) exit "$FAKE_OPS" ;;
    *torch.version.cuda*) echo "$FAKE_STATE"; exit 0 ;;
    *torch.cuda.is_available*) exit "$FAKE_CUDA" ;;
esac
exit 3
'''
FUNCS = ('want_cuda_ops', 'mmcv_has_cuda_ops', 'cuda_ops_ok', 'torch_index',
         'torch_build_ok', 'driver_hint')


def bash_with(env, call):
    """``call`` after the script's decision functions, with ``env`` only."""
    with open(SCRIPT) as f:
        text = f.read()
    funcs = [re.search(rf'^{n}\(\) {{.*?^}}', text, re.S | re.M)[0]
             for n in FUNCS]  # yapf: disable
    script = 'log() { echo "$*"; }\n' + '\n'.join(funcs) + '\n' + call
    return subprocess.run(['bash', '-c', script],
                          env={
                              'PATH': '/usr/bin:/bin',
                              **env
                          },
                          capture_output=True,
                          text=True)


@pytest.fixture
def run(tmp_path):
    """``run(call, gpu, cuda=0, ops=1, force=None, state='')``: (exit code,
    the fake Python's calls, stdout)."""
    (tmp_path / 'bin').mkdir()
    py, log = tmp_path / 'python', tmp_path / 'calls.log'
    py.write_text(FAKE_PY)
    py.chmod(0o755)

    def _run(call, gpu, cuda=0, ops=1, force=None, state=''):
        smi = tmp_path / 'bin' / 'nvidia-smi'
        if gpu:  # prints its driver version when asked
            smi.write_text('#!/bin/sh\necho 550.54.14\n')
            smi.chmod(0o755)
        elif smi.exists():
            smi.unlink()
        log.write_text('')
        env = dict(PATH=f'{tmp_path / "bin"}:/usr/bin:/bin', PY=str(py),
                   FAKE_LOG=str(log), FAKE_CUDA=str(cuda), FAKE_OPS=str(ops),
                   FAKE_STATE=state)  # yapf: disable
        if force is not None:
            env['MMSOFT_MMCV_CUDA'] = force
        proc = bash_with(env, call)
        return proc.returncode, log.read_text().splitlines(), proc.stdout

    return _run


def test_cuda_ops_wanted_and_up_to_date(run):
    # a CPU machine keeps CPU ops without importing torch
    assert run('want_cuda_ops', gpu=False) == (1, [], '')
    assert run('cuda_ops_ok', gpu=False) == (0, [], '')
    rc, calls, _ = run('want_cuda_ops', gpu=True, cuda=0)
    assert rc == 0 and 'torch.cuda.is_available' in calls[0]
    # a driver but torch sees no GPU (e.g. a CPU torch): CPU-only ops
    assert run('want_cuda_ops', gpu=True, cuda=1)[0] == 1
    # a GPU machine: ops without CUDA are rebuilt, with CUDA kept
    assert run('cuda_ops_ok', gpu=True, cuda=0, ops=1)[0] == 1
    assert run('cuda_ops_ok', gpu=True, cuda=0, ops=0)[0] == 0
    # forced either way
    assert run('want_cuda_ops', gpu=False, force='1') == (0, [], '')
    assert run('want_cuda_ops', gpu=True, force='0') == (1, [], '')


def test_driver_torch_cannot_use_gets_one_note(run):
    """None if torch sees the GPU, a CPU torch, no driver or forced."""
    assert run(
        'driver_hint', gpu=True, state='0 13.0'
    )[::2] == (
        0, 'note: NVIDIA driver 550.54.14 found, but torch (CUDA 13.0) sees '
        "no GPU, so mmcv's ops are CPU-only: CUDA 13.0 needs driver >= "
        '580.65.06; on a CUDA 12 driver rerun with MMSOFT_TORCH_CUDA=cu126 '
        "(docs/en/get_started.md, 'On a GPU machine')\n")
    # a CUDA 12 torch (MMSOFT_TORCH_CUDA) on a still older driver
    out = run('driver_hint', gpu=True, state='0 12.6')[2]
    assert 'torch (CUDA 12.6) sees no GPU' in out and 'newer driver' in out
    assert 'cu126' not in out and len(out.splitlines()) == 1
    for kw in (dict(state='1 13.0'), dict(state='0 None'),
               dict(state='0 13.0', force='1')):
        assert run('driver_hint', gpu=True, **kw)[::2] == (0, ''), kw
    assert run('driver_hint', gpu=False) == (0, [], '')


def test_torch_index_or_one_line_before_anything(tmp_path):
    """An unknown build: exit 2 with one line, before looking for Python or
    making the venv."""
    proc = bash_with({}, 'torch_index cu128')
    assert (proc.returncode, proc.stdout,
            proc.stderr) == (0, 'https://download.pytorch.org/whl/cu128\n', '')
    proc = subprocess.run(['bash', SCRIPT],
                          env=dict(PATH='/usr/bin:/bin', HOME=str(tmp_path),
                                   MMSOFT_TORCH_CUDA='12.6',
                                   MMSOFT_VENV=str(tmp_path / 'venv'),
                                   MMSOFT_PYTHON=str(tmp_path / 'no-python')),
                          capture_output=True,
                          text=True)  # yapf: disable
    assert (proc.returncode, proc.stdout) == (2, '')
    assert proc.stderr.splitlines() == [
        'MMSOFT_TORCH_CUDA=12.6 is not a torch build this script '
        'installs: use cu126 or cu128 (CUDA 12 driver), cu130, cpu, or '
        'leave it unset (PyPI\'s torch, CUDA 13.0)'
    ]
    assert not (tmp_path / 'venv').exists()
    # unset: any build, never asks Python
    proc = bash_with(dict(PY='/nonexistent', TORCH_CUDA=''), 'torch_build_ok')
    assert (proc.returncode, proc.stderr) == (0, '')


# a real Python, fake torch / torchvision distributions or modules
@pytest.mark.parametrize(
    'call,versions,rc',
    [
        ('torch_build_ok', ('2.14.1+cu126', '0.29.1+cu126'), 0),
        ('torch_build_ok', ('2.14.1', '0.29.1'), 1),  # PyPI's build
        ('torch_build_ok', ('2.14.1+cu126', '0.29.1'), 1),  # torchvision
        # mmcv's ops, torch's CUDA: one major is the same runtime ABI
        ('mmcv_has_cuda_ops', ('12.8', '12.6'), 0),
        ('mmcv_has_cuda_ops', ('13.0', '12.6'), 1),
        ('mmcv_has_cuda_ops', ('not available', '13.0'), 1),
    ])
def test_installed_builds(call, versions, rc, tmp_path):
    a, b = versions
    if call == 'torch_build_ok':
        files = {
            f'{n}-{v}.dist-info/METADATA':
            f'Metadata-Version: 2.1\nName: {n}\nVersion: {v}\n'
            for n, v in (('torch', a), ('torchvision', b))
        }
    else:
        files = {
            'mmcv/__init__.py': '',
            'mmcv/ops/__init__.py':
            f'def get_compiling_cuda_version():\n    return {a!r}\n',
            'torch/__init__.py': f'class version:\n    cuda = {b!r}\n'
        }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = dict(PY=sys.executable, PYTHONPATH=str(tmp_path), TORCH_CUDA='cu126')
    proc = bash_with(env, call)
    assert proc.returncode == rc, proc.stderr
