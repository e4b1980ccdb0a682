"""Deterministic synthetic data sets in the real formats (coco/, ade/,
imagenet/; configs/demo/README.md), one random stream per image, written
atomically with a ``demo_data.json`` manifest (a user's folder: never)."""
import itertools
import json
import os
import os.path as osp
import shutil
import time

import cv2
import numpy as np

GENERATOR_VERSION = 2  # bump when the images change
DET_CLASSES = ('circle', 'square', 'triangle')  # COCO category ids 1..3
#: background + shapes: ADE20K names, written as their ADE20K label values
SEG_CLASSES = ('wall', 'ball', 'box', 'tent')
SEG_ADE_INDEX = dict(wall=1, ball=120, box=42, tent=115)
CLS_CLASSES = ('circle', 'square', 'triangle', 'star', 'cross')
#: each class's hue (OpenCV, 0-180), for a share ``colour_cue`` of objects
CLASS_HUES = dict(circle=0, square=108, triangle=54, star=27, cross=144)
HUE_JITTER = 10
MIN_VISIBLE = 0.6  # the least visible share of an object's area
MIN_FRAGMENT = 20  # smaller visible fragments (pixels) are ADE20K "other"
MANIFEST = 'demo_data.json'
_SCENES = dict(
    num_train=500,
    num_val=100,
    size=160,
    objects=(2, 6),
    radius=(10, 38),
    colour_cue=0.9)
DEFAULTS = dict(
    det=dict(_SCENES),
    seg=dict(_SCENES),
    cls=dict(num_train=4000, num_val=500, size=64, colour_cue=0.95))
_TASK_IDS, _SPLIT_IDS = dict(det=1, seg=2, cls=3), dict(train=0, val=1)
_FOLDERS = dict(det='coco', seg='ade', cls='imagenet')
_COCO_HEAD = dict(
    info=dict(
        description='mmsoft synthetic demo data (COCO instances)',
        version=str(GENERATOR_VERSION),
        year=2024,
        contributor='mmsoft tools/misc/make_demo_data.py'),
    licenses=[dict(id=1, name='CC0', url='')])


def shape_polygon(kind, cx, cy, r, angle, rng):
    """Vertices (N, 2) of a jittered shape in the circle (cx, cy, r)."""
    if kind == 'circle':
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        pts = np.stack([r * np.cos(t), r * rng.uniform(0.8, 1.0) * np.sin(t)],
                       1)
    elif kind == 'square':
        a = rng.uniform(0.8, 1.0)
        h = r / np.sqrt(1 + a * a)  # half-diagonal = r
        pts = np.array([[-h, -a * h], [h, -a * h], [h, a * h], [-h, a * h]])
    elif kind == 'triangle':
        t = np.deg2rad(np.array([90., 210., 330.]) + rng.uniform(-8, 8, 3))
        pts = np.stack([r * np.cos(t), r * np.sin(t)], 1)
    elif kind == 'star':
        t = np.pi / 2 + np.arange(10) * np.pi / 5
        rad = np.where(np.arange(10) % 2 == 0, r, r * rng.uniform(0.4, 0.5))
        pts = np.stack([rad * np.cos(t), rad * np.sin(t)], 1)
    elif kind == 'cross':
        w = r * rng.uniform(0.3, 0.4)
        a = np.sqrt(r * r - w * w)  # arm tips' corners on the circle r
        pts = np.array([[-w, -a], [w, -a], [w, -w], [a, -w], [a, w], [w, w],
                        [w, a], [-w, a], [-w, w], [-a, w], [-a, -w], [-w, -w]])
    else:
        raise ValueError(f'unknown shape {kind!r}')
    c, s = np.cos(angle), np.sin(angle)
    return pts @ np.array([[c, -s], [s, c]]).T + np.array([cx, cy])


def _pts(poly):  # OpenCV's fixed point with 4 fractional bits (1/16 px)
    return np.round(poly * 16).astype(np.int32)[None]


