"""Inference: ``demo/image_demo.py`` and the README's Python API.

For each codebase (mmdet RetinaNet, mmseg UperNet, mmpretrain classifier)
a tiny SOFT variant of the demo config (``configs/demo``) gets a random
checkpoint saved as mmengine saves one (``state_dict`` + ``meta`` with the
``dataset_meta``); then

* ``demo/image_demo.py`` runs on a generated image and on a folder (with a
  sub-folder) and writes valid visualisations and json predictions with the
  task's keys, atomically (no temporary files left);
* the README's "Inference" snippets run as written, with only the config /
  checkpoint / image names replaced;
* bad input gives one error line.
"""
import json
import os
import os.path as osp
import re
import runpy
import sys

import cv2
import numpy as np
import pytest
import torch
from conftest import ROOT, random_model, run, tiny_arch

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
pytest.importorskip('mmpretrain')

DEMO = osp.join(ROOT, 'demo', 'image_demo.py')
DIMS = [16, 32, 64, 128]
ARCH = repr(tiny_arch(DIMS, [1, 1, 2, 2], sampling_ratios=[4, 2, 2, 1]))

TINY = {
    'det': ('retinanet_soft_demo.py', f"""
# random weights score ~0.01 (focal-loss prior): keep every box
model = dict(backbone=dict(arch={ARCH}),
             neck=dict(in_channels={DIMS[1:]}),
             test_cfg=dict(score_thr=0.0, max_per_img=20))
"""),
    'seg': ('upernet_soft_demo.py', f"""
model = dict(backbone=dict(arch={ARCH}),
             decode_head=dict(in_channels={DIMS}, channels=16),
             auxiliary_head=dict(in_channels={DIMS[2]}, channels=16))
"""),
    'cls': ('soft_cls_demo.py', f"""
model = dict(backbone=dict(arch={ARCH}),
             head=dict(in_channels={DIMS[3]}))
"""),
}


