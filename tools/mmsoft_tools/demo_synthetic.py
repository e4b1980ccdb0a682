"""Deterministic synthetic data sets in the real on-disk formats.

Three small data sets that the *unmodified* dataset classes of the
OpenMMLab codebases read:

* ``coco/`` - COCO instances for detection / instance segmentation
  (mmdet ``CocoDataset``)::

      coco/annotations/instances_{train,val}.json
      coco/{train,val}/000000.jpg ...

  Every annotation has ``bbox`` ([x, y, w, h] of the visible part),
  ``segmentation`` (polygons of the visible part), ``area`` (visible
  pixels), ``iscrowd`` (0) and ``category_id`` (1..K).

* ``ade/`` - the ADE20K layout for semantic segmentation (mmseg
  ``ADE20KDataset``)::

      ade/images/{training,validation}/ADE_*.jpg
      ade/annotations/{training,validation}/ADE_*.png

  Label PNGs follow the ADE20K indexing convention: 0 = "other" (unlabelled;
  here the thin clutter drawn on the background) and an ADE20K class k
  (1..150) is written as k: the background is ADE20K's 'wall' (1), circles
  are 'ball' (120), squares 'box' (42), triangles 'tent' (115). With
  ``reduce_zero_label=True`` (ADE20KDataset's default) 0 becomes the ignore
  index 255, and ``metainfo=dict(classes=SEG_CLASSES)`` makes the dataset's
  label map turn the four classes into 0..3 (and any other into 255).

* ``imagenet/`` - ImageNet-style class folders plus annotation files
  (mmpretrain ``CustomDataset`` / ``ImageNet``)::

      imagenet/{train,val}/<class>/<class>_0000.JPEG
      imagenet/meta/{train,val}.txt      ("<class>/<file> <label>" lines)
      imagenet/meta/classes.txt

Scenes: a textured background (colour gradient + a sinusoidal grating +
smooth blotches + a low-contrast checker + pixel noise), clutter (thin lines
and small blobs that belong to no class), then several objects of several
shape classes with random size, rotation, colour and fill texture
(solid / shaded / stripes / two-tone / speckled). Objects may overlap, but
every object keeps at least ``MIN_VISIBLE`` of its area visible.

Everything is a pure function of ``(seed, data set, split, index)``: each
image has its own ``numpy.random.default_rng`` stream, so the output is
byte-identical from run to run (and independent of the generation order).
Each data set is generated into a temporary folder that then replaces the
target folder in one ``os.replace``; a ``demo_data.json`` manifest records
the parameters, so that :func:`make_demo_data` skips data sets that are
already up to date.

The module itself needs only numpy and OpenCV (no torch, no OpenMMLab);
``tools/misc/make_demo_data.py`` is its command line.
"""
import json
import os
import os.path as osp
import shutil
import time

import cv2
import numpy as np

__all__ = [
    'GENERATOR_VERSION', 'DET_CLASSES', 'SEG_CLASSES', 'CLS_CLASSES',
    'SEG_ADE_INDEX', 'CLASS_HUES', 'DET_PALETTE', 'SEG_PALETTE', 'DEFAULTS',
    'MIN_VISIBLE', 'MIN_FRAGMENT', 'MANIFEST', 'shape_polygon', 'render_scene',
    'render_cls_image', 'scene_options', 'make_coco', 'make_ade',
    'make_imagenet', 'make_demo_data', 'dataset_paths'
]

#: bump when the rendering changes (invalidates generated data on disk)
GENERATOR_VERSION = 2

#: detection / instance segmentation classes (COCO category ids 1..K)
DET_CLASSES = ('circle', 'square', 'triangle')
#: semantic segmentation classes: ADE20K class names, written with their
#: ADE20K label values (:data:`SEG_ADE_INDEX`), so that ``ADE20KDataset``
#: with ``metainfo=dict(classes=SEG_CLASSES)`` maps them to 0..3 through its
#: label map. The background is 'wall'; circle, square and triangle objects
#: are 'ball', 'box' and 'tent'.
SEG_CLASSES = ('wall', 'ball', 'box', 'tent')
#: ADE20K label value (1-based index into the 150 ADE20K classes)
SEG_ADE_INDEX = dict(wall=1, ball=120, box=42, tent=115)
#: classification classes (dominant shape of the image)
CLS_CLASSES = ('circle', 'square', 'triangle', 'star', 'cross')

