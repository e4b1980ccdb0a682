"""tools/setup_env.sh: which torch build, and when mmcv's ops are built with
their CUDA kernels. The script's decision functions run in bash against a
fake ``nvidia-smi`` and a fake Python (a CPU machine never asks torch), or a
real Python with fake distributions / modules first on its path."""
import re
import subprocess
import sys

import pytest
from conftest import ROOT

SCRIPT = f'{ROOT}/tools/setup_env.sh'
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
NOTE = ("note: NVIDIA driver 550.54.14 found, but torch (CUDA {}) sees no "
        "GPU, so mmcv's ops are CPU-only: {} (docs/en/get_started.md, 'On a "
        "GPU machine')\n").format


def bash_with(env, call):
    """``call`` after the script's decision functions, with ``env`` only."""
    text = open(SCRIPT).read()
    funcs = [re.search(rf'^{n}\(\) {{.*?^}}', text, re.S | re.M)[0]
             for n in FUNCS]  # yapf: disable
    script = 'log() { echo "$*"; }\n' + '\n'.join(funcs) + '\n' + call
    return subprocess.run(['bash', '-c', script], capture_output=True,
                          text=True, env={'PATH': '/usr/bin:/bin', **env}
                          )  # yapf: disable


# (call, with a GPU driver, env) -> (exit code, asks Python, stdout); env:
# FAKE_CUDA 0/1 (torch sees the GPU), FAKE_OPS 0/1 (mmcv's ops have CUDA),
# FAKE_STATE (torch's "is_available cuda"), MMSOFT_MMCV_CUDA (forced)
FAKE_CASES = [
    # a CPU machine keeps CPU ops without importing torch
    ('want_cuda_ops', 0, {}, (1, 0, '')),
    ('cuda_ops_ok', 0, {}, (0, 0, '')),
    ('want_cuda_ops', 1, {}, (0, 1, '')),
    # a driver but torch sees no GPU (e.g. a CPU torch): CPU-only ops
    ('want_cuda_ops', 1, dict(FAKE_CUDA='1'), (1, 1, '')),
    # a GPU machine: ops without CUDA are rebuilt, with CUDA kept
    ('cuda_ops_ok', 1, dict(FAKE_OPS='1'), (1, 2, '')),
    ('cuda_ops_ok', 1, dict(FAKE_OPS='0'), (0, 2, '')),
    # forced either way
    ('want_cuda_ops', 0, dict(MMSOFT_MMCV_CUDA='1'), (0, 0, '')),
    ('want_cuda_ops', 1, dict(MMSOFT_MMCV_CUDA='0'), (1, 0, '')),
    # a driver torch cannot use: one note; none if torch sees the GPU, a
    # CPU torch, no driver or forced
    ('driver_hint', 1, dict(FAKE_STATE='0 13.0'), (0, 1, NOTE(
        '13.0', 'CUDA 13.0 needs driver >= 580.65.06; on a CUDA 12 driver '
        'rerun with MMSOFT_TORCH_CUDA=cu126'))),
    # a CUDA 12 torch (MMSOFT_TORCH_CUDA) on a still older driver
    ('driver_hint', 1, dict(FAKE_STATE='0 12.6'), (0, 1, NOTE(
        '12.6', "CUDA 12.6 needs a newer driver (NVIDIA's CUDA release "
        "notes, 'CUDA Driver')"))),
    ('driver_hint', 1, dict(FAKE_STATE='1 13.0'), (0, 1, '')),
    ('driver_hint', 1, dict(FAKE_STATE='0 None'), (0, 1, '')),
    ('driver_hint', 1, dict(FAKE_STATE='0 13.0', MMSOFT_MMCV_CUDA='1'),
     (0, 0, '')),
    ('driver_hint', 0, {}, (0, 0, '')),
    # a known build's index; unset: any build, never asks Python
    ('torch_index cu128', 0, {},
     (0, 0, 'https://download.pytorch.org/whl/cu128\n')),
    ('torch_build_ok', 0, dict(TORCH_CUDA=''), (0, 0, '')),
]  # yapf: disable


@pytest.mark.parametrize('call,gpu,env,want', FAKE_CASES)
def test_cuda_ops_and_driver_decisions(tmp_path, call, gpu, env, want):
    (tmp_path / 'bin').mkdir()
    py, log = tmp_path / 'python', tmp_path / 'calls.log'
    py.write_text(FAKE_PY)
    log.write_text('')
    if gpu:  # prints its driver version when asked
        (tmp_path / 'bin' /
         'nvidia-smi').write_text('#!/bin/sh\necho 550.54.14\n')
    for exe in tmp_path.glob('**/*'):
        exe.chmod(0o755)
    env = dict(dict(PATH=f'{tmp_path / "bin"}:/usr/bin:/bin', PY=str(py),
                    FAKE_LOG=str(log), FAKE_CUDA='0', FAKE_OPS='1',
                    FAKE_STATE=''), **env)  # yapf: disable
    proc = bash_with(env, call)
    calls = log.read_text().splitlines()
    assert (proc.returncode, len(calls), proc.stdout) == want
    if call == 'want_cuda_ops' and calls:
        assert 'torch.cuda.is_available' in calls[0]


def test_torch_index_or_one_line_before_anything(tmp_path):
    """An unknown build: exit 2 with one line, before looking for Python or
    making the venv."""
    proc = subprocess.run(['bash', SCRIPT],
                          env=dict(PATH='/usr/bin:/bin', HOME=str(tmp_path),
                                   MMSOFT_TORCH_CUDA='12.6',
                                   MMSOFT_VENV=str(tmp_path / 'venv'),
                                   MMSOFT_PYTHON=str(tmp_path / 'no-python')),
                          capture_output=True, text=True)  # yapf: disable
    assert (proc.returncode, proc.stdout) == (2, '')
    assert proc.stderr.splitlines() == [
        'MMSOFT_TORCH_CUDA=12.6 is not a torch build this script '
        'installs: use cu126 or cu128 (CUDA 12 driver), cu130, cpu, or '
        'leave it unset (PyPI\'s torch, CUDA 13.0)'
    ]
    assert not (tmp_path / 'venv').exists()


# a real Python, fake torch / torchvision distributions or modules
@pytest.mark.parametrize('call,a,b,rc', [
    ('torch_build_ok', '2.14.1+cu126', '0.29.1+cu126', 0),
    ('torch_build_ok', '2.14.1', '0.29.1', 1),  # PyPI's build
    ('torch_build_ok', '2.14.1+cu126', '0.29.1', 1),  # torchvision
    # mmcv's ops, torch's CUDA: one major is the same runtime ABI
    ('mmcv_has_cuda_ops', '12.8', '12.6', 0),
    ('mmcv_has_cuda_ops', '13.0', '12.6', 1),
    ('mmcv_has_cuda_ops', 'not available', '13.0', 1),
])  # yapf: disable
def test_installed_builds(call, a, b, rc, tmp_path):
    files = {f'{n}-{v}.dist-info/METADATA':
             f'Metadata-Version: 2.1\nName: {n}\nVersion: {v}\n'
             for n, v in (('torch', a), ('torchvision', b))
             } if call == 'torch_build_ok' else {
        'mmcv/__init__.py': '', 'mmcv/ops/__init__.py':
        f'def get_compiling_cuda_version():\n    return {a!r}\n',
        'torch/__init__.py': f'class version:\n    cuda = {b!r}\n'
    }  # yapf: disable
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = dict(PY=sys.executable, PYTHONPATH=str(tmp_path), TORCH_CUDA='cu126')
    proc = bash_with(env, call)
    assert proc.returncode == rc, proc.stderr
