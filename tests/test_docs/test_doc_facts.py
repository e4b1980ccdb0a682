"""Statements of the README and the docs against what they describe: one
table of (doc file, claim, how it is checked), usage snippets that are the
shipped recipes, a snippet's ``arch`` that fits its authors' file, the
model index's schedule that is the configs'."""
import glob
import os.path as osp
import re

import pytest
from conftest import CONFIGS, ROOT, load_module
from mmengine.config import Config

from mmsoft.models.converters import OFFICIAL_FILES

PAGES = sorted(
    osp.relpath(p, ROOT)
    for p in glob.glob(f'{ROOT}/docs/en/**/*.md', recursive=True)) + [
        'README.md'
    ]  # yapf: disable
FENCE = re.compile(r'^```python\n(?P<body>.*?)^```', re.S | re.M)
GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_docs_gen_facts')


def read(rel):
    with open(osp.join(ROOT, rel)) as f:
        return f.read()


def shipped(name):
    return Config.fromfile(osp.join(CONFIGS, name + '.py'))


def python_blocks(rel):
    return [m.group('body') for m in FENCE.finditer(read(rel))]


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
#: rows measured before block Lanczos took the pseudo-inverse at detection
#: resolution: a page may quote them only in a paragraph saying "before"
BEFORE_LANCZOS = ('benchmark_backbones.csv', 'gpu_h200.csv', 'gpu_h100.csv')


def csv_ratios():
    """``{(H x W, peer): {ratio: superseded}}``: every SOFT-vs-PVTv2 time
    ratio of the benchmark CSVs, rounded as the pages write them;
    ``superseded``: only pre-Lanczos rows at 800 x 1216 give it."""
    out = {}

    def add(size, peer, ratio, name):
        hw = 'x'.join(size.split('x')[:2])
        ratios = out.setdefault((hw, peer), {})
        old = name in BEFORE_LANCZOS and hw == '800x1216'
        ratios[GEN._x(ratio)] = ratios.get(GEN._x(ratio), True) and old

    def pairs(name, rows, size='size', ms='time_ms'):
        times = {(r['model'], r[size], r['mode']): float(r[ms]) for r in rows}
        for (model, sz, mode), t in times.items():
            for peer in ('pvtv2_b1', 'pvtv2_b2'):
                if model.startswith('soft') and times.get((peer, sz, mode)):
                    add(sz, peer[-2:], t / times[(peer, sz, mode)], name)

    pairs('benchmark_backbones.csv', GEN.read_csv('benchmark_backbones.csv'))
    # the alternated runs; in the second, one run per allocator and load
    for name in ('detection_resolution_cpu.csv',
                 'detection_resolution_cpu_runs.csv'):
        det = GEN.read_csv(name)
        for run in {(r.get('memory'), r.get('note')) for r in det}:
            pairs(name,
                  [r for r in det if (r.get('memory'), r.get('note')) == run])
        for r in (r for r in det if r['ratio']):
            add(r['size'], r['baseline'][-2:], float(r['ratio']), name)
    for _, name in GEN.GPU_CSVS:
        rows = GEN.read_csv(name)
        pairs(name, [r for r in rows if r['section'] == 'backbones'], 'input',
              'ms')
    return out


def stated_ratios(text):
    """``(sizes, peer, ratio, quote, context)`` of every SOFT-vs-PVTv2 ratio
    of ``text`` with the sizes its paragraph names: prose "N.NNx PVTv2-bK";
    each "(N.NNx)" of a table row naming "PVTv2-bK" and a size (context:
    the row and its footnotes)."""
    out, paras = [], re.split(r'\n\s*\n', text)
    notes = {p.strip()[0]: p for p in paras if p.strip()[:1] in '¹²³⁴'}

    def sizes(s):
        return {f'{m.group(1)}x{m.group(2)}' for m in SIZE.finditer(s)}

    for para in paras:
        lines = para.splitlines()
        for row in (ln for ln in lines if ln.startswith('|')):
            peer = re.search(r'PVTv2-b(\d)', row)
            ctx = row + ''.join(notes.get(c, '') for c in '¹²³⁴' if c in row)
            out += [(sizes(row), 'b' + peer.group(1), m.group(1) + 'x',
                     m.group(0), ctx)
                    for m in re.finditer(r'\((\d+\.\d+)x\)', row)
                    if peer and sizes(row)]  # yapf: disable
        prose = '\n'.join(ln for ln in lines if not ln.startswith('|'))
        out += [(sizes(prose), 'b' + m.group('peer'), ratio + 'x',
                 m.group(0).replace('**', ''), prose)
                for m in RATIO.finditer(prose)
                for ratio in filter(None, (m.group('a'), m.group('b')))]
    return out