#: the hue (OpenCV scale, 0-180) typical of each shape class: with probability
#: ``colour_cue`` an object's colour is drawn around its class's hue (+-
#: ``HUE_JITTER``), otherwise uniformly - a real-world-like, imperfect cue
CLASS_HUES = dict(circle=0, square=108, triangle=54, star=27, cross=144)
HUE_JITTER = 10

DET_PALETTE = [(220, 20, 60), (0, 130, 255), (0, 200, 80), (255, 170, 0)]
SEG_PALETTE = [(90, 90, 90)] + DET_PALETTE[:len(DET_CLASSES)]

#: a visible fraction below this makes a placement be redrawn
MIN_VISIBLE = 0.6
#: visible fragments of an object smaller than this (pixels), or without a
#: solid 3 x 3 block, are not annotated (ADE20K "other" in label maps)
MIN_FRAGMENT = 20

#: default sizes: a few hundred images each, generated in seconds (the
#: detection and segmentation sets: the same scenes)
_SCENE_SETS = dict(
    num_train=500,
    num_val=100,
    size=160,
    objects=(2, 6),
    radius=(10, 38),
    colour_cue=0.9)
DEFAULTS = dict(
    det=dict(_SCENE_SETS),
    seg=dict(_SCENE_SETS),
    cls=dict(num_train=4000, num_val=500, size=64, colour_cue=0.95),
)

_TASK_IDS = dict(det=1, seg=2, cls=3)
_SPLIT_IDS = dict(train=0, val=1)


# ---------------------------------------------------------------- shapes
def shape_polygon(kind, cx, cy, r, angle, rng):
    """Vertices (N, 2) float64 of a shape inscribed in the circle of radius
    r centred at (cx, cy).

    Each kind has a distinctive outline, with random jitter: 'circle' a
    slightly elliptic disk, 'square' a rotated near-square, 'triangle' a
    near-equilateral triangle, 'star' a five-pointed star, 'cross' a plus.
    """
    if kind == 'circle':
        t = np.linspace(0, 2 * np.pi, 48, endpoint=False)
        ry = r * rng.uniform(0.8, 1.0)
        pts = np.stack([r * np.cos(t), ry * np.sin(t)], 1)
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
    rot = np.array([[c, -s], [s, c]])
    return pts @ rot.T + np.array([cx, cy])


def _fill_mask(poly, h, w, antialias=False):
    """uint8 mask (0/255) of a polygon, rendered with 1/16 px precision."""
    canvas = np.zeros((h, w), np.uint8)
    pts = np.round(poly * 16).astype(np.int32)[None]
    cv2.fillPoly(
        canvas, pts, 255, cv2.LINE_AA if antialias else cv2.LINE_8, shift=4)
    return canvas


def _hsv_colour(rng, s_range, v_range, hue=None):
    h = rng.uniform(0, 180) if hue is None else \
        (hue + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 180
    s = rng.uniform(*s_range) * 255
    v = rng.uniform(*v_range) * 255
    hsv = np.uint8([[[h, s, v]]])
    return cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0].astype(np.float32)


def _smooth_noise(rng, h, w, cells, channels=1):
    """Smooth random field in [-1, 1] (bicubic upsampled coarse noise)."""
    coarse = rng.uniform(-1, 1, (cells, cells, channels)).astype(np.float32)
    out = cv2.resize(coarse, (w, h), interpolation=cv2.INTER_CUBIC)
    return out.reshape(h, w, channels)


