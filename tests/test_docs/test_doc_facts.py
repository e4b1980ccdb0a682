"""Statements of the README and the docs checked against what they
describe (issue 51): the usage snippets set the backbone and the optimizer
of the shipped configs they stand for, a snippet's ``arch`` fits the
authors' file it loads, and the pages count the authors' files as
``OFFICIAL_FILES`` lists them.
"""
import glob
import os.path as osp
import re

import pytest
from conftest import CONFIGS, ROOT, load_module

from mmsoft.models.converters import OFFICIAL_FILES

PAGES = sorted(
    glob.glob(osp.join(ROOT, 'docs', 'en', '**', '*.md'),
              recursive=True)) + [osp.join(ROOT, 'README.md')]
FENCE = re.compile(r'^```python\n(?P<body>.*?)^```', re.S | re.M)
#: the backbone keys a usage snippet must share with its shipped config
RECIPE_KEYS = ('arch', 'attn_cfg', 'out_indices', 'drop_path_rate',
               'residual_drop', 'norm_eval')


def python_blocks(rel):
    with open(osp.join(ROOT, rel)) as f:
        return [m.group('body') for m in FENCE.finditer(f.read())]


def block_with(rel, base):
    """The one Python block of ``rel`` whose ``_base_`` is ``base``."""
    found = [b for b in python_blocks(rel) if f"_base_ = '{base}'" in b]
    assert len(found) == 1, (rel, base, len(found))
    return found[0]


def config(code, tmp_path):
    from mmengine.config import Config
    path = tmp_path / 'snippet.py'
    path.write_text(code)
    return Config.fromfile(str(path))


@pytest.mark.parametrize('rel,base,shipped', [
    ('README.md', 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
     'retinanet_soft_small_1x'),
    ('docs/en/user_guides/own_config.md',
     'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
     'retinanet_soft_small_1x'),
    ('docs/en/user_guides/own_config.md',
     'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py',
     'upernet_soft_small_512x512_160k_ade20k'),
])
def test_usage_snippet_is_the_shipped_recipe(rel, base, shipped, tmp_path):
    """Pasted into a ResNet config, the snippet trains as the shipped
    config does: the same backbone settings (drop path included), the
    same authors' file and the papers' AdamW, not the base's SGD."""
    pytest.importorskip(base.split('::')[0])
    from mmengine.config import Config
    mine = config(block_with(rel, base), tmp_path)
    ref = Config.fromfile(osp.join(CONFIGS, shipped + '.py'))
    for key in RECIPE_KEYS:
        assert mine.model.backbone.get(key) == ref.model.backbone.get(key), \
            (rel, key)
    assert mine.model.backbone.init_cfg.checkpoint == \
        ref.model.backbone.init_cfg.checkpoint
    assert mine.optim_wrapper.to_dict() == ref.optim_wrapper.to_dict(), rel


def _arch_and_file(code, tmp_path):
    """(arch, checkpoint) a config snippet ends with: its own values, else
    those of the shipped config it copies (``mmsoft_configs/<name>.py``)."""
    arch = re.search(r"\barch='([\w-]+)'", code)
    ckpt = re.search(r"checkpoint='([^']+\.pth)'", code)
    shipped = re.search(r"mmsoft_configs/(\w+)\.py", code)
    base_arch = base_ckpt = None
    if shipped:
        from mmengine.config import Config
        ref = Config.fromfile(osp.join(CONFIGS, shipped.group(1) + '.py'))
        base_arch = ref.model.backbone.arch
        base_ckpt = ref.model.backbone.init_cfg.checkpoint
    return (arch.group(1) if arch else base_arch,
            ckpt.group(1) if ckpt else base_ckpt)


def snippets_loading_an_authors_file():
    out = []
    for page in PAGES:
        rel = osp.relpath(page, ROOT)
        for i, code in enumerate(python_blocks(rel)):
            if "arch='" in code and ('checkpoint=' in code
                                     or 'mmsoft_configs/' in code):
                out.append(pytest.param(rel, code, id=f'{rel}-{i}'))
    return out


