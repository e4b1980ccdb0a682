"""Issue 35: which authors' ImageNet file (``OFFICIAL_FILES``) fits which
paper config: each paper config loads a file in the authors' layout (zeros
of the real shapes, from ``tests/reference``) strictly; a missing file or one
of another arch stops with one line."""
import functools
import glob
import importlib
import os.path as osp
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT, authors_file, cls_demo_config, run
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmsoft.models import loading
from mmsoft.models.arch_zoo import ARCH_ZOO
from mmsoft.models.converters import (OFFICIAL_FILES, OFFICIAL_PAGE,
                                      OFFICIAL_PRESETS)
from mmsoft.utils.strict_load import CheckpointMismatchError
from mmsoft_tools import checkpoint_files as cf
from mmsoft_tools import launch

PAPER = sorted(
    osp.splitext(osp.basename(p))[0]
    for p in glob.glob(osp.join(CONFIGS, '*.py')))
DEMO = sorted(glob.glob(osp.join(CONFIGS, 'demo', '*.py')))
#: the files the authors' README links (fudan-zvg/SOFT, Main results)
PUBLISHED = {
    'soft_tiny', 'soft_norm_tiny', 'soft_norm_small', 'soft_norm_medium',
    'soft_norm_large'
}
FILE_OF = {c: f for f, e in OFFICIAL_FILES.items() for c in e['configs']}
MISSING = ("checkpoints/soft_norm_small.pth "
           '(model.backbone.init_cfg.checkpoint) does not exist: download '
           "the authors' soft_norm_small ImageNet file ('SOFT_Small_norm' on "
           'https://github.com/fudan-zvg/SOFT#main-results) to that path, or '
           'use another file with --cfg-options '
           'model.backbone.init_cfg.checkpoint=PATH; to train from scratch '
           'on purpose: --cfg-options model.backbone.init_cfg=None '
           'model.backbone.norm_eval=False')
WRONG_ARCH = ("checkpoint checkpoints/soft_norm_small.pth holds the authors' "
              "weights of arch='small-official' (depths [1, 3, 20, 4]), not "
              "of the configured arch='small': use --cfg-options "
              'model.backbone.arch=small-official')


def load(name):
    return Config.fromfile(osp.join(CONFIGS, name + '.py'))


@pytest.fixture
def no_default_init(monkeypatch):
    """No default init of linear / conv layers (every tensor is loaded)."""
    for cls in (torch.nn.Linear, torch.nn.modules.conv._ConvNd):
        monkeypatch.setattr(cls, 'reset_parameters', lambda self: None)


def build_backbone(cfg):
    """``cfg.model.backbone`` built in the config's codebase registry."""
    scope = launch.import_codebase(cfg)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    with DefaultScope.overwrite_default_scope(scope):
        return registry.build(cfg.model.backbone)


@functools.lru_cache()
def n_params(arch):
    """Parameters of the authors' model of ``arch`` (1000-class head)."""
    from mmsoft.models import SOFT
    c = ARCH_ZOO[arch]['embed_dims'][3]
    return sum(p.numel() for p in SOFT(arch).parameters()) + 1000 * (c + 1)


# ----------------------------------------------------------------- table
def test_every_paper_config_expects_one_file():
    listed = [c for e in OFFICIAL_FILES.values() for c in e['configs']]
    assert sorted(listed) == PAPER  # each once, all of them
    assert {f for f, e in OFFICIAL_FILES.items() if e['link']} == PUBLISHED
    assert OFFICIAL_PAGE == 'https://github.com/fudan-zvg/SOFT#main-results'


@pytest.mark.parametrize('name', list(OFFICIAL_FILES))
def test_table_facts_match_the_code(name):
    """Depths / parameters are the presets'; OFFICIAL_PRESETS is the arch
    or ``code_arch`` (SOFT-Small: the README counts the arch's)."""
    e = OFFICIAL_FILES[name]
    size = name.split('_')[-1]
    assert name in (f'soft_{size}', f'soft_norm_{size}')
    assert ARCH_ZOO[e['arch']]['depths'] == e['depths']
    assert round(n_params(e['arch']) / 1e6, 1) == e['params']
    assert int(e['readme'].rstrip('M')) == int(e['params'])
    code = e.get('code_arch')
    if code:
        preset, depths, params = code
        assert OFFICIAL_PRESETS[size] == preset != e['arch']
        assert ARCH_ZOO[preset]['depths'] == depths
        assert round(n_params(preset) / 1e6, 1) == params
    else:
        assert OFFICIAL_PRESETS[size] == e['arch']


@pytest.mark.parametrize('name', PAPER)
def test_paper_config_names_its_file(name):
    f = FILE_OF[name]
    e = OFFICIAL_FILES[f]
    cfg = load(name)
    bb = cfg.model.backbone
    assert bb.arch == e['arch']
    assert bb.attn_cfg.attn_norm == f.startswith('soft_norm_')
    with open(osp.join(CONFIGS, name + '.py')) as fh:
        header = fh.read().split('_base_ =')[0]
    assert f'tools/dist_train.sh configs/{name}.py 8' in header
    assert (f"'{e['link']}'" in header) if e['link'] else \
        f'The authors publish no {f} file' in header
    if name.endswith('_in1k'):  # the ImageNet pretraining itself
        assert bb.init_cfg == dict(
            type='Pretrained', checkpoint=None, prefix='backbone.')
        return
    assert bb.init_cfg == dict(
        type='Pretrained',
        checkpoint=f'checkpoints/{f}.pth',
        prefix='backbone.')
    assert bb.norm_eval is True  # right only with ImageNet statistics
    assert f'tools/dist_test.sh configs/{name}.py' in header


