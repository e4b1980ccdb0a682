"""Which Python the launch scripts use (``tools/python.sh``).

A user who ran ``make demo`` and did not activate ``.venv`` has a
``python`` on PATH without torch. ``tools/dist_train.sh`` (and
``dist_test.sh`` / ``slurm_*.sh``) must then use the project venv; an
explicit ``PYTHON=...`` wins; an active virtualenv is respected; without
a usable interpreter the scripts say what to do in one line.

Each case runs the real scripts in a copy of the repository layout
(``tools/`` and ``mmsoft/`` linked) whose ``.venv/bin/python`` wraps the
Python running this test and records its calls, with a PATH whose
``python`` is a system Python without torch.
"""
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, free_port


def _python_without_torch(tmp_path):
    """A real interpreter that cannot import torch (the venv's base
    Python or a system one), else a stand-in that fails as it would."""
    for cand in (getattr(sys, '_base_executable', None),
                 shutil.which('python3',
                              path='/usr/bin:/bin'), '/usr/local/bin/python3'):
        if cand and osp.isfile(cand) and subprocess.run(
            [cand, '-c', 'import torch'], capture_output=True,
                timeout=120).returncode != 0:
            return cand
    fake = tmp_path / 'fake_python'
    fake.write_text('#!/bin/sh\necho "ModuleNotFoundError: No module named '
                    '\'torch\'" >&2\nexit 1\n')
    fake.chmod(0o755)
    return str(fake)


@pytest.fixture()
def repo(tmp_path):
    """<tmp>/clone: tools/*, mmsoft (linked), .venv/bin/python (a logging
    wrapper of this interpreter); <tmp>/bin/python: no torch."""
    clone = tmp_path / 'clone'
    (clone / 'tools').mkdir(parents=True)
    for name in ('dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
                 'slurm_test.sh', 'launch.sh', 'python.sh', 'train.py',
                 'test.py', 'mmsoft_tools'):
        os.symlink(osp.join(ROOT, 'tools', name), clone / 'tools' / name)
    os.symlink(osp.join(ROOT, 'mmsoft'), clone / 'mmsoft')
    venv_bin = clone / '.venv' / 'bin'
    venv_bin.mkdir(parents=True)
    log = tmp_path / 'venv_calls'
    (venv_bin / 'python').write_text(
        f'#!/bin/sh\necho "$@" >> {log}\n[ -n "$VENV_DRY" ] && exit 0\n'
        f'exec {sys.executable} "$@"\n')
    (venv_bin / 'python').chmod(0o755)
    bindir = tmp_path / 'bin'
    bindir.mkdir()
    os.symlink(_python_without_torch(tmp_path), bindir / 'python')
    (tmp_path / 'empty.py').write_text('x = 1\n')  # a config without data
    return dict(
        clone=clone,
        log=log,
        bindir=str(bindir),
        tmp=tmp_path,
        cfg=str(tmp_path / 'empty.py'))


