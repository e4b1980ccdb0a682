"""``make docs`` needs only the docs requirements (not the torch / mmcv
stack of ``make env``), honours ``VENV=`` and installs only what is
missing."""
import os.path as osp
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, load_module

gen_tables = load_module(
    osp.join(ROOT, 'docs', 'gen_tables.py'), '_gen_tables_make_docs')


@pytest.mark.skipif(shutil.which('make') is None, reason='no make')
def test_make_docs_does_not_build_the_stack(tmp_path):
    venv = tmp_path / 'docsvenv'
    proc = subprocess.run(['make', '-n', 'docs', f'VENV={venv}'],
                          cwd=ROOT,
                          capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert 'setup_env.sh' not in proc.stdout  # no mmcv build
    # VENV= honoured, as one shell word
    assert f"'{venv}/bin/python' -m sphinx" in proc.stdout
    assert f"-m venv '{venv}'" in proc.stdout  # created when missing
    assert 'requirements/docs.txt requirements/docs_api.txt' in proc.stdout


def _pins():
    pins = {}
    for name in ('docs.txt', 'docs_api.txt'):
        with open(osp.join(ROOT, 'requirements', name)) as f:
            for ln in f:
                ln = ln.split('#')[0].strip()
                if '==' in ln:
                    pins[ln.split('==')[0]] = ln.split('==')[1]
    return pins


DOCS, API = 'requirements/docs.txt', 'requirements/docs_api.txt'


@pytest.mark.parametrize(
    'installed,missing',
    [
        ({}, []),
        (dict(torch='2.14.1+cpu'), []),  # the CPU wheel of docs_api.txt
        (dict(torch='2.14.1+cu130'), []),  # the project venv's
        (dict(torch='2.1.2'), [API]),
        (dict(sphinx=None), [DOCS]),
        (dict(sphinx=None, mmengine=None), [DOCS, API]),
    ])
def test_docs_env_lists_what_is_missing(installed, missing, monkeypatch):
    import importlib.metadata as metadata
    versions = dict(_pins(), **installed)
    assert 'torch' in versions and 'sphinx' in versions

    def version(name):
        if versions.get(name) is None:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, 'version', version)
    assert gen_tables.docs_env_missing() == missing


def test_docs_env_command_prints_the_missing_files():
    proc = subprocess.run([
        sys.executable,
        osp.join(ROOT, 'docs', 'gen_tables.py'), '--docs-env'
    ],
                          capture_output=True,
                          text=True)
    missing = gen_tables.docs_env_missing()
    assert proc.returncode == (1 if missing else 0)
    assert proc.stdout.split() == missing
