"""The synthetic demo data (``tools/mmsoft_tools/demo_synthetic.py``,
``tools/misc/make_demo_data.py``).

* deterministic (byte-identical for a seed, whatever the worker count),
  up-to-date data is skipped, a new seed changes everything;
* scenes: several objects of several classes, partly occluded but at least
  ``MIN_VISIBLE`` visible, disjoint visible masks;
* COCO instances: valid boxes / polygons / areas / iscrowd, consistent with
  pycocotools' rasterisation; loads through mmdet's ``CocoDataset``;
* ADE20K layout: ADE20K label values, loads through mmseg's
  ``ADE20KDataset`` (reduce_zero_label + label map to the 4 demo classes);
* ImageNet layout: loads through mmpretrain's ``ImageNet`` (annotation
  files) and ``CustomDataset`` (class folders);
* the command line tool; the generator needs no torch / OpenMMLab.
"""
import hashlib
import json
import os
import os.path as osp

import cv2
import numpy as np
import pytest
from conftest import ROOT, run_python

from mmsoft_tools import demo_synthetic as S

TOOL = osp.join(ROOT, 'tools', 'misc', 'make_demo_data.py')
SMALL = {t: dict(num_train=6, num_val=3) for t in ('det', 'seg', 'cls')}
SMALL['cls'] = dict(num_train=10, num_val=5)


def _tree_hashes(root):
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = osp.join(d, f)
            with open(p, 'rb') as fh:
                out[osp.relpath(p, root)] = hashlib.sha1(fh.read()).hexdigest()
    return out


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('demo_data'))
    report = S.make_demo_data(
        root, seed=0, overrides=SMALL, workers=1, log=None)
    assert all(r['generated'] for r in report.values())
    return root


# ---------------------------------------------------------------- generator
def test_deterministic_and_cached(demo_root, tmp_path):
    other = str(tmp_path / 'again')
    S.make_demo_data(other, seed=0, overrides=SMALL, workers=2, log=None)
    ref = _tree_hashes(demo_root)
    assert ref == _tree_hashes(other)
    assert len(ref) > 3 * (6 + 3)
    # up to date: nothing is rewritten
    msgs = []
    report = S.make_demo_data(other, seed=0, overrides=SMALL, log=msgs.append)
    assert not any(r['generated'] for r in report.values())
    assert all('up to date' in m for m in msgs)
    # another seed: regenerated, different images
    report = S.make_demo_data(
        other, seed=1, tasks=['det'], overrides=SMALL, log=None)
    assert report['det']['generated']
    new = _tree_hashes(other)
    assert new['coco/train/000000.jpg'] != ref['coco/train/000000.jpg']
    assert not [p for p in os.listdir(other) if p.startswith('.')], \
        'temporary folders left behind'


def test_scenes_are_not_trivial():
    n_obj, classes = [], set()
    for i in range(20):
        rng = np.random.default_rng([7, i])
        img, objs, clutter = S.render_scene(rng, 160, colour_cue=0.9)
        assert img.shape == (160, 160, 3) and img.dtype == np.uint8
        assert img.std() > 20  # textured, not flat
        n_obj.append(len(objs))
        classes |= {o['label'] for o in objs}
        total = np.zeros((160, 160), int)
        for o in objs:
            total += o['mask']
            assert o['mask'].sum() >= 16
        assert total.max() <= 1, 'visible masks must be disjoint'
        assert not (clutter & (total > 0)).any()
    assert min(n_obj) >= 1 and max(n_obj) >= 4 and np.mean(n_obj) >= 2.5
    assert classes == set(range(len(S.DET_CLASSES)))


def test_every_shape_renders():
    rng = np.random.default_rng(0)
    for kind in S.CLS_CLASSES:
        poly = S.shape_polygon(kind, 32, 32, 20, 0.3, rng)
        assert poly.shape[1] == 2 and len(poly) >= 3
        assert np.linalg.norm(poly - 32, axis=1).max() <= 20 + 1e-6
    with pytest.raises(ValueError, match='unknown shape'):
        S.shape_polygon('hexagon', 0, 0, 1, 0, rng)


