"""The three demo tasks: configs, metrics, targets, training and drawing.

Used by ``tools/demo.py`` (the README's main job) and by the tests. Each
task trains one ``configs/demo`` config with mmengine's ``Runner``
(``Runner.from_cfg`` -> ``runner.train()`` -> ``runner.test()`` on the
validation split), reads the codebase's own metric and draws the first
validation predictions into a PNG.
"""
import copy
import os
import os.path as osp
import time

import cv2
import numpy as np
from mmengine.hooks import Hook

from mmsoft.configs import get_config_path
from mmsoft.utils.atomic import atomic_write
from mmsoft_tools import demo_synthetic as synthetic

CLS_CLASSES = synthetic.CLS_CLASSES
DET_CLASSES = synthetic.DET_CLASSES
SEG_CLASSES = synthetic.SEG_CLASSES

__all__ = [
    'TASKS', 'config_path', 'load_demo_config', 'set_data_root',
    'shrink_for_smoke', 'run_task', 'PredictionCollector', 'draw_predictions',
    'format_table'
]

#: task -> what the demo trains and how it is judged (one row per task, keys
#: ``_TASK_KEYS``). ``data``: the folder
#: under the data root, made by :func:`make_demo_data` task ``data_task``;
#: ``metric``: the key of the codebase's metric dict; ``scale`` turns it into
#: a fraction; ``target``: the value to reach (None: reported only);
#: ``extra``: further metrics shown in the table.
_TASK_KEYS = ('name', 'model', 'config', 'data', 'data_task', 'metric',
              'label', 'scale', 'target', 'extra')
TASKS = {
    row[0]: dict(zip(_TASK_KEYS, row[1:]))
    for row in (
        ('det', 'detection', 'RetinaNet + SOFT',
         'configs/demo/retinanet_soft_demo.py', 'coco', 'det',
         'coco/bbox_mAP_50', 'bbox mAP@0.5', 1.0, 0.5, {
             'coco/bbox_mAP': ('bbox mAP@[.5:.95]', 1.0)
         }),
        ('seg', 'segmentation', 'UperNet + SOFT',
         'configs/demo/upernet_soft_demo.py', 'ade', 'seg', 'mIoU', 'mIoU',
         0.01, 0.6, {
             'aAcc': ('pixel accuracy', 0.01)
         }),
        ('cls', 'classification', 'SOFT + linear classifier',
         'configs/demo/soft_cls_demo.py', 'imagenet', 'cls', 'accuracy/top1',
         'top-1', 0.01, 0.9, {}),
    )
}


def config_path(task, root=None):
    """The task's config file: under ``root`` if given, else the shipped
    one (the checkout's ``configs/`` or the installed ``mmsoft/.mim``)."""
    if root is not None:
        return osp.join(root, TASKS[task]['config'])
    return get_config_path(TASKS[task]['config'])


def load_demo_config(task, root=None):
    """The task's config (``mmengine.Config``)."""
    from mmengine.config import Config
    return Config.fromfile(config_path(task, root))


def set_data_root(cfg, data_root):
    """Point every dataloader (and the COCO evaluators) of ``cfg`` at
    ``data_root`` (the task's folder, e.g. ``data/demo/coco``)."""
    root = osp.abspath(data_root).rstrip('/') + '/'
    cfg.data_root = root
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dl = cfg.get(key)
        if dl is not None:
            dl.dataset.data_root = root
    for key in ('val_evaluator', 'test_evaluator'):
        ev = cfg.get(key)
        if ev is None:
            continue
        for e in (ev if isinstance(ev, (list, tuple)) else [ev]):
            if e.get('ann_file'):
                e.ann_file = root + 'annotations/' + osp.basename(e.ann_file)
    return cfg


def shrink_for_smoke(cfg, iters=3, batch_size=2):
    """A few training iterations only (tests / ``--smoke``): iteration-based
    loop, constant learning rate after a 1-iteration warm-up, no checkpoint."""
    cfg.train_cfg = dict(
        type='IterBasedTrainLoop', max_iters=iters, val_interval=iters + 1)
    cfg.param_scheduler = [
        dict(
            type='ConstantLR', factor=1.0, by_epoch=False, begin=0, end=iters)
    ]
    cfg.train_dataloader.batch_size = batch_size
    cfg.train_dataloader.sampler = dict(type='InfiniteSampler', shuffle=True)
    cfg.val_dataloader.batch_size = batch_size
    cfg.test_dataloader.batch_size = batch_size
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook',
        interval=iters + 1,
        by_epoch=False,
        save_last=False)
    cfg.default_hooks.logger = dict(type='LoggerHook', interval=1)
    cfg.log_processor = dict(by_epoch=False, window_size=1)
    # an untrained detector scores low: keep its boxes for the metric
    test_cfg = cfg.model.get('test_cfg')
    if test_cfg is not None:
        if 'score_thr' in test_cfg:
            test_cfg.score_thr = 0.0
        if test_cfg.get('rcnn') is not None:
            test_cfg.rcnn.score_thr = 0.0
    return cfg


