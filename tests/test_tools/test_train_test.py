"""tools/train.py, tools/test.py and the launch scripts on the CPU (the
2-process dist_train.sh chain: test_chain.py, with :func:`make_ade` and
:func:`seg_config` of this file)."""
import json
import os
import os.path as osp
import subprocess
import sys
import traceback

import numpy as np
import pytest
import torch
from conftest import ROOT, TOOLS, free_port, run, tiny_arch
from conftest import tool_namespace as tool
from PIL import Image

TINY = repr(dict(_delete_=True, **tiny_arch()))


def check(proc):
    assert proc.returncode == 0, (
        f'exit code {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}'
        f'\n--- stderr\n{proc.stderr[-6000:]}')
    return proc.stdout + proc.stderr


# the data loaders of both configs: tiny batches, no worker processes
LOADERS = """\
train_dataloader = dict(
    batch_size=2, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=1, num_workers=0, persistent_workers=False,
    dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader"""


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


KEYS = ('id', 'image_id', 'category_id', 'bbox', 'area', 'iscrowd',
        'segmentation')
CATEGORIES = ('person', 'bicycle', 'car')


def make_coco(root, n=2, h=64, w=96):
    """COCO layout: train2017/, val2017/ and annotations/instances_*.json."""
    rng = np.random.RandomState(0)
    os.makedirs(osp.join(root, 'annotations'))
    for split in ('train2017', 'val2017'):
        os.makedirs(osp.join(root, split))
        images, anns = [], []
        for i in range(n):
            fname = f'{i:012d}.jpg'
            Image.fromarray(rng.randint(0, 256, (h, w, 3), dtype=np.uint8)) \
                .save(osp.join(root, split, fname))
            images.append(dict(id=i + 1, file_name=fname, height=h, width=w))
            for j, (x, y, bw, bh) in enumerate(
                ((4, 4, 30, 20), (40, 20, 40, 36))):  # noqa: E125
                poly = [x, y, x + bw, y, x + bw, y + bh, x, y + bh]
                anns.append(
                    dict(
                        zip(KEYS, (len(anns) + 1, i + 1, 1 + j, [x, y, bw, bh],
                                   bw * bh, 0, [poly]))))
        cats = [dict(id=k, name=n) for k, n in enumerate(CATEGORIES, 1)]
        with open(f'{root}/annotations/instances_{split}.json', 'w') as f:
            json.dump(
                dict(images=images, annotations=anns, categories=cats), f)
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
{LOADERS}
train_cfg = dict(max_iters=2, val_interval=1000)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False)]
default_hooks = dict(
    logger=dict(interval=1), checkpoint=dict(interval=2))
""")
    return str(path)


def det_config(tmp_path, data_root):
    """The RetinaNet config, a tiny SOFT, small images, ``data_root``."""
    path = tmp_path / 'retinanet_tiny_coco.py'
    path.write_text(f"""
