"""The documentation's generated tables equal their sources
(``docs/gen_tables.py``: the model index, the benchmark CSVs,
``mmsoft/deps.py``)."""
import os.path as osp
import re
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
    monkeypatch.setattr(GEN, '_metrics', lambda m: {'box AP (paper)': 0.0})
    assert 'docs/en/model_zoo.md' in GEN.stale_pages()
    assert 'README.md' in GEN.stale_pages()


def _numbers(text):
    return re.findall(r'\d+(?:\.\d+)?', text)


def test_readme_why_table_is_measured():
    """Every number of the README's "Why SOFT" table is a figure of the
    benchmarks page (as rounded there, or rounded from it)."""
    with open(osp.join(ROOT, 'README.md')) as f:
        section = f.read().split('\n## Why SOFT\n', 1)[1].split('\n## ')[0]
    rows = [ln for ln in section.splitlines() if ln.startswith('| ')][1:]
    assert len(rows) >= 5
    with open(osp.join(ROOT, 'docs', 'en', 'benchmarks.md')) as f:
        source = [float(x) for x in _numbers(f.read())]
    for row in rows:
        for cell in row.strip('|').split('|')[1:]:
            for x in _numbers(cell):
                d = len(x.split('.')[1]) if '.' in x else 0
                assert any(round(y, d) == float(x) for y in source), \
                    (x, row)