# ---------------------------------------------------------------- COCO
def test_coco_annotations(demo_root):
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    for split, n in (('train', 6), ('val', 3)):
        path = osp.join(demo_root, 'coco', 'annotations',
                        f'instances_{split}.json')
        with open(path) as f:
            coco = json.load(f)
        assert [c['name'] for c in coco['categories']] == list(S.DET_CLASSES)
        assert [c['id'] for c in coco['categories']] == [1, 2, 3]
        assert len(coco['images']) == n
        for im in coco['images']:
            assert osp.isfile(
                osp.join(demo_root, 'coco', split, im['file_name']))
        ids = [a['id'] for a in coco['annotations']]
        assert len(set(ids)) == len(ids) >= 2 * n
        api = COCO(path)
        for a in coco['annotations']:
            x, y, w, h = a['bbox']
            assert w > 0 and h > 0 and x >= 0 and y >= 0
            assert x + w <= 160 and y + h <= 160
            assert a['iscrowd'] == 0 and a['category_id'] in (1, 2, 3)
            assert a['area'] > 0
            assert all(
                len(p) >= 6 and len(p) % 2 == 0 for p in a['segmentation'])
            m = api.annToMask(a)
            # polygons run through pixel centres: slightly smaller masks
            assert 0.6 * a['area'] <= m.sum() <= 1.05 * a['area']
            bx, by, bw, bh = mask_utils.toBbox(
                mask_utils.encode(np.asfortranarray(m)))
            assert abs(bx - x) <= 1.5 and abs(by - y) <= 1.5
            assert abs(bw - w) <= 2 and abs(bh - h) <= 2


def test_mmdet_coco_dataset(demo_root):
    pytest.importorskip('mmdet')
    from mmdet.datasets import CocoDataset
    from mmdet.utils import register_all_modules
    register_all_modules()
    ds = CocoDataset(
        data_root=osp.join(demo_root, 'coco'),
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        metainfo=dict(classes=S.DET_CLASSES),
        filter_cfg=dict(filter_empty_gt=True, min_size=4),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='PackDetInputs')
        ])
    assert len(ds) == 6
    with open(
            osp.join(demo_root, 'coco', 'annotations',
                     'instances_train.json')) as f:
        coco = json.load(f)
    labels = set()
    for i in range(len(ds)):
        sample = ds[i]
        gt = sample['data_samples'].gt_instances
        img_id = sample['data_samples'].img_id
        n_ann = sum(a['image_id'] == img_id for a in coco['annotations'])
        assert len(gt) == n_ann > 0
        assert sample['inputs'].shape == (3, 160, 160)
        assert gt.masks.masks.shape == (n_ann, 160, 160)
        labels |= set(gt.labels.tolist())
    assert labels <= {0, 1, 2} and len(labels) >= 2


# ---------------------------------------------------------------- ADE20K
def test_ade20k_label_values(demo_root):
    allowed = {0} | set(S.SEG_ADE_INDEX.values())
    for folder in ('training', 'validation'):
        ann_dir = osp.join(demo_root, 'ade', 'annotations', folder)
        names = sorted(os.listdir(ann_dir))
        assert len(names) == (6 if folder == 'training' else 3)
        for name in names:
            lab = cv2.imread(osp.join(ann_dir, name), cv2.IMREAD_UNCHANGED)
            assert lab.dtype == np.uint8 and lab.shape == (160, 160)
            assert set(np.unique(lab).tolist()) <= allowed
            assert (lab == S.SEG_ADE_INDEX['wall']).mean() > 0.3
            assert osp.isfile(
                osp.join(demo_root, 'ade', 'images', folder,
                         name[:-4] + '.jpg'))


def test_mmseg_ade20k_dataset(demo_root):
    pytest.importorskip('mmseg')
    from mmseg.datasets import ADE20KDataset
    from mmseg.utils import register_all_modules
    register_all_modules()
    ds = ADE20KDataset(
        data_root=osp.join(demo_root, 'ade'),
        data_prefix=dict(
            img_path='images/validation',
            seg_map_path='annotations/validation'),
        metainfo=dict(classes=S.SEG_CLASSES),
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations')
        ])
    assert len(ds) == 3
    assert ds.reduce_zero_label
    assert ds.metainfo['classes'] == S.SEG_CLASSES
    seen = set()
    for i in range(len(ds)):
        sample = ds[i]
        seg = sample['gt_seg_map']
        raw = cv2.imread(sample['seg_map_path'], cv2.IMREAD_UNCHANGED)
        assert seg.shape == raw.shape == (160, 160)
        # ADE20K label k -> position of its name among the demo classes
        for k, name in enumerate(S.SEG_CLASSES):
            assert (seg[raw == S.SEG_ADE_INDEX[name]] == k).all()
        assert (seg[raw == 0] == 255).all()  # "other" is ignored
        seen |= set(np.unique(seg).tolist())
    assert seen <= {0, 1, 2, 3, 255}
    assert len(seen - {255}) >= 3


