"""tools/train.py, tools/test.py and the launch scripts on the CPU (the
2-process dist_train.sh chain: test_chain.py, with :func:`make_ade` and
:func:`seg_config` of this file; the slurm scripts' srun line and launch's
helpers: test_launch_python.py, test_tool_helpers.py)."""
import os
import os.path as osp
import subprocess
import traceback

import numpy as np
import pytest
import torch
from conftest import ROOT, TOOLS, child_env, free_port, tiny_arch
from conftest import tool_namespace as tool
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


def test_resume_and_work_dir_arguments():
    path = osp.join(ROOT, 'configs', 'retinanet_soft_tiny_1x.py')

    def cfg(name, *argv):
        t = tool(name)
        return t['build_cfg'](t['parse_args']([path, *argv]))

    c = cfg('train')
    assert c.work_dir == './work_dirs/retinanet_soft_tiny_1x' and not c.resume
    c = cfg('train', '--resume', '--work-dir', 'w')
    assert c.resume is True and c.load_from is None and c.work_dir == 'w'
    init = 'weights/soft_norm_tiny.pth'
    c = cfg('train', '--resume', 'x.pth', '--auto-scale-lr', '--cfg-options',
            f'model.backbone.init_cfg.checkpoint={init}')
    assert c.resume is True and c.load_from == 'x.pth'
    assert c.auto_scale_lr.enable is True
    assert c.model.backbone.init_cfg.checkpoint == init
    assert cfg('test', 'c.pth').load_from == 'c.pth'


def test_missing_config_file_message(script_server):
    proc = script_server(f'{TOOLS}/train.py', ['configs/no_such_config.py'])
    assert proc.returncode == 1
    assert proc.stderr == ('error: configs/no_such_config.py: No such file '
                           'or directory (errno 2 ENOENT); check the path\n')


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
    data = make_ade(
        str(tmp_path / 'ade' / 'ADEChallengeData2016'), n_train=2, n_val=1)
    work = str(tmp_path / 'work')
    proc = script_server(
        osp.join(TOOLS, 'train.py'), [
            seg_config(tmp_path, data), '--launcher', 'slurm', '--amp',
            '--work-dir', work, '--cfg-options', 'train_cfg.max_iters=1',
            'default_hooks.checkpoint.interval=1'
        ],
        env=child_env(
            SLURM_NODELIST='localhost',
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(free_port()),
            SLURM_PROCID='0',
            SLURM_NTASKS='1',
            SLURM_LOCALID='0'))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "backend 'nccl' -> 'gloo'" in out and 'bfloat16' in out
    assert 'CPUAmpOptimWrapper' in out
    assert osp.isfile(osp.join(work, 'iter_1.pth'))