_base_ = {osp.join(ROOT, 'configs', 'retinanet_soft_tiny_1x.py')!r}
data_root = {str(data_root) + '/'!r}
model = dict(
    backbone=dict(arch={TINY}, init_cfg=None),  # no ImageNet file
    neck=dict(in_channels=[16, 32, 32, 64]),
    bbox_head=dict(num_classes=3))  # the generated categories (COCO 1-3)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(128, 64), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 64), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                    'scale_factor'))
]
{LOADERS}
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val2017.json')
test_evaluator = val_evaluator
train_cfg = dict(max_epochs=1, val_interval=1000)
default_hooks = dict(logger=dict(interval=1))
""")
    return str(path)


# ------------------------------------------------------------ scripts
@pytest.mark.parametrize(
    'script',
    ['dist_train.sh', 'dist_test.sh', 'slurm_train.sh', 'slurm_test.sh'])
def test_script_syntax_and_usage(script):
    path = osp.join(TOOLS, script)
    assert os.access(path, os.X_OK)
    assert subprocess.run(['bash', '-n', path]).returncode == 0
    proc = subprocess.run(['bash', path], capture_output=True, text=True)
    assert proc.returncode == 2 and 'usage' in proc.stderr


@pytest.mark.parametrize('script,extra', [
    ('slurm_train.sh', ['/tmp/wd']),
    ('slurm_test.sh', ['ckpt.pth']),
])
def test_slurm_scripts_compose_srun(tmp_path, script, extra):
    # the README's first command's config
    assert osp.isfile(osp.join(ROOT, 'configs', 'retinanet_soft_small_1x.py'))
    if script == 'slurm_test.sh':  # the script checks that it exists
        (tmp_path / 'ckpt.pth').write_bytes(b'')
        extra = [str(tmp_path / 'ckpt.pth')]
    bindir = tmp_path / 'bin'
    bindir.mkdir()
    out = tmp_path / 'srun_args'
    (bindir / 'srun').write_text(f'#!/bin/sh\necho "$@" > {out}\n')
    (bindir / 'srun').chmod(0o755)
    env = dict(os.environ, GPUS='16', PYTHON='python')
    env['PATH'] = f'{bindir}:{env["PATH"]}'
    proc = run([
        'bash',
        osp.join(TOOLS, script), 'part', 'job',
        'configs/retinanet_soft_small_1x.py', *extra, '--cfg-options', 'a=1'
    ],
               env=env)
    assert proc.returncode == 0, proc.stderr
    args = out.read_text()
    assert '-p part' in args and '--job-name=job' in args
    assert '--ntasks=16' in args and '--ntasks-per-node=8' in args
    tool_py = 'train.py' if 'train' in script else 'test.py'
    assert f'tools/{tool_py} configs/retinanet_soft_small_1x.py' in args
    if 'train' in script:
        assert '--work-dir=/tmp/wd' in args
    else:
        assert 'ckpt.pth' in args
    assert args.strip().endswith('--launcher=slurm --cfg-options a=1')


# ------------------------------------------------------------ arguments
def test_resume_and_work_dir_arguments():
    train = tool('train')
    cfg_path = osp.join(ROOT, 'configs', 'retinanet_soft_tiny_1x.py')
    cfg = train['build_cfg'](train['parse_args']([cfg_path]))
    assert cfg.work_dir == osp.join('./work_dirs', 'retinanet_soft_tiny_1x')
    assert not cfg.resume
    cfg = train['build_cfg'](
        train['parse_args']([cfg_path, '--resume', '--work-dir', 'w']))
    assert cfg.resume is True and cfg.load_from is None
    assert cfg.work_dir == 'w'
    cfg = train['build_cfg'](
        train['parse_args']([
            cfg_path, '--resume', 'x.pth', '--auto-scale-lr', '--cfg-options',
            'model.backbone.init_cfg.checkpoint=weights/soft_norm_tiny.pth'
        ]))
    assert cfg.resume is True and cfg.load_from == 'x.pth'
    assert cfg.auto_scale_lr.enable is True
    assert cfg.model.backbone.init_cfg.checkpoint == \
        'weights/soft_norm_tiny.pth'
    test = tool('test')
    cfg = test['build_cfg'](test['parse_args']([cfg_path, 'c.pth']))
    assert cfg.load_from == 'c.pth'


@pytest.mark.parametrize('name,tta_type', [
    ('soft_tiny_in1k', 'mmpretrain.AverageClsScoreTTA'),
    ('retinanet_soft_tiny_1x', 'DetTTAModel'),
    ('upernet_soft_small_512x512_160k_ade20k', 'SegTTAModel'),
])
def test_test_tool_options(name, tta_type, tmp_path):
    test = tool('test')
    cfg_path = osp.join(ROOT, 'configs', name + '.py')
    args = test['parse_args'](
        [cfg_path, 'c.pth', '--tta', '--show-dir',
         str(tmp_path)])
    cfg = test['build_cfg'](args)
    scope = cfg.default_scope
    test['enable_tta'](cfg, scope)
    assert cfg.model.type == tta_type
    assert cfg.model.module.backbone.type == 'SOFT'
    assert cfg.test_dataloader.dataset.pipeline[-1].type == 'TestTimeAug'
    test['trigger_visualization_hook'](cfg, args, scope)
    hook = cfg.default_hooks.visualization
    assert hook.get('enable', hook.get('draw')) is True


def test_cpu_distributed_settings():
    """launch's CPU distributed changes (a 1-process gloo group)."""
    import torch.distributed as dist
    from mmengine.config import Config

    from mmsoft_tools import launch
    if torch.cuda.is_available():
        pytest.skip('the CPU fall-back only applies without CUDA')
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
    from mmengine.config import Config

    from mmsoft_tools import launch
    cfg = Config.fromfile(
        osp.join(ROOT, 'configs', 'retinanet_soft_tiny_1x.py'))
    mask = Config.fromfile(
        osp.join(ROOT, 'configs', 'mask_rcnn_soft_tiny_1x.py'))
    if torch.cuda.is_available():
        assert launch.enable_amp(cfg) == 'AmpOptimWrapper'
        assert cfg.optim_wrapper.loss_scale == 'dynamic'
        return
    assert launch.enable_amp(cfg) == 'CPUAmpOptimWrapper'
    # mmcv's CPU RoIAlign has no bfloat16 kernel: a clear error up front
    with pytest.raises(ValueError, match='RoIAlign'):
        launch.enable_amp(mask)


