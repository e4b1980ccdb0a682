"""tools/demo_synthetic.py, tools/misc/make_demo_data.py: deterministic,
cached, non-trivial scenes the codebases load."""
import hashlib
import json
import os
import os.path as osp
import runpy

import cv2
import numpy as np
import pytest
from conftest import ROOT

import demo_synthetic as S

TOOL = osp.join(ROOT, 'tools', 'misc', 'make_demo_data.py')
SMALL = dict(det=dict(num_train=6, num_val=3),
             seg=dict(num_train=6, num_val=3),
             cls=dict(num_train=10, num_val=5))  # yapf: disable


def _tree_hashes(root):
    return {osp.relpath(osp.join(d, f), root):
            hashlib.sha1(open(osp.join(d, f), 'rb').read()).hexdigest()
            for d, _, files in os.walk(root) for f in files}  # yapf: disable


@pytest.fixture(scope='module')
def demo_root(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('demo_data'))
    report = S.make_demo_data(root, overrides=SMALL, workers=1, log=None)
    assert all(r['generated'] for r in report.values())
    return root


def test_deterministic_and_cached(demo_root, tmp_path):
    """Same bytes on 1 or 2 workers; cached; seeded; no temporary folder."""
    other, msgs = str(tmp_path / 'again'), []
    S.make_demo_data(other, seed=0, overrides=SMALL, workers=2, log=None)
    ref = _tree_hashes(demo_root)
    assert ref == _tree_hashes(other) and len(ref) > 3 * (6 + 3)
    report = S.make_demo_data(other, seed=0, overrides=SMALL, log=msgs.append)
    assert not any(r['generated'] for r in report.values())
    assert all('up to date' in m for m in msgs)
    assert S.make_demo_data(other, seed=1, tasks=['det'], overrides=SMALL,
                            log=None)['det']['generated']  # yapf: disable
    img = 'coco/train/000000.jpg'
    assert _tree_hashes(other)[img] != ref[img]
    assert not [p for p in os.listdir(other) if p.startswith('.')]


def test_scenes_are_not_trivial():
    """Objects of every class, disjoint masks, clutter; every shape renders."""
    n_obj, classes = [], set()
    for i in range(20):
        img, objs, clutter = S.render_scene(
            np.random.default_rng([7, i]), 160, colour_cue=0.9)
        assert img.shape == (160, 160, 3) and img.dtype == np.uint8
        assert img.std() > 20 and all(o['mask'].sum() >= 16 for o in objs)
        n_obj.append(len(objs))
        classes |= {o['label'] for o in objs}
        total = sum(o['mask'].astype(int) for o in objs)
        assert np.max(total) <= 1 and not (clutter & (total > 0)).any()
    assert min(n_obj) >= 1 and max(n_obj) >= 4 and np.mean(n_obj) >= 2.5
    assert classes == set(range(len(S.DET_CLASSES)))
    rng = np.random.default_rng(0)
    for kind in S.CLS_CLASSES:
        poly = S.shape_polygon(kind, 32, 32, 20, 0.3, rng)
        assert poly.shape[1] == 2 and len(poly) >= 3
        assert np.linalg.norm(poly - 32, axis=1).max() <= 20 + 1e-6
    with pytest.raises(ValueError, match='unknown shape'):
        S.shape_polygon('hexagon', 0, 0, 1, 0, rng)


