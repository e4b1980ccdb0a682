"""The Makefile's paths: ``VENV`` is one path in every recipe (spaces and
quotes included), and ``make clean-env`` deletes a virtualenv, never a
folder that is not one."""
import os
import shutil
import subprocess

import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(
    shutil.which('make') is None, reason='needs GNU make')


def _make(cwd, *args):
    return subprocess.run(['make', '-s', *args],
                          cwd=cwd,
                          capture_output=True,
                          text=True,
                          timeout=60)


@pytest.fixture
def tree(tmp_path):
    shutil.copy(os.path.join(ROOT, 'Makefile'), tmp_path)
    for d in ('my', 'env', 'keep'):
        (tmp_path / d).mkdir()
        (tmp_path / d / 'mine.txt').write_text(d)
    return tmp_path


@pytest.mark.parametrize('name', ['my env', "it's a venv"])
def test_clean_env_removes_exactly_the_virtualenv(tree, name):
    """``VENV="my env"`` once ran ``rm -rf my env``; then nothing to do."""
    (tree / name).mkdir()
    (tree / name / 'pyvenv.cfg').write_text('home = /usr/bin\n')
    proc = _make(tree, 'clean-env', f'VENV={name}')
    assert proc.returncode == 0, proc.stderr
    assert not (tree / name).exists()
    assert sorted(os.listdir(tree)) == ['Makefile', 'env', 'keep', 'my']
    assert all((tree / d / 'mine.txt').read_text() == d
               for d in ('my', 'env', 'keep'))
    again = _make(tree, 'clean-env', f'VENV={name}')
    assert again.stdout == (
        f'clean-env: {name} does not exist: nothing to remove\n')


@pytest.mark.parametrize('venv', ['keep', 'link'])
def test_clean_env_refuses_what_is_not_a_virtualenv(tree, venv):
    (tree / 'venv').mkdir()
    (tree / 'venv' / 'pyvenv.cfg').write_text('')
    (tree / 'link').symlink_to(tree / 'venv')  # removes the link's target
    before = sorted(os.listdir(tree))
    proc = _make(tree, 'clean-env', f'VENV={venv}')
    assert proc.returncode != 0
    assert proc.stderr.splitlines()[0] == (
        f'clean-env: {venv} is not a virtualenv (no pyvenv.cfg, or a link): '
        "refusing to delete it; set VENV to the virtualenv's own path")
    assert sorted(os.listdir(tree)) == before
    assert (tree / 'keep' / 'mine.txt').read_text() == 'keep'
    assert (tree / 'venv' / 'pyvenv.cfg').exists()


@pytest.mark.parametrize('target', ['env', 'test', 'lint', 'demo', 'docs'])
def test_every_recipe_quotes_the_venv(tree, target):
    """A dry run: the venv's python and MMSOFT_VENV are one shell word."""
    proc = _make(tree, '-n', target, "VENV=a b's")
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert "a b's" not in text.replace("'a b'\\''s", '')  # never bare
    assert "'a b'\\''s/bin/python'" in text or \
        "MMSOFT_VENV='a b'\\''s'" in text
