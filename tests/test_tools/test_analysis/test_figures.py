"""The docs' figures are redrawn by scripts, in seconds, at a size legible
at the docs' page width: the architecture figure, and ``--plot CSV`` of
the benchmark tools from the committed CSVs of docs/en/benchmarks/."""
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
    with Image.open(out) as im:
        # 8 in at 120 dpi: shown about 1:1 at the docs' content width
        assert im.size[0] == 960
    assert list(tmp_path.glob('sub/*')) == [out]  # no temporary left
    # the pyramid shows the preset's channels (medium: 288 at stage 3)
    texts = []
    fig = arch.figure('medium')
    for ax in fig.axes:
        texts += [t.get_text() for t in ax.texts]
    assert any('C = 288' in t for t in texts)
    assert any('stride 32' in t for t in texts)
    assert any('1-3-29-5' in t for t in texts)  # medium's depths


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
    fig = mod.plot(rows, sorted({r['size']
                                 for r in rows})) if name == 'benchmark' \
        else mod.plot(rows)
    if n_bars is not None:  # one horizontal bar per row (x component)
        bars = [p for ax in fig.axes for p in ax.patches]
        assert len(bars) == n_bars
    labels = [
        t.get_fontsize() for ax in fig.axes for t in ax.get_yticklabels()
    ]
    assert labels and min(labels) >= 9  # legible, unlike the 7 pt ones
    if name == 'benchmark':
        panels_name_their_device(mod, rows, fig)


def panels_name_their_device(mod, rows, fig):
    """Each panel of benchmark.png names the machine its rows were measured
    on, from the CSV's device column (the committed one: every row has it);
    rows of two devices at one size name both; a CSV without the column
    says so instead of naming none."""
    assert all(r['device'] for r in rows)
    sizes = sorted({r['size'] for r in rows})
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
    """What the docs show: no figure wider than about twice the page (the
    21-bar FLOPs chart of 1952 px, shrunk to the page, was unreadable)."""
    names = sorted(os.listdir(FIGURES))
    assert 'architecture.png' in names and 'flops.png' in names
    for name in names:
        with Image.open(osp.join(FIGURES, name)) as im:
            assert im.size[0] <= 1000, (name, im.size)