# ---------------------------------------------------------------- results
def _atomic_png(path, img):
    ok, buf = cv2.imencode('.png', img)
    if not ok:
        raise IOError(f'could not encode {path}')
    atomic_write(path, buf.tobytes())


def format_table(rows):
    """rows: dicts task, metric, value, target (None for info rows),
    seconds. Returns the text of the results table."""
    head = ('task', 'metric', 'value', 'target', 'result', 'time')
    lines = []
    for r in rows:
        val = r.get('value')
        tgt = r.get('target')
        if tgt is None:
            res = ''
        elif val is None:
            res = 'ERROR'
        else:
            res = 'PASS' if val >= tgt else 'FAIL'
        lines.append(
            (r['task'], r['metric'], '-' if val is None else f'{val:.3f}',
             '' if tgt is None else f'>= {tgt:g}', res,
             '' if r.get('seconds') is None else f'{r["seconds"]:.0f} s'))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]

    def fmt(cells):
        return '| ' + ' | '.join(
            str(c).ljust(w) for c, w in zip(cells, widths)) + ' |'

    sep = '|' + '|'.join('-' * (w + 2) for w in widths) + '|'
    return '\n'.join([fmt(head), sep] + [fmt(x) for x in lines])


# ---------------------------------------------------------------- drawing
class PredictionCollector(Hook):
    """Keeps the first ``n`` test outputs (data samples) of a Runner."""

    priority = 'LOWEST'

    def __init__(self, n=8):
        self.n = n
        self.samples = []

    def after_test_iter(self,
                        runner,
                        batch_idx,
                        data_batch=None,
                        outputs=None):
        for s in outputs or []:
            if len(self.samples) < self.n:
                self.samples.append(s.cpu() if hasattr(s, 'cpu') else s)


def _put_label(img, text, org, colour, scale=0.4):
    x, y = org
    (tw, th), base = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
    y = max(y, th + 2)
    cv2.rectangle(img, (x, y - th - 2), (x + tw + 2, y + base - 1), colour, -1)
    cv2.putText(img, text, (x + 1, y - 1), cv2.FONT_HERSHEY_SIMPLEX, scale,
                (255, 255, 255), 1, cv2.LINE_AA)


def _bgr(rgb):
    return tuple(int(c) for c in rgb[::-1])


def _load(path, upscale):
    img = cv2.imread(path, cv2.IMREAD_COLOR)
    return cv2.resize(
        img, None, fx=upscale, fy=upscale, interpolation=cv2.INTER_NEAREST)


def _title(width, text):
    bar = np.full((22, width, 3), 255, np.uint8)
    cv2.putText(bar, text, (4, 15), cv2.FONT_HERSHEY_SIMPLEX, 0.45, (0, 0, 0),
                1, cv2.LINE_AA)
    return bar


def _grid(tiles, cols, pad=4):
    h, w = tiles[0].shape[:2]
    rows = (len(tiles) + cols - 1) // cols
    out = np.full((rows * (h + pad) + pad, cols * (w + pad) + pad, 3), 255,
                  np.uint8)
    for k, t in enumerate(tiles):
        r, c = divmod(k, cols)
        out[pad + r * (h + pad):pad + r * (h + pad) + h,
            pad + c * (w + pad):pad + c * (w + pad) + w] = t
    return out


def _draw_det(samples, upscale, score_thr):
    DET_PALETTE = synthetic.DET_PALETTE
    tiles = []
    for s in samples:
        img = _load(s.img_path, upscale)
        gt = _load(s.img_path, upscale)
        pred = s.pred_instances
        keep = pred.scores >= score_thr
        pred = pred[keep]
        if 'masks' in pred and len(pred):
            overlay = img.copy()
            for m, lab in zip(pred.masks.numpy(), pred.labels.tolist()):
                m = cv2.resize(
                    m.astype(np.uint8),
                    img.shape[1::-1],
                    interpolation=cv2.INTER_NEAREST) > 0
                overlay[m] = _bgr(DET_PALETTE[lab])
            img = cv2.addWeighted(img, 0.55, overlay, 0.45, 0)
        for box, lab, sc in zip(pred.bboxes.numpy() * upscale,
                                pred.labels.tolist(), pred.scores.tolist()):
            x0, y0, x1, y1 = [int(round(v)) for v in box]
            col = _bgr(DET_PALETTE[lab])
            cv2.rectangle(img, (x0, y0), (x1, y1), col, 2)
            _put_label(img, f'{DET_CLASSES[lab]} {sc:.2f}', (x0, y0), col)
        gts = s.gt_instances
        for box, lab in zip(
                gts.bboxes.numpy() * upscale if hasattr(gts.bboxes, 'numpy')
                else np.asarray(gts.bboxes) * upscale, gts.labels.tolist()):
            x0, y0, x1, y1 = [int(round(v)) for v in box]
            col = _bgr(DET_PALETTE[lab])
            cv2.rectangle(gt, (x0, y0), (x1, y1), col, 2)
            _put_label(gt, DET_CLASSES[lab], (x0, y0), col)
        tiles.append(np.vstack([gt, img]))
    return _grid(
        tiles, cols=4), (f'top: ground truth, bottom: predictions '
                         f'(score >= {score_thr})')


