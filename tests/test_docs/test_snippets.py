"""Every snippet of the documentation (``docs/en/**/*.md`` and README.md).

* Python blocks run as written (small inputs). A block that cannot run here
  is preceded by ``<!-- snippet: skip (the reason) -->``; they are counted
  (:data:`EXPECTED_SKIPS`), so that skipping one more is a visible change.
* Blocks that configure a SOFT backbone work where users paste them: in
  mmdet / mmseg / mmpretrain configs that inherit a ResNet one. A block with
  its own ``_base_ = '<codebase>::...'`` is that config: its model is built,
  loads the authors'-layout file it names strictly and runs a forward
  pass; a block without one is pasted under each of the three ResNet
  configs and its backbone is built.
* Shell blocks: every ``tools/...``, ``demo/...`` and ``python -m mmsoft...``
  invocation is parsed by the tool's own argparse (nothing runs: the parse
  stops right after ``parse_args``), the launch scripts' positional
  arguments are counted, every ``configs/...py`` path exists and every
  ``make`` target is in the Makefile.
* Internal links and anchors resolve (no network).
"""
import argparse
import glob
import importlib
import os
import os.path as osp
import re
import shlex

import pytest
from conftest import ROOT, authors_file, load_module, load_tool

DOCS = osp.join(ROOT, 'docs', 'en')
PAGES = sorted(glob.glob(osp.join(DOCS, '**', '*.md'),
                         recursive=True)) + [osp.join(ROOT, 'README.md')]
#: Python blocks marked ``<!-- snippet: skip (...) -->`` (the inference
#: APIs need trained models: tests/test_demo/test_image_demo.py runs those
#: three blocks with tiny ones; compatibility.md's load of a training run's
#: checkpoint: tests/test_compat.py)
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
#: ``python -m mmsoft.<module>`` commands the docs may show (none: the
#: configs CLI is the tool ``tools/misc/configs.py``)
MODULES = ()


def rel(path):
    return osp.relpath(path, ROOT)


def blocks(langs):
    out = []
    for page in PAGES:
        with open(page) as f:
            text = f.read()
        for m in FENCE.finditer(text):
            if m.group('lang') in langs:
                line = text[:m.start('body')].count('\n') + 1
                out.append((f'{rel(page)}:{line}', m.group('body'),
                            m.group('reason')))
    return out


# ------------------------------------------------------------ python
PY_BLOCKS = blocks({'python'})


def test_python_blocks_found_and_skips_counted():
    assert len(PY_BLOCKS) >= 8
    skipped = [(where, reason) for where, _, reason in PY_BLOCKS
               if reason is not None]
    assert all(reason.strip() for _, reason in skipped), skipped
    assert len(skipped) == EXPECTED_SKIPS, skipped


@pytest.mark.parametrize('where,code',
                         [(w, c)
                          for w, c, reason in PY_BLOCKS if reason is None])
def test_python_block_runs(where, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # a snippet may register a module (the 30-line attention of the
    # architecture guide): the registries are restored afterwards, so the
    # tests after it see mmsoft's own (order-independent suite)
    from mmsoft import registry
    saved = {
        reg: dict(reg._module_dict)
        for reg in (registry.MODELS, registry.ATTENTIONS)
    }
    try:
        exec(compile(code, where, 'exec'), {'__name__': '__snippet__'})
    finally:
        for reg, modules in saved.items():
            reg._module_dict.clear()
            reg._module_dict.update(modules)


# ------------------------------------ SOFT snippets in ResNet configs
#: a config of each codebase that inherits a ResNet backbone
RESNET_BASES = {
    'mmdet': 'mmdet::retinanet/retinanet_r50_fpn_1x_coco.py',
    'mmseg': 'mmseg::upernet/upernet_r50_4xb4-160k_ade20k-512x512.py',
    'mmpretrain': 'mmpretrain::resnet/resnet50_8xb32_in1k.py',
}
OWN_BASE = re.compile(r"^_base_ = '(\w+)::", re.M)


def soft_cases():
    """(where, code, codebase) of the Python blocks that configure a SOFT
    backbone: a block with its own base once, the others per codebase."""
    out = []
    for where, code, reason in PY_BLOCKS:
        if reason is not None or not re.search(r"type='(mmsoft\.)?SOFT'",
                                               code):
            continue
        own = OWN_BASE.search(code)
        for scope in [own.group(1)] if own else RESNET_BASES:
            out.append((where, code, scope))
    return out


SOFT_CASES = soft_cases()


def test_soft_snippets_found():
    """The README's usage block and a complete config per codebase."""
    whole = {(w.split(':')[0], s)
             for w, c, s in SOFT_CASES if OWN_BASE.search(c)}
    assert ('README.md', 'mmdet') in whole
    assert {s for _, s in whole} == set(RESNET_BASES)
    assert len(SOFT_CASES) >= 8


def _leaves(out):
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _leaves(o)]
    return [out]


