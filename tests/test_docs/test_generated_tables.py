"""``docs/gen_tables.py``: the generated tables equal their sources;
``--docs-env`` lists only what is missing."""
import importlib.metadata as metadata
import math
import os.path as osp
import shutil

import pytest
from conftest import ROOT, load_module

GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_docs_gen')
DOCS, API = 'requirements/docs.txt', 'requirements/docs_api.txt'


@pytest.fixture
def bench(tmp_path, monkeypatch):  # a copy of the benchmark CSVs
    shutil.copytree(GEN.BENCH, tmp_path / 'benchmarks')
    monkeypatch.setattr(GEN, 'BENCH', str(tmp_path / 'benchmarks'))
    return tmp_path / 'benchmarks'


def test_every_source_is_on_a_page_and_pages_equal_their_sources():
    names = set()
    for rel in GEN.PAGES:
        with open(osp.join(ROOT, rel)) as f:
            names.update(GEN.blocks(f.read()))
    assert names == set(GEN.SOURCES)
    assert GEN.main(['--check']) == 0, 'run python docs/gen_tables.py'


def test_a_changed_source_number_is_caught(bench, monkeypatch, capsys):
    """Every cell is compared; ``--check`` names each stale page, exit 1."""
    for name, old, new, stale in (
        ('benchmark_backbones.csv', '419.8', '418.8', ['benchmarks.md']),
        ('benchmark_attention.csv', '147.1', '157.1',  # README's too
         ['README.md', 'benchmarks.md'])):  # yapf: disable
        csv = bench / name
        csv.write_text(csv.read_text().replace(old, new, 1))
        stale = [p if p == 'README.md' else 'docs/en/' + p for p in stale]
        assert GEN.stale_pages() == stale
    capsys.readouterr()
    assert GEN.main(['--check']) == 1
    assert capsys.readouterr().out.splitlines() == [
        f'{p}: generated tables differ from their sources; run python '
        'docs/gen_tables.py' for p in stale
    ]
    monkeypatch.setattr(GEN, '_metrics', lambda m: {'box AP (paper)': 0.0})
    assert {'docs/en/model_zoo.md', 'README.md'} <= set(GEN.stale_pages())


def test_a_measured_recipe_becomes_an_estimate(bench):
    """A recipe_gpu.csv row: "not measured yet" becomes an estimate."""
    csv = bench / 'recipe_gpu.csv'
    csv.write_text(csv.read_text() + 'retinanet_soft_tiny_1x,NVIDIA H100,'
                   '0.500,7000,2026-12-07,first 100 iterations\n')
    assert GEN.stale_pages() == ['docs/en/model_zoo.md']
    rows = {r.split(' | ')[0]: r for r in GEN.recipe_times().splitlines()}
    row = rows['| `retinanet_soft_tiny_1x`']
    iters = 12 * math.ceil(117266 / 16)  # 1x: 12 epochs of COCO at 16
    assert (f'estimated {iters * 0.5 / 3600:.1f} h ({iters:,} iters × '
            '0.500 s/iter, NVIDIA H100)') in row
    assert '7,000 MiB (NVIDIA H100)' in row and 'not measured' not in row
    assert 'not measured yet' in rows['| `retinanet_soft_medium_1x`']


@pytest.mark.parametrize('installed,missing', [
    ({}, []), (dict(torch='2.14.1+cu130'), []), (dict(torch='2.1.2'), [API]),
    (dict(sphinx=None, mmengine=None), [DOCS, API])])  # yapf: disable
def test_docs_env_lists_what_is_missing(installed, missing, monkeypatch,
                                        capsys):
    """The missing files on one line, exit 1 (a local version: ignored)."""
    versions = {}
    for name in (DOCS, API):
        with open(osp.join(ROOT, name)) as f:
            pins = [ln.split('#')[0].strip().split('==') for ln in f]
        versions.update(p for p in pins if len(p) == 2)
    versions.update(installed)
    assert 'torch' in versions and 'sphinx' in versions

    def version(name):
        if versions.get(name) is None:
            raise metadata.PackageNotFoundError(name)
        return versions[name]

    monkeypatch.setattr(metadata, 'version', version)
    assert GEN.docs_env_missing() == missing
    assert GEN.main(['--docs-env']) == (1 if missing else 0)
    assert capsys.readouterr().out == ' '.join(missing) + '\n'