@pytest.mark.parametrize('rel,code', snippets_loading_an_authors_file())
def test_snippet_arch_fits_its_authors_file(rel, code, tmp_path):
    """An ``arch`` with the authors' file of another arch stops the run
    (the own-config page used to set arch='tiny' over the Small file)."""
    arch, ckpt = _arch_and_file(code, tmp_path)
    name = osp.splitext(osp.basename(ckpt or ''))[0]
    if name not in OFFICIAL_FILES:
        return  # not an authors' file (an mmsoft one, a trained model)
    entry = OFFICIAL_FILES[name]
    fits = {entry['arch']} | {(entry.get('code_arch') or [None])[0]}
    assert arch in fits, f'{rel}: arch={arch!r} with {ckpt} ({fits})'


def test_the_copied_config_case_is_checked():
    """The own-config page's copied-config snippet is among the cases."""
    ids = [p.values[1] for p in snippets_loading_an_authors_file()]
    assert any('mmsoft_configs/retinanet_soft_small_1x.py' in c for c in ids)


NUMBERS = {4: 'four', 5: 'five', 6: 'six', 7: 'seven', 8: 'eight'}


@pytest.mark.parametrize(
    'rel', ['docs/en/user_guides/official_weights.md', 'docs/en/model_zoo.md'])
def test_pages_count_the_authors_files(rel):
    """As many published files as the README of fudan-zvg/SOFT links
    (``link`` and ``more_links`` of ``OFFICIAL_FILES``: six, two of them
    SOFT-Tiny's)."""
    n = sum(1 + len(e.get('more_links', [])) for e in OFFICIAL_FILES.values()
            if e['link'])
    assert n == 6
    with open(osp.join(ROOT, rel)) as f:
        text = ' '.join(f.read().split())
    counts = re.findall(r'The authors publish (\w+)', text)
    assert counts == [NUMBERS[n]], (rel, counts)


def test_readme_names_the_machine_of_its_figures():
    """No "no GPU figures" left, and the GPU rows name their GPU."""
    with open(osp.join(ROOT, 'README.md')) as f:
        text = f.read()
    assert 'no GPU figures' not in ' '.join(text.split())
    why = text[text.index('<!-- generated: why -->'):]
    why = why[:why.index('<!-- end generated -->')]
    rows = [r for r in why.splitlines() if r.startswith('| ')][1:]
    machines = ('2-core CPU, 1 thread', '2-core CPU, 2 threads', 'NVIDIA H200',
                'NVIDIA H100')
    assert rows and all(r.split(' | ')[1] in machines for r in rows), rows
    for machine in ('2-core CPU, 2 threads', 'NVIDIA H200'):  # beside
        assert any(f'| {machine} |' in r and '800 × 1216' in r
                   for r in rows), machine
    assert any('| NVIDIA H100 |' in r for r in rows)


# ------------------------------------------- figures against their CSVs
GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_docs_gen_facts')
#: "0.90x PVTv2-b2", "**0.90x** PVTv2-b2", "0.29x / 0.28x PVTv2-b2"
RATIO = re.compile(r'(?P<a>\d+\.\d+)x(?:\*\*)?(?: / (?P<b>\d+\.\d+)x)? '
                   r'(?:the )?PVTv2-b(?P<peer>\d)')
SIZE = re.compile(r'(\d{3,4}) [×x] (\d{3,4})')
#: ratios against PVTv2 stated in prose that no CSV holds, and why
NOT_IN_A_CSV = {
    ('docs/en/benchmarks.md', '0.29x / 0.28x PVTv2-b2'):
    'max_landmarks=196: a one-off run of November 2026 (the page says so)',
    ('docs/en/benchmarks.md', '1.28x PVTv2-b2'):
    'Gaussian-noise input (--input noise): a run not kept as a CSV',
}
#: the rows measured before block Lanczos took the pseudo-inverse at
#: detection resolution (superseded on the CPU by
#: detection_resolution_cpu.csv; on GPUs not yet rerun): a page may
#: quote them only in a paragraph that says "before"
BEFORE_LANCZOS = ('benchmark_backbones.csv', 'gpu_h200.csv', 'gpu_h100.csv')


