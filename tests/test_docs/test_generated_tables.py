"""The documentation's generated tables equal their sources
(``docs/gen_tables.py``: the model index, the benchmark CSVs,
``requirements/*.txt``)."""
import math
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


def test_a_measured_recipe_becomes_an_estimate(tmp_path, monkeypatch):
    """A row of recipe_gpu.csv (a recipe's s/iter and memory on a GPU)
    turns the model zoo's "not measured yet" into iterations x s/iter,
    labelled estimated and naming the GPU."""
    bench = tmp_path / 'benchmarks'
    shutil.copytree(GEN.BENCH, bench)
    csv = bench / 'recipe_gpu.csv'
    csv.write_text(csv.read_text() + 'retinanet_soft_tiny_1x,NVIDIA H100,'
                   '0.500,7000,2026-12-07,first 100 iterations\n')
    monkeypatch.setattr(GEN, 'BENCH', str(bench))
    assert GEN.stale_pages() == ['docs/en/model_zoo.md']
    rows = {r.split(' | ')[0]: r for r in GEN.recipe_times().splitlines()}
    row = rows['| `retinanet_soft_tiny_1x`']
    iters = 12 * math.ceil(117266 / 16)  # 1x: 12 epochs of COCO at 16
    assert (f'estimated {iters * 0.5 / 3600:.1f} h ({iters:,} iters × '
            '0.500 s/iter, NVIDIA H100)') in row
    assert '7,000 MiB (NVIDIA H100)' in row and 'not measured' not in row
    assert 'not measured yet' in rows['| `retinanet_soft_medium_1x`']
