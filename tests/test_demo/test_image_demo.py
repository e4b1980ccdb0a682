"""``demo/image_demo.py`` and the docs' Python API on tiny random checkpoints
of the demo configs (``dataset_meta`` in ``meta``, as mmengine saves)."""
import json
import os
import os.path as osp
import re
import runpy

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT, random_model, tiny_arch

for _cb in ('mmdet', 'mmseg', 'mmpretrain'):
    pytest.importorskip(_cb)

DEMO = osp.join(ROOT, 'demo', 'image_demo.py')
DIMS = [16, 32, 64, 128]
ARCH = repr(tiny_arch(DIMS, [1, 1, 2, 2], sampling_ratios=[4, 2, 2, 1]))
TINY = {  # random det weights score ~0.01 (focal prior): keep every box
    'det': ('retinanet_soft_demo.py', f'neck=dict(in_channels={DIMS[1:]}), '
            'test_cfg=dict(score_thr=0.0, max_per_img=20)'),
    'seg': ('upernet_soft_demo.py', f'decode_head=dict(in_channels={DIMS}, '
            f'channels=16), auxiliary_head=dict(in_channels={DIMS[2]}, '
            'channels=16)'),
    'cls': ('soft_cls_demo.py', f'head=dict(in_channels={DIMS[3]})'),
}
TASK = dict(det='detection', seg='segmentation', cls='classification')


