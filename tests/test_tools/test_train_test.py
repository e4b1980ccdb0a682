"""tools/train.py, test.py (``--tta``'s views) and the launch scripts on the
CPU (the chain: test_chain.py, with :func:`make_ade`, :func:`seg_config`)."""
import copy
import glob
import importlib
import os
import os.path as osp
import re
import shutil
import subprocess
import sys
import traceback

import numpy as np
import pytest
import torch
from conftest import (CONFIGS, ROOT, TOOLS, child_env, cls_demo_config,
                      free_port, load_module, tiny_arch)
from conftest import tool_namespace as tool
from mmengine.config import Config
from mmengine.registry import DefaultScope
from PIL import Image

TINY = repr(dict(_delete_=True, **tiny_arch()))


def make_ade(root, n_train=4, n_val=2, h=64, w=96):
    """ADE20K layout: images/ (jpg) and annotations/ (png, 0 = ignore)."""
    rng = np.random.RandomState(0)
    for split, n in (('training', n_train), ('validation', n_val)):
        os.makedirs(osp.join(root, 'images', split))
        os.makedirs(osp.join(root, 'annotations', split))
        for i in range(n):
            name = f'ADE_{split[:5]}_{i:08d}'
            img = rng.randint(0, 256, (h, w, 3), dtype=np.uint8)
            Image.fromarray(img).save(
                osp.join(root, 'images', split, name + '.jpg'))
            seg = np.zeros((h, w), dtype=np.uint8)
            for k, cls in enumerate((1, 2, 3, 13)):  # wall, building, ...
                seg[:, k * w // 4:(k + 1) * w // 4] = cls
            seg[:4] = 0
            Image.fromarray(seg).save(
                osp.join(root, 'annotations', split, name + '.png'))
    return root


def seg_config(tmp_path, data_root):
    """The UperNet config, a tiny SOFT, 64 x 64 crops, ``data_root``."""
    path = tmp_path / 'upernet_tiny_ade.py'
    path.write_text(f"""
_base_ = {osp.join(ROOT, 'configs',
                   'upernet_soft_small_512x512_160k_ade20k.py')!r}
data_root = {str(data_root)!r}
crop_size = (64, 64)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(arch={TINY}, init_cfg=None),  # no ImageNet file
    decode_head=dict(in_channels=[16, 32, 32, 64], channels=32),
    auxiliary_head=dict(in_channels=32, channels=16))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomResize', scale=(128, 64), ratio_range=(0.5, 2.0),
         keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 64), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
train_cfg = dict(max_iters=2, val_interval=1000)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False)]
default_hooks = dict(
    logger=dict(interval=1), checkpoint=dict(interval=2))
""")
    return str(path)


def test_script_syntax_and_usage():
    for script in ('dist_train', 'dist_test', 'slurm_train', 'slurm_test'):
        path = osp.join(TOOLS, script + '.sh')
        assert os.access(path, os.X_OK)
        assert subprocess.run(['bash', '-n', path]).returncode == 0
        proc = subprocess.run(['bash', path], capture_output=True, text=True)
        assert proc.returncode == 2 and 'usage' in proc.stderr, script


def test_auto_scale_lr_argument():
    t = tool('train')
    cfg = t['build_cfg'](t['parse_args'](
        [osp.join(ROOT, 'configs', 'retinanet_soft_tiny_1x.py'),
         '--auto-scale-lr']))  # yapf: disable
    assert cfg.auto_scale_lr.enable is True and not cfg.resume


@pytest.mark.parametrize('text, error, match', [
    ("_base_ = './_base_/no_such_base.py'\n", FileNotFoundError,
     'no_such_base.py'),
    (f"_base_ = {osp.join(ROOT, 'configs', 'retinanet_soft_tiny_1x.py')!r}\n"
     "model = dict(backbone=dict(type='SOFTT'))\n", KeyError,
     'SOFTT is not in the mmdet::model registry'),
])
def test_config_errors_are_mmengines(tmp_path, monkeypatch, text, error,
                                     match):
    """mmengine's error, raised outside mmsoft (data check skipped)."""
    monkeypatch.setenv('MMSOFT_SKIP_DATA_CHECK', '1')
    cfg = tmp_path / 'bad.py'
    cfg.write_text(text)
    with pytest.raises(error, match=match) as exc:
        tool('train')['main']([str(cfg), '--work-dir', str(tmp_path)])
    pkg = osp.join(ROOT, 'mmsoft') + os.sep
    frames = traceback.extract_tb(exc.tb)
    inside = [f for f in frames if osp.abspath(f.filename).startswith(pkg)]
    assert not inside, inside


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU fall-back')
def test_slurm_launcher_and_amp_on_cpu(tmp_path, script_server):
    """``--launcher slurm`` (one task) and ``--amp`` without CUDA."""
    work = str(tmp_path / 'work')
    proc = script_server(
        osp.join(TOOLS, 'train.py'), [
            cls_demo_config(tmp_path, val=4), '--launcher', 'slurm', '--amp',
            '--work-dir', work, '--cfg-options', 'train_cfg.max_epochs=1'
        ],
        env=child_env(SLURM_NODELIST='localhost', MASTER_ADDR='127.0.0.1',
                      MASTER_PORT=str(free_port()), SLURM_PROCID='0',
                      SLURM_NTASKS='1', SLURM_LOCALID='0'))  # yapf: disable
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "backend 'nccl' -> 'gloo'" in out and 'bfloat16' in out
    assert 'CPUAmpOptimWrapper' in out
    assert osp.isfile(osp.join(work, 'epoch_1.pth'))


# ------------------------- which Python the launch scripts use (python.sh)
def _python_without_torch(tmp_path):
    """A real interpreter that cannot import torch (the venv's base Python
    or a system one), else a stand-in that fails as it would."""
    for cand in (getattr(sys, '_base_executable', None),
                 shutil.which('python3',
                              path='/usr/bin:/bin'), '/usr/local/bin/python3'):
        if cand and osp.isfile(cand) and subprocess.run(
            [cand, '-c', 'import torch'], capture_output=True,
                timeout=120).returncode != 0:
            return cand
    fake = tmp_path / 'fake_python'
    _exe(
        fake, 'echo "ModuleNotFoundError: No module named \'torch\'" >&2\n'
        'exit 1\n')
    return str(fake)


def _exe(path, text):
    path.write_text('#!/bin/sh\n' + text)
    path.chmod(0o755)


@pytest.fixture()
def repo(tmp_path):
    """<tmp>/clone: tools/*, mmsoft (linked), .venv/bin/python (a wrapper
    that logs its calls; VENV_DRY: log only); <tmp>/bin/python: no torch
    (a user who ran ``make demo`` and did not activate the venv);
    <tmp>/empty.py: a config without data."""
    clone = tmp_path / 'clone'
    (clone / 'tools').mkdir(parents=True)
    for name in ('dist_train.sh', 'dist_test.sh', 'slurm_train.sh',
                 'slurm_test.sh', 'launch.sh', 'python.sh', 'train.py',
                 'test.py', 'mmsoft_tools'):
        os.symlink(osp.join(ROOT, 'tools', name), clone / 'tools' / name)
    os.symlink(osp.join(ROOT, 'mmsoft'), clone / 'mmsoft')
    (clone / '.venv' / 'bin').mkdir(parents=True)
    log = tmp_path / 'venv_calls'
    _exe(
        clone / '.venv' / 'bin' / 'python',
        f'echo "$@" >> {log}\n[ -n "$VENV_DRY" ] && exit 0\n'
        f'exec {sys.executable} "$@"\n')
    (tmp_path / 'bin').mkdir()
    os.symlink(_python_without_torch(tmp_path), tmp_path / 'bin' / 'python')
    (tmp_path / 'empty.py').write_text('x = 1\n')
    return dict(
        clone=clone,
        log=log,
        tmp=tmp_path,
        cfg=str(tmp_path / 'empty.py'),
        venv_py=str(clone / '.venv' / 'bin' / 'python'))


def _script(repo, script, *args, **env):
    """``tools/<script> args``: no venv active, no PYTHON; ``env``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if k not in ('PYTHON', 'VIRTUAL_ENV', 'CONDA_DEFAULT_ENV',
                     'CONDA_PREFIX', 'PYTHONPATH', 'MMSOFT_VENV', 'PYTHONHOME')
    }
    base.update(
        PATH=f'{repo["tmp"]}/bin:/usr/bin:/bin',
        OMP_NUM_THREADS='1',
        PYTHONWARNINGS='ignore',
        PORT=str(free_port()),
        **env)
    return subprocess.run(
        ['bash', str(repo['clone'] / 'tools' / script)] + list(args),
        cwd=str(repo['tmp']),
        env=base,
        capture_output=True,
        text=True,
        timeout=300)


def test_dist_scripts_use_the_project_venv(repo, tmp_path):
    """No venv active: the project's .venv, for the data check and then
    torchrun; an explicit PYTHON=... wins."""
    for ckpt in ('ckpt.pth', 'c'):  # the scripts check that it exists
        (tmp_path / ckpt).write_bytes(b'')
    for script, ckpt in (('dist_train', []), ('dist_test', ['ckpt.pth'])):
        proc = _script(repo, f'{script}.sh', repo['cfg'], *ckpt, '1',
                       '--help', VENV_DRY='1')  # yapf: disable
        assert proc.returncode == 0, proc.stderr
        assert f'{script}.sh: python: {repo["venv_py"]}' in proc.stderr
    calls = repo['log'].read_text().splitlines()
    assert calls[0].startswith('- train ' + repo['cfg'])  # the data check
    assert calls[1].startswith('-m torch.distributed.run')
    assert calls[1].endswith(f'tools/train.py {repo["cfg"]} --launcher '
                             'pytorch --help')
    assert calls[2] == f'- test {repo["cfg"]} --help'
    assert calls[3].endswith(f'tools/test.py {repo["cfg"]} ckpt.pth '
                             '--launcher pytorch --help')
    log, explicit = tmp_path / 'explicit_calls', tmp_path / 'my_python'
    _exe(explicit, f'echo "$@" >> {log}\n')  # dry
    proc = _script(repo, 'dist_train.sh', repo['cfg'], '1', '--help',
                   PYTHON=str(explicit))  # yapf: disable
    assert proc.returncode == 0, proc.stderr
    assert f'python: {explicit}' in proc.stderr
    assert [c.split()[:2] for c in log.read_text().splitlines()
            ] == [['-', 'train'], ['-m', 'torch.distributed.run']]
    assert len(repo['log'].read_text().splitlines()) == 4  # venv not used
    _exe(tmp_path / 'bin' / 'srun', f'echo "$@" > {tmp_path}/srun_args\n')
    for name, arg, python, env in (('train', 'wd', repo['venv_py'], {}),
                                   ('test', 'c', '/opt/py/bin/python3',
                                    dict(PYTHON='/opt/py/bin/python3'))):
        argv = ('part', 'job', repo['cfg'], arg, '--cfg-options', 'a=1')
        proc = _script(repo, f'slurm_{name}.sh', *argv, GPUS='16', **env)
        assert proc.returncode == 0, proc.stderr
        value = '--work-dir=wd' if name == 'train' else 'c'
        assert (tmp_path / 'srun_args').read_text() == (
            '-p part --job-name=job --gres=gpu:8 --ntasks=16 '
            '--ntasks-per-node=8 --cpus-per-task=5 --kill-on-bad-exit=1 '
            f'{python} -u {repo["clone"]}/tools/{name}.py {repo["cfg"]} '
            f'{value} --launcher=slurm --cfg-options a=1\n')


def test_active_venv_is_respected_and_bad_python_explained(repo):
    """An active venv's python without torch; no project venv: one hint."""
    proc = _script(repo, 'dist_train.sh', repo['cfg'], '1',
                   VIRTUAL_ENV='/some/other/venv')  # yapf: disable
    assert proc.returncode != 0
    assert 'dist_train.sh: python: python' in proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 2, proc.stderr
    assert "cannot run the tools (No module named 'torch')" in err[1]
    assert 'make demo' in err[1] and 'PYTHON=' in err[1]
    assert not repo['log'].exists()
    shutil.rmtree(repo['clone'] / '.venv')
    proc = _script(repo, 'dist_train.sh', repo['cfg'], '1')
    assert proc.returncode != 0 and 'cannot run the tools' in proc.stderr


# ------------------------------------------ tools/test.py --tta's views
@pytest.mark.parametrize(
    'name, model_type, flips, shorts',
    [
        # no TTA of their own: the image flipped, then as it is (cls: the
        # flip is the only difference from the plain test pipeline)
        ('soft_tiny_in1k', 'mmpretrain.AverageClsScoreTTA', None, [224]),
        ('mask_rcnn_soft_tiny_1x', 'DetTTAModel', [True, False], None),
        # mmdet's own RetinaNet TTA (inherited): shorter sides 800, 400, 1200
        ('retinanet_soft_tiny_1x', 'DetTTAModel', [True, False] * 3,
         [800, 400, 1200]),
        # the config's own TTA (mmseg's ADE20K): 6 scales (0.5 .. 1.75), rising
        ('upernet_soft_small_512x512_160k_ade20k', 'SegTTAModel',
         [False, True] * 6, None),
    ])
def test_tta_views(name, model_type, flips, shorts, tmp_path):
    """The views ``tools/test.py --tta`` makes of one 40 x 56 image (the
    config's TTA pipeline after ``enable_tta``, built and run): each scale
    flipped and not, merged by the TTA model."""
    import mmcv
    from mmengine.dataset import Compose

    from mmsoft_tools import launch
    test, path = tool('test'), osp.join(CONFIGS, name + '.py')
    args = test['parse_args']([path, 'c.pth', '--tta', '--show-dir', 'v'])
    cfg = test['build_cfg'](args)
    scope = launch.import_codebase(cfg)
    test['enable_tta'](cfg, scope)
    assert cfg.model.module.type == Config.fromfile(path).model.type
    assert cfg.model.module.backbone.type == 'SOFT'
    assert cfg.test_dataloader.dataset.pipeline[-1].type == 'TestTimeAug'
    assert cfg.test_dataloader.dataset.pipeline == cfg.tta_pipeline
    test['trigger_visualization_hook'](cfg, args, scope)
    hook = cfg.default_hooks.visualization
    assert hook.get('enable', hook.get('draw')) is True
    g = np.random.default_rng(0)
    for name, high, shape in (('img', 256, (40, 56, 3)),
                              ('seg', 150, (40, 56))):  # yapf: disable
        mmcv.imwrite(g.integers(0, high, shape, dtype=np.uint8),
                     str(tmp_path / f'{name}.png'))  # yapf: disable
    transforms = importlib.import_module(f'{scope}.registry').TRANSFORMS
    with DefaultScope.overwrite_default_scope(scope):
        pipeline = Compose(
            [transforms.build(copy.deepcopy(t)) for t in cfg.tta_pipeline])
        out = pipeline(dict(img_path=str(tmp_path / 'img.png'), img_id=0,
                            seg_map_path=str(tmp_path / 'seg.png'),
                            gt_label=0, reduce_zero_label=True,
                            seg_fields=[], instances=[]))  # yapf: disable
    inputs, samples = out['inputs'], out['data_samples']
    assert cfg.model.type == model_type and len(inputs) == len(samples)
    assert flips is None or [bool(s.flip) for s in samples] == flips
    assert all(s.flip_direction == 'horizontal' for s in samples
               if flips and s.flip)
    assert [s.get('scale_factor') for s in samples[0::2]] == \
        [s.get('scale_factor') for s in samples[1::2]]
    sizes = [tuple(t.shape[1:]) for t in inputs]
    assert sizes[0::2] == sizes[1::2]
    got = [min(s) for s in sizes[0::2]]
    assert got == (shorts or sorted(set(got))) and len(got) == len(inputs) // 2
    for a, b in zip(inputs[0::2], inputs[1::2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy()[:, :, ::-1])


# ------------------------------------- the config names the docs show
DEMO_CFGS = osp.join(CONFIGS, 'demo')
_NAME = re.compile(r'\b((?:[a-z0-9]+_)*soft(?:_[a-z0-9]+)*_(?:in1k|1x|3x_ms|'
                   r'ade20k|demo))\b(?!\.yml)')


def _doc_names():
    """{config name: the first file (README / docs page) that names it}."""
    names = {}
    readmes = [osp.join(d, 'README.md') for d in (ROOT, CONFIGS, DEMO_CFGS)]
    for path in readmes + sorted(
            glob.glob(f'{ROOT}/docs/en/**/*.md', recursive=True)):
        if osp.isfile(path):
            with open(path, encoding='utf-8') as f:
                for name in _NAME.findall(f.read()):
                    names.setdefault(name, osp.relpath(path, ROOT))
    return names


def test_every_config_name_in_the_docs_builds():
    from mmsoft.configs import get_config_path, list_configs
    base_files = load_module(
        osp.join(ROOT, 'tools', 'misc', 'configs.py'), '_configs').base_files
    names = _doc_names()
    shipped = {osp.splitext(n)[0] for n in list_configs()}
    assert len(names) >= 20, names  # the docs do name configs
    for name, where in sorted(names.items()):
        if name.endswith('_demo'):
            path = osp.join(DEMO_CFGS, name + '.py')
            assert osp.isfile(path), f'{where} names {name}: {path} missing'
            cfg = Config.fromfile(path)
            assert cfg.model.backbone.type in ('SOFT', 'mmsoft.SOFT'), name
        else:
            assert name in shipped, f'{where} names {name}: no such config'
            assert all(
                osp.isfile(f) for f in base_files(get_config_path(name))), name