def csv_ratios():
    """``{(H x W, peer): {ratio: superseded}}``: every SOFT-vs-PVTv2 time
    ratio the benchmark CSVs give (any SOFT variant, mode, batch and
    machine), rounded as the pages write them; ``superseded``: only rows
    at 800 x 1216 measured before block Lanczos give it."""
    out = {}

    def add(size, peer, ratio, name):
        hw = 'x'.join(size.split('x')[:2])
        old = name in BEFORE_LANCZOS and hw == '800x1216'
        ratios = out.setdefault((hw, peer), {})
        ratios[GEN._x(ratio)] = ratios.get(GEN._x(ratio), True) and old

    def pairs(name, times):
        for (model, size, mode), t in times.items():
            for peer in ('pvtv2_b1', 'pvtv2_b2'):
                ref = times.get((peer, size, mode))
                if model.startswith('soft') and ref:
                    add(size, peer[-2:], t / ref, name)

    name = 'benchmark_backbones.csv'
    pairs(
        name, {
            (r['model'], r['size'], r['mode']): float(r['time_ms'])
            for r in GEN.read_csv(name)
        })
    # the alternated runs; in the second, one run per allocator and load
    for name in ('detection_resolution_cpu.csv',
                 'detection_resolution_cpu_runs.csv'):
        det = GEN.read_csv(name)
        for run in {(r.get('memory'), r.get('note')) for r in det}:
            pairs(
                name, {
                    (r['model'], r['size'], r['mode']): float(r['time_ms'])
                    for r in det if (r.get('memory'), r.get('note')) == run
                })
        for r in det:
            if r['ratio']:
                add(r['size'], r['baseline'][-2:], float(r['ratio']), name)
    for _, name in GEN.GPU_CSVS:
        pairs(
            name, {
                (r['model'], r['input'], r['mode']): float(r['ms'])
                for r in GEN.read_csv(name) if r['section'] == 'backbones'
            })
    return out


def stated_ratios(text):
    """``(sizes, peer, ratio, quote, context)`` of every SOFT-vs-PVTv2
    ratio stated in ``text``, with the sizes its paragraph names: in prose
    "N.NNx PVTv2-bK"; in a table row that names "PVTv2-bK" and a size,
    each "(N.NNx)" (its context: the row and its footnotes)."""
    out = []
    paras = re.split(r'\n\s*\n', text)
    notes = {p.strip()[0]: p for p in paras if p.strip()[:1] in '¹²³⁴'}
    for para in paras:
        rows = [ln for ln in para.splitlines() if ln.startswith('|')]
        for row in rows:
            peer = re.search(r'PVTv2-b(\d)', row)
            sizes = {f'{m.group(1)}x{m.group(2)}' for m in SIZE.finditer(row)}
            if not (peer and sizes):
                continue
            context = row + ''.join(
                notes.get(c, '') for c in '¹²³⁴' if c in row)
            for m in re.finditer(r'\((\d+\.\d+)x\)', row):
                out.append((sizes, 'b' + peer.group(1), m.group(1) + 'x',
                            m.group(0), context))
        prose = '\n'.join(ln for ln in para.splitlines()
                          if not ln.startswith('|'))
        sizes = {f'{m.group(1)}x{m.group(2)}' for m in SIZE.finditer(prose)}
        for m in RATIO.finditer(prose):
            quote = m.group(0).replace('**', '')
            for ratio in filter(None, (m.group('a'), m.group('b'))):
                out.append(
                    (sizes, 'b' + m.group('peer'), ratio + 'x', quote, prose))
    return out


def contradicted(rel, text, known):
    """The stated ratios of ``text`` that no CSV row at a size of their
    paragraph gives (or only a row measured before block Lanczos, in a
    paragraph that does not say so)."""
    wrong = []
    for sizes, peer, ratio, quote, para in stated_ratios(text):
        if (rel, quote) in NOT_IN_A_CSV:
            continue
        flags = [known.get((s, peer), {}).get(ratio) for s in sizes]
        ok = any(f is False
                 for f in flags) or (any(f is True
                                         for f in flags) and 'before' in para)
        if not ok:
            wrong.append((sorted(sizes), quote))
    return wrong


@pytest.mark.parametrize('rel', ['README.md', 'docs/en/benchmarks.md'])
def test_stated_ratios_match_the_csvs(rel):
    """Every "N.NNx PVTv2-bK" of the page is the ratio of a CSV row at a
    size its paragraph names, and a figure measured before block Lanczos
    is said to be (the README's 800 x 1216 CPU row said 1.40x, the old
    backbone table's, after the CSV of the run since said 0.90x)."""
    with open(osp.join(ROOT, rel)) as f:
        text = f.read()
    assert stated_ratios(text), rel
    wrong = contradicted(rel, text, csv_ratios())
    assert not wrong, f'{rel}: no CSV row gives {wrong}'