def _snippet_config(code, scope, tmp_path):
    from mmengine.config import Config
    path = tmp_path / 'snippet.py'
    base = '' if OWN_BASE.search(code) else \
        f'_base_ = {RESNET_BASES[scope]!r}\n'
    path.write_text(base + code)
    return Config.fromfile(str(path))


@pytest.mark.parametrize(
    'where,code,scope', SOFT_CASES, ids=[f'{w}-{s}' for w, _, s in SOFT_CASES])
def test_soft_snippet_in_a_resnet_config(where, code, scope, tmp_path,
                                         monkeypatch):
    pytest.importorskip(scope)
    import torch
    from mmengine.registry import DefaultScope

    from mmsoft.models import SOFT
    monkeypatch.chdir(tmp_path)
    cfg = _snippet_config(code, scope, tmp_path)
    assert cfg.default_scope == scope
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        if not OWN_BASE.search(code):
            assert isinstance(registry.build(cfg.model.backbone), SOFT)
            return
        model = registry.build(cfg.model)
    # the paste runs: the heads take the backbone's maps / cls token
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(1, 3, 64, 64), mode='tensor')
    assert _leaves(out) and all(torch.isfinite(t).all() for t in _leaves(out))
    # and loads the authors' file it names (zeros of the real shapes)
    authors_file(cfg.model.backbone.init_cfg.checkpoint,
                 cfg.model.backbone.arch)
    with DefaultScope.overwrite_default_scope(scope):
        model.init_weights()
    assert all(v.abs().sum() == 0
               for v in model.backbone.state_dict().values()), where


# ------------------------------------------------------------ shell
class _Parsed(Exception):
    pass


def commands(body):
    """The commands of a shell block: continuations joined, comments and
    leading VAR=value assignments dropped (lines with ``$(`` skipped)."""
    out = []
    for line in body.replace('\\\n', ' ').splitlines():
        if not line.strip() or '$(' in line:
            continue
        words = shlex.split(line, comments=True)
        while words and re.match(r'^[A-Z_]+=', words[0]):
            words = words[1:]
        if words:
            out.append(words)
    return out