def _image(path, h=72, w=96, seed=0):
    img = np.random.RandomState(seed).randint(0, 256, (h, w, 3), np.uint8)
    cv2.circle(img, (w // 3, h // 2), h // 4, (20, 60, 220), -1)
    os.makedirs(osp.dirname(path), exist_ok=True)
    assert cv2.imwrite(str(path), img)
    return str(path)


def _main(argv):
    return runpy.run_path(DEMO, run_name='image_demo')['main'](argv)


@pytest.fixture(scope='module')
def models(tmp_path_factory):  # {task: (config, checkpoint, classes)}
    from mmengine.config import Config
    tmp, out = tmp_path_factory.mktemp('tiny_models'), {}
    for task, (base, body) in TINY.items():
        cfg, ckpt = (tmp / f'tiny_{task}.{e}' for e in ('py', 'pth'))
        cfg.write_text(f"_base_ = {osp.join(ROOT, 'configs', 'demo', base)!r}"
                       f'\nmodel = dict(backbone=dict(arch={ARCH}), {body})\n')
        torch.manual_seed(0)
        sd = random_model(cfg).state_dict()
        meta = dict(Config.fromfile(cfg).test_dataloader.dataset.metainfo)
        torch.save(dict(meta=dict(dataset_meta=meta, epoch=1, iter=1),
                        state_dict=sd), ckpt)  # yapf: disable
        out[task] = (str(cfg), str(ckpt), list(meta['classes']))
    return out


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('images')
    _image(tmp / 'folder' / 'a.jpg', seed=1)
    _image(tmp / 'folder' / 'sub' / 'b.png', h=64, w=80, seed=2)
    (tmp / 'folder' / 'notes.txt').write_text('not an image')
    return dict(single=_image(tmp / 'one.jpg'), folder=str(tmp / 'folder'))


_DET_REF = {}


def _det_reference(cfg_ckpt, img):  # mmdet's inference_detector
    from mmdet.apis import inference_detector, init_detector
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope('mmdet'):
        if cfg_ckpt not in _DET_REF:
            _DET_REF[cfg_ckpt] = init_detector(*cfg_ckpt, device='cpu')
        res = inference_detector(_DET_REF[cfg_ckpt], img)
    return res.pred_instances.numpy()


def _check_outputs(task, out_dir, img, name, classes, cfg_ckpt=None):
    h, w = cv2.imread(img).shape[:2]
    with open(osp.join(out_dir, 'preds', name + '.json')) as f:
        pred = json.load(f)
    assert pred['img_path'] == osp.abspath(img) and pred['task'] == TASK[task]
    assert pred['vis'].startswith('vis' + os.sep + name + '.')
    vis = cv2.imread(osp.join(out_dir, pred['vis']))
    assert vis.ndim == 3 and (task == 'cls' or vis.shape[:2] == (h, w))
    if task == 'det':  # inference_detector's boxes, same order, best first
        assert 0 < len(pred['scores']) <= 20  # score_thr 0: max_per_img
        assert pred['label_names'] == [classes[i] for i in pred['labels']]
        ref = _det_reference(cfg_ckpt, img)
        assert pred['scores'] == sorted(pred['scores'], reverse=True)
        assert pred['labels'] == ref.labels.tolist()
        np.testing.assert_allclose(pred['scores'], ref.scores, rtol=1e-4)
        np.testing.assert_allclose(pred['bboxes'], ref.bboxes, 1e-4, 1e-3)
    elif task == 'seg':
        assert pred['label_names'] == [classes[i] for i in pred['labels']]
        label_map = cv2.imread(
            osp.join(out_dir, pred['sem_seg']), cv2.IMREAD_UNCHANGED)
        assert label_map.shape == (h, w) == (pred['height'], pred['width'])
        assert sorted(np.unique(label_map).tolist()) == pred['labels']
        assert abs(sum(pred['pixel_fractions']) - 1) < 1e-6
    else:
        assert pred['pred_class'] == classes[pred['pred_label']]
        assert len(pred['pred_scores']) == len(classes)
        assert abs(sum(pred['pred_scores']) - 1) < 1e-4
        assert pred['pred_score'] == pytest.approx(max(pred['pred_scores']))


@pytest.mark.parametrize('task', ['det', 'seg', 'cls'])
def test_image_demo_image_and_folder(task, models, images, tmp_path, capsys):
    """A folder (recursive; other files skipped); no temporary files."""
    cfg, ckpt, classes = models[task]
    out = str(tmp_path / 'out')
    assert _main([images['folder'], cfg, ckpt, '--device', 'cpu', '--out-dir',
                  out, '--score-thr', '0.01']) == 0  # yapf: disable
    assert 'a.jpg -> ' in capsys.readouterr().out
    for rel, name in (('a.jpg', 'a'), ('sub/b.png', osp.join('sub', 'b'))):
        _check_outputs(task, out, osp.join(images['folder'], rel), name,
                       classes, (cfg, ckpt))
    found = [osp.relpath(osp.join(d, f), out) for d, dirs, fs in os.walk(out)
             for f in fs + dirs]  # yapf: disable
    assert sum(f.endswith('.json') for f in found) == 2
    assert not [f for f in found if '.' in f.split(os.sep)[0] or 'tmp' in f]


def test_image_demo_command_line(models, images, tmp_path, script_server):
    """From another folder; bad inputs: exit 2, one line, nothing written."""
    cfg, ckpt, classes = models['cls']
    out = str(tmp_path / 'cli_out')
    proc = script_server(DEMO, [images['single'], cfg, ckpt, '--out-dir', out],
                         cwd=tmp_path)  # yapf: disable
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_outputs('cls', out, images['single'], 'one', classes)
    bad, empty = tmp_path / 'bad.jpg', tmp_path / 'empty'
    (empty / 'readme.txt').parent.mkdir()
    bad.write_text('not a jpeg')
    (empty / 'readme.txt').write_text('x')
    img, no = images['single'], tmp_path / 'nope'
    cases = [([f'{no}.jpg', cfg, ckpt], f'input not found: {no}.jpg'),
             ([img, f'{no}.py', ckpt], f'config file not found: {no}.py'),
             ([img, cfg, f'{no}.pth'], f'checkpoint file not found: {no}.pth'),
             ([bad, cfg, ckpt], f'cannot read image: {bad}'),
             ([empty, cfg, ckpt], 'no images (.jpg, .jpeg')]
    for args, msg in cases:
        proc = script_server(DEMO, [*args, '--out-dir', tmp_path / 'o'])
        err = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(err) == 1, proc.stderr
        assert err[0].startswith(f'image_demo.py: error: {msg}'), err
    assert not osp.exists(tmp_path / 'o')


def test_readme_python_api_in_one_process(models, images, tmp_path,
                                          monkeypatch):
    """The inference page's three snippets in one interpreter."""
    from mmengine.registry import DefaultScope
    with open(osp.join(ROOT, 'docs/en/user_guides/inference.md')) as f:
        snippets = re.findall(r'```python\n(.*?)```', f.read(), flags=re.S)
    assert len(snippets) == 3
    monkeypatch.chdir(tmp_path)
    ns = {}
    api = dict(det='init_detector', seg='init_model',
               cls='ImageClassificationInferencer')  # yapf: disable
    with DefaultScope.overwrite_default_scope('mmdet'):  # restored after
        for task in ('det', 'seg', 'cls'):
            cfg, ckpt, classes = models[task]
            code = next(s for s in snippets if api[task] in s)
            for var, value in (('config', cfg), ('checkpoint', ckpt),
                               ('img', images['single'])):
                code, n = re.subn(
                    rf'^{var} = .*$', f'{var} = {value!r}', code, flags=re.M)
                assert n == 1, (var, code)
            code = code.replace('torch.rand(1, 3, 224, 224)',
                                'torch.rand(1, 3, 64, 64)')
            exec(compile(code, f'README-{task}', 'exec'), ns)
            if task == 'det':
                assert ns['result'].pred_instances.bboxes.shape[1] == 4
                assert list(ns['model'].dataset_meta['classes']) == classes
            elif task == 'seg':
                h, w = cv2.imread(images['single']).shape[:2]
                assert tuple(ns['label_map'].shape) == (h, w)
                assert cv2.imread(str(tmp_path / 'seg_vis.png')) is not None
            else:
                assert ns['result']['pred_class'] in classes
                assert ns['feats'][-1].shape == (1, DIMS[3])


def test_out_dir_inside_input_and_unreadable_images(models, tmp_path, capsys,
                                                    monkeypatch):
    """Outputs not inputs; bad images reported, exit 1; other model: exit 2."""
    cfg, ckpt, classes = models['cls']
    names = ('x.jpg', 'x.png', 'y.jpg', 'sub/c.jpg')
    for seed, name in enumerate(names):
        path = _image(tmp_path / 'in' / name, seed=seed)
        if name.startswith('x'):  # a camera's trailer
            with open(path, 'ab') as f:
                f.write(b'\0' * 70000 + b'TRAILER')
    whole = (tmp_path / 'in' / 'y.jpg').read_bytes()
    (tmp_path / 'in' / 'b.jpg').write_bytes(whole[:len(whole) // 2])
    (tmp_path / 'in' / 'd.png').write_bytes(b'')  # truncated, empty
    monkeypatch.chdir(tmp_path / 'in')
    for _ in range(2):
        assert _main(['.', cfg, ckpt, '--out-dir', 'out']) == 1
        std = capsys.readouterr()
        assert 'classification: 4 image(s)' in std.out
        err = std.err.strip().splitlines()
        assert err[0].startswith(
            'image_demo.py: skipped ./b.jpg: truncated JPEG'), err
        assert err[1:] == [
            'image_demo.py: skipped ./d.png: the file is empty (0 bytes)',
            'image_demo.py: error: 2 of 6 image(s) could not be read and '
            'were skipped: ./b.jpg, ./d.png'
        ]
    for sub in ('preds', 'vis'):
        assert sorted(
            osp.splitext(osp.relpath(osp.join(dp, f), 'out/' + sub))[0]
            for dp, _, files in os.walk('out/' + sub)
            for f in files) == ['sub/c', 'x.jpg', 'x.png', 'y']
    for name in names[:2]:
        _check_outputs('cls', 'out', str(tmp_path / 'in' / name), name,
                       classes)
    # INPUT is --out-dir: its vis / preds are not inputs, its images are
    os.link('y.jpg', 'out/z.jpg')
    listed = runpy.run_path(DEMO)['list_images']('out', 'out')
    assert listed == [('out/z.jpg', 'z')]
    # the checkpoint of another model: refused, nothing written
    assert _main(['y.jpg', models['det'][0], ckpt, '--out-dir', 'o']) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines()
           if 'image_demo.py: error' in ln]  # yapf: disable
    assert err[0].startswith(
        f'image_demo.py: error: checkpoint {ckpt} does not match the model '
        '(RetinaNet): '), err
    assert not osp.exists('o/preds')