def _image(path, h=72, w=96, seed=0):
    rng = np.random.RandomState(seed)
    img = rng.randint(0, 256, (h, w, 3), dtype=np.uint8)
    cv2.circle(img, (w // 3, h // 2), h // 4, (20, 60, 220), -1)
    os.makedirs(osp.dirname(path), exist_ok=True)
    assert cv2.imwrite(path, img)
    return path


@pytest.fixture(scope='module')
def models(tmp_path_factory):
    """{task: (config path, checkpoint path, classes)}."""
    from mmengine.config import Config

    import mmsoft  # noqa: F401
    tmp = tmp_path_factory.mktemp('tiny_models')
    out = {}
    for task, (base, body) in TINY.items():
        cfg_path = tmp / f'tiny_{task}.py'
        cfg_path.write_text(
            f"_base_ = {osp.join(ROOT, 'configs', 'demo', base)!r}\n" + body)
        cfg = Config.fromfile(str(cfg_path))
        torch.manual_seed(0)
        model = random_model(cfg)
        meta = dict(cfg.test_dataloader.dataset.metainfo)
        classes = list(meta['classes'])
        ckpt = tmp / f'tiny_{task}.pth'
        torch.save(
            dict(
                meta=dict(dataset_meta=meta, epoch=1, iter=1),
                state_dict=model.state_dict()), str(ckpt))
        out[task] = (str(cfg_path), str(ckpt), classes)
    return out


@pytest.fixture(scope='module')
def images(tmp_path_factory):
    tmp = tmp_path_factory.mktemp('images')
    single = _image(str(tmp / 'one.jpg'))
    folder = tmp / 'folder'
    _image(str(folder / 'a.jpg'), seed=1)
    _image(str(folder / 'sub' / 'b.png'), h=64, w=80, seed=2)
    (folder / 'notes.txt').write_text('not an image')
    return dict(single=single, folder=str(folder))


_DET_REF = {}


def _det_reference(cfg_ckpt, img):
    """``pred_instances`` of ``mmdet.apis.inference_detector`` (the model
    of the config + checkpoint ``cfg_ckpt``) on ``img``."""
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
    assert pred['img_path'] == osp.abspath(img)
    assert pred['task'] == {
        'det': 'detection',
        'seg': 'segmentation',
        'cls': 'classification'
    }[task]
    vis = cv2.imread(osp.join(out_dir, pred['vis']))
    assert vis is not None and vis.ndim == 3
    assert pred['vis'].startswith('vis' + os.sep + name + '.')
    if task == 'det':
        assert vis.shape[:2] == (h, w)
        n = len(pred['scores'])
        assert 0 < n <= 20  # score_thr 0: every box up to max_per_img
        assert len(pred['bboxes']) == len(pred['labels']) == n
        assert all(len(b) == 4 for b in pred['bboxes'])
        assert pred['label_names'] == [classes[i] for i in pred['labels']]
        # the model's boxes (mmdet.apis.inference_detector, not the demo's
        # DetInferencer) on the same image, same order, best first
        ref = _det_reference(cfg_ckpt, img)
        assert pred['scores'] == sorted(pred['scores'], reverse=True)
        assert pred['labels'] == ref.labels.tolist()
        np.testing.assert_allclose(pred['scores'], ref.scores, rtol=1e-4)
        np.testing.assert_allclose(
            pred['bboxes'], ref.bboxes, rtol=1e-4, atol=1e-3)
    elif task == 'seg':
        assert vis.shape[:2] == (h, w)
        label_map = cv2.imread(
            osp.join(out_dir, pred['sem_seg']), cv2.IMREAD_UNCHANGED)
        assert label_map.shape == (h, w)
        assert sorted(np.unique(label_map).tolist()) == pred['labels']
        assert pred['label_names'] == [classes[i] for i in pred['labels']]
        assert abs(sum(pred['pixel_fractions']) - 1) < 1e-6
        assert (pred['height'], pred['width']) == (h, w)
    else:
        assert 0 <= pred['pred_label'] < len(classes)
        assert pred['pred_class'] == classes[pred['pred_label']]
        assert len(pred['pred_scores']) == len(classes)
        assert abs(sum(pred['pred_scores']) - 1) < 1e-4
        assert pred['pred_score'] == pytest.approx(max(pred['pred_scores']))


def _no_temp_files(out_dir):
    left = [
        osp.join(d, f) for d, dirs, files in os.walk(out_dir)
        for f in files + dirs if f.startswith('.') or 'tmp' in f
    ]
    assert not left, left


@pytest.mark.parametrize('task', ['det', 'seg', 'cls'])
def test_image_demo_image_and_folder(task, models, images, tmp_path, capsys):
    cfg, ckpt, classes = models[task]
    main = runpy.run_path(DEMO, run_name='image_demo')['main']
    out = str(tmp_path / 'out')
    assert main([
        images['single'], cfg, ckpt, '--out-dir', out, '--device', 'cpu',
        '--score-thr', '0.01'
    ]) == 0
    _check_outputs(task, out, images['single'], 'one', classes, (cfg, ckpt))
    assert 'one.jpg -> ' in capsys.readouterr().out
    # a folder (recursive; other files skipped)
    out2 = str(tmp_path / 'out2')
    assert main(
        [images['folder'], cfg, ckpt, '--out-dir', out2, '--device',
         'cpu']) == 0
    _check_outputs(task, out2, osp.join(images['folder'], 'a.jpg'), 'a',
                   classes, (cfg, ckpt))
    _check_outputs(task, out2, osp.join(images['folder'], 'sub', 'b.png'),
                   osp.join('sub', 'b'), classes, (cfg, ckpt))
    n_json = sum(
        f.endswith('.json') for _, _, fs in os.walk(osp.join(out2, 'preds'))
        for f in fs)
    assert n_json == 2
    _no_temp_files(out)
    _no_temp_files(out2)


def test_image_demo_command_line(models, images, tmp_path):
    """The script as a user runs it, from another directory."""
    cfg, ckpt, classes = models['det']
    out = str(tmp_path / 'cli_out')
    proc = run([
        sys.executable, DEMO, images['single'], cfg, ckpt, '--out-dir', out,
        '--device', 'cpu'
    ],
               cwd=tmp_path,
               timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _check_outputs('det', out, images['single'], 'one', classes, (cfg, ckpt))


def test_image_demo_errors(models, images, tmp_path, script_server):
    """Each bad input: exit code 2, one line on stderr. The first case in a
    fresh interpreter, the others forked from conftest's script server
    (the same script run, without the imports' cost each time)."""
    cfg, ckpt, _ = models['cls']
    bad = tmp_path / 'bad.jpg'
    bad.write_text('not a jpeg')
    empty = tmp_path / 'empty'
    empty.mkdir()
    (empty / 'readme.txt').write_text('x')
    cases = [
        ([str(tmp_path / 'nope.jpg'), cfg,
          ckpt], f'input not found: {tmp_path / "nope.jpg"}'),
        ([images['single'], str(tmp_path / 'nope.py'),
          ckpt], f'config file not found: {tmp_path / "nope.py"}'),
        ([images['single'], cfg,
          str(tmp_path / 'nope.pth')],
         f'checkpoint file not found: {tmp_path / "nope.pth"}'),
        ([str(bad), cfg, ckpt], f'cannot read image: {bad}'),
        ([str(empty), cfg, ckpt], 'no images (.jpg, .jpeg'),
    ]
    for i, (args, msg) in enumerate(cases):
        argv = [*args, '--out-dir', str(tmp_path / 'o')]
        if i == 0:
            proc = run([sys.executable, DEMO, *argv], timeout=120)
        else:
            proc = script_server(DEMO, argv, timeout=120)
        assert proc.returncode == 2, proc.stderr
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1, proc.stderr
        assert err[0].startswith(f'image_demo.py: error: {msg}'), err
    assert not osp.exists(tmp_path / 'o')  # nothing written


def _readme_snippets():
    # the documentation page of the inference APIs (docs/en)
    with open(osp.join(ROOT, 'docs', 'en', 'user_guides',
                       'inference.md')) as f:
        section = f.read()
    return re.findall(r'```python\n(.*?)```', section, flags=re.S)


def _readme_code(task, models, images):
    """The README snippet of ``task`` with only the config / checkpoint /
    image names replaced (and the tiny classifier's input size)."""
    snippets = _readme_snippets()
    assert len(snippets) == 3
    code = next(
        s for s in snippets if {
            'det': 'init_detector',
            'seg': 'init_model',
            'cls': 'ImageClassificationInferencer'
        }[task] in s)
    cfg, ckpt, classes = models[task]
    for var, value in (('config', cfg), ('checkpoint', ckpt),
                       ('img', images['single'])):
        code, n = re.subn(
            rf'^{var} = .*$', f'{var} = {value!r}', code, flags=re.M)
        assert n == 1, (var, code)
    if task == 'cls':  # the snippet's 224 x 224 input; the tiny model: 64
        code = code.replace('torch.rand(1, 3, 224, 224)',
                            'torch.rand(1, 3, 64, 64)')
    return code


def test_readme_python_api_in_one_process(models, images, tmp_path,
                                          monkeypatch):
    """The three README snippets one after the other in one interpreter,
    as in a notebook, each checked after it ran: mmpretrain's inferencer
    builds its pipeline in the *current* default scope, which mmdet's /
    mmseg's APIs leave at theirs ("ResizeEdge is not in the
    mmseg::transform registry") unless the snippet selects mmpretrain's
    scope itself."""
    from mmengine.registry import DefaultScope
    monkeypatch.chdir(tmp_path)
    ns = {}
    # the scope state of this process is restored afterwards
    with DefaultScope.overwrite_default_scope('mmdet'):
        for task in ('det', 'seg', 'cls'):
            code = _readme_code(task, models, images)
            exec(compile(code, f'README-{task}', 'exec'), ns)
            classes = models[task][2]
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


def test_same_name_other_extension_both_kept(models, tmp_path, capsys):
    """Issue 27, item 5: x.jpg and x.png reported "2 image(s)" and wrote
    one result (the other was overwritten)."""
    cfg, ckpt, classes = models['cls']
    folder = tmp_path / 'in'
    _image(str(folder / 'x.jpg'), seed=1)
    _image(str(folder / 'x.png'), seed=2)
    _image(str(folder / 'y.jpg'), seed=3)
    main = runpy.run_path(DEMO, run_name='image_demo')['main']
    out = str(tmp_path / 'out')
    assert main([str(folder), cfg, ckpt, '--out-dir', out]) == 0
    assert sorted(os.listdir(osp.join(
        out, 'preds'))) == ['x.jpg.json', 'x.png.json', 'y.json']
    assert len(os.listdir(osp.join(out, 'vis'))) == 3
    for name in ('x.jpg', 'x.png'):
        _check_outputs('cls', out, str(folder / name), name, classes)
    assert 'classification: 3 image(s)' in capsys.readouterr().out


@pytest.mark.parametrize('out', ['out', '.'])
def test_out_dir_inside_input_is_not_input(models, tmp_path, capsys,
                                           monkeypatch, out):
    """Issue 36 (5): ``--out-dir`` inside INPUT (also INPUT ``.`` with the
    default ``outputs/``): the second run took its own outputs as inputs
    (6 images for 3) and wrote ``out/vis/out/vis/...``."""
    cfg, ckpt, _ = models['cls']
    folder = tmp_path / 'in'
    for i, name in enumerate(('a.jpg', 'b.png', 'sub/c.jpg')):
        _image(str(folder / name), seed=i)
    monkeypatch.chdir(folder)
    main = runpy.run_path(DEMO, run_name='image_demo')['main']
    for _ in range(2):
        assert main(['.', cfg, ckpt, '--out-dir', out]) == 0
        assert 'classification: 3 image(s)' in capsys.readouterr().out
    vis = sorted(
        osp.relpath(osp.join(d, f), osp.join(out, 'vis'))
        for d, _, files in os.walk(osp.join(out, 'vis')) for f in files)
    assert [osp.splitext(v)[0] for v in vis] == ['a', 'b', 'sub/c']


def test_unreadable_images_in_folder_are_skipped(models, tmp_path, capsys):
    """Issue 27, item 7: one truncated JPEG in a folder aborted the rest;
    now each bad image is reported, the others are processed, and the
    exit code is 1 at the end."""
    cfg, ckpt, classes = models['cls']
    folder = tmp_path / 'in'
    good = _image(str(folder / 'a.jpg'), seed=1)
    _image(str(folder / 'c.jpg'), seed=2)
    whole = open(good, 'rb').read()
    (folder / 'b.jpg').write_bytes(whole[:len(whole) // 2])  # truncated
    (folder / 'd.png').write_bytes(b'')  # empty
    main = runpy.run_path(DEMO, run_name='image_demo')['main']
    out = str(tmp_path / 'out')
    assert main([str(folder), cfg, ckpt, '--out-dir', out]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    b, d = str(folder / 'b.jpg'), str(folder / 'd.png')
    assert err[0].startswith(f'image_demo.py: skipped {b}: truncated JPEG')
    assert err[1] == f'image_demo.py: skipped {d}: the file is empty ' \
        '(0 bytes)'
    assert err[2] == ('image_demo.py: error: 2 of 4 image(s) could not be '
                      f'read and were skipped: {b}, {d}')
    assert sorted(os.listdir(osp.join(out, 'preds'))) == ['a.json', 'c.json']


def test_images_with_bytes_after_their_end_are_read(models, tmp_path, capsys):
    """Issue 52, item 5: a valid JPEG / PNG with bytes after its end
    marker (a camera's trailer, beyond the data check's tail window; OpenCV
    decodes it) was skipped as truncated; image_demo.py shares the data
    check's reader and predicts both."""
    cfg, ckpt, _ = models['cls']
    folder = tmp_path / 'in'
    for name, seed in (('a.jpg', 1), ('b.png', 2)):
        path = _image(str(folder / name), seed=seed)
        data = open(path, 'rb').read() + b'\0' * 70000 + b'TRAILER'
        open(path, 'wb').write(data)
        assert cv2.imdecode(np.frombuffer(data, np.uint8), 1) is not None
    main = runpy.run_path(DEMO, run_name='image_demo')['main']
    out = str(tmp_path / 'out')
    assert main([str(folder), cfg, ckpt, '--out-dir', out]) == 0
    assert 'skipped' not in capsys.readouterr().err
    assert sorted(os.listdir(osp.join(out, 'preds'))) == ['a.json', 'b.json']


def test_checkpoint_of_another_model_is_refused(models, images, tmp_path,
                                                capsys):
    """Strict inference: a classifier checkpoint under the detector config
    used to give random-weight boxes after mmengine's WARNING. (In this
    process: the script from another directory is
    test_image_demo_command_line.)"""
    cfg, _, _ = models['det']
    _, cls_ckpt, _ = models['cls']
    main = runpy.run_path(DEMO, run_name='image_demo')['main']
    rc = main(
        [images['single'], cfg, cls_ckpt, '--out-dir',
         str(tmp_path / 'o')])
    stderr = capsys.readouterr().err
    assert rc == 2, stderr[-2000:]
    err = stderr.strip().splitlines()
    first = [i for i, ln in enumerate(err) if 'image_demo.py: error' in ln]
    assert first, stderr[-2000:]
    assert err[first[0]].startswith(
        f'image_demo.py: error: checkpoint {cls_ckpt} does not match the '
        'model (RetinaNet): '), err
    assert not osp.exists(tmp_path / 'o' / 'preds')