def parse_with_tool_argparse(module, argv):
    """Run ``module``'s argument parsing on ``argv`` and stop right after
    ``parse_args`` (the tool's work never starts)."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    argparse.ArgumentParser.parse_args = parse_and_stop
    try:
        entry = getattr(module, 'parse_args', None) or module.main
        entry(list(argv))
    except _Parsed:
        return
    except SystemExit as e:
        raise AssertionError(f'argparse refused {argv}: exit {e.code}')
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f'{module.__name__} did not call parse_args')


def invocations():
    """(where, kind, target, argv) of every tool invocation."""
    out = []
    for where, body, _ in blocks({'bash', 'shell', 'sh', 'console'}):
        for words in commands(body):
            if words[0] == 'bash' and len(words) > 1:
                words = words[1:]
            if words[0] == 'tools/python.sh':
                words = ['python'] + words[1:]
            if words[0] in ('python', 'python3') and len(words) > 1:
                if words[1] == '-m' and words[2].startswith('mmsoft'):
                    out.append((where, 'module', words[2], words[3:]))
                elif re.match(r'^(tools|demo)/.*\.py$', words[1]):
                    out.append((where, 'tool', words[1], words[2:]))
            elif words[0] in SCRIPTS:
                out.append((where, 'script', words[0], words[1:]))
            elif words[0] == 'make':
                out.append((where, 'make', 'Makefile', words[1:]))
            for w in words:
                if re.match(r'^configs/.*\.py$', w):
                    out.append((where, 'config', w, []))
    return out


INVOCATIONS = invocations()


def test_shell_invocations_found():
    kinds = {k for _, k, _, _ in INVOCATIONS}
    assert {'tool', 'script', 'make', 'config'} <= kinds
    assert len(INVOCATIONS) >= 40


@pytest.mark.parametrize('where,kind,target,argv', INVOCATIONS)
def test_shell_invocation(where, kind, target, argv):
    if kind == 'config':
        assert osp.isfile(osp.join(ROOT, target)), f'{where}: no {target}'
    elif kind == 'make':
        with open(osp.join(ROOT, 'Makefile')) as f:
            targets = set(re.findall(r'^([\w-]+):', f.read(), re.M))
        missing = [t for t in argv if '=' not in t and t not in targets]
        assert not missing, f'{where}: no make target {missing}'
    elif kind == 'module':
        assert target in MODULES, f'{where}: unknown module {target}'
        parse_with_tool_argparse(importlib.import_module(target), argv)
    elif kind == 'script':
        assert osp.isfile(osp.join(ROOT, target)), f'{where}: no {target}'
        tool, n, mapping = SCRIPTS[target]
        pos = [a for a in argv[:n]]
        assert len(pos) == n and not any(
            p.startswith('-') for p in pos), f'{where}: {target} {argv}'
        parse_with_tool_argparse(load_tool(tool), mapping(pos) + argv[n:])
    else:
        assert osp.isfile(osp.join(ROOT, target)), f'{where}: no {target}'
        if target.startswith('demo/'):
            mod = load_module(
                osp.join(ROOT, target),
                '_snippet_' + target[:-3].replace('/', '_'))
        else:
            mod = load_tool(target[len('tools/'):])
        parse_with_tool_argparse(mod, argv)


# ------------------------------------------------------------ links
LINK = re.compile(r'!?\[[^\]]*\]\(([^)\s]+)\)')


def slug(heading):
    """MyST's heading anchor (myst_heading_anchors; GitHub's is the same
    for these headings)."""
    text = re.sub(r'[`*]', '', heading.strip()).lower()
    text = re.sub(r'[^\w\- ]', '', text)
    return text.replace(' ', '-')


def anchors(path):
    with open(path) as f:
        text = re.sub(r'^```.*?^```', '', f.read(), flags=re.S | re.M)
    return {slug(h) for h in re.findall(r'^#{1,6} (.+)$', text, re.M)}


def links():
    out = []
    for page in PAGES:
        with open(page) as f:
            text = re.sub(r'^```.*?^```', '', f.read(), flags=re.S | re.M)
        for target in LINK.findall(text):
            if re.match(r'^(https?|mailto):', target):
                continue
            out.append((rel(page), target))
    return out


def test_links_found():
    assert len(links()) >= 50


@pytest.mark.parametrize('page,target', links())
def test_internal_link_resolves(page, target):
    path, _, anchor = target.partition('#')
    full = osp.normpath(osp.join(ROOT, osp.dirname(page), path)) \
        if path else osp.join(ROOT, page)
    assert osp.exists(full), f'{page}: {target} does not exist'
    if anchor:
        assert full.endswith('.md'), f'{page}: anchor into {path}'
        assert anchor in anchors(full), \
            f'{page}: no heading #{anchor} in {rel(full)}'


def test_slug_matches_myst():
    assert slug('The alpha rule (`nr_init`) in plain words') == \
        'the-alpha-rule-nr_init-in-plain-words'
    assert slug('GPU check (`make gpu-check`)') == 'gpu-check-make-gpu-check'
    assert os.sep not in slug('a/b')
