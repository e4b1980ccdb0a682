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
from conftest import CONFIGS, ROOT

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
    assert rows and all(
        r.split(' | ')[1] in ('2-core CPU, 1 thread', '2-core CPU, 2 threads',
                              'NVIDIA H200') for r in rows), rows
    assert any('NVIDIA H200' in r and '800 × 1216' in r for r in rows)
