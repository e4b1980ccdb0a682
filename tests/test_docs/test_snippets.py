"""Every snippet of ``docs/en/**/*.md`` and README.md: Python blocks run
(``<!-- snippet: skip (reason) -->`` ones are counted); SOFT config blocks
work where users paste them; shell blocks' tool invocations pass the tool's
argparse, configs and make targets exist; links and anchors resolve."""
import argparse
import glob
import importlib
import os
import os.path as osp
import re
import shlex

import pytest
from conftest import ROOT, authors_file, load_module, load_tool

PAGES = sorted(
    glob.glob(osp.join(ROOT, 'docs', 'en', '**', '*.md'),
              recursive=True)) + [osp.join(ROOT, 'README.md')]
#: skipped Python blocks (inference: test_image_demo.py; compatibility.md's
#: load of a run's checkpoint: tests/test_compat.py)
EXPECTED_SKIPS = 4
FENCE = re.compile(
    r'(?P<marker><!-- snippet: skip \((?P<reason>[^)]*)\) -->\n\n)?'
    r'^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```', re.S | re.M)
#: launch script -> (tool, number of positional arguments, how they map)
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
#: SOFT blocks: a whole config in its codebase; a backbone dict pasted into
#: mmdet's ResNet config (the three codebases' registries resolve ``SOFT``
#: in the whole configs: one scope per fragment)
SOFT_CASES = [(where, code, (OWN_BASE.search(code) or [0, 'mmdet'])[1])
              for where, code, reason in PY_BLOCKS if reason is None
              and re.search(r"type='(mmsoft\.)?SOFT'", code)]  # yapf: disable


@pytest.mark.parametrize('where,code',
                         [(w, c) for w, c, r in PY_BLOCKS if r is None])
def test_python_block_runs(where, code, tmp_path, monkeypatch):
    """The registries are restored after it (a snippet may register)."""
    from mmsoft import registry
    monkeypatch.chdir(tmp_path)
    saved = {
        r: dict(r._module_dict)
        for r in (registry.MODELS, registry.ATTENTIONS)
    }
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
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from mmsoft.models import SOFT
    monkeypatch.chdir(tmp_path)
    own = OWN_BASE.search(code)
    (tmp_path / 'snippet.py'
     ).write_text(('' if own else f'_base_ = {RESNET_BASES[scope]!r}\n') +
                  code)
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
    assert not any(v.any()
                   for v in model.backbone.state_dict().values()), where


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
    """(where, kind, target, argv) of every tool invocation of the shell
    blocks (lines with ``$(`` skipped)."""
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
    """Python blocks (the skipped ones counted, each with its reason; a
    whole SOFT config per codebase), tool invocations of every kind, links;
    MyST's anchors."""
    assert len(PY_BLOCKS) >= 8
    skipped = [(w, reason) for w, _, reason in PY_BLOCKS if reason is not None]
    assert all(reason.strip() for _, reason in skipped), skipped
    assert len(skipped) == EXPECTED_SKIPS, skipped
    whole = {(w.split(':')[0], s)
             for w, c, s in SOFT_CASES if OWN_BASE.search(c)}
    assert ('README.md', 'mmdet') in whole
    assert {s for _, s in whole} == set(RESNET_BASES)
    assert len(SOFT_CASES) >= 6
    assert {'tool', 'script', 'make', 'config'
            } <= {k
                  for _, k, _, _ in INVOCATIONS} and len(INVOCATIONS) >= 40
    assert len(LINKS) >= 50
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
