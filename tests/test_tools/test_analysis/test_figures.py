"""The docs' figures redrawn by scripts at a size legible at the page width:
the architecture, ``--plot CSV`` of docs/en/benchmarks/' committed CSVs."""
import os
import os.path as osp

import pytest
from conftest import ROOT, load_tool
from PIL import Image

BENCH = osp.join(ROOT, 'docs', 'en', 'benchmarks')
FIGURES = osp.join(ROOT, 'tools', 'analysis', 'figures')


def tool(name):
    return load_tool(f'analysis/{name}.py', f'_analysis_{name}')


def test_architecture_figure(tmp_path):
    arch = tool('draw_architecture')
    out = tmp_path / 'sub' / 'architecture.png'
    assert arch.main(['--out', str(out), '--arch', 'medium']) == 0
    with Image.open(out) as im:  # 8 in at 120 dpi: the docs' width
        assert im.size[0] == 960
    assert list(tmp_path.glob('sub/*')) == [out]  # no temporary left
    texts = [t.get_text() for ax in arch.figure('medium').axes
             for t in ax.texts]  # yapf: disable
    # medium: 288 channels at stage 3, depths 1-3-29-5
    for part in ('C = 288', 'stride 32', '1-3-29-5'):
        assert any(part in t for t in texts), part


@pytest.mark.parametrize('name,csv,n_bars', [
    ('benchmark', 'benchmark_backbones.csv', 28),
    ('benchmark_attention', 'benchmark_attention.csv', None),
    ('get_flops', 'flops.csv', 21 * 3),
])
def test_plot_redraws_from_the_committed_csv(name, csv, n_bars, tmp_path):
    mod = tool(name)
    out = tmp_path / f'{name}.png'
    mod.main(['--plot', osp.join(BENCH, csv), '--figure', str(out)])
    with Image.open(out) as im:
        assert im.size[0] == 880  # 8 in at 110 dpi, whatever the row count
    rows = mod.read_rows(osp.join(BENCH, csv))
    sizes = sorted({r['size'] for r in rows}) if name == 'benchmark' else 0
    fig = mod.plot(rows, sizes) if sizes else mod.plot(rows)
    if n_bars is not None:  # one horizontal bar per row (x component)
        assert len([p for ax in fig.axes for p in ax.patches]) == n_bars
    labels = [t.get_fontsize() for ax in fig.axes
              for t in ax.get_yticklabels()]  # yapf: disable
    assert labels and min(labels) >= 9  # legible, unlike the 7 pt ones
    if not sizes:
        return
    # each panel names the machine(s) of its rows (the CSV's device column);
    # a CSV without the column says so
    assert all(r['device'] for r in rows)
    titles = [ax.get_title() for ax in fig.axes]
    assert len(titles) == len(sizes) >= 2
    for size, title in zip(sizes, titles):
        devices = {r['device'] for r in rows if r['size'] == size}
        assert size in title and all(d in title for d in devices), title
    gpu = [dict(r, device='NVIDIA H100 80GB HBM3') for r in rows[:2]]
    title = mod.plot(rows[:2] + gpu, [rows[0]['size']]).axes[0].get_title()
    assert 'NVIDIA H100 80GB HBM3' in title and rows[0]['device'] in title
    bare = [{k: v for k, v in r.items() if k != 'device'} for r in rows[:2]]
    title = mod.plot(bare, [rows[0]['size']]).axes[0].get_title()
    assert title.endswith('on a device the CSV does not name')


def test_committed_figures_are_page_width():
    """No figure wider than about twice the page (the 21-bar FLOPs chart of
    1952 px, shrunk to the page, was unreadable)."""
    names = sorted(os.listdir(FIGURES))
    assert 'architecture.png' in names and 'flops.png' in names
    for name in names:
        with Image.open(osp.join(FIGURES, name)) as im:
            assert im.size[0] <= 1000, (name, im.size)