def _draw_seg(samples, upscale):
    SEG_PALETTE = synthetic.SEG_PALETTE
    palette = np.array([_bgr(c) for c in SEG_PALETTE] + [(0, 0, 0)], np.uint8)
    tiles = []
    for s in samples:
        img = _load(s.img_path, upscale)
        pred = s.pred_sem_seg.data[0].numpy().astype(np.int64)
        gt = s.gt_sem_seg.data[0].numpy().astype(np.int64)
        gt = np.where(gt == 255, len(SEG_PALETTE), gt)
        size = img.shape[1::-1]

        def paint(lab):
            col = palette[np.clip(lab, 0, len(palette) - 1)]
            col = cv2.resize(col, size, interpolation=cv2.INTER_NEAREST)
            return cv2.addWeighted(img, 0.35, col, 0.65, 0)

        tiles.append(np.vstack([img, paint(gt), paint(pred)]))
    legend = ', '.join(f'{c}' for c in SEG_CLASSES)
    return _grid(
        tiles, cols=4), (f'image / ground truth / prediction '
                         f'({legend}; black = ignored)')


def _draw_cls(samples, upscale):
    tiles = []
    for s in samples:
        img = _load(s.img_path, upscale)
        pred = int(s.pred_label[0])
        gt = int(s.gt_label[0])
        score = float(s.pred_score[pred])
        col = (40, 160, 40) if pred == gt else (40, 40, 220)
        _put_label(img, f'{CLS_CLASSES[pred]} {score:.2f}', (2, 14), col)
        if pred != gt:
            _put_label(img, f'gt: {CLS_CLASSES[gt]}', (2, img.shape[0] - 4),
                       (90, 90, 90))
        tiles.append(img)
    return _grid(
        tiles, cols=8), ('prediction and score (green = correct, '
                         'red = wrong)')


def draw_predictions(task, samples, out_png, score_thr=0.4):
    """Draw collected test outputs into ``out_png`` (written atomically)."""
    if not samples:
        return None
    if task == 'det':
        grid, title = _draw_det(samples, 2, score_thr)
    elif task == 'seg':
        grid, title = _draw_seg(samples, 2)
    else:
        grid, title = _draw_cls(samples, 2)
    spec = TASKS[task]
    title = f'{spec["name"]} ({spec["model"]}), validation images: {title}'
    img = np.vstack([_title(grid.shape[1], title), grid])
    _atomic_png(out_png, img)
    return out_png


# ---------------------------------------------------------------- running
def run_task(task,
             data_root,
             work_dir,
             cfg=None,
             n_draw=None,
             seed=0,
             runner_cls=None,
             cfg_options=None):
    """Train, evaluate and draw one demo task.

    Args:
        task: 'det', 'seg' or 'cls'.
        data_root: the task's data folder (e.g. ``data/demo/coco``).
        work_dir: the Runner's work_dir (logs, checkpoint, PNG).
        cfg: the config (default: the task's ``configs/demo`` file).
        n_draw: validation images to draw (default 8; 24 for cls).
        seed: ``randomness.seed`` of the Runner.
        runner_cls: an mmengine ``Runner`` subclass (default ``Runner``).
        cfg_options: a dict merged into the config.

    Returns:
        dict: ``metrics`` (the codebase's dict), ``value`` (the target
        metric as a fraction), ``train_s``, ``test_s``, ``png``.
    """
    from mmengine.runner import Runner
    runner_cls = runner_cls or Runner
    spec = TASKS[task]
    if cfg is None:
        cfg = load_demo_config(task)
    cfg = copy.deepcopy(cfg)
    set_data_root(cfg, data_root)
    cfg.work_dir = work_dir
    cfg.randomness = dict(seed=seed)
    # evaluate once, with runner.test() after training (the configs also
    # validate at the end of training when used with tools/train.py)
    cfg.train_cfg.val_begin = 10**9
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    os.makedirs(work_dir, exist_ok=True)
    # a logger / message hub of its own, even within the same second
    from mmsoft_tools.launch import name_run
    name_run(cfg)
    runner = runner_cls.from_cfg(cfg)
    n = n_draw if n_draw is not None else (24 if task == 'cls' else 8)
    collector = PredictionCollector(n)
    runner.register_hook(collector, priority='LOWEST')
    t0 = time.perf_counter()
    runner.train()
    t1 = time.perf_counter()
    metrics = runner.test()
    t2 = time.perf_counter()
    metrics = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, (int, float, np.floating, np.integer))
    }
    value = metrics.get(spec['metric'])
    if value is None and task == 'det':
        value = 0.0  # CocoMetric returns nothing when there is no detection
    png = draw_predictions(task, collector.samples,
                           osp.join(work_dir, f'{task}_predictions.png'))
    return dict(
        metrics=metrics,
        value=None if value is None else value * spec['scale'],
        train_s=t1 - t0,
        test_s=t2 - t1,
        png=png)
