"""Packaging: where configs / tools are found, the model index, building
on a shipped config from another directory."""
import os
import os.path as osp
import shutil

import pytest
from conftest import ROOT, load_module
from mmengine.config import Config

import mmsoft
from mmsoft import configs as paths

C = load_module(osp.join(ROOT, 'tools', 'misc', 'configs.py'), '_configs')
GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_gen_pkg')


def test_paths_in_checkout_and_the_configs_cli(tmp_path, capsys):
    """Bare names, sub-folders, the closest name; ``configs`` CLI."""
    assert osp.samefile(paths.configs_root(), osp.join(ROOT, 'configs'))
    for name in ('retinanet_soft_small_1x', 'retinanet_soft_small_1x.py',
                 'configs/retinanet_soft_small_1x.py',
                 'demo/retinanet_soft_demo.py', 'retinanet_soft_demo'):
        sub = 'demo' if 'demo' in name else ''
        path = osp.join(ROOT, 'configs', sub, name.split('/')[-1])
        assert osp.samefile(
            mmsoft.get_config_path(name),
            path + '.py' * (not name.endswith('.py')))
    names = paths.list_configs()
    assert 'retinanet_soft_small_1x.py' in names
    assert 'demo/soft_cls_demo.py' in names
    assert not any(n.startswith('_base_/') for n in names)
    assert '_base_/soft_dense.py' in paths.list_configs(include_base=True)
    with pytest.raises(FileNotFoundError) as e:
        paths.get_config_path('retina_soft_small_1x')
    assert str(e.value).startswith(
        f"mmsoft has no config 'retina_soft_small_1x' in "
        f'{paths.configs_root()}; did you mean retinanet_soft_small_1x.py, ')
    assert C.main(['list']) == 0
    assert capsys.readouterr().out.split() == names
    up = 'upernet_soft_small_512x512_160k_ade20k'
    assert C.main(['path', up]) == 0
    assert capsys.readouterr().out.strip() == paths.get_config_path(up)
    assert C.main(['path', 'nope']) == 1
    assert capsys.readouterr().err == (
        f"error: mmsoft has no config 'nope' in {paths.configs_root()}; list "
        'them with: mim run mmsoft configs list\n')
    dest = str(tmp_path / 'c')
    assert C.main(['copy', 'retinanet_soft_tiny_1x', '--dest', dest]) == 0
    assert sorted(os.listdir(tmp_path / 'c' / '_base_')) == [
        'retinanet_soft_fpn_1x_coco.py', 'soft_dense.py']  # yapf: disable


def test_installed_layout_and_the_tools_package(tmp_path):
    """Installed: <site>/mmsoft/.mim/configs, not a stray <site>/configs."""
    import demo_tasks
    import mmsoft_tools
    pkg = tmp_path / 'mmsoft'
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'retinanet_soft_small_1x.py').write_text('x = 0')
    mim = pkg / '.mim' / 'tools' / 'mmsoft_tools'
    mim.mkdir(parents=True)
    for src, dst in (('mmsoft/configs.py', pkg / 'configs.py'),
                     ('tools/mmsoft_tools/__init__.py', mim / '__init__.py')):
        shutil.copyfile(osp.join(ROOT, src), dst)
    mod = load_module(str(pkg / 'configs.py'), '_paths_copy')
    with pytest.raises(FileNotFoundError, match='reinstall mmsoft'):
        mod.configs_root()
    (pkg / '.mim' / 'configs' / 'demo').mkdir(parents=True)
    cfg = pkg / '.mim' / 'configs' / 'retinanet_soft_small_1x.py'
    cfg.write_text('y = 1\n')
    (pkg / '.mim' / 'configs' / 'demo' / 'd.py').write_text('z = 2\n')
    assert mod.configs_root() == str(pkg / '.mim' / 'configs')
    assert mod.get_config_path('retinanet_soft_small_1x') == str(cfg)
    assert mod.list_configs() == ['demo/d.py', 'retinanet_soft_small_1x.py']
    copy = load_module(str(mim / '__init__.py'), '_mmsoft_tools_copy')
    assert (copy.TOOLS_DIR, copy.checkout_root()) == (str(mim.parent), None)
    assert mmsoft_tools.TOOLS_DIR == osp.join(ROOT, 'tools')
    assert mmsoft_tools.checkout_root() == ROOT
    assert mmsoft_tools.import_root() == osp.dirname(
        osp.dirname(mmsoft.__file__))
    demo = ('configs', 'demo', 'retinanet_soft_demo.py')
    assert osp.samefile(demo_tasks.config_path('det'), osp.join(ROOT, *demo))
    assert demo_tasks.config_path('det', root='/x') == osp.join('/x', *demo)


