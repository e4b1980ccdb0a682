"""Which authors' ImageNet file (``OFFICIAL_FILES``) fits which paper config:
each loads strictly; a missing file or another arch's: one line."""
import copy
import functools
import glob
import importlib
import os.path as osp
import warnings

import pytest
import torch
from conftest import CONFIGS, ROOT, authors_file, current_log
from mmengine.config import Config
from mmengine.model.weight_init import initialize
from mmengine.registry import DefaultScope

from mmsoft.models import SOFT
from mmsoft.models.arch_zoo import ARCH_ZOO
from mmsoft.models.converters import (OFFICIAL_FILES, OFFICIAL_PAGE,
                                      OFFICIAL_PRESETS)
from mmsoft.models.loading import pretrained_init_cfg
from mmsoft.utils.strict_load import CheckpointMismatchError
from mmsoft_tools import cli, launch

PAPER = sorted(
    osp.splitext(osp.basename(p))[0]
    for p in glob.glob(osp.join(CONFIGS, '*.py')))
FILE_OF = {c: f for f, e in OFFICIAL_FILES.items() for c in e['configs']}
SMALL = 'checkpoints/soft_norm_small.pth'
MISSING = (f'{SMALL} (model.backbone.init_cfg.checkpoint) does not exist: '
           "download the authors' soft_norm_small ImageNet file "
           "('SOFT_Small_norm' on https://github.com/fudan-zvg/SOFT#main-"
           'results) to that path, or use another file with --cfg-options '
           'model.backbone.init_cfg.checkpoint=PATH; to train from scratch '
           'on purpose: --cfg-options model.backbone.init_cfg=None '
           'model.backbone.norm_eval=False')
WRONG_ARCH = ("checkpoint C holds the authors' weights of "
              "arch='small-official' (depths [1, 3, 20, 4]), not of the "
              "configured arch='small': use --cfg-options "
              'model.backbone.arch=small-official')
pytestmark = pytest.mark.usefixtures('metafiles_read_once')

_load = functools.lru_cache(None)(
    lambda name: Config.fromfile(osp.join(CONFIGS, name + '.py')))


def load(name):
    return copy.deepcopy(_load(name))


def read(rel):
    with open(osp.join(ROOT, rel)) as f:
        return f.read()


@pytest.fixture
def no_default_init(monkeypatch, tmp_path):  # no init of linear / conv
    monkeypatch.chdir(tmp_path)
    for cls in (torch.nn.Linear, torch.nn.modules.conv._ConvNd):
        monkeypatch.setattr(cls, 'reset_parameters', lambda self: None)


def build_backbone(cfg):
    scope = launch.import_codebase(cfg)
    with DefaultScope.overwrite_default_scope(scope):
        return importlib.import_module(f'{scope}.registry').MODELS.build(
            cfg.model.backbone)


def load_on_meta(cfg):
    """The lines ``init_weights`` logs, the backbone on the meta device."""
    backbone = build_backbone(cfg).to_empty(device='meta')
    init_cfg, loads_all = pretrained_init_cfg(backbone.init_cfg)
    assert loads_all
    with current_log() as records, warnings.catch_warnings():
        warnings.simplefilter('ignore')  # copying into meta tensors: no-op
        initialize(backbone, init_cfg)
    return [r.getMessage() for r in records]


@functools.lru_cache()
def n_params(arch):  # millions, of the authors' model (1000-class head)
    c = ARCH_ZOO[arch]['embed_dims'][3]
    n = sum(p.numel() for p in SOFT(arch).parameters()) + 1000 * (c + 1)
    return round(n / 1e6, 1)


def test_every_paper_config_expects_one_file():
    listed = [c for e in OFFICIAL_FILES.values() for c in e['configs']]
    assert sorted(listed) == PAPER  # each once, all of them
    # the files the authors' README links (fudan-zvg/SOFT, Main results)
    assert {f for f, e in OFFICIAL_FILES.items() if e['link']} == {
        'soft_tiny', 'soft_norm_tiny', 'soft_norm_small', 'soft_norm_medium',
        'soft_norm_large'}  # yapf: disable
    assert OFFICIAL_PAGE == 'https://github.com/fudan-zvg/SOFT#main-results'


