"""The three demo tasks of ``tools/demo.py``: train a ``configs/demo`` config
with mmengine's Runner, test it, draw with the config's visualizer."""
import copy
import logging
import os
import os.path as osp
import time

import cv2
import mmcv
import numpy as np
import torch
from mmengine.config import Config
from mmengine.runner import Runner

from mmsoft.configs import get_config_path
from mmsoft.utils.atomic import atomic_write

#: task -> (name, model, config, metric key, label, scale to a fraction,
#: target, [(extra key, label, scale)])
_KEYS = ('name', 'model', 'config', 'metric', 'label', 'scale', 'target',
         'extra')
TASKS = {
    'det': ('detection', 'RetinaNet + SOFT', 'retinanet_soft_demo.py',
            'coco/bbox_mAP_50', 'bbox mAP@0.5', 1.0, 0.5, [
                ('coco/bbox_mAP', 'bbox mAP@[.5:.95]', 1.0)
            ]),
    'seg': ('segmentation', 'UperNet + SOFT', 'upernet_soft_demo.py', 'mIoU',
            'mIoU', 0.01, 0.6, [('aAcc', 'pixel accuracy', 0.01)]),
    'cls': ('classification', 'SOFT + linear classifier', 'soft_cls_demo.py',
            'accuracy/top1', 'top-1', 0.01, 0.9, []),
}
TASKS = {
    task: dict(zip(_KEYS, row), config='configs/demo/' + row[2])
    for task, row in TASKS.items()
}


def config_path(task, root=None):
    """The task's config: under ``root``, else the shipped one."""
    rel = TASKS[task]['config']
    return osp.join(root, rel) if root else get_config_path(rel)


def load_demo_config(task, root=None):
    return Config.fromfile(config_path(task, root))


def set_data_root(cfg, data_root):
    """Point the dataloaders and evaluators of ``cfg`` at ``data_root``."""
    root = cfg.data_root = osp.abspath(data_root).rstrip('/') + '/'
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if cfg.get(key) is not None:
            cfg[key].dataset.data_root = root
    for key in ('val_evaluator', 'test_evaluator'):
        evs = cfg.get(key) or []
        for e in (evs if isinstance(evs, (list, tuple)) else [evs]):
            if e.get('ann_file'):
                e.ann_file = root + 'annotations/' + osp.basename(e.ann_file)
    return cfg


def shrink_for_smoke(cfg, iters=3, batch_size=2):
    """``iters`` iterations, constant lr, no checkpoint (``--smoke``)."""
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=iters, val_interval=iters + 1)
    cfg.param_scheduler = [
        dict(
            type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=iters)
    ]
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        cfg[key].batch_size = batch_size
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook',
        interval=iters + 1,
        by_epoch=False,
        save_last=False)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_processor = dict(by_epoch=False, window_size=1)
    test_cfg = cfg.model.get('test_cfg') or {}
    if 'score_thr' in test_cfg:  # an untrained detector scores low
        test_cfg.score_thr = 0.0
    return cfg


def format_table(rows):
    """The markdown results table of dicts task, metric, value, target."""
    head = ('task', 'metric', 'value', 'target', 'result', 'time')
    lines = [head]
    for r in rows:
        val, tgt, sec = r.get('value'), r.get('target'), r.get('seconds')
        res = '' if tgt is None else 'ERROR' if val is None else \
            'PASS' if val >= tgt else 'FAIL'
        lines.append(
            (r['task'], r['metric'], '-' if val is None else f'{val:.3f}',
             '' if tgt is None else f'>= {tgt:g}', res,
             '' if sec is None else f'{sec:.0f} s'))
    widths = [max(len(c) for c in col) for col in zip(*lines)]
    out = [
        '| ' + ' | '.join(c.ljust(w) for c, w in zip(cells, widths)) + ' |'
        for cells in lines
    ]
    out.insert(1, '|' + '|'.join('-' * (w + 2) for w in widths) + '|')
    return '\n'.join(out)