def tool_references(source):
    """A path constant ``tools`` or a loader of files by path."""
    import ast
    loaders = ('spec_from_file_location', 'run_path', 'SourceFileLoader')
    return [
        ast.dump(node) for node in ast.walk(ast.parse(source))
        if isinstance(getattr(node, 'value', None), str)
        and node.value.strip('/\\') in ('tools', 'mmsoft_tools')
        or getattr(node, 'attr', getattr(node, 'id', None)) in loaders
    ]


def test_package_does_not_know_tools():
    """Nothing in mmsoft/ joins a path to tools/ or loads a file by path."""
    for bad in ('p = osp.join(ROOT, "tools", "train.py")\n',
                'spec = importlib.util.spec_from_file_location(n, p)\n'):
        assert tool_references(bad), bad
    assert tool_references('"""Run tools/train.py --resume."""\n') == []
    for d, _, files in os.walk(osp.join(ROOT, 'mmsoft')):
        for f in files:
            if f.endswith('.py') and '.mim' not in d:
                with open(osp.join(d, f)) as fh:
                    assert tool_references(fh.read()) == [], (d, f)
    import demo_synthetic
    assert osp.samefile(demo_synthetic.__file__,
                        osp.join(ROOT, 'tools', 'demo_synthetic.py'))
    tool = load_module(
        osp.join(ROOT, 'tools', 'misc', 'make_demo_data.py'), '_mkdemo')
    assert tool.demo_synthetic is demo_synthetic


@pytest.mark.usefixtures('metafiles_read_once')
def test_model_index_lists_every_config_as_papers():
    """Once each, numbers the papers', read by mim; the config's schedule."""
    from modelindex.load_model_index import load
    models = GEN.load_models()
    listed = [m['Config'] for m in models]
    top = sorted(f'configs/{n}' for n in os.listdir(osp.join(ROOT, 'configs'))
                 if n.endswith('.py'))
    assert sorted(listed) == top
    assert len({m['Name'] for m in models}) == len(models)
    for m in models:
        name, meta = m['Name'], m['Metadata']
        assert 'Weights' not in m and 'paper' in meta['Numbers'], name
        assert 'not reproduced' in meta['Numbers'], name
        assert not [
            k for k in meta if k.startswith(('Parameters', 'FLOPs'))
            and not k.endswith(('(paper)', '(mmsoft)'))
        ], name
        assert all(k.endswith('(paper)') for res in m.get('Results', [])
                   for k in res['Metrics']), name  # yapf: disable
        cfg = Config.fromfile(osp.join(ROOT, m['Config']))
        assert meta['Training Resources'] == '8x GPUs'
        assert cfg.train_dataloader.batch_size * 8 == meta['Batch Size']
        bs = cfg.get('auto_scale_lr', {}).get('base_batch_size')
        assert bs in (None, meta['Batch Size'])
        if 'Iterations' in meta:
            assert cfg.train_cfg.max_iters == meta['Iterations'], name
        else:
            assert cfg.train_cfg.max_epochs == meta['Epochs'], name
            data = 'ImageNet' if name.endswith('_in1k') else 'Coco'
            assert data in cfg.train_dataloader.dataset.type, name
    mi = load(osp.join(ROOT, 'model-index.yml'))
    assert sorted(m.name for m in mi.models) == sorted(m['Name']
                                                       for m in models)


def test_copy_config_and_inherit_from_another_directory(tmp_path):
    pytest.importorskip('mmpretrain')
    proj = tmp_path / 'my_project'
    proj.mkdir()
    written = C.copy_config('soft_tiny_in1k', str(proj / 'mmsoft_configs'))
    rels = [osp.relpath(w, proj / 'mmsoft_configs') for w in written]
    assert rels[0] == 'soft_tiny_in1k.py'
    assert '_base_/soft_in1k.py' in rels
    (proj / 'my_cls.py').write_text(
        "_base_ = ['./mmsoft_configs/soft_tiny_in1k.py']\n"
        "model = dict(backbone=dict(drop_path_rate=0.0))\n")
    mine = Config.fromfile(str(proj / 'my_cls.py'))
    shipped = Config.fromfile(mmsoft.get_config_path('soft_tiny_in1k'))
    assert mine.model.backbone.drop_path_rate == 0.0
    mine.model.backbone.drop_path_rate = shipped.model.backbone.drop_path_rate
    assert mine.to_dict() == shipped.to_dict()
    # identical files are fine; a changed one is kept unless forced
    C.copy_config('soft_tiny_in1k', str(proj / 'mmsoft_configs'))
    (proj / 'mmsoft_configs' / 'soft_tiny_in1k.py').write_text('x = 1\n')
    with pytest.raises(FileExistsError, match='--force'):
        C.copy_config('soft_tiny_in1k', str(proj / 'mmsoft_configs'))
    C.copy_config('soft_tiny_in1k', str(proj / 'mmsoft_configs'), force=True)
    assert not [p for p in os.listdir(proj / 'mmsoft_configs') if '.tmp' in p]