def _background(rng, h, w):
    """A textured background, float32 (h, w, 3) BGR in ~[0, 255]."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    c0 = _hsv_colour(rng, (0.0, 0.35), (0.35, 0.85))
    c1 = _hsv_colour(rng, (0.0, 0.35), (0.35, 0.85))
    t = rng.uniform(0, 2 * np.pi)
    ramp = (np.cos(t) * xx + np.sin(t) * yy) / max(h, w)
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
    img = c0 * (1 - ramp[..., None]) + c1 * ramp[..., None]
    # a sinusoidal grating of random orientation / frequency / contrast
    t = rng.uniform(0, np.pi)
    f = rng.uniform(0.08, 0.5)
    grating = np.sin(f * (np.cos(t) * xx + np.sin(t) * yy) +
                     rng.uniform(0, 2 * np.pi))
    img += rng.uniform(8, 30) * grating[..., None] * rng.uniform(0.5, 1, 3)
    # smooth colour blotches
    img += rng.uniform(10, 35) * _smooth_noise(rng, h, w,
                                               int(rng.integers(3, 8)), 3)
    # sometimes a low-contrast checker (tiles / floor)
    if rng.random() < 0.4:
        p = int(rng.integers(6, 20))
        checker = ((xx // p + yy // p) % 2) * 2 - 1
        img += rng.uniform(6, 18) * checker[..., None]
    img += rng.normal(0, rng.uniform(2, 9), img.shape).astype(np.float32)
    return img


def _texture(rng, h, w, base):
    """The fill of an object: float32 (h, w, 3)."""
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    kind = rng.choice(['solid', 'shaded', 'stripes', 'two-tone', 'speckled'],
                      p=[0.25, 0.25, 0.2, 0.15, 0.15])
    img = np.broadcast_to(base, (h, w, 3)).astype(np.float32)
    if kind == 'shaded':
        t = rng.uniform(0, 2 * np.pi)
        ramp = (np.cos(t) * xx + np.sin(t) * yy) / max(h, w) - 0.5
        img = img * (1 + rng.uniform(0.3, 0.7) * ramp[..., None])
    elif kind == 'stripes':
        t = rng.uniform(0, np.pi)
        period = rng.uniform(4, 9)
        s = np.sin(2 * np.pi * (np.cos(t) * xx + np.sin(t) * yy) / period)
        img = img * (1 - 0.3 * (s[..., None] > 0))
    elif kind == 'two-tone':
        other = base[::-1] * 0.5 + 100
        t = rng.uniform(0, 2 * np.pi)
        ramp = (np.cos(t) * xx + np.sin(t) * yy) / max(h, w)
        ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
        img = img * (1 - ramp[..., None]) + other * ramp[..., None]
    elif kind == 'speckled':
        img = img + 40 * _smooth_noise(rng, h, w, int(rng.integers(8, 20)))
    return img + rng.normal(0, 4, (h, w, 3)).astype(np.float32)


def _clutter(rng, img, h, w):
    """Thin lines and small blobs that belong to no class; returns a bool
    mask of the pixels they cover (ADE20K "other")."""
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
        poly = np.stack([r * np.cos(t), r * np.sin(t)], 1) + c
        m = _fill_mask(poly, h, w)
        img[m > 0] = _hsv_colour(rng, (0, 0.6), (0.1, 1))
        mask |= m
    return mask > 0


def _composite(img, poly, rng, hue=None):
    """Draw a textured polygon into img (anti-aliased edges); ``hue``: the
    hue the fill colour is drawn around (None: any hue)."""
    h, w = img.shape[:2]
    alpha = _fill_mask(poly, h, w, antialias=True).astype(np.float32) / 255.
    x0, y0 = np.floor(poly.min(0)).astype(int) - 1
    x1, y1 = np.ceil(poly.max(0)).astype(int) + 2
    x0, y0 = max(x0, 0), max(y0, 0)
    x1, y1 = min(x1, w), min(y1, h)
    if x1 <= x0 or y1 <= y0:
        return
    base = _hsv_colour(rng, (0.45, 1.0), (0.45, 1.0), hue)
    tex = _texture(rng, y1 - y0, x1 - x0, base)
    a = alpha[y0:y1, x0:x1, None]
    img[y0:y1, x0:x1] = img[y0:y1, x0:x1] * (1 - a) + tex * a
    if rng.random() < 0.3:  # a dark or light outline
        colour = (20., 20., 20.) if rng.random() < 0.5 else (235., 235., 235.)
        pts = np.round(poly * 16).astype(np.int32)[None]
        cv2.polylines(img, pts, True, colour, 1, cv2.LINE_AA, shift=4)


def _class_hue(rng, kind, colour_cue):
    """The hue to draw an object of class ``kind`` around, or None."""
    return CLASS_HUES[kind] if rng.random() < colour_cue else None


def render_scene(rng,
                 size,
                 classes=DET_CLASSES,
                 objects=(2, 6),
                 radius=(10, 38),
                 colour_cue=0.0,
                 max_tries=30):
    """A scene with several objects of several classes.

    Returns:
        tuple: ``(img, objs, other)`` - uint8 BGR image (size, size, 3);
        a list of dicts ``label`` (0-based class index), ``mask`` (bool,
        the *visible* pixels, slivers removed) in drawing order; the bool
        mask of the pixels that belong to no annotated object or to the
        background: clutter and occlusion slivers (ADE20K "other").
    """
    h = w = size
    img = _background(rng, h, w)
    clutter = _clutter(rng, img, h, w)
    n = int(rng.integers(objects[0], objects[1] + 1))
    objs = []  # dicts: label, poly, full (bool mask), mask (visible)
    for _ in range(n):
        label = int(rng.integers(len(classes)))
        for _ in range(max_tries):
            r = rng.uniform(*radius)
            cx, cy = rng.uniform(r, w - r), rng.uniform(r, h - r)
            poly = shape_polygon(classes[label], cx, cy, r,
                                 rng.uniform(0, 2 * np.pi), rng)
            full = _fill_mask(poly, h, w) > 0
            if full.sum() < 16:
                continue
            # every earlier object must stay visible enough
            if all((o['mask'] & ~full).sum() >= MIN_VISIBLE * o['full'].sum()
                   for o in objs):
                break
        else:
            continue  # no valid placement: fewer objects in this scene
        for o in objs:
            o['mask'] = o['mask'] & ~full
        _composite(img, poly, rng, _class_hue(rng, classes[label], colour_cue))
        objs.append(dict(label=label, poly=poly, full=full, mask=full.copy()))
    # occlusion can leave slivers: not annotated, "other" in label maps
    dropped = np.zeros((h, w), bool)
    kernel = np.ones((3, 3), np.uint8)
    for o in objs:
        m = o['mask'].astype(np.uint8)
        n_cc, cc, stats, _ = cv2.connectedComponentsWithStats(
            m, connectivity=8)
        solid = cv2.erode(m, kernel)
        keep = np.zeros(n_cc, bool)
        for k in range(1, n_cc):
            keep[k] = stats[k, cv2.CC_STAT_AREA] >= MIN_FRAGMENT and \
                solid[cc == k].any()
        clean = keep[cc]
        dropped |= o['mask'] & ~clean
        o['mask'] = clean
    objs = [o for o in objs if o['mask'].any()]
    covered = np.zeros((h, w), bool)
    for o in objs:
        covered |= o['mask']
    img = np.clip(img, 0, 255).astype(np.uint8)
    objs = [dict(label=o['label'], mask=o['mask']) for o in objs]
    return img, objs, (clutter & ~covered) | dropped


def render_cls_image(rng, size, label, classes=CLS_CLASSES, colour_cue=0.0):
    """A classification image: one dominant shape of class ``label`` plus
    0-2 small distractor shapes of other classes on a textured background.
    Returns a uint8 BGR image."""
    h = w = size
    img = _background(rng, h, w)
    _clutter(rng, img, h, w)
    for _ in range(int(rng.integers(0, 3))):
        other = int(rng.integers(len(classes) - 1))
        other += other >= label
        r = rng.uniform(0.06, 0.12) * size
        poly = shape_polygon(classes[other], rng.uniform(r, w - r),
                             rng.uniform(r, h - r), r,
                             rng.uniform(0, 2 * np.pi), rng)
        _composite(img, poly, rng, _class_hue(rng, classes[other], colour_cue))
    r = rng.uniform(0.24, 0.42) * size
    jitter = 0.5 * size - r
    cx = 0.5 * size + rng.uniform(-1, 1) * min(jitter, 0.12 * size)
    cy = 0.5 * size + rng.uniform(-1, 1) * min(jitter, 0.12 * size)
    poly = shape_polygon(classes[label], cx, cy, r, rng.uniform(0, 2 * np.pi),
                         rng)
    _composite(img, poly, rng, _class_hue(rng, classes[label], colour_cue))
    return np.clip(img, 0, 255).astype(np.uint8)


# ---------------------------------------------------------------- writers
def _rng(seed, task, split, index):
    return np.random.default_rng(
        [seed, _TASK_IDS[task], _SPLIT_IDS[split], index])


def _imwrite(path, img, jpeg_quality=95):
    ext = osp.splitext(path)[1].lower()
    params = [cv2.IMWRITE_JPEG_QUALITY, jpeg_quality] \
        if ext in ('.jpg', '.jpeg') else []
    ok, buf = cv2.imencode('.jpg' if ext == '.jpeg' else ext, img, params)
    if not ok:
        raise IOError(f'could not encode {path}')
    with open(path, 'wb') as f:
        f.write(buf.tobytes())


def _write_json(path, obj):
    with open(path, 'w') as f:
        json.dump(obj, f, separators=(',', ':'))


def _mask_polygons(mask):
    """COCO polygons [[x0, y0, x1, y1, ...], ...] of a bool mask's outer
    contours (pixel-centre coordinates, >= 3 vertices each)."""
    contours, _ = cv2.findContours(
        mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    polys = []
    for c in contours:
        c = c.reshape(-1, 2)
        if len(c) >= 3:
            polys.append([float(v) for v in c.reshape(-1)])
    return polys


def _map(fn, items, workers):
    """``[fn(x) for x in items]``, in ``workers`` forked processes if > 1
    (each item seeds its own generator, so the result is the same)."""
    items = list(items)
    if workers <= 1 or len(items) < 2 * workers:
        return [fn(x) for x in items]
    import multiprocessing as mp
    try:
        ctx = mp.get_context('fork')
    except ValueError:  # no fork (Windows): stay sequential
        return [fn(x) for x in items]
    with ctx.Pool(workers) as pool:
        return pool.map(
            fn, items, chunksize=max(1,
                                     len(items) // (8 * workers)))


def _coco_item(args):
    """Render and write one COCO image; returns its annotations."""
    img_dir, split, i, seed, cfg = args
    rng = _rng(seed, 'det', split, i)
    img, objs, _ = render_scene(rng, cfg['size'], DET_CLASSES, cfg['objects'],
                                cfg['radius'], cfg['colour_cue'])
    _imwrite(osp.join(img_dir, f'{i:06d}.jpg'), img)
    anns = []
    for o in objs:
        m = o['mask']
        polys = _mask_polygons(m)
        if not polys:
            continue
        ys, xs = np.nonzero(m)
        x0, y0 = int(xs.min()), int(ys.min())
        bw, bh = int(xs.max()) - x0 + 1, int(ys.max()) - y0 + 1
        anns.append(
            dict(
                category_id=o['label'] + 1,
                segmentation=polys,
                area=float(m.sum()),
                bbox=[x0, y0, bw, bh],
                iscrowd=0))
    return anns


def _coco_split(root, split, n, seed, cfg, workers):
    img_dir = osp.join(root, split)
    os.makedirs(img_dir, exist_ok=True)
    per_image = _map(_coco_item, [(img_dir, split, i, seed, cfg)
                                  for i in range(n)], workers)
    images, anns = [], []
    for i, image_anns in enumerate(per_image):
        images.append(
            dict(
                id=i + 1,
                file_name=f'{i:06d}.jpg',
                width=cfg['size'],
                height=cfg['size']))
        for a in image_anns:
            anns.append(dict(id=len(anns) + 1, image_id=i + 1, **a))
    coco = dict(
        info=dict(
            description='mmsoft synthetic demo data (COCO instances)',
            version=str(GENERATOR_VERSION),
            year=2024,
            contributor='mmsoft tools/misc/make_demo_data.py'),
        licenses=[dict(id=1, name='CC0', url='')],
        images=images,
        annotations=anns,
        categories=[
            dict(id=k + 1, name=c, supercategory='shape')
            for k, c in enumerate(DET_CLASSES)
        ])
    _write_json(osp.join(root, 'annotations', f'instances_{split}.json'), coco)
    return dict(images=n, instances=len(anns))


def scene_options(size=160, objects=(2, 6), radius=(10, 38), colour_cue=0.0):
    """The scene options of :func:`make_coco` and :func:`make_ade`: image
    ``size``, the range of ``objects`` per image and of their ``radius``,
    ``colour_cue`` (see :func:`render_scene`)."""
    return dict(
        size=size,
        objects=tuple(objects),
        radius=tuple(radius),
        colour_cue=colour_cue)


def make_coco(root, num_train, num_val, seed=0, workers=1, **scene):
    """Write the COCO instances data set into ``root`` (see module doc);
    ``scene``: :func:`scene_options`."""
    cfg = scene_options(**scene)
    os.makedirs(osp.join(root, 'annotations'), exist_ok=True)
    return dict(
        train=_coco_split(root, 'train', num_train, seed, cfg, workers),
        val=_coco_split(root, 'val', num_val, seed, cfg, workers))


def _ade_item(args):
    """Render and write one ADE20K image + label PNG; returns the label
    histogram."""
    img_dir, ann_dir, folder, split, i, seed, cfg = args
    ade = [SEG_ADE_INDEX[c] for c in SEG_CLASSES]
    size = cfg['size']
    rng = _rng(seed, 'seg', split, i)
    img, objs, other = render_scene(rng, size, DET_CLASSES, cfg['objects'],
                                    cfg['radius'], cfg['colour_cue'])
    label = np.full((size, size), ade[0], np.uint8)  # wall
    label[other] = 0  # ADE20K "other" (ignored by the metric)
    for o in objs:  # masks are disjoint (visible parts)
        label[o['mask']] = ade[o['label'] + 1]
    name = f'ADE_{folder}_{i:08d}'
    _imwrite(osp.join(img_dir, name + '.jpg'), img)
    _imwrite(osp.join(ann_dir, name + '.png'), label)
    return np.bincount(label.ravel(), minlength=256)


def make_ade(root, num_train, num_val, seed=0, workers=1, **scene):
    """Write the ADE20K-layout data set into ``root`` (see module doc);
    ``scene``: :func:`scene_options`."""
    cfg = scene_options(**scene)
    stats = {}
    for split, folder, n in (('train', 'training', num_train),
                             ('val', 'validation', num_val)):
        img_dir = osp.join(root, 'images', folder)
        ann_dir = osp.join(root, 'annotations', folder)
        os.makedirs(img_dir, exist_ok=True)
        os.makedirs(ann_dir, exist_ok=True)
        hists = _map(_ade_item,
                     [(img_dir, ann_dir, folder, split, i, seed, cfg)
                      for i in range(n)], workers)
        counts = np.sum(hists, axis=0) if hists else np.zeros(256, np.int64)
        stats[split] = dict(
            images=n,
            pixels={
                'other': int(counts[0]),
                **{
                    c: int(counts[SEG_ADE_INDEX[c]])
                    for c in SEG_CLASSES
                }
            })
    return stats


def _cls_item(args):
    """Render and write one classification image; returns its line of the
    annotation file."""
    split_dir, split, i, seed, size, colour_cue = args
    label = i % len(CLS_CLASSES)
    rng = _rng(seed, 'cls', split, i)
    img = render_cls_image(rng, size, label, colour_cue=colour_cue)
    rel = f'{CLS_CLASSES[label]}/{CLS_CLASSES[label]}_{i:05d}.JPEG'
    _imwrite(osp.join(split_dir, rel), img)
    return f'{rel} {label}'


def make_imagenet(root,
                  num_train,
                  num_val,
                  seed=0,
                  size=64,
                  colour_cue=0.0,
                  workers=1):
    """Write the ImageNet-style data set into ``root`` (see module doc).
    Classes are balanced (index i has label i % K)."""
    os.makedirs(osp.join(root, 'meta'), exist_ok=True)
    with open(osp.join(root, 'meta', 'classes.txt'), 'w') as f:
        f.write('\n'.join(CLS_CLASSES) + '\n')
    stats = {}
    for split, n in (('train', num_train), ('val', num_val)):
        split_dir = osp.join(root, split)
        for c in CLS_CLASSES:
            os.makedirs(osp.join(split_dir, c), exist_ok=True)
        lines = _map(_cls_item, [(split_dir, split, i, seed, size, colour_cue)
                                 for i in range(n)], workers)
        with open(osp.join(root, 'meta', f'{split}.txt'), 'w') as f:
            f.write('\n'.join(lines) + '\n')
        stats[split] = dict(images=n)
    return stats


# ---------------------------------------------------------------- driver
_MAKERS = dict(
    det=('coco', make_coco),
    seg=('ade', make_ade),
    cls=('imagenet', make_imagenet))
MANIFEST = 'demo_data.json'


def dataset_paths(out):
    """Folders of the three data sets under ``out``."""
    return {
        task: osp.join(out, folder)
        for task, (folder, _) in _MAKERS.items()
    }


def _params(task, seed, cfg):
    classes = dict(det=DET_CLASSES, seg=SEG_CLASSES, cls=CLS_CLASSES)[task]
    return dict(
        generator_version=GENERATOR_VERSION,
        task=task,
        seed=seed,
        classes=list(classes),
        **{
            k: list(v) if isinstance(v, tuple) else v
            for k, v in cfg.items()
        })


def _up_to_date(folder, params):
    try:
        with open(osp.join(folder, MANIFEST)) as f:
            return json.load(f).get('params') == params
    except (OSError, ValueError):
        return False


class NotDemoDataError(Exception):
    """A folder the demo data would replace holds something else."""


def _check_ours(folder):
    """Refuse to replace ``folder`` unless it is missing, empty or marked
    as demo data (its :data:`MANIFEST`): never a user's real data set."""
    if not osp.lexists(folder):
        return
    if osp.isdir(folder) and not osp.islink(folder) and (
            not os.listdir(folder) or osp.isfile(osp.join(folder, MANIFEST))):
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
    """Generate the demo data sets under ``out`` (skip up-to-date ones).

    Args:
        out: root folder (e.g. ``data/demo``).
        seed: the global seed.
        tasks: any of 'det' (COCO), 'seg' (ADE20K), 'cls' (ImageNet).
        force: regenerate even if the manifest matches (never a folder
            that is not demo data: :class:`NotDemoDataError`).
        overrides: ``{task: {key: value}}`` over :data:`DEFAULTS`
            (``num_train``, ``num_val``, ``size``, ...).
        workers: processes that render in parallel (default: the CPU
            count, at most 4); the output does not depend on it.
        log: a print-like callable for progress (or None).

    Returns:
        dict: ``{task: dict(path=..., generated=bool, seconds=..., stats)}``.
    """
    log = log or (lambda *a, **k: None)
    overrides = overrides or {}
    if workers is None:
        workers = min(os.cpu_count() or 1, 4)
    for task in tasks:  # before anything is written
        _check_ours(osp.join(out, _MAKERS[task][0]))
    os.makedirs(out, exist_ok=True)
    report = {}
    for task in tasks:
        folder_name, maker = _MAKERS[task]
        cfg = dict(DEFAULTS[task], **overrides.get(task, {}))
        params = _params(task, seed, cfg)
        folder = osp.join(out, folder_name)
        if not force and _up_to_date(folder, params):
            with open(osp.join(folder, MANIFEST)) as f:
                stats = json.load(f).get('stats')
            log(f'{task}: {folder} is up to date, skipped')
            report[task] = dict(
                path=folder, generated=False, seconds=0.0, stats=stats)
            continue
        t0 = time.perf_counter()
        tmp = osp.join(out, f'.{folder_name}.tmp{os.getpid()}')
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
        try:
            stats = maker(tmp, seed=seed, workers=workers, **cfg)
            _write_json(
                osp.join(tmp, MANIFEST), dict(params=params, stats=stats))
            old = None
            if osp.exists(folder):
                old = osp.join(out, f'.{folder_name}.old{os.getpid()}')
                shutil.rmtree(old, ignore_errors=True)
                os.replace(folder, old)
            os.replace(tmp, folder)
            if old:
                shutil.rmtree(old, ignore_errors=True)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        dt = time.perf_counter() - t0
        log(f'{task}: wrote {folder} in {dt:.1f} s: '
            f'{json.dumps(stats)}')
        report[task] = dict(
            path=folder, generated=True, seconds=dt, stats=stats)
    return report
