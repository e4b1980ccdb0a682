"""The snippets of docs/en and README.md run / build / parse / resolve; the
pages' claims (FACTS) hold."""
import argparse
import glob
import importlib
import os
import os.path as osp
import re
import shlex

import pytest
from conftest import CONFIGS, ROOT, authors_file, load_module, load_tool
from mmengine.config import Config

from mmsoft.models.converters import OFFICIAL_FILES

PAGES = sorted(
    glob.glob(osp.join(ROOT, 'docs', 'en', '**', '*.md'),
              recursive=True)) + [osp.join(ROOT, 'README.md')]
GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_docs_gen_facts')
EXPECTED_SKIPS = 4  # test_image_demo.py (3), test_compat.py (1)
FENCE = re.compile(
    r'(?P<marker><!-- snippet: skip \((?P<reason>[^)]*)\) -->\n\n)?'
    r'^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```', re.S | re.M)
#: launch script -> (tool, positional arguments, how they map)
SCRIPTS = {
    'tools/dist_train.sh': ('train.py', 2, lambda p: [p[0]]),
    'tools/dist_test.sh': ('test.py', 3, lambda p: p[:2]),
    'tools/slurm_train.sh':
    ('train.py', 4, lambda p: [p[2], '--work-dir', p[3]]),
    'tools/slurm_test.sh': ('test.py', 4, lambda p: p[2:4]),
}
#: a config of each codebase that inherits a ResNet backbone
RESNET_BASES = {
    'mmdet': 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    'mmseg': 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py',
    'mmpretrain': 'mmpretrain::resnet/resnet50_8xb32_in1k.py',
}
OWN_BASE = re.compile(r"^_base_ = '(\w+)::", re.M)
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')
pytestmark = pytest.mark.usefixtures('metafiles_read_once')


def rel(path):
    return osp.relpath(path, ROOT)


def text_of(page, no_code=False):
    with open(page) as f:
        text = f.read()
    return re.sub(r'^```.*?^```', '', text, flags=re.S | re.M) \
        if no_code else text


def blocks(langs):
    """(page:line, body, skip reason) of the fenced blocks in ``langs``."""
    return [(f"{rel(page)}:{text[:m.start('body')].count(chr(10)) + 1}",
             m.group('body'), m.group('reason')) for page in PAGES
            for text in [text_of(page)] for m in FENCE.finditer(text)
            if m.group('lang') in langs]  # yapf: disable


PY_BLOCKS = blocks({'python'})
#: SOFT blocks: a whole config in its codebase, or a backbone dict pasted
#: into mmdet's ResNet config
SOFT_CASES = [(where, code, (OWN_BASE.search(code) or [0, 'mmdet'])[1])
              for where, code, reason in PY_BLOCKS if reason is None
              and re.search(r"type='(mmsoft\.)?SOFT'", code)]  # yapf: disable


@pytest.mark.parametrize('where,code',
                         [(w, c) for w, c, r in PY_BLOCKS if r is None])
def test_python_block_runs(where, code, tmp_path, monkeypatch):
    from mmsoft import registry
    monkeypatch.chdir(tmp_path)
    saved = {r: dict(r._module_dict)
             for r in (registry.MODELS, registry.ATTENTIONS)}  # yapf: disable
    try:
        exec(compile(code, where, 'exec'), {'__name__': '__snippet__'})
    finally:
        for reg, modules in saved.items():
            reg._module_dict.clear()
            reg._module_dict.update(modules)


def _leaves(out):
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _leaves(o)]
    return [out]


@pytest.mark.parametrize(
    'where,code,scope', SOFT_CASES, ids=[f'{w}-{s}' for w, _, s in SOFT_CASES])
def test_soft_snippet_in_a_resnet_config(where, code, scope, tmp_path,
                                         monkeypatch):
    pytest.importorskip(scope)
    import torch
    from mmengine.registry import DefaultScope

    from mmsoft.models import SOFT
    monkeypatch.chdir(tmp_path)
    own = OWN_BASE.search(code)
    base = '' if own else f'_base_ = {RESNET_BASES[scope]!r}\n'
    (tmp_path / 'snippet.py').write_text(base + code)
    cfg = Config.fromfile(str(tmp_path / 'snippet.py'))
    assert cfg.default_scope == scope
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        if not own:
            assert isinstance(registry.build(cfg.model.backbone), SOFT)
            return
        model = registry.build(cfg.model)
    # the paste runs: the heads take the backbone's maps / cls token
    model.eval()
    with torch.no_grad():
        out = _leaves(model(torch.rand(1, 3, 64, 64), mode='tensor'))
    assert out and all(torch.isfinite(t).all() for t in out)
    # and loads the authors' file it names (zeros of the real shapes)
    authors_file(cfg.model.backbone.init_cfg.checkpoint,
                 cfg.model.backbone.arch)
    with DefaultScope.overwrite_default_scope(scope):
        model.init_weights()
    assert not any(v.any() for v in model.backbone.state_dict().values())