def test_coco_annotations(demo_root):
    """Boxes / polygons / areas consistent with pycocotools'."""
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO
    for split, n in (('train', 6), ('val', 3)):
        path = f'{demo_root}/coco/annotations/instances_{split}.json'
        with open(path) as f:
            coco = json.load(f)
        cats = [(c['id'], c['name']) for c in coco['categories']]
        assert cats == list(enumerate(S.DET_CLASSES, 1)) and len(cats) == 3
        assert len(coco['images']) == n and all(
            osp.isfile(f'{demo_root}/coco/{split}/{i["file_name"]}')
            for i in coco['images'])
        ids = [a['id'] for a in coco['annotations']]
        assert len(set(ids)) == len(ids) >= 2 * n
        api = COCO(path)
        for a in coco['annotations']:
            x, y, w, h = a['bbox']
            assert 0 <= x < x + w <= 160 and 0 <= y < y + h <= 160
            assert a['iscrowd'] == 0 and a['category_id'] in (1, 2, 3)
            assert all(len(p) >= 6 and len(p) % 2 == 0
                       for p in a['segmentation'])  # yapf: disable
            m = api.annToMask(a)
            # polygons run through pixel centres: slightly smaller masks
            assert 0 < 0.6 * a['area'] <= m.sum() <= 1.05 * a['area']
            box = mask_utils.toBbox(mask_utils.encode(np.asfortranarray(m)))
            np.testing.assert_allclose(box, a['bbox'], atol=2)
            np.testing.assert_allclose(box[:2], a['bbox'][:2], atol=1.5)


def test_codebase_datasets(demo_root):
    """mmseg's ADE20KDataset; mmpretrain's ImageNet and CustomDataset."""
    allowed = {0} | set(S.SEG_ADE_INDEX.values())
    for folder, n in (('training', 6), ('validation', 3)):
        ann_dir = osp.join(demo_root, 'ade', 'annotations', folder)
        assert len(os.listdir(ann_dir)) == n
        for name in os.listdir(ann_dir):
            lab = cv2.imread(osp.join(ann_dir, name), cv2.IMREAD_UNCHANGED)
            assert lab.dtype == np.uint8 and lab.shape == (160, 160)
            assert set(np.unique(lab).tolist()) <= allowed
            assert (lab == S.SEG_ADE_INDEX['wall']).mean() > 0.3
            assert osp.isfile(
                f'{demo_root}/ade/images/{folder}/{name[:-4]}.jpg')
    for cb in ('mmseg', 'mmpretrain'):
        pytest.importorskip(cb)
    from mmpretrain.datasets import CustomDataset, ImageNet
    from mmseg.datasets import ADE20KDataset
    from mmseg.utils import register_all_modules
    register_all_modules()
    ds = ADE20KDataset(
        data_root=osp.join(demo_root, 'ade'),
        data_prefix=dict(img_path='images/validation',
                         seg_map_path='annotations/validation'),
        metainfo=dict(classes=S.SEG_CLASSES),
        pipeline=[dict(type='LoadImageFromFile'),
                  dict(type='LoadAnnotations')])  # yapf: disable
    assert len(ds) == 3 and ds.reduce_zero_label
    assert ds.metainfo['classes'] == S.SEG_CLASSES
    seen = set()
    for sample in (ds[i] for i in range(len(ds))):
        seg = sample['gt_seg_map']
        raw = cv2.imread(sample['seg_map_path'], cv2.IMREAD_UNCHANGED)
        assert seg.shape == raw.shape == (160, 160)
        # ADE20K label k -> position of its name among the demo classes
        for k, name in enumerate(S.SEG_CLASSES):
            assert (seg[raw == S.SEG_ADE_INDEX[name]] == k).all()
        assert (seg[raw == 0] == 255).all()  # "other" is ignored
        seen |= set(np.unique(seg).tolist())
    assert seen <= {0, 1, 2, 3, 255} and len(seen - {255}) >= 3
    root, meta = osp.join(demo_root, 'imagenet'), dict(classes=S.CLS_CLASSES)
    for ds, n in ((ImageNet(root, split='train', metainfo=meta), 10),
                  (ImageNet(root, split='val', metainfo=meta), 5),
                  (CustomDataset(root, data_prefix='val', with_label=True),
                   5)):  # yapf: disable
        assert len(ds) == n and sorted(ds.CLASSES) == sorted(S.CLS_CLASSES)
        infos = [ds.get_data_info(i) for i in range(n)]
        assert {i['gt_label'] for i in infos} == set(range(len(ds.CLASSES)))
        for info in infos:
            assert ds.CLASSES[info['gt_label']] == \
                osp.basename(osp.dirname(info['img_path']))
            assert cv2.imread(info['img_path']).shape == (64, 64, 3)