# ---------------------------------------------------------------- ImageNet
def test_mmpretrain_datasets(demo_root):
    pytest.importorskip('mmpretrain')
    from mmpretrain.datasets import CustomDataset, ImageNet
    root = osp.join(demo_root, 'imagenet')
    for split, n in (('train', 10), ('val', 5)):
        ds = ImageNet(
            data_root=root, split=split, metainfo=dict(classes=S.CLS_CLASSES))
        assert len(ds) == n
        assert ds.CLASSES == S.CLS_CLASSES
        for i in range(n):
            info = ds.get_data_info(i)
            cls = osp.basename(osp.dirname(info['img_path']))
            assert S.CLS_CLASSES[info['gt_label']] == cls
            assert osp.isfile(info['img_path'])
        assert {ds.get_data_info(i)['gt_label'] for i in range(n)} == \
            set(range(len(S.CLS_CLASSES)))
    # the class-folder layout alone (no annotation file)
    ds = CustomDataset(data_root=root, data_prefix='val', with_label=True)
    assert len(ds) == 5
    assert sorted(ds.CLASSES) == sorted(S.CLS_CLASSES)
    for i in range(len(ds)):
        info = ds.get_data_info(i)
        assert ds.CLASSES[info['gt_label']] == \
            osp.basename(osp.dirname(info['img_path']))
    img = cv2.imread(info['img_path'])
    assert img.shape == (64, 64, 3)


# ---------------------------------------------------------------- the tool
def test_tool_cli(tmp_path):
    """tools/misc/make_demo_data.py writes the chosen data sets; the
    generator module itself needs only numpy and OpenCV (its imports)."""
    import ast
    tree = ast.parse(open(S.__file__).read())
    imported = {
        a.name.split('.')[0]
        for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    } | {
        n.module.split('.')[0]
        for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
    }
    assert imported <= {
        'itertools', 'json', 'os', 'shutil', 'time', 'multiprocessing', 'cv2',
        'numpy'
    }, imported
    out = tmp_path / 'cli'
    code = (
        'import runpy\n'
        f'ns = runpy.run_path({TOOL!r}, run_name="tool")\n'
        f'rc = ns["main"](["--out", {str(out)!r}, "--tasks", "det", "cls", '
        '"--num-train", "5", "--num-val", "2", "--workers", "1"])\n'
        'assert rc == 0\n')
    proc = run_python(code, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert '[data] det: wrote' in proc.stdout
    assert osp.isfile(out / 'coco' / 'annotations' / 'instances_val.json')
    assert len(os.listdir(out / 'imagenet' / 'train')) == 5
    assert not osp.exists(out / 'ade')
    with open(out / 'coco' / S.MANIFEST) as f:
        manifest = json.load(f)
    assert manifest['params']['num_train'] == 5
    assert manifest['params']['seed'] == 0


@pytest.mark.parametrize('force', [False, True])
@pytest.mark.parametrize('kind', ['data', 'file', 'link'])
def test_a_users_data_is_never_replaced(tmp_path, force, kind):
    """``make_demo_data.py --out data`` in a project whose ``data/coco``
    holds the user's data set (or is a file, or a link to one) stops with
    one line before writing anything, ``--force`` included; an empty folder
    or one marked as demo data is (re)generated."""
    out = tmp_path / 'data'
    real = tmp_path / 'real_coco'
    real.mkdir()
    (real / 'instances_train2017.json').write_text('{"mine": 1}')
    out.mkdir()
    if kind == 'data':
        (out / 'coco').mkdir()
        (out / 'coco' / 'mine.json').write_text('{"mine": 1}')
    elif kind == 'file':
        (out / 'coco').write_text('mine')
    else:
        (out / 'coco').symlink_to(real, target_is_directory=True)
    (out / 'imagenet').mkdir()  # empty: may be filled
    before = _tree_hashes(tmp_path)
    argv = [
        '--out',
        str(out), '--tasks', 'cls', 'det', '--num-train', '2', '--num-val',
        '1', '--workers', '1'
    ] + (['--force'] if force else [])
    proc = run_python(
        'import runpy, sys\n'
        f'ns = runpy.run_path({TOOL!r}, run_name="tool")\n'
        f'from mmsoft_tools.cli import run_main\n'
        f'run_main(ns["main"], {argv!r})\n',
        timeout=300,
        cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f'error: {out / "coco"} exists and is '), proc.stderr
    assert 'choose another --out' in err[0]
    assert _tree_hashes(tmp_path) == before
    assert sorted(os.listdir(out)) == ['coco', 'imagenet']
    assert os.listdir(out / 'imagenet') == []
    # its own marked folder and an empty one are regenerated
    if kind == 'data':
        S.make_demo_data(str(out), tasks=['cls'], overrides=SMALL, log=None)
        assert osp.isfile(out / 'imagenet' / S.MANIFEST)
        report = S.make_demo_data(
            str(out), seed=3, tasks=['cls'], overrides=SMALL, log=None)
        assert report['cls']['generated']