def contradicted(rel, text, known):
    """The stated ratios of ``text`` that no CSV row at a size of their
    paragraph gives (or only a pre-Lanczos row, in a paragraph that does
    not say "before")."""
    wrong = []
    for sizes, peer, ratio, quote, para in stated_ratios(text):
        flags = [known.get((s, peer), {}).get(ratio) for s in sizes]
        if (rel, quote) not in NOT_IN_A_CSV and False not in flags and not (
                True in flags and 'before' in para):
            wrong.append((sorted(sizes), quote))
    return wrong


def ratios_are_the_csvs(rel, text):
    assert stated_ratios(text), rel
    assert contradicted(rel, text, csv_ratios()) == []


def six_authors_files(rel, text):
    n = sum(1 + len(e.get('more_links', [])) for e in OFFICIAL_FILES.values()
            if e['link'])
    assert n == 6
    assert re.findall(r'The authors publish (\w+)',
                      ' '.join(text.split())) == ['six']


def why_rows_name_machines(rel, text):
    why = text[text.index('<!-- generated: why -->'):]
    rows = [
        r.split(' | ') for r in why[:why.index('<!-- end')].splitlines()
        if r.startswith('| ')
    ][1:]
    assert rows and {r[1]
                     for r in rows
                     } <= {GEN.CPU1, GEN.CPU2, GEN.H200, GEN.H100}
    for machine in (GEN.CPU2, GEN.H200):  # side by side at 800 x 1216
        assert any(r[1] == machine and '800 × 1216' in r[0] for r in rows)
    assert any(r[1] == GEN.H100 for r in rows)


def no_page_denies_gpu_figures(rel, text):
    assert sum(len(GEN.read_csv(name)) for _, name in GEN.GPU_CSVS) > 0
    no_gpu = re.compile(r'no GPU (figures|numbers|measurements|results|rows)',
                        re.I)
    said = [(p, no_gpu.search(' '.join(read(p).split()))) for p in PAGES]
    assert [(p, m.group(0)) for p, m in said if m] == []


#: (doc file, claim, how it is checked); README's ratios: generated tables
FACTS = [
    ('docs/en/benchmarks.md', 'N.NNx PVTv2-bK: a CSV ratio',
     ratios_are_the_csvs),
    ('docs/en/user_guides/official_weights.md', 'six files',
     six_authors_files),
    ('docs/en/model_zoo.md', 'six files', six_authors_files),
    ('README.md', 'Why SOFT: each row its machine', why_rows_name_machines),
    ('README.md', 'no page: "no GPU figures"', no_page_denies_gpu_figures),
]


@pytest.mark.parametrize(
    'rel,claim,check', FACTS, ids=[f'{r}-{c.__name__}' for r, _, c in FACTS])
def test_doc_fact(rel, claim, check):
    check(rel, read(rel))