def _env(repo, **extra):
    """A login shell's environment: no venv active, no PYTHON."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ('PYTHON', 'VIRTUAL_ENV', 'CONDA_DEFAULT_ENV',
                     'CONDA_PREFIX', 'PYTHONPATH', 'MMSOFT_VENV', 'PYTHONHOME')
    }
    env.update(
        PATH=f'{repo["bindir"]}:/usr/bin:/bin',
        OMP_NUM_THREADS='1',
        PYTHONWARNINGS='ignore')
    env.update(extra)
    return env


def _dist_train(repo, *args, **env):
    return subprocess.run([
        'bash',
        str(repo['clone'] / 'tools' / 'dist_train.sh'), repo['cfg'], '1', *args
    ],
                          cwd=str(repo['tmp']),
                          env=_env(repo, PORT=str(free_port()), **env),
                          capture_output=True,
                          text=True,
                          timeout=300)


def test_dist_train_uses_project_venv(repo):
    proc = _dist_train(repo, '--help')
    venv_py = str(repo['clone'] / '.venv' / 'bin' / 'python')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'dist_train.sh: python: {venv_py}' in proc.stderr
    # torchrun started train.py with the venv's interpreter
    assert 'usage: train.py' in proc.stdout
    calls = repo['log'].read_text().splitlines()
    assert calls[0].startswith('- train ' + repo['cfg'])  # the data check
    assert calls[1].startswith('-m torch.distributed.run')
    assert "No module named 'torch'" not in proc.stderr


def test_explicit_python_wins(repo, tmp_path):
    log = tmp_path / 'explicit_calls'
    explicit = tmp_path / 'my_python'
    explicit.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')  # dry
    explicit.chmod(0o755)
    proc = _dist_train(repo, '--help', PYTHON=str(explicit))
    assert proc.returncode == 0, proc.stderr
    assert f'python: {explicit}' in proc.stderr
    calls = log.read_text().splitlines()  # the data check, then torchrun
    assert calls[0].startswith('- train ') and len(calls) == 2
    assert calls[1].startswith('-m torch.distributed.run')
    assert not repo['log'].exists()  # the venv was not used


def test_active_venv_is_respected_and_bad_python_explained(repo):
    # another virtualenv is active: its `python` (here without torch) is
    # used, and the one-line hint says what to do
    proc = _dist_train(repo, VIRTUAL_ENV='/some/other/venv')
    assert proc.returncode != 0
    assert 'dist_train.sh: python: python' in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 2, proc.stderr
    assert "cannot run the tools (No module named 'torch')" in err[1]
    assert 'make demo' in err[1] and 'PYTHON=' in err[1]
    assert not repo['log'].exists()
    # no project venv (make demo not run): the same hint
    shutil.rmtree(repo['clone'] / '.venv')
    proc = _dist_train(repo)
    assert proc.returncode != 0
    assert 'cannot run the tools' in proc.stderr


def test_dist_test_and_slurm_scripts_use_venv(repo, tmp_path):
    venv_py = str(repo['clone'] / '.venv' / 'bin' / 'python')
    for ckpt in ('ckpt.pth', 'c'):  # the scripts check that it exists
        (repo['tmp'] / ckpt).write_bytes(b'')
    proc = subprocess.run([
        'bash',
        str(repo['clone'] / 'tools' / 'dist_test.sh'), repo['cfg'], 'ckpt.pth',
        '1', '--help'
    ],
                          cwd=str(repo['tmp']),
                          env=_env(repo, PORT=str(free_port()), VENV_DRY='1'),
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f'dist_test.sh: python: {venv_py}' in proc.stderr
    calls = repo['log'].read_text().splitlines()
    assert calls[0] == f'- test {repo["cfg"]} --help'
    assert calls[1].startswith('-m torch.distributed.run')
    assert calls[1].endswith(f'tools/test.py {repo["cfg"]} ckpt.pth '
                             '--launcher pytorch --help')
    # slurm: the srun command line names the venv's python
    out = tmp_path / 'srun_args'
    srun = tmp_path / 'bin' / 'srun'
    srun.write_text(f'#!/bin/sh\necho "$@" > {out}\n')
    srun.chmod(0o755)
    for script, extra in (('slurm_train.sh', 'wd'), ('slurm_test.sh', 'c')):
        proc = subprocess.run([
            'bash',
            str(repo['clone'] / 'tools' / script), 'p', 'j', repo['cfg'], extra
        ],
                              cwd=str(repo['tmp']),
                              env=_env(repo),
                              capture_output=True,
                              text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f'{venv_py} -u ' in out.read_text()
        proc = subprocess.run([
            'bash',
            str(repo['clone'] / 'tools' / script), 'p', 'j', repo['cfg'], extra
        ],
                              cwd=str(repo['tmp']),
                              env=_env(repo, PYTHON='/opt/py/bin/python3'),
                              capture_output=True,
                              text=True,
                              timeout=60)
        assert '/opt/py/bin/python3 -u ' in out.read_text()
