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


def bash_with(env, call):
    """``call`` after the script's decision functions (and a log() as the
    script's), with ``env`` only."""
    with open(SCRIPT) as f:
        text = f.read()
    funcs = []
    for name in ('want_cuda_ops', 'mmcv_has_cuda_ops', 'cuda_ops_ok',
                 'torch_index', 'torch_build_ok', 'driver_hint'):
        m = re.search(rf'^{name}\(\) {{.*?^}}', text, re.S | re.M)
        assert m, f'{name} not defined in setup_env.sh'
        funcs.append(m.group(0))
    return subprocess.run([
        'bash', '-c', 'log() { echo "$*"; }\n' + '\n'.join(funcs) + '\n' + call
    ],
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
    py = tmp_path / 'python'
    py.write_text(FAKE_PY)
    py.chmod(0o755)
    log = tmp_path / 'calls.log'

    def _run(call, gpu, cuda=0, ops=1, force=None, state=''):
        smi = tmp_path / 'bin' / 'nvidia-smi'
        if gpu:  # prints its driver version when asked
            smi.write_text('#!/bin/sh\necho 550.54.14\n')
            smi.chmod(0o755)
        elif smi.exists():
            smi.unlink()
        log.write_text('')
        env = dict(
            PATH=f'{tmp_path / "bin"}:/usr/bin:/bin',
            PY=str(py),
            FAKE_LOG=str(log),
            FAKE_CUDA=str(cuda),
            FAKE_OPS=str(ops),
            FAKE_STATE=state)
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
    # a GPU machine: ops without CUDA are rebuilt, with CUDA kept; no CUDA
    # for torch: the CPU-only ops are fine
    assert run('cuda_ops_ok', gpu=True, cuda=0, ops=1)[0] == 1
    assert run('cuda_ops_ok', gpu=True, cuda=0, ops=0)[0] == 0
    assert run('cuda_ops_ok', gpu=True, cuda=1, ops=1)[0] == 0
    # forced either way
    assert run('want_cuda_ops', gpu=False, force='1') == (0, [], '')
    assert run('cuda_ops_ok', gpu=False, force='1', ops=1)[0] == 1
    assert run('want_cuda_ops', gpu=True, force='0') == (1, [], '')
    assert run('cuda_ops_ok', gpu=True, force='0', ops=1)[:2] == (0, [])


def test_driver_torch_cannot_use_gets_one_note(run):
    """A driver older than torch's CUDA: one note (driver, minimum, CUDA 12
    route); none if torch sees the GPU, a CPU torch, no driver or forced."""
    rc, _, out = run('driver_hint', gpu=True, state='0 13.0')
    assert rc == 0 and len(out.splitlines()) == 1, out
    assert 'NVIDIA driver 550.54.14 found' in out
    assert 'torch (CUDA 13.0) sees no GPU' in out
    assert '>= 580.65.06' in out and 'MMSOFT_TORCH_CUDA=cu126' in out
    # a CUDA 12 torch (MMSOFT_TORCH_CUDA) on a still older driver
    out = run('driver_hint', gpu=True, state='0 12.6')[2]
    assert 'torch (CUDA 12.6) sees no GPU' in out and 'newer driver' in out
    assert 'cu126' not in out and len(out.splitlines()) == 1
    for kw in (dict(state='1 13.0'), dict(state='0 None'),
               dict(state='0 13.0',
                    force='0'), dict(state='0 13.0', force='1')):
        assert run('driver_hint', gpu=True, **kw)[::2] == (0, ''), kw
    assert run('driver_hint', gpu=False) == (0, [], '')


@pytest.mark.parametrize('value', ['cu126', 'cu128', 'cu130', 'cpu'])
def test_torch_index_of_each_build(value):
    proc = bash_with({}, f'torch_index {value}')
    assert proc.returncode == 0 and proc.stderr == ''
    assert proc.stdout == f'https://download.pytorch.org/whl/{value}\n'


@pytest.mark.parametrize('value', ['cu118', '12.6', 'cuda'])
def test_unknown_torch_build_is_one_line_before_anything(value, tmp_path):
    """Exit 2 with one line, before looking for Python or making the venv."""
    proc = subprocess.run(['bash', SCRIPT],
                          env=dict(
                              PATH='/usr/bin:/bin',
                              HOME=str(tmp_path),
                              MMSOFT_TORCH_CUDA=value,
                              MMSOFT_VENV=str(tmp_path / 'venv'),
                              MMSOFT_PYTHON=str(tmp_path / 'no-python')),
                          capture_output=True,
                          text=True)
    assert proc.returncode == 2 and proc.stdout == ''
    assert proc.stderr.splitlines() == [
        f'MMSOFT_TORCH_CUDA={value} is not a torch build this script '
        'installs: use cu126 or cu128 (CUDA 12 driver), cu130, cpu, or '
        'leave it unset (PyPI\'s torch, CUDA 13.0)'
    ]
    assert not (tmp_path / 'venv').exists()


@pytest.mark.parametrize(
    'torch,vision,want,ok',
    [
        ('2.14.1+cu126', '0.29.1+cu126', 'cu126', True),
        ('2.14.1+cu128', '0.29.1+cu128', 'cu128', True),
        ('2.14.1', '0.29.1', 'cu126', False),  # PyPI's build
        ('2.14.1+cu126', '0.29.1', 'cu126', False),  # torchvision not
        ('2.14.1+cu130', '0.29.1+cu130', 'cu126', False),  # a switch
        ('2.14.1', '0.29.1', '', True),  # unset: any build
        ('2.14.1+cu126', '0.29.1+cu126', '', True),
    ])
def test_torch_build_is_the_one_asked_for(torch, vision, want, ok, tmp_path):
    for name, version in (('torch', torch), ('torchvision', vision)):
        info = tmp_path / f'{name}-{version}.dist-info'
        info.mkdir()
        (info / 'METADATA').write_text(
            f'Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n')
    proc = bash_with(
        dict(PY=sys.executable, PYTHONPATH=str(tmp_path), TORCH_CUDA=want),
        'torch_build_ok')
    assert proc.returncode == (0 if ok else 1), proc.stderr
    # unset: never asks Python
    proc = bash_with(
        dict(PY='/nonexistent/python', TORCH_CUDA=''), 'torch_build_ok')
    assert proc.returncode == 0 and proc.stderr == ''


@pytest.mark.parametrize(
    'ops,torch_cuda,has',
    [
        ('13.0', '13.0', True),
        ('12.8', '12.6', True),  # one CUDA major: the same runtime ABI
        ('13.0', '12.6', False),  # built for CUDA 13, torch now cu126
        ('12.6', '13.0', False),
        ('not available', '13.0', False),
        ('13.0', 'None', False),  # a CPU torch
    ])
def test_mmcv_cuda_ops_match_torchs_cuda_major(ops, torch_cuda, has, tmp_path):
    """A switch between CUDA 12 and 13 rebuilds mmcv's CUDA ops."""
    (tmp_path / 'mmcv' / 'ops').mkdir(parents=True)
    (tmp_path / 'mmcv' / '__init__.py').write_text('')
    (tmp_path / 'mmcv' / 'ops' / '__init__.py'
     ).write_text(f'def get_compiling_cuda_version():\n    return {ops!r}\n')
    (tmp_path / 'torch').mkdir()
    cuda = None if torch_cuda == 'None' else torch_cuda
    (tmp_path / 'torch' /
     '__init__.py').write_text(f'class version:\n    cuda = {cuda!r}\n')
    proc = bash_with(
        dict(PY=sys.executable, PYTHONPATH=str(tmp_path)), 'mmcv_has_cuda_ops')
    assert proc.returncode == (0 if has else 1)