def _tool(*argv):  # make_demo_data.py's main() through ``run_main``
    from mmsoft_tools.cli import run_main
    with pytest.raises(SystemExit) as exit:
        run_main(runpy.run_path(TOOL, run_name='tool')['main'], list(argv))
    return exit.value.code


def test_tool_cli(tmp_path, capsys):
    """The chosen data sets; the generator imports only numpy and OpenCV."""
    import ast
    imported = {(n.module if isinstance(n, ast.ImportFrom) else a.name)
                for n in ast.walk(ast.parse(open(S.__file__).read()))
                if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in n.names}  # yapf: disable
    assert {m.split('.')[0] for m in imported} <= {
        'itertools', 'json', 'os', 'shutil', 'time', 'multiprocessing', 'cv2',
        'numpy'}, imported  # yapf: disable
    out = tmp_path / 'cli'
    rc = _tool('--out', str(out), '--tasks', 'det', 'cls', '--num-train', '5',
               '--num-val', '2', '--workers', '1')
    std = capsys.readouterr()
    assert rc == 0, std.out + std.err
    assert '[data] det: wrote' in std.out
    assert osp.isfile(out / 'coco' / 'annotations' / 'instances_val.json')
    assert len(os.listdir(out / 'imagenet' / 'train')) == 5
    assert not osp.exists(out / 'ade')
    with open(out / 'coco' / S.MANIFEST) as f:
        params = json.load(f)['params']
    assert params['num_train'] == 5 and params['seed'] == 0


@pytest.mark.parametrize('kind,force', [('data', False), ('file', True),
                                        ('link', False)])
def test_a_users_data_is_never_replaced(tmp_path, force, kind, capsys):
    """One line, nothing written (``--force`` too); empty / marked: made."""
    out, real = tmp_path / 'data', tmp_path / 'real_coco'
    real.mkdir()
    (real / 'instances_train2017.json').write_text('{"mine": 1}')
    (out / 'imagenet').mkdir(parents=True)  # empty: may be filled
    if kind == 'data':
        (out / 'coco').mkdir()
        (out / 'coco' / 'mine.json').write_text('{"mine": 1}')
    elif kind == 'file':
        (out / 'coco').write_text('mine')
    else:
        (out / 'coco').symlink_to(real, target_is_directory=True)
    before = _tree_hashes(tmp_path)
    rc = _tool('--out', str(out), '--tasks', 'cls', 'det', '--num-train', '2',
               '--num-val', '1', '--workers', '1', *['--force'] * force)
    std = capsys.readouterr()
    err = std.err.strip().splitlines()
    assert rc == 1, std.out + std.err
    what = {
        'file': 'a file',
        'link': 'a link'
    }.get(kind, f'data not written by this generator (no {S.MANIFEST})')
    assert err == [f'error: {out / "coco"} exists and is {what}: the demo '
                   'data never replaces it (--force included); choose '
                   'another --out, e.g. data/demo']  # yapf: disable
    assert _tree_hashes(tmp_path) == before and os.listdir(out / 'imagenet') \
        == [] and sorted(os.listdir(out)) == ['coco', 'imagenet']
    if kind == 'data' and not force:  # its marked folder, an empty one
        few = dict(cls=dict(num_train=5, num_val=5))
        S.make_demo_data(str(out), tasks=['cls'], overrides=few, log=None)
        assert osp.isfile(out / 'imagenet' / S.MANIFEST)
        report = S.make_demo_data(
            str(out), seed=3, tasks=['cls'], overrides=few, log=None)
        assert report['cls']['generated']