class _Parsed(Exception):
    pass


def parse_with_tool_argparse(module, argv):
    """``module``'s argument parsing on ``argv``, stopped after it."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        (getattr(module, 'parse_args', None) or module.main)(list(argv))
    except _Parsed:
        return
    except SystemExit as e:
        raise AssertionError(f'argparse refused {argv}: exit {e.code}')
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f'{module.__name__} did not call parse_args')


def invocations():
    """(where, kind, target, argv) per invocation in shell blocks."""
    out = []
    for where, body, _ in blocks({'bash', 'shell', 'sh', 'console'}):
        for line in body.replace('\\\n', ' ').splitlines():
            words = [] if '$(' in line else shlex.split(line, comments=True)
            while words and re.match(r'^[A-Z_]+=', words[0]):
                words = words[1:]
            if words[:1] == ['bash'] and len(words) > 1:
                words = words[1:]
            if words[:1] == ['tools/python.sh']:
                words = ['python'] + words[1:]
            if not words:
                continue
            if words[0] in ('python', 'python3') and len(words) > 1:
                if words[1] == '-m' and words[2].startswith('mmsoft'):
                    out.append((where, 'module', words[2], words[3:]))
                elif re.match(r'^(tools|demo)/.*\.py$', words[1]):
                    out.append((where, 'tool', words[1], words[2:]))
            elif words[0] in SCRIPTS:
                out.append((where, 'script', words[0], words[1:]))
            elif words[0] == 'make':
                out.append((where, 'make', 'Makefile', words[1:]))
            out += [(where, 'config', w, []) for w in words
                    if re.match(r'^configs/.*\.py$', w)]
    return out


INVOCATIONS = invocations()


@pytest.mark.parametrize('where,kind,target,argv', INVOCATIONS)
def test_shell_invocation(where, kind, target, argv):
    assert kind != 'module', f'{where}: unknown module {target}'
    assert osp.isfile(osp.join(ROOT, target)), f'{where}: no {target}'
    if kind == 'make':
        targets = set(
            re.findall(r'^([\w-]+):', text_of(f'{ROOT}/Makefile'), re.M))
        missing = [t for t in argv if '=' not in t and t not in targets]
        assert not missing, f'{where}: no make target {missing}'
    elif kind == 'script':
        tool, n, mapping = SCRIPTS[target]
        pos = argv[:n]
        assert len(pos) == n and not any(
            p.startswith('-') for p in pos), f'{where}: {target} {argv}'
        parse_with_tool_argparse(load_tool(tool), mapping(pos) + argv[n:])
    elif kind == 'tool':
        mod = load_module(
            osp.join(ROOT, target), '_snippet_' +
            target[:-3].replace('/', '_')) if target.startswith('demo/') \
            else load_tool(target[len('tools/'):])
        parse_with_tool_argparse(mod, argv)


def slug(heading):
    """MyST's heading anchor (GitHub's for these headings)."""
    text = re.sub(r'[`*]', '', heading.strip()).lower()
    return re.sub(r'[^\w\- ]', '', text).replace(' ', '-')


LINKS = [(rel(page), target) for page in PAGES
         for target in LINK.findall(text_of(page, no_code=True))
         if not re.match(r'^(https?|mailto):', target)]


def test_the_scan_finds_what_it_checks():
    """Skipped blocks counted, each with a reason; MyST's anchors."""
    assert len(PY_BLOCKS) >= 8 and len(SOFT_CASES) >= 6 and len(LINKS) >= 50
    skipped = [(w, reason) for w, _, reason in PY_BLOCKS if reason is not None]
    assert all(reason.strip() for _, reason in skipped), skipped
    assert len(skipped) == EXPECTED_SKIPS, skipped
    whole = {(w.split(':')[0], s)
             for w, c, s in SOFT_CASES if OWN_BASE.search(c)}
    assert ('README.md', 'mmdet') in whole
    assert {s for _, s in whole} == set(RESNET_BASES)
    kinds = {k for _, k, _, _ in INVOCATIONS}
    assert {'tool', 'script', 'make', 'config'} <= kinds
    assert len(INVOCATIONS) >= 40
    assert slug('The alpha rule (`nr_init`) in plain words') == \
        'the-alpha-rule-nr_init-in-plain-words'
    assert slug('GPU check (`make gpu-check`)') == 'gpu-check-make-gpu-check'
    assert os.sep not in slug('a/b')


