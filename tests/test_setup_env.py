"""The environment: tools/setup_env.sh's decision functions (torch build,
mmcv's CUDA ops) against a fake ``nvidia-smi`` / Python / distributions; the
Makefile (``VENV`` one word in every recipe, ``clean-env`` deletes only a
virtualenv, ``make test``'s random order whose printed seed replays it)."""
import inspect
import os
import re
import shutil
import subprocess
import sys

import conftest
import pytest
from conftest import ROOT, run

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
    """``call`` after the script's functions, with ``env`` only."""
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
    """An unknown build: exit 2, one line, before anything else."""
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


def _make(cwd, *args):
    if shutil.which('make') is None:
        pytest.skip('needs GNU make')
    return subprocess.run(['make', '-s', *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)  # yapf: disable


@pytest.fixture
def tree(tmp_path):
    shutil.copy(os.path.join(ROOT, 'Makefile'), tmp_path)
    for d in ('my', 'env', 'keep'):
        (tmp_path / d).mkdir()
        (tmp_path / d / 'mine.txt').write_text(d)
    return tmp_path


@pytest.mark.parametrize('name', ['my env', "it's a venv", 'keep', 'link'])
def test_clean_env_removes_exactly_the_virtualenv(tree, name):
    """Not ``rm -rf my env``; no pyvenv.cfg or a link: refused."""
    (tree / 'venv').mkdir()
    (tree / 'venv' / 'pyvenv.cfg').write_text('')
    (tree / 'link').symlink_to(tree / 'venv')  # rm -rf: the link's target
    venv = name not in ('keep', 'link')
    if venv:
        (tree / name).mkdir()
        (tree / name / 'pyvenv.cfg').write_text('home = /usr/bin\n')
    before = sorted(os.listdir(tree))
    proc = _make(tree, 'clean-env', f'VENV={name}')
    assert sorted(os.listdir(tree)) == [d for d in before if d != name or
                                        not venv]  # yapf: disable
    assert all((tree / d / 'mine.txt').read_text() == d
               for d in ('my', 'env', 'keep'))  # yapf: disable
    assert (tree / 'venv' / 'pyvenv.cfg').exists()
    if venv:
        assert proc.returncode == 0, proc.stderr
        assert _make(tree, 'clean-env', f'VENV={name}').stdout == (
            f'clean-env: {name} does not exist: nothing to remove\n')
    else:
        assert proc.returncode != 0 and proc.stderr.splitlines()[0] == (
            f'clean-env: {name} is not a virtualenv (no pyvenv.cfg, or a '
            "link): refusing to delete it; set VENV to the virtualenv's own "
            'path')


@pytest.mark.parametrize('target', ['env', 'test', 'lint', 'demo', 'docs'])
def test_every_recipe_quotes_the_venv(tree, target):
    """Dry runs: the venv one shell word; ``make docs``: docs requirements."""
    proc = _make(tree, '-n', target, "VENV=a b's")
    text, quoted = proc.stdout, "'a b'\\''s"
    assert proc.returncode == 0, proc.stderr
    assert "a b's" not in text.replace(quoted, '')  # never bare
    assert f"{quoted}/bin/python'" in text or f"MMSOFT_VENV={quoted}'" in text
    if target == 'docs':  # the docs' own venv: no mmcv (setup_env.sh)
        assert 'setup_env.sh' not in text and f'-m venv {quoted}' in text
        assert f"{quoted}/bin/python' -m sphinx" in text
        assert 'requirements/docs.txt requirements/docs_api.txt' in text


def test_make_test_runs_in_a_random_order():
    """On two xdist workers, a module on one worker; JOBS=0: one process."""

    def make_test(*args):
        proc = _make(ROOT, '-n', 'test', *args)
        assert proc.returncode == 0, proc.stderr
        return ' '.join(proc.stdout.replace('\\\n', ' ').split())

    plain = make_test()
    assert '-p randomly' in plain and '--randomly-seed' not in plain
    assert '-n 2 --dist loadfile' in plain
    assert '--randomly-seed=3' in make_test('SEED=3')
    assert '-n 0 ' in make_test('JOBS=0')


#: ``pytest -q --co`` of two files, once per argument
COLLECT = '''import sys, pytest
for args in sys.argv[1:]:
    print('=== run', flush=True)
    pytest.main(['test_a.py', 'test_b.py', '-q', '--co',
                 '-p', 'no:cacheprovider', *args.split()])
'''


def test_the_seed_gives_the_order_and_is_printed(tmp_path):
    """conftest's summary hook; a module's tests stay together."""
    (tmp_path / 'conftest.py').write_text(
        inspect.getsource(conftest.pytest_terminal_summary))
    for f in 'ab':
        (tmp_path /
         f'test_{f}.py').write_text(''.join(f'def test_{f}{i}():\n    pass\n'
                                            for i in range(6)))
    seven = '-p randomly --randomly-seed=7'
    proc = run([sys.executable, '-c', COLLECT, seven, seven, '-p no:randomly'],
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (order, printed), again, (plain, unprinted) = (
        ([ln for ln in out.splitlines() if '::' in ln],
         [ln for ln in out.splitlines() if ln.startswith('test order:')])
        for out in proc.stdout.split('=== run\n')[1:])  # yapf: disable
    assert printed == [
        'test order: random, --randomly-seed=7 (make test SEED=7 replays it)'
    ]
    assert again == (order, printed) and unprinted == []
    assert order != plain and sorted(order) == sorted(plain)
    files = [i.split('::')[0] for i in order]
    assert len(files) == 12
    assert sum(a != b for a, b in zip(files, files[1:])) == 1, order