def _fill_mask(poly, h, w, antialias=False):
    """uint8 mask (0/255) of a polygon."""
    canvas = np.zeros((h, w), np.uint8)
    line = cv2.LINE_AA if antialias else cv2.LINE_8
    return cv2.fillPoly(canvas, _pts(poly), 255, line, shift=4)


def _hsv_colour(rng, s_range, v_range, hue=None):
    h = rng.uniform(0, 180) if hue is None else \
        (hue + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 180
    hsv = np.uint8(
        [[[h, rng.uniform(*s_range) * 255,
           rng.uniform(*v_range) * 255]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0].astype(np.float32)


def _smooth_noise(rng, h, w, cells, channels=1):
    """Smooth random field in [-1, 1] (bicubic upsampled coarse noise)."""
    coarse = rng.uniform(-1, 1, (cells, cells, channels)).astype(np.float32)
    out = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    return out.reshape(h, w, channels)


def _ramp(rng, xx, yy, h, w):
    """A linear ramp in [0, 1] of random direction."""
    t = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(t) * xx + np.sin(t) * yy) / max(h, w)
    return (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)


def _background(rng, h, w):
    """Ramp, grating, blotches, a checker, noise: float32 BGR."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c0 = _hsv_colour(rng, (0.0, 0.35), (0.35, 0.85))
    c1 = _hsv_colour(rng, (0.0, 0.35), (0.35, 0.85))
    ramp = _ramp(rng, xx, yy, h, w)[..., None]
    img = c0 * (1 - ramp) + c1 * ramp
    t, f = rng.uniform(0, np.pi), rng.uniform(0.08, 0.5)
    grating = np.sin(f * (np.cos(t) * xx + np.sin(t) * yy) +
                     rng.uniform(0, 2 * np.pi))
    img += rng.uniform(8, 30) * grating[..., None] * rng.uniform(0.5, 1, 3)
    img += rng.uniform(10, 35) * _smooth_noise(rng, h, w,
                                               int(rng.integers(3, 8)), 3)
    if rng.random() < 0.4:
        p = int(rng.integers(6, 20))
        img += rng.uniform(6, 18) * ((
            (xx // p + yy // p) % 2) * 2 - 1)[..., None]
    return img + rng.normal(0, rng.uniform(2, 9), img.shape).astype(np.float32)


def _texture(rng, h, w, base):
    """An object's fill: solid, shaded, stripes, two-tone or speckled."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    kind = rng.choice(['solid', 'shaded', 'stripes', 'two-tone', 'speckled'],
                      p=[0.25, 0.25, 0.2, 0.15, 0.15])
    img = np.broadcast_to(base, (h, w, 3)).astype(np.float32)
    if kind == 'shaded':
        t = rng.uniform(0, 2 * np.pi)
        ramp = (np.cos(t) * xx + np.sin(t) * yy) / max(h, w) - 0.5
        img = img * (1 + rng.uniform(0.3, 0.7) * ramp[..., None])
    elif kind == 'stripes':
        t, period = rng.uniform(0, np.pi), rng.uniform(4, 9)
        s = np.sin(2 * np.pi * (np.cos(t) * xx + np.sin(t) * yy) / period)
        img = img * (1 - 0.3 * (s[..., None] > 0))
    elif kind == 'two-tone':
        ramp = _ramp(rng, xx, yy, h, w)[..., None]
        img = img * (1 - ramp) + (base[::-1] * 0.5 + 100) * ramp
    elif kind == 'speckled':
        img = img + 40 * _smooth_noise(rng, h, w, int(rng.integers(8, 20)))
    return img + rng.normal(0, 4, (h, w, 3)).astype(np.float32)


def _clutter(rng, img, h, w):
    """Thin lines and small blobs of no class; their bool mask."""
    mask = np.zeros((h, w), np.uint8)
    for _ in range(int(rng.integers(0, 4))):
        colour = _hsv_colour(rng, (0, 0.6), (0.1, 1)).tolist()
        p0 = tuple(int(v) for v in rng.integers(0, [w, h]))
        p1 = tuple(int(v) for v in rng.integers(0, [w, h]))
        th = int(rng.integers(1, 3))
        cv2.line(img, p0, p1, colour, th, cv2.LINE_AA)
        cv2.line(mask, p0, p1, 255, th, cv2.LINE_8)
    for _ in range(int(rng.integers(0, 3))):
        n = int(rng.integers(5, 9))
        r = rng.uniform(2, 6, n)
        t = np.sort(rng.uniform(0, 2 * np.pi, n))
        c = rng.uniform(8, [w - 8, h - 8])
        m = _fill_mask(np.stack([r * np.cos(t), r * np.sin(t)], 1) + c, h, w)
        img[m > 0] = _hsv_colour(rng, (0, 0.6), (0.1, 1))
        mask |= m
    return mask > 0


def _composite(img, poly, rng, kind, colour_cue):
    """Draw a textured polygon of class ``kind`` into img (anti-aliased)."""
    hue = CLASS_HUES[kind] if rng.random() < colour_cue else None
    h, w = img.shape[:2]
    alpha = _fill_mask(poly, h, w, antialias=True).astype(np.float32) / 255.
    x0, y0 = np.maximum(np.floor(poly.min(0)).astype(int) - 1, 0)
    x1, y1 = np.minimum(np.ceil(poly.max(0)).astype(int) + 2, [w, h])
    if x1 <= x0 or y1 <= y0:
        return
    tex = _texture(rng, y1 - y0, x1 - x0,
                   _hsv_colour(rng, (0.45, 1.0), (0.45, 1.0), hue))
    a = alpha[y0:y1, x0:x1, None]
    img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * (1 - a) + tex * a
    if rng.random() < 0.3:  # a dark or light outline
        colour = (20., 20., 20.) if rng.random() < 0.5 else (235., 235., 235.)
        cv2.polylines(img, _pts(poly), True, colour, 1, cv2.LINE_AA, shift=4)


def render_scene(rng, size, objects=(2, 6), radius=(10, 38), colour_cue=0.):
    """``(BGR img, [dict(label, visible mask)], ADE20K "other" mask)``."""
    img = _background(rng, size, size)
    clutter = _clutter(rng, img, size, size)
    objs = []
    for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
        label = int(rng.integers(len(DET_CLASSES)))
        for _ in range(30):  # tries
            r = rng.uniform(*radius)
            cx, cy = rng.uniform(r, size - r), rng.uniform(r, size - r)
            poly = shape_polygon(DET_CLASSES[label], cx, cy, r,
                                 rng.uniform(0, 2 * np.pi), rng)
            full = _fill_mask(poly, size, size) > 0
            if full.sum() >= 16 and all(
                (o['mask'] & ~full).sum() >= MIN_VISIBLE * o['full'].sum()
                    for o in objs):
                break
        else:
            continue  # no valid placement: fewer objects in this scene
        for o in objs:
            o['mask'] = o['mask'] & ~full
        _composite(img, poly, rng, DET_CLASSES[label], colour_cue)
        objs.append(dict(label=label, full=full, mask=full.copy()))
    dropped = np.zeros((size, size), bool)  # occlusion slivers
    for o in objs:
        m = o['mask'].astype(np.uint8)
        n_cc, cc, stats, _ = cv2.connectedComponentsWithStats(
            m, connectivity=8)
        solid = cv2.erode(m, np.ones((3, 3), np.uint8))
        keep = [False] + [
            stats[k, cv2.CC_STAT_AREA] >= MIN_FRAGMENT
            and solid[cc == k].any() for k in range(1, n_cc)
        ]
        clean = np.array(keep)[cc]
        dropped |= o['mask'] & ~clean
        o['mask'] = clean
    objs = [
        dict(label=o['label'], mask=o['mask']) for o in objs
        if o['mask'].any()
    ]
    covered = np.logical_or.reduce([o['mask'] for o in objs] +
                                   [np.zeros((size, size), bool)])
    img = np.clip(img, 0, 255).astype(np.uint8)
    return img, objs, (clutter & ~covered) | dropped


def render_cls_image(rng, size, label, colour_cue=0.0):
    """One dominant shape of class ``label`` and 0-2 small others."""
    img = _background(rng, size, size)
    _clutter(rng, img, size, size)
    for _ in range(int(rng.integers(0, 3))):
        other = int(rng.integers(len(CLS_CLASSES) - 1))
        other += other >= label
        r = rng.uniform(0.06, 0.12) * size
        poly = shape_polygon(CLS_CLASSES[other], rng.uniform(r, size - r),
                             rng.uniform(r, size - r), r,
                             rng.uniform(0, 2 * np.pi), rng)
        _composite(img, poly, rng, CLS_CLASSES[other], colour_cue)
    r = rng.uniform(0.24, 0.42) * size
    jitter = min(0.5 * size - r, 0.12 * size)
    cx = 0.5 * size + rng.uniform(-1, 1) * jitter
    cy = 0.5 * size + rng.uniform(-1, 1) * jitter
    poly = shape_polygon(CLS_CLASSES[label], cx, cy, r,
                         rng.uniform(0, 2 * np.pi), rng)
    _composite(img, poly, rng, CLS_CLASSES[label], colour_cue)
    return np.clip(img, 0, 255).astype(np.uint8)


def _imwrite(path, img):
    os.makedirs(osp.dirname(path), exist_ok=True)
    if not cv2.imwrite(path, img):  # JPEG quality 95: OpenCV's default
        raise IOError(f'could not write {path}')


def _write_text(path, text):
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.write(text)


def _map(fn, items, workers):
    """``[fn(x) for x in items]``, in ``workers`` forked processes."""
    import multiprocessing as mp
    if workers <= 1 or len(items) < 2 * workers or \
            'fork' not in mp.get_all_start_methods():
        return [fn(x) for x in items]
    with mp.get_context('fork').Pool(workers) as pool:
        return pool.map(fn, items, max(1, len(items) // (8 * workers)))


def _item(args):
    """Render and write image ``i``: its list line (cls) or its annotations."""
    task, root, split, i, seed, cfg = args
    rng = np.random.default_rng([seed, _TASK_IDS[task], _SPLIT_IDS[split], i])
    if task == 'cls':
        label = i % len(CLS_CLASSES)
        rel = f'{CLS_CLASSES[label]}/{CLS_CLASSES[label]}_{i:05d}.JPEG'
        img = render_cls_image(rng, cfg['size'], label, cfg['colour_cue'])
        _imwrite(osp.join(root, split, rel), img)
        return f'{rel} {label}'
    img, objs, other = render_scene(rng, cfg['size'], cfg['objects'],
                                    cfg['radius'], cfg['colour_cue'])
    if task == 'seg':
        folder = dict(train='training', val='validation')[split]
        name = f'{folder}/ADE_{folder}_{i:08d}'
        label = np.full(img.shape[:2], SEG_ADE_INDEX['wall'], np.uint8)
        label[other] = 0  # ADE20K "other" (ignored by the metric)
        for o in objs:  # disjoint visible parts
            label[o['mask']] = SEG_ADE_INDEX[SEG_CLASSES[o['label'] + 1]]
        _imwrite(osp.join(root, 'images', name + '.jpg'), img)
        _imwrite(osp.join(root, 'annotations', name + '.png'), label)
        return None
    _imwrite(osp.join(root, split, f'{i:06d}.jpg'), img)
    anns = []
    for o in objs:
        contours, _ = cv2.findContours(o['mask'].astype(np.uint8),
                                       cv2.RETR_EXTERNAL,
                                       cv2.CHAIN_APPROX_SIMPLE)
        polys = [[float(v) for v in c.reshape(-1)] for c in contours
                 if len(c) >= 3]  # outer contours, pixel centres
        ys, xs = np.nonzero(o['mask'])
        box = [int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())]
        anns += [
            dict(
                category_id=o['label'] + 1,
                segmentation=polys,
                area=float(o['mask'].sum()),
                bbox=box[:2] + [box[2] - box[0] + 1, box[3] - box[1] + 1],
                iscrowd=0)
        ] if polys else []
    return anns


def _write(root, task, num_train, num_val, seed=0, workers=1, **cfg):
    """Write the data set of ``task`` into ``root``."""
    for split, n in (('train', num_train), ('val', num_val)):
        for c in CLS_CLASSES if task == 'cls' else ():
            os.makedirs(osp.join(root, split, c), exist_ok=True)
        out = _map(_item, [(task, root, split, i, seed, cfg)
                           for i in range(n)], workers)
        if task == 'cls':
            _write_text(
                osp.join(root, 'meta', f'{split}.txt'), '\n'.join(out) + '\n')
        elif task == 'det':
            ids, size = itertools.count(1), cfg['size']
            _write_text(
                osp.join(root, 'annotations', f'instances_{split}.json'),
                json.dumps(
                    dict(
                        _COCO_HEAD,
                        images=[
                            dict(
                                id=i + 1,
                                file_name=f'{i:06d}.jpg',
                                width=size,
                                height=size) for i in range(n)
                        ],
                        annotations=[
                            dict(id=next(ids), image_id=i + 1, **a)
                            for i, anns in enumerate(out) for a in anns
                        ],
                        categories=[
                            dict(id=k + 1, name=c, supercategory='shape')
                            for k, c in enumerate(DET_CLASSES)
                        ]),
                    separators=(',', ':')))
    if task == 'cls':
        _write_text(
            osp.join(root, 'meta', 'classes.txt'),
            '\n'.join(CLS_CLASSES) + '\n')


class NotDemoDataError(Exception):
    """A folder the demo data would replace holds something else."""


def _check_ours(folder):
    """Refuse to replace ``folder`` unless missing, empty or demo data."""
    ours = osp.isdir(folder) and not osp.islink(folder) and (
        not os.listdir(folder) or osp.isfile(osp.join(folder, MANIFEST)))
    if ours or not osp.lexists(folder):
        return
    what = 'a link' if osp.islink(folder) else 'a file' if not osp.isdir(
        folder) else f'data not written by this generator (no {MANIFEST})'
    raise NotDemoDataError(
        f'{folder} exists and is {what}: the demo data never replaces it '
        f'(--force included); choose another --out, e.g. data/demo')


def make_demo_data(out,
                   seed=0,
                   tasks=('det', 'seg', 'cls'),
                   force=False,
                   overrides=None,
                   workers=None,
                   log=print):
    """``{task: dict(path, generated, seconds)}``; up-to-date sets kept."""
    log = log or (lambda *a, **k: None)
    workers = workers or min(os.cpu_count() or 1, 4)
    for task in tasks:  # before anything is written
        _check_ours(osp.join(out, _FOLDERS[task]))
    report = {}
    for task in tasks:
        cfg = dict(DEFAULTS[task], **(overrides or {}).get(task, {}))
        classes = dict(det=DET_CLASSES, seg=SEG_CLASSES, cls=CLS_CLASSES)[task]
        params = json.loads(
            json.dumps(
                dict(  # as the manifest reads back
                    generator_version=GENERATOR_VERSION,
                    task=task,
                    seed=seed,
                    classes=classes,
                    **cfg)))
        folder, t0 = osp.join(out, _FOLDERS[task]), time.perf_counter()
        try:
            with open(osp.join(folder, MANIFEST)) as f:
                done = json.load(f).get('params') == params and not force
        except (OSError, ValueError):
            done = False
        if done:
            log(f'{task}: {folder} is up to date, skipped')
        else:
            tmp = osp.join(out, f'.{_FOLDERS[task]}.tmp{os.getpid()}')
            old = osp.join(out, f'.{_FOLDERS[task]}.old{os.getpid()}')
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                _write(tmp, task, seed=seed, workers=workers, **cfg)
                _write_text(
                    osp.join(tmp, MANIFEST), json.dumps(dict(params=params)))
                if osp.exists(folder):
                    shutil.rmtree(old, ignore_errors=True)
                    os.replace(folder, old)
                os.replace(tmp, folder)
                shutil.rmtree(old, ignore_errors=True)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
            log(f'{task}: wrote {folder} in {time.perf_counter() - t0:.1f} s')
        report[task] = dict(
            path=folder, generated=not done, seconds=time.perf_counter() - t0)
    return report