@pytest.mark.parametrize('page,target', LINKS)
def test_internal_link_resolves(page, target):
    path, _, anchor = target.partition('#')
    full = osp.normpath(osp.join(ROOT, osp.dirname(page), path)) \
        if path else osp.join(ROOT, page)
    assert osp.exists(full), f'{page}: {target} does not exist'
    if anchor:
        assert full.endswith('.md'), f'{page}: anchor into {path}'
        headings = re.findall(r'^#{1,6} (.+)$', text_of(full, True), re.M)
        assert anchor in {slug(h) for h in headings}, \
            f'{page}: no heading #{anchor} in {rel(full)}'


def shipped(name):
    return Config.fromfile(osp.join(CONFIGS, name + '.py'))


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
    """``{(H x W, peer): {ratio: only pre-Lanczos 800 x 1216 rows give
    it}}`` of the benchmark CSVs' SOFT-vs-PVTv2 time ratios."""
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
    """``(sizes, peer, ratio, quote, context)``: prose "N.NNx PVTv2-bK";
    table rows' "(N.NNx)" (context: the row and its footnotes)."""
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
    """Stated ratios no CSV row gives (or only a pre-Lanczos one, in a
    paragraph not saying "before")."""
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
    assert sum(1 + len(e.get('more_links', []))
               for e in OFFICIAL_FILES.values() if e['link']) == 6
    assert re.findall(r'The authors publish (\w+)',
                      ' '.join(text.split())) == ['six']


def why_rows_name_machines(rel, text):
    why = text[text.index('<!-- generated: why -->'):]
    rows = [r.split(' | ') for r in why[:why.index('<!-- end')].splitlines()
            if r.startswith('| ')][1:]  # yapf: disable
    machines = {GEN.CPU1, GEN.CPU2, GEN.H200, GEN.H100}
    assert rows and {r[1] for r in rows} <= machines
    for machine in (GEN.CPU2, GEN.H200):  # side by side at 800 x 1216
        assert any(r[1] == machine and '800 × 1216' in r[0] for r in rows)
    assert any(r[1] == GEN.H100 for r in rows)


def no_page_denies_gpu_figures(page, text):
    assert sum(len(GEN.read_csv(name)) for _, name in GEN.GPU_CSVS) > 0
    no_gpu = re.compile(r'no GPU (figures|numbers|measurements|results|rows)',
                        re.I)
    said = [(rel(p), no_gpu.search(' '.join(text_of(p).split())))
            for p in PAGES]  # yapf: disable
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
]  # yapf: disable


@pytest.mark.parametrize(
    'rel,claim,check', FACTS, ids=[f'{r}-{c.__name__}' for r, _, c in FACTS])
def test_doc_fact(rel, claim, check):
    check(rel, text_of(osp.join(ROOT, rel)))


def test_a_contradicted_ratio_is_caught(monkeypatch):
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


@pytest.mark.parametrize('rel,scope,name', [
    ('README.md', 'mmdet', 'retinanet_soft_small_1x'),
    ('docs/en/user_guides/own_config.md', 'mmdet', 'retinanet_soft_small_1x'),
    ('docs/en/user_guides/own_config.md', 'mmseg',
     'upernet_soft_small_512x512_160k_ade20k')
])
def test_usage_snippet_is_the_shipped_recipe(rel, scope, name, tmp_path):
    pytest.importorskip(scope)
    base = RESNET_BASES[scope]
    found = [b for w, b, _ in PY_BLOCKS if w.startswith(rel + ':')
             and f"_base_ = '{base}'" in b]  # yapf: disable
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
    (w, code) for w, code, _ in PY_BLOCKS
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