# ------------------------------------------------------------ errors
def test_missing_config_file_message():
    proc = run(
        [sys.executable, f'{TOOLS}/train.py', 'configs/no_such_config.py'])
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
def test_slurm_launcher_and_amp_on_cpu(tmp_path):
    """``--launcher slurm`` (one task) and ``--amp`` without CUDA."""
    if torch.cuda.is_available():
        pytest.skip('checks the CPU fall-back')
    data = make_ade(
        str(tmp_path / 'ade' / 'ADEChallengeData2016'), n_train=2, n_val=1)
    cfg = seg_config(tmp_path, data)
    work = str(tmp_path / 'work')
    slurm = dict(SLURM_PROCID='0', SLURM_NTASKS='1', SLURM_LOCALID='0')
    out = check(
        run([
            sys.executable,
            osp.join(TOOLS, 'train.py'), cfg, '--launcher', 'slurm', '--amp',
            '--work-dir', work, '--cfg-options', 'train_cfg.max_iters=1',
            'default_hooks.checkpoint.interval=1'
        ],
            SLURM_NODELIST='localhost',
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(free_port()),
            **slurm))
    assert "backend 'nccl' -> 'gloo'" in out
    assert 'bfloat16' in out
    assert 'CPUAmpOptimWrapper' in out
    assert osp.isfile(osp.join(work, 'iter_1.pth'))


def test_det_train_and_test_tools(tmp_path):
    """RetinaNet config: tools/train.py then tools/test.py (COCO metric)."""
    data = make_coco(str(tmp_path / 'coco'))
    cfg = det_config(tmp_path, data)
    work = str(tmp_path / 'work')
    tool('train')['main'](
        [cfg, '--work-dir', work, '--cfg-options', 'randomness.seed=0'])
    ckpt = osp.join(work, 'epoch_1.pth')
    assert osp.isfile(ckpt)
    pkl = str(tmp_path / 'preds.pkl')
    # score_thr 0: every box up to max_per_img, so that the mAPs of the
    # barely trained model are not all 0 (an empty result)
    metrics = tool('test')['main']([
        cfg, ckpt, '--work-dir', work, '--out', pkl, '--cfg-options',
        'model.test_cfg.score_thr=0.0'
    ])
    keys = [f'coco/bbox_mAP{s}' for s in ('', '_50', '_75', '_s', '_m', '_l')]
    assert set(keys) <= set(metrics), sorted(metrics)
    # the metrics are COCOeval's on the dumped predictions (pycocotools,
    # called here directly): the first 6 of its summary, rounded to 3
    # decimals by mmdet's CocoMetric
    stats = coco_eval_stats(
        pkl, osp.join(data, 'annotations', 'instances_val2017.json'))
    for key, ref in zip(keys, stats):
        assert metrics[key] == pytest.approx(round(ref, 3), abs=1e-9), \
            (key, metrics[key], ref)
    # 100 boxes an image: some match (the comparison is not all zeros)
    assert max(metrics[k] for k in keys) > 0, metrics
    assert metrics['coco/bbox_mAP_l'] == -1  # no large (> 96^2) box
    scalars = [f for f in os.listdir(work) if osp.isdir(osp.join(work, f))]
    assert len(scalars) == 2  # the timestamped log dirs of both runs


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


def coco_eval_stats(pkl, ann_file):
    """The first 6 numbers of pycocotools' COCOeval of ``--out``'s dump."""
    import contextlib
    import io
    import pickle

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval
    with open(pkl, 'rb') as f:
        preds = pickle.load(f)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(ann_file)
        cat_ids = sorted(gt.getCatIds())
        dets = []
        for p in preds:
            inst = p['pred_instances']
            for box, score, label in zip(inst['bboxes'].tolist(),
                                         inst['scores'].tolist(),
                                         inst['labels'].tolist()):
                x1, y1, x2, y2 = box
                bbox = [x1, y1, x2 - x1, y2 - y1]
                dets.append(
                    dict(
                        zip(('image_id', 'category_id', 'bbox', 'score'),
                            (p['img_id'], cat_ids[label], bbox, score))))
        assert dets, 'no detections dumped'
        ev = COCOeval(gt, gt.loadRes(dets), 'bbox')
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return ev.stats[:6].tolist()