def test_a_contradicted_ratio_is_caught(monkeypatch):
    """An invented ratio, a pre-Lanczos one not said to be, a CSV
    re-measured under a page."""
    known = csv_ratios()
    now = GEN.detection_cpu_rows()[('soft_small_norm', '800x1216x1',
                                    'forward')]['ratio']  # the current run
    got = known[('800x1216', 'b2')]
    assert (got[now + 'x'], got['1.40x']) == (False, True)  # now; the old
    page = 'At 800 × 1216 the forward takes {}x PVTv2-b2{}.'.format
    row = ('| SOFT-Small-Norm vs PVTv2-b2, 800 × 1216 × 1, forward | CPU | '
           '7986 ms (1.40x){} | 5700 ms |\n').format
    for text, wrong in [
        (page(now, ''), []),
        (page('1.40', ''), [(['800x1216'], '1.40x PVTv2-b2')]),
        (page('1.40', ' (measured before block Lanczos)'), []),
        ('512 x 512: 1.40x PVTv2-b2', [(['512x512'], '1.40x PVTv2-b2')]),
        (row(''), [(['800x1216'], '(1.40x)')]),
        (row(' ²') + '\n² measured before block Lanczos\n', []),
    ]:  # yapf: disable
        assert contradicted('x.md', text, known) == wrong, text
    real = GEN.read_csv
    monkeypatch.setattr(
        GEN, 'read_csv', lambda name: [
            dict(r, ratio='', time_ms=str(float(r['time_ms']) * 1.1))
            if r['model'].startswith('soft') else r for r in real(name)
        ] if name == 'detection_resolution_cpu.csv' else real(name))
    assert contradicted('x.md', page(now, ''), csv_ratios())  # SOFT +10%


@pytest.mark.parametrize('rel,base,name', [
    ('README.md', 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
     'retinanet_soft_small_1x'),
    ('docs/en/user_guides/own_config.md',
     'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
     'retinanet_soft_small_1x'),
    ('docs/en/user_guides/own_config.md',
     'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py',
     'upernet_soft_small_512x512_160k_ade20k'),
])
def test_usage_snippet_is_the_shipped_recipe(rel, base, name, tmp_path):
    pytest.importorskip(base.split('::')[0])
    found = [b for b in python_blocks(rel) if f"_base_ = '{base}'" in b]
    assert len(found) == 1, (rel, base, len(found))
    (tmp_path / 'snippet.py').write_text(found[0])
    mine, ref = Config.fromfile(tmp_path / 'snippet.py'), shipped(name)
    bb, ref_bb = mine.model.backbone, ref.model.backbone
    for key in ('arch', 'attn_cfg', 'out_indices', 'drop_path_rate',
                'residual_drop', 'norm_eval'):
        assert bb.get(key) == ref_bb.get(key), (rel, key)
    assert bb.init_cfg.checkpoint == ref_bb.init_cfg.checkpoint
    assert mine.optim_wrapper.to_dict() == ref.optim_wrapper.to_dict(), rel


@pytest.mark.parametrize('rel,code', [
    pytest.param(rel, code, id=f'{rel}-{i}') for rel in PAGES
    for i, code in enumerate(python_blocks(rel))
    if "arch='" in code and re.search('checkpoint=|mmsoft_configs/', code)
])  # yapf: disable
def test_snippet_arch_fits_its_authors_file(rel, code):
    """Values not in the snippet: the shipped config's it copies."""
    arch = re.search(r"\barch='([\w-]+)'", code)
    ckpt = re.search(r"checkpoint='([^']+\.pth)'", code)
    copied = re.search(r"mmsoft_configs/(\w+)\.py", code)
    ref = shipped(copied.group(1)).model.backbone if copied else None
    arch = arch.group(1) if arch else ref and ref.arch
    ckpt = ckpt.group(1) if ckpt else ref and ref.init_cfg.checkpoint
    name = osp.splitext(osp.basename(ckpt or ''))[0]
    if name in OFFICIAL_FILES:  # else an mmsoft file, a trained model
        entry = OFFICIAL_FILES[name]
        fits = {entry['arch'], (entry.get('code_arch') or [None])[0]}
        assert arch in fits, f'{rel}: arch={arch!r} with {ckpt} ({fits})'


@pytest.mark.parametrize('model', GEN.load_models(), ids=lambda m: m['Name'])
def test_model_index_schedule_is_the_configs(model):
    """What the model zoo's training-time table multiplies."""
    name, meta = model['Name'], model['Metadata']
    pytest.importorskip(
        dict(in1k='mmpretrain',
             ade20k='mmseg').get(name.split('_')[-1], 'mmdet'))
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