def test_a_contradicted_ratio_is_caught(monkeypatch):
    """The check compares the numbers and the labels: an invented ratio, a
    pre-Lanczos one not said to be, and a CSV re-measured under a page
    are each reported."""
    known = csv_ratios()
    now = GEN.detection_cpu_rows()[('soft_small_norm', '800x1216x1',
                                    'forward')]['ratio']  # the current run
    assert known[('800x1216', 'b2')][now + 'x'] is False
    assert known[('800x1216', 'b2')]['1.40x'] is True  # the old table
    page = 'At 800 × 1216 the forward takes {}x PVTv2-b2{}.'
    assert contradicted('x.md', page.format(now, ''), known) == []
    assert contradicted('x.md', page.format('1.40', ''),
                        known) == [(['800x1216'], '1.40x PVTv2-b2')]
    assert contradicted(
        'x.md', page.format('1.40', ' (measured before block Lanczos)'),
        known) == []
    assert contradicted('x.md', page.format('1.11', ''), known)
    assert contradicted('x.md', '512 x 512: 1.40x PVTv2-b2', known)
    row = ('| SOFT-Small-Norm vs PVTv2-b2, 800 × 1216 × 1, forward | CPU | '
           '7986 ms (1.40x){} | 5700 ms |\n')
    assert contradicted('x.md', row.format(''),
                        known) == [(['800x1216'], '(1.40x)')]
    note = '\n² measured before block Lanczos\n'
    assert contradicted('x.md', row.format(' ²') + note, known) == []
    real = GEN.read_csv

    def remeasured(name):  # SOFT 10% slower in the current run
        rows = real(name)
        if name != 'detection_resolution_cpu.csv':
            return rows
        return [
            dict(r, ratio='', time_ms=str(float(r['time_ms']) * 1.1))
            if r['model'].startswith('soft') else r for r in rows
        ]

    monkeypatch.setattr(GEN, 'read_csv', remeasured)
    assert contradicted('x.md', page.format(now, ''), csv_ratios())


GPU_CSV_ROWS = sum(len(GEN.read_csv(name)) for _, name in GEN.GPU_CSVS)
NO_GPU = re.compile(r'no GPU (figures|numbers|measurements|results|rows)',
                    re.I)


@pytest.mark.parametrize('page', PAGES, ids=lambda p: osp.relpath(p, ROOT))
def test_no_page_says_there_are_no_gpu_figures(page):
    """GPU rows exist (``gpu_h200.csv``, ``gpu_h100.csv``): no page says
    there are none (the README said "no GPU figures yet")."""
    assert GPU_CSV_ROWS > 0
    with open(page) as f:
        text = ' '.join(f.read().split())
    assert not NO_GPU.search(text), (page, NO_GPU.search(text).group(0))


@pytest.mark.parametrize('model', GEN.load_models(), ids=lambda m: m['Name'])
def test_model_index_schedule_is_the_configs(model):
    """The schedule the model zoo's training-time table multiplies (the
    metafile's ``Epochs`` / ``Iterations`` and ``Batch Size`` on 8 GPUs)
    is the config's."""
    from mmengine.config import Config
    name, meta = model['Name'], model['Metadata']
    pytest.importorskip({
        'in1k': 'mmpretrain',
        'ade20k': 'mmseg'
    }.get(name.split('_')[-1], 'mmdet'))
    cfg = Config.fromfile(osp.join(ROOT, model['Config']))
    assert meta['Training Resources'] == '8x GPUs'
    assert cfg.train_dataloader.batch_size * 8 == meta['Batch Size'], name
    if cfg.get('auto_scale_lr'):
        assert cfg.auto_scale_lr.base_batch_size == meta['Batch Size']
    if 'Iterations' in meta:
        assert cfg.train_cfg.max_iters == meta['Iterations'], name
    else:
        assert cfg.train_cfg.max_epochs == meta['Epochs'], name
        data = 'ImageNet' if name.endswith('_in1k') else 'Coco'
        assert data in cfg.train_dataloader.dataset.type, name
