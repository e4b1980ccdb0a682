"""The documentation's generated tables equal their sources
(``docs/gen_tables.py``: the model index, the benchmark CSVs,
``requirements/*.txt``)."""
import os.path as osp
import shutil

from conftest import ROOT, load_module

GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_docs_gen')


def test_every_source_is_on_a_page():
    names = set()
    for rel in GEN.PAGES:
        with open(osp.join(ROOT, rel)) as f:
            names.update(GEN.blocks(f.read()))
    assert names == set(GEN.SOURCES)


def test_pages_equal_their_sources():
    assert GEN.stale_pages() == [], \
        'run python docs/gen_tables.py (or make docs)'


def test_a_changed_source_number_is_caught(tmp_path, monkeypatch):
    """A number changed in a CSV (or the model index) makes its page
    stale: the check compares every cell, not just the table's shape."""
    bench = tmp_path / 'benchmarks'
    shutil.copytree(GEN.BENCH, bench)
    csv = bench / 'benchmark_backbones.csv'
    csv.write_text(csv.read_text().replace('419.8', '418.8', 1))
    monkeypatch.setattr(GEN, 'BENCH', str(bench))
    assert GEN.stale_pages() == ['docs/en/benchmarks.md']
    csv = bench / 'benchmark_attention.csv'  # a figure of README's table
    csv.write_text(csv.read_text().replace('147.1', '157.1', 1))
    assert GEN.stale_pages() == ['README.md', 'docs/en/benchmarks.md']
    monkeypatch.setattr(GEN, '_metrics', lambda m: {'box AP (paper)': 0.0})
    assert 'docs/en/model_zoo.md' in GEN.stale_pages()
    assert 'README.md' in GEN.stale_pages()
