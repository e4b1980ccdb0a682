"""The Makefile: ``VENV`` is one path in every recipe (spaces and quotes
included), ``make clean-env`` deletes a virtualenv, never a folder that is
not one; ``make test`` runs in a random order (pytest-randomly;
docs/en/contributing.md) whose seed alone gives the order and is printed at
the end also under ``-q`` (``tests/conftest.py``)."""
import inspect
import os
import shutil
import subprocess
import sys

import conftest
import pytest
from conftest import ROOT, run


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
    """``VENV="my env"`` once ran ``rm -rf my env``; then nothing to do; a
    folder without pyvenv.cfg, or a link to a virtualenv, is refused."""
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
    """A dry run: the venv's python and MMSOFT_VENV are one shell word;
    ``make docs`` needs only the docs requirements (created when missing)."""
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
    """On two pytest-xdist workers, a module's tests on one worker (its
    module fixtures are built once); JOBS=0: in one process."""

    def make_test(*args):
        proc = _make(ROOT, '-n', 'test', *args)
        assert proc.returncode == 0, proc.stderr
        return ' '.join(proc.stdout.replace('\\\n', ' ').split())

    assert '-p randomly' in make_test()
    assert '--randomly-seed' not in make_test()
    assert '--randomly-seed=3' in make_test('SEED=3')
    assert '-n 2 --dist loadfile' in make_test()
    assert '-n 0 ' in make_test('JOBS=0')


#: ``pytest -q --co`` of two files, once per argument (one interpreter)
COLLECT = '''import sys, pytest
for args in sys.argv[1:]:
    print('=== run', flush=True)
    pytest.main(['test_a.py', 'test_b.py', '-q', '--co',
                 '-p', 'no:cacheprovider', *args.split()])
'''


def test_the_seed_gives_the_order_and_is_printed(tmp_path):
    """conftest's summary hook on two small files; a module's tests stay
    together (module fixtures are built once)."""
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