def draw_predictions(runner, task, n, out_png):
    """The first ``n`` validation images, truth and predictions, in a PNG."""
    from mmengine.registry import VISUALIZERS
    name = f'mmsoft_demo_{task}_{time.time_ns()}'
    vis_cfg = dict(runner.cfg.visualizer, name=name, vis_backends=None)
    vis, loader = VISUALIZERS.build(vis_cfg), runner.test_loop.dataloader
    vis.dataset_meta = loader.dataset.metainfo
    samples = []
    with torch.no_grad():
        for batch in loader:
            samples += runner.model.test_step(batch)
            if len(samples) >= n:
                break
    tiles, kw = [], dict(pred_score_thr=0.4) if task == 'det' else {}
    for s in samples[:n]:
        img = mmcv.imread(s.img_path, channel_order='rgb')
        if task == 'cls':
            tiles.append(vis.visualize_cls(img, s, resize=128))
            continue
        # one panel per call (mmseg's visualizer keeps only its last one)
        for gt in (True, False):
            vis.add_datasample(
                task, img, s, draw_gt=gt, draw_pred=not gt, **kw)
            tiles.append(vis.get_image())
    cols = min(len(tiles), 8 if task == 'cls' else 4)
    tiles += [np.full_like(tiles[0], 255)] * (-len(tiles) % cols)
    grid = np.vstack(
        [np.hstack(tiles[i:i + cols]) for i in range(0, len(tiles), cols)])
    bgr = cv2.cvtColor(grid, cv2.COLOR_RGB2BGR)
    atomic_write(out_png, cv2.imencode('.png', bgr)[1].tobytes())
    return out_png


def _concise(record):
    """The console's (not the log file's): no dumps, per-parameter lines."""
    msg = record.getMessage()
    if record.levelno >= logging.WARNING:
        return 'init_weights' not in msg
    return msg.count('\n') < 2 and not msg.startswith('paramwise_options')


class ConciseRunner(Runner):
    """mmengine's Runner with :func:`_concise` on its console."""

    def build_logger(self, *args, **kwargs):
        logger = super().build_logger(*args, **kwargs)
        for h in logger.handlers:
            if type(h) is logging.StreamHandler:
                h.addFilter(_concise)
        return logger


def run_task(task,
             data_root,
             work_dir,
             cfg=None,
             n_draw=None,
             seed=0,
             runner_cls=None,
             cfg_options=None):
    """Train, test and draw ``task``: metrics, value, train_s, test_s, png."""
    from mmsoft_tools.launch import name_run
    spec = TASKS[task]
    cfg = copy.deepcopy(cfg if cfg is not None else load_demo_config(task))
    set_data_root(cfg, data_root)
    cfg.work_dir = work_dir
    cfg.randomness = dict(seed=seed)
    cfg.train_cfg.val_begin = 10**9  # evaluated once, by runner.test()
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    os.makedirs(work_dir, exist_ok=True)
    name_run(cfg)  # its own logger, even within the same second
    runner = (runner_cls or ConciseRunner).from_cfg(cfg)
    t0 = time.perf_counter()
    runner.train()
    t1 = time.perf_counter()
    metrics = {
        k: float(v)
        for k, v in runner.test().items()
        if isinstance(v, (int, float, np.floating, np.integer))
    }
    t2 = time.perf_counter()
    # CocoMetric returns nothing when there is no detection
    value = metrics.get(spec['metric'], 0.0 if task == 'det' else None)
    n = n_draw if n_draw is not None else (24 if task == 'cls' else 8)
    png = osp.join(work_dir, f'{task}_predictions.png')
    return dict(
        metrics=metrics,
        value=None if value is None else value * spec['scale'],
        train_s=t1 - t0,
        test_s=t2 - t1,
        png=draw_predictions(runner, task, n, png))