@pytest.mark.parametrize('name', list(OFFICIAL_FILES))
def test_table_facts_match_the_code(name):
    """Depths / parameters; OFFICIAL_PRESETS is the arch or ``code_arch``."""
    e = OFFICIAL_FILES[name]
    size = name.split('_')[-1]
    assert name in (f'soft_{size}', f'soft_norm_{size}')
    assert ARCH_ZOO[e['arch']]['depths'] == e['depths']
    assert n_params(e['arch']) == e['params']
    assert int(e['readme'].rstrip('M')) == int(e['params'])
    preset, depths, params = e.get('code_arch') or (e['arch'], e['depths'],
                                                    e['params'])
    assert OFFICIAL_PRESETS[size] == preset
    assert (preset != e['arch']) == bool(e.get('code_arch'))
    assert ARCH_ZOO[preset]['depths'] == depths
    assert n_params(preset) == params


@pytest.mark.parametrize('name', PAPER)
def test_paper_config_names_its_file(name):
    f = FILE_OF[name]
    e, bb = OFFICIAL_FILES[f], load(name).model.backbone
    assert bb.arch == e['arch']
    assert bb.attn_cfg.attn_norm == f.startswith('soft_norm_')
    header = read(f'configs/{name}.py').split('_base_ =')[0]
    assert f'tools/dist_train.sh configs/{name}.py 8' in header
    assert (f"'{e['link']}'" in header) if e['link'] else \
        f'The authors publish no {f} file' in header
    pretraining = name.endswith('_in1k')  # the ImageNet pretraining itself
    assert bb.init_cfg == dict(
        type='Pretrained',
        checkpoint=None if pretraining else f'checkpoints/{f}.pth',
        prefix='backbone.')
    # norm_eval: test_recipe_card.py
    assert pretraining or f'tools/dist_test.sh configs/{name}.py' in header


def test_paper_configs_load_the_authors_file_strictly(no_default_init):
    """Strictly, all but the head; one build per arch and output."""
    built = {}
    for name, e in OFFICIAL_FILES.items():
        path = f'checkpoints/{name}.pth'
        n = authors_file(path, e['arch'])
        for config in e['configs']:
            cfg = load(config)
            if cfg.model.backbone.init_cfg.checkpoint is None:
                cfg.merge_from_dict(
                    {'model.backbone.init_cfg.checkpoint': path})
            key = (cfg.model.backbone.arch, cfg.model.backbone.out_type)
            if key not in built:
                built[key] = line = load_on_meta(cfg)[-1]
                assert line.startswith(f"mmsoft: loaded {path}: authors' ")
                assert line.endswith(f"('model'), converted, keys under "
                                     f"'backbone.', {n - 2} tensors, strict")
    assert len(built) == 9


@pytest.mark.parametrize(
    'path',
    sorted(glob.glob(osp.join(CONFIGS, 'demo', '*.py'))),
    ids=osp.basename)
def test_demo_configs_opt_out(path):
    cfg = Config.fromfile(path)
    assert cfg.model.backbone.init_cfg is None
    assert cli.missing_pretrained(cfg) is None


def test_missing_pretrained_names_the_backbone():
    """A SOFT anywhere (its type a class), init_cfg lists: the line names
    that backbone's options (the walk, URLs, files: test_tool_helpers.py)."""
    gone = dict(type='Pretrained', checkpoint='gone.pth')
    soft = dict(type=SOFT, init_cfg=[dict(type='TruncNormal'), gone])
    cfg = dict(model=dict(type='X', extra=[1, 'two'], teacher=[3, soft]))
    msg = cli.missing_pretrained(cfg)
    assert msg.startswith('gone.pth (model.teacher[1].init_cfg[1].checkpoint)'
                          ' does not exist: download')
    assert msg.endswith('--cfg-options model.teacher[1].init_cfg=None '
                        'model.teacher[1].norm_eval=False')
    cfg['model']['teacher'] = None
    assert cli.missing_pretrained(cfg) is None


def test_missing_or_other_small_file_is_one_line(no_default_init):
    """The docs' lines; with the option it names, the file loads."""
    cfg = load('retinanet_soft_small_1x')
    with pytest.raises(FileNotFoundError) as exc:
        build_backbone(cfg).init_weights()
    assert str(exc.value) == MISSING
    assert f'\nerror: {MISSING}\n' in read(
        'docs/en/user_guides/official_weights.md')
    n = authors_file(SMALL, 'small-official')
    with pytest.raises(CheckpointMismatchError) as exc:
        build_backbone(cfg).init_weights()
    assert str(exc.value) == WRONG_ARCH.replace('C', SMALL, 1)
    for page in ('docs/en/user_guides/official_weights.md', 'docs/en/faq.md'):
        assert WRONG_ARCH in read(page).replace(SMALL, 'C'), page
    cfg.merge_from_dict({'model.backbone.arch': 'small-official'})
    assert load_on_meta(cfg)[-1].endswith(f', {n - 2} tensors, strict')