@pytest.mark.parametrize('name', list(OFFICIAL_FILES))
def test_paper_configs_load_the_authors_file_strictly(name, tmp_path,
                                                      monkeypatch,
                                                      no_default_init):
    """Each paper config of the entry loads the authors' file at its path
    (classification: as the override) strictly; one build per backbone."""
    monkeypatch.chdir(tmp_path)
    path = f'checkpoints/{name}.pth'
    n = authors_file(tmp_path / path, OFFICIAL_FILES[name]['arch'])
    built = {}
    for config in OFFICIAL_FILES[name]['configs']:
        cfg = load(config)
        if cfg.model.backbone.init_cfg.checkpoint is None:
            cfg.merge_from_dict({'model.backbone.init_cfg.checkpoint': path})
        key = repr(cfg.model.backbone.to_dict())
        if key in built:
            continue
        backbone = build_backbone(cfg)
        backbone.init_weights()
        sd = backbone.state_dict()
        assert len(sd) == n - 2, config  # all but head.weight / head.bias
        assert all(v.abs().sum() == 0 for v in sd.values()), config
        built[key] = config
    assert built


# ------------------------------------------------------------ opting out
@pytest.mark.parametrize('path', DEMO, ids=osp.basename)
def test_demo_configs_opt_out(path):
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.init_cfg is None
    assert cf.missing_pretrained(cfg) is None


# ------------------------------------------------------- a missing file
def test_train_stops_at_init_without_the_file(tmp_path):
    """tools/train.py without ``checkpoints/``: exit 1 and the docs' line
    (from the backbone's own initialiser; host tools: test_host_tools)."""
    config = tmp_path / 'missing.py'
    config.write_text(
        f'_base_ = {cls_demo_config(tmp_path, val=4)!r}\n'
        "model = dict(backbone=dict(init_cfg=dict(_delete_=True, "
        "type='Pretrained', prefix='backbone.', "
        "checkpoint='checkpoints/soft_norm_small.pth')))\n")
    proc = run([
        sys.executable,
        osp.join(ROOT, 'tools', 'train.py'), config, '--work-dir',
        tmp_path / 'work'
    ],
               cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.splitlines()[-1] == f'error: {MISSING}'
    assert 'Traceback' not in proc.stderr
    with open(osp.join(ROOT, 'docs/en/user_guides/official_weights.md')) as f:
        assert f'error: {MISSING}\n' in f.read()


def test_backbone_load_without_the_file_is_one_line(tmp_path, monkeypatch,
                                                    no_default_init):
    """The backbone's own init_cfg load (the host tools) says the same."""
    monkeypatch.chdir(tmp_path)
    cfg = load('retinanet_soft_small_1x')
    with pytest.raises(FileNotFoundError) as exc:
        build_backbone(cfg).init_weights()
    assert str(exc.value) == MISSING


def test_missing_pretrained_finds_nested_and_listed_entries(tmp_path):
    """A SOFT anywhere (a teacher's), init_cfg lists; URLs, files: fine."""
    here = tmp_path / 'w.pth'
    here.write_bytes(b'')
    ok = dict(type='Pretrained', checkpoint=str(here))
    cfg = dict(
        model=dict(
            type='X',
            backbone=dict(type='SOFT', init_cfg=ok),
            teacher=dict(
                backbone=dict(
                    type='mmsoft.SOFT',
                    init_cfg=[
                        dict(type='TruncNormal'),
                        dict(type='Pretrained', checkpoint='https://x/a.pth'),
                        dict(type='Pretrained', checkpoint='gone.pth')
                    ]))))
    msg = cf.missing_pretrained(cfg)
    assert msg.startswith('gone.pth (model.teacher.backbone.init_cfg[2]'
                          '.checkpoint) does not exist: download')
    assert msg.endswith('--cfg-options model.teacher.backbone.init_cfg=None '
                        'model.teacher.backbone.norm_eval=False')
    cfg['model']['teacher'] = None
    assert cf.missing_pretrained(cfg) is None
    # a file the authors do not publish: train its config first
    assert 'the authors publish no soft_norm_huge file' in \
        loading.missing_weights_message('checkpoints/soft_norm_huge.pth')
    assert 'train configs/soft_norm_huge_in1k.py' in \
        loading.missing_weights_message('checkpoints/soft_norm_huge.pth')


# ----------------------------------------------------------- wrong arch
def test_authors_file_of_the_other_small_is_one_line(tmp_path, monkeypatch,
                                                     no_default_init):
    """SOFT-Small: the authors' code's depths [1, 3, 20, 4] in a Small
    config: one line naming the arch and the option; with it, it loads."""
    monkeypatch.chdir(tmp_path)
    n = authors_file(tmp_path / 'checkpoints' / 'soft_norm_small.pth',
                     'small-official')
    cfg = load('retinanet_soft_small_1x')
    with pytest.raises(CheckpointMismatchError) as exc:
        build_backbone(cfg).init_weights()
    assert str(exc.value) == WRONG_ARCH
    path = 'checkpoints/soft_norm_small.pth'
    for page in ('docs/en/user_guides/official_weights.md', 'docs/en/faq.md'):
        with open(osp.join(ROOT, page)) as f:
            text = f.read().replace(path, 'C')
        assert WRONG_ARCH.replace(path, 'C') in text, page
    cfg.merge_from_dict({'model.backbone.arch': 'small-official'})
    backbone = build_backbone(cfg)
    backbone.init_weights()
    assert len(backbone.state_dict()) == n - 2  # all but the head
