"""tools/train.py, tools/test.py and the launch scripts on the CPU (the
2-process dist_train.sh chain: test_chain.py, with :func:`make_ade` and
:func:`seg_config` of this file)."""
import os
import os.path as osp
import subprocess
import traceback

import numpy as np
import pytest
import torch
from conftest import ROOT, TOOLS, child_env, free_port, run, tiny_arch
from conftest import tool_namespace as tool
from mmengine.config import Config
from PIL import Image

from mmsoft_tools import launch

TINY = repr(dict(_delete_=True, **tiny_arch()))


# ------------------------------------------------------------ data
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


@pytest.mark.parametrize(
    'script',
    ['dist_train.sh', 'dist_test.sh', 'slurm_train.sh', 'slurm_test.sh'])
def test_script_syntax_and_usage(script):
    path = osp.join(TOOLS, script)
    assert os.access(path, os.X_OK)
    assert subprocess.run(['bash', '-n', path]).returncode == 0
    proc = subprocess.run(['bash', path], capture_output=True, text=True)
    assert proc.returncode == 2 and 'usage' in proc.stderr


@pytest.mark.parametrize('script,extra,tool_py', [
    ('slurm_train.sh', '--work-dir=/tmp/wd', 'train.py'),
    ('slurm_test.sh', 'ckpt.pth', 'test.py'),
])
def test_slurm_scripts_compose_srun(tmp_path, script, extra, tool_py):
    """The README's first config; slurm_test.sh checks the file exists."""
    cfg = 'configs/retinanet_soft_small_1x.py'
    assert osp.isfile(osp.join(ROOT, cfg))
    (tmp_path / 'ckpt.pth').write_bytes(b'')
    last = '/tmp/wd' if 'train' in script else str(tmp_path / 'ckpt.pth')
    (tmp_path / 'srun').write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/a\n')
    (tmp_path / 'srun').chmod(0o755)
    env = dict(os.environ, GPUS='16', PYTHON='python')
    env['PATH'] = f'{tmp_path}:{env["PATH"]}'
    proc = run(['bash', osp.join(TOOLS, script), 'part', 'job', cfg, last,
                '--cfg-options', 'a=1'], env=env)  # yapf: disable
    assert proc.returncode == 0, proc.stderr
    args = (tmp_path / 'a').read_text()
    assert '-p part' in args and '--job-name=job' in args
    assert '--ntasks=16' in args and '--ntasks-per-node=8' in args
    assert f'tools/{tool_py} {cfg}' in args and extra in args
    assert args.strip().endswith('--launcher=slurm --cfg-options a=1')


# ------------------------------------------------------------ arguments
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


@pytest.mark.skipif(torch.cuda.is_available(), reason='the CPU fall-back')
def test_cpu_distributed_settings():
    """launch's CPU distributed changes (a 1-process gloo group)."""
    import torch.distributed as dist
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'upernet_soft_small_512x512_160k_ade20k.py'))
    assert cfg.env_cfg.dist_cfg.backend == 'nccl'
    assert cfg.model.decode_head.norm_cfg.type == 'SyncBN'
    assert launch.setup_cpu_distributed(cfg, 'none') is False
    url = f'tcp://127.0.0.1:{free_port()}'
    dist.init_process_group('gloo', url, rank=0, world_size=1)
    try:
        assert launch.setup_cpu_distributed(cfg, 'pytorch') is True
    finally:
        dist.destroy_process_group()
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model_wrapper_cfg.type == 'MMDistributedDataParallel'
    assert cfg.model_wrapper_cfg.device_ids is None
    assert cfg.model.decode_head.norm_cfg.type == 'BN'
    assert cfg.model.auxiliary_head.norm_cfg.type == 'BN'


def test_amp_settings():
    cfg, mask = (
        Config.fromfile(f'{ROOT}/configs/{n}_soft_tiny_1x.py')
        for n in ('retinanet', 'mask_rcnn'))
    if torch.cuda.is_available():
        assert launch.enable_amp(cfg) == 'AmpOptimWrapper'
        assert cfg.optim_wrapper.loss_scale == 'dynamic'
        return
    assert launch.enable_amp(cfg) == 'CPUAmpOptimWrapper'
    # mmcv's CPU RoIAlign has no bfloat16 kernel: a clear error up front
    with pytest.raises(ValueError, match='RoIAlign'):
        launch.enable_amp(mask)


# ------------------------------------------------------------ errors
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
    """A missing _base_, a type typo: mmengine's error, raised outside
    mmsoft (the data check skipped: it would stop before the model)."""
    monkeypatch.setenv('MMSOFT_SKIP_DATA_CHECK', '1')
    cfg = tmp_path / 'bad.py'
    cfg.write_text(text)
    with pytest.raises(error, match=match) as exc:
        tool('train')['main']([str(cfg), '--work-dir', str(tmp_path)])
    pkg = osp.join(ROOT, 'mmsoft') + os.sep
    frames = traceback.extract_tb(exc.tb)
    inside = [f for f in frames if osp.abspath(f.filename).startswith(pkg)]
    assert not inside, inside


# ------------------------------------------------------------ runs
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


def test_test_out_logs_where_the_results_are(tmp_path):
    """Issue 52: --out logs the result file, not its temporary."""
    import glob
    import pickle

    from conftest import cls_demo_config, random_model
    cfg = cls_demo_config(tmp_path, test=4)
    ckpt = str(tmp_path / 'model.pth')
    torch.save(dict(state_dict=random_model(cfg).state_dict()), ckpt)
    out, work = tmp_path / 'res' / 'results.pkl', tmp_path / 'work'
    tool('test')['main'](
        [cfg, ckpt, '--work-dir',
         str(work), '--out',
         str(out)])
    with open(out, 'rb') as f:
        assert len(pickle.load(f)) == 4
    log = open(glob.glob(str(work / '*' / '*.log'))[0]).read()
    assert f'Results has been saved to {out}.' in log
    assert 'mmsoft-tmp' not in log and 'prefix is not set' not in log
