"""Which Python the launch scripts use (``tools/python.sh``): without an
active venv the project's ``.venv`` (a user who ran ``make demo`` and did
not activate it has a ``python`` without torch on PATH); an explicit
``PYTHON=...`` wins; an active virtualenv is respected; an unusable one gets
one line saying what to do. The real scripts run in a copy of the layout
(``tools/`` and ``mmsoft/`` linked) whose ``.venv/bin/python`` wraps this
interpreter and records its calls; PATH's ``python`` has no torch."""
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, free_port


def _python_without_torch(tmp_path):
    """A real interpreter that cannot import torch (the venv's base Python
    or a system one), else a stand-in that fails as it would."""
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


def _exe(path, text):
    path.write_text('#!/bin/sh\n' + text)
    path.chmod(0o755)


@pytest.fixture()
def repo(tmp_path):
    """<tmp>/clone: tools/*, mmsoft (linked), .venv/bin/python (a logging
    wrapper of this interpreter; VENV_DRY: log only); <tmp>/bin/python: no
    torch; <tmp>/empty.py: a config without data."""
    clone = tmp_path / 'clone'
    (clone / 'tools').mkdir(parents=True)
    for name in ('dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
                 'slurm_test.sh', 'launch.sh', 'python.sh', 'train.py',
                 'test.py', 'mmsoft_tools'):
        os.symlink(osp.join(ROOT, 'tools', name), clone / 'tools' / name)
    os.symlink(osp.join(ROOT, 'mmsoft'), clone / 'mmsoft')
    (clone / '.venv' / 'bin').mkdir(parents=True)
    log = tmp_path / 'venv_calls'
    _exe(
        clone / '.venv' / 'bin' / 'python',
        f'echo "$@" >> {log}\n[ -n "$VENV_DRY" ] && exit 0\n'
        f'exec {sys.executable} "$@"\n')
    (tmp_path / 'bin').mkdir()
    os.symlink(_python_without_torch(tmp_path), tmp_path / 'bin' / 'python')
    (tmp_path / 'empty.py').write_text('x = 1\n')
    return dict(
        clone=clone,
        log=log,
        tmp=tmp_path,
        cfg=str(tmp_path / 'empty.py'),
        venv_py=str(clone / '.venv' / 'bin' / 'python'))


def _script(repo, script, *args, **env):
    """``tools/<script> args`` in a login shell's environment (no venv
    active, no PYTHON) plus ``env``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ('PYTHON', 'VIRTUAL_ENV', 'CONDA_DEFAULT_ENV',
                     'CONDA_PREFIX', 'PYTHONPATH', 'MMSOFT_VENV', 'PYTHONHOME')
    }
    base.update(
        PATH=f'{repo["tmp"]}/bin:/usr/bin:/bin',
        OMP_NUM_THREADS='1',
        PYTHONWARNINGS='ignore',
        PORT=str(free_port()),
        **env)
    return subprocess.run(
        ['bash', str(repo['clone'] / 'tools' / script), *args],
        cwd=str(repo['tmp']),
        env=base,
        capture_output=True,
        text=True,
        timeout=300)


def _dist_train(repo, *args, **env):
    return _script(repo, 'dist_train.sh', repo['cfg'], '1', *args, **env)


def test_dist_train_uses_project_venv(repo):
    proc = _dist_train(repo, '--help')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f'dist_train.sh: python: {repo["venv_py"]}' in proc.stderr
    assert 'usage: train.py' in proc.stdout  # torchrun ran it with the venv
    calls = repo['log'].read_text().splitlines()
    assert calls[0].startswith('- train ' + repo['cfg'])  # the data check
    assert calls[1].startswith('-m torch.distributed.run')
    assert "No module named 'torch'" not in proc.stderr


def test_explicit_python_wins(repo, tmp_path):
    log, explicit = tmp_path / 'explicit_calls', tmp_path / 'my_python'
    _exe(explicit, f'echo "$@" >> {log}\n')  # dry
    proc = _dist_train(repo, '--help', PYTHON=str(explicit))
    assert proc.returncode == 0, proc.stderr
    assert f'python: {explicit}' in proc.stderr
    calls = log.read_text().splitlines()  # the data check, then torchrun
    assert calls[0].startswith('- train ') and len(calls) == 2
    assert calls[1].startswith('-m torch.distributed.run')
    assert not repo['log'].exists()  # the venv was not used


def test_active_venv_is_respected_and_bad_python_explained(repo):
    """An active venv's python without torch; no project venv: one hint."""
    proc = _dist_train(repo, VIRTUAL_ENV='/some/other/venv')
    assert proc.returncode != 0
    assert 'dist_train.sh: python: python' in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 2, proc.stderr
    assert "cannot run the tools (No module named 'torch')" in err[1]
    assert 'make demo' in err[1] and 'PYTHON=' in err[1]
    assert not repo['log'].exists()
    shutil.rmtree(repo['clone'] / '.venv')
    proc = _dist_train(repo)
    assert proc.returncode != 0 and 'cannot run the tools' in proc.stderr


def test_dist_test_and_slurm_scripts_use_venv(repo, tmp_path):
    for ckpt in ('ckpt.pth', 'c'):  # the scripts check that it exists
        (tmp_path / ckpt).write_bytes(b'')
    proc = _script(repo, 'dist_test.sh', repo['cfg'], 'ckpt.pth', '1',
                   '--help', VENV_DRY='1')  # yapf: disable
    assert proc.returncode == 0, proc.stderr
    assert f'dist_test.sh: python: {repo["venv_py"]}' in proc.stderr
    calls = repo['log'].read_text().splitlines()
    assert calls[0] == f'- test {repo["cfg"]} --help'
    assert calls[1].startswith('-m torch.distributed.run')
    assert calls[1].endswith(f'tools/test.py {repo["cfg"]} ckpt.pth '
                             '--launcher pytorch --help')
    _exe(tmp_path / 'bin' / 'srun', f'echo "$@" > {tmp_path}/srun_args\n')
    for script, arg in (('slurm_train.sh', 'wd'), ('slurm_test.sh', 'c')):
        for python, env in ((repo['venv_py'], {}),
                            ('/opt/py/bin/python3',
                             dict(PYTHON='/opt/py/bin/python3'))):
            argv = ('part', 'job', repo['cfg'], arg, '--cfg-options', 'a=1')
            proc = _script(repo, script, *argv, GPUS='16', **env)
            assert proc.returncode == 0, proc.stderr
            tool = script[6:-3]
            value = '--work-dir=wd' if tool == 'train' else 'c'
            assert (tmp_path / 'srun_args').read_text() == (
                '-p part --job-name=job --gres=gpu:8 --ntasks=16 '
                '--ntasks-per-node=8 --cpus-per-task=5 --kill-on-bad-exit=1 '
                f'{python} -u {repo["clone"]}/tools/{tool}.py {repo["cfg"]} '
                f'{value} --launcher=slurm --cfg-options a=1\n')
