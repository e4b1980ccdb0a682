"""ONNX export (tools/deployment/pytorch2onnx.py, deploy.py): H != W inputs
of each task family exported, onnxruntime parity with the normal forward (so
the plain-op export path equals it; no eigh: test_chain.py's ONNX test; its
functions: test_pinv.py, test_soft_attention.py); one error line for what
cannot be exported."""
import copy
import os
import os.path as osp

import numpy as np
import pytest
import torch
from conftest import CONFIGS, ROOT, load_module, tiny_arch
from mmengine.config import Config
from mmengine.registry import DefaultScope

pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')
pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
pytest.importorskip('mmpretrain')

import mmsoft  # noqa: E402,F401
from deployment import deploy  # noqa: E402
from mmsoft_tools import launch  # noqa: E402

DEMO = osp.join(ROOT, 'configs', 'demo')
TINY = tiny_arch([16, 32, 64, 64], [1, 2, 2, 2], sampling_ratios=[4, 2, 2, 1])


def _tool():
    return load_module(
        osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'),
        'pytorch2onnx')


def _error_line(capsys, argv):
    rc = _tool().main(argv)
    err = without_logging_errors(capsys.readouterr().err)
    assert rc == 2
    # the tool's whole stderr: one error line
    assert len(err) == 1 and err[0].startswith('error: '), err
    return err[0]


def without_logging_errors(text):
    """``text``'s lines less :mod:`logging`'s reports of a failed emit (an
    earlier test's logger may hold a closed captured stream)."""
    lines, inside = [], False
    for ln in text.strip().splitlines():
        if ln == '--- Logging error ---':
            inside = True
        elif inside and ln.startswith('Arguments: '):
            inside = False
        elif not inside:
            lines.append(ln)
    assert not inside, text  # a report is complete
    return lines


CLS = '{demo}/soft_cls_demo.py none --shape 64 64 --out {tmp}/x.onnx '
ATTN = CLS + '--cfg-options model.backbone.attn_cfg.'


@pytest.mark.parametrize('args, parts', [
    (ATTN + 'nr_method=spectral',
     ["nr_method='spectral'", 'model.backbone.attn_cfg.nr_method=auto']),
    (ATTN + 'max_landmarks=7', ['max_landmarks', '--dynamo']),
    (ATTN + 'landmark_hw=[2,2]', ['landmark_hw=(2, 2)', '--dynamo']),
    ('{demo}/retinanet_soft_demo.py {tmp}/cls.pth --shape 160 160 --out '
     '{tmp}/x.onnx', [
         'does not match the model (RetinaNet)', 'missing from the checkpoint',
         '--partial-load'
     ]),
    ('{demo}/soft_cls_demo.py {tmp}/nope.pth --shape 64 64',
     ['does not exist']),
    ('{demo}/retinanet_soft_demo.py none --shape 150 160 --out {tmp}/x.onnx',
     ['--shape 160 160']),
    ('{demo}/soft_cls_demo.py none --shape 64 64 --dynamic',
     ['dynamic input shapes are not supported']),
])
def test_error_line(tmp_path, capsys, args, parts):
    """What cannot be exported: one line naming it, nothing written."""
    if 'cls.pth' in args:  # the classifier's weights (they load exactly)
        cls = f'{DEMO}/soft_cls_demo.py'
        sd = deploy.build_model(cls, None)[0].state_dict()
        torch.save({'state_dict': sd}, tmp_path / 'cls.pth')
        loaded = deploy.build_model(cls, str(tmp_path / 'cls.pth'))[0]
        assert all(
            torch.equal(loaded.state_dict()[k], v) for k, v in sd.items())
    line = _error_line(
        capsys, [a.format(demo=DEMO, tmp=tmp_path) for a in args.split()])
    assert all(p in line for p in parts), (line, parts)
    assert not (tmp_path / 'x.onnx').exists()


@pytest.fixture(scope='module')
def cls_wrapper():
    """The demo classifier's export wrapper at 64 x 64."""
    model, scope, _ = deploy.build_model(
        osp.join(DEMO, 'soft_cls_demo.py'), None)
    return deploy.ExportWrapper(model, scope, (64, 64))


def test_matmul_adaptive_pool_equals_torch():
    x = torch.randn(2, 3, 16, 11)
    for size in [(1, 1), (3, 3), (6, 6), (5, 2)]:
        ref = torch.nn.AdaptiveAvgPool2d(size)(x)
        out = deploy.MatmulAdaptiveAvgPool2d(size)(x)
        torch.testing.assert_close(out, ref)


def test_error_is_all_the_output_with_random_weights(tmp_path, script_server):
    """``CHECKPOINT none``: no parameter-initialisation log (~700 lines)."""
    proc = script_server(
        osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'), [
            osp.join(DEMO, 'soft_cls_demo.py'), 'none', '--shape', '64', '64',
            '--out', tmp_path / 'x.onnx', '--cfg-options',
            'model.backbone.attn_cfg.nr_method=spectral'
        ], tmp_path)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, out
    assert out[-1].startswith('error: ') and 'nr_method' in out[-1]
    assert len(out) <= 3, '\n'.join(out[:20])


def test_out_directory_and_opset_refused_up_front(tmp_path, capsys,
                                                  monkeypatch):
    """Issue 27: --out a directory, --opset 5: refused before the model."""
    built = []
    monkeypatch.setattr(deploy, 'build_model',
                        lambda *a, **k: built.append(a) or 1 / 0)
    cfg = osp.join(DEMO, 'soft_cls_demo.py')
    line = _error_line(
        capsys, [cfg, 'none', '--shape', '64', '64', '--out',
                 str(tmp_path)])
    assert line == (f'error: --out {tmp_path} is a directory; give a file '
                    f'name, e.g. --out '
                    f'{osp.join(str(tmp_path), "soft_cls_demo_64x64.onnx")}')
    lo, hi = deploy.opset_range()
    assert lo == deploy.MIN_OPSET and hi >= deploy.DEFAULT_OPSET
    for opset in (5, hi + 1):
        line = _error_line(
            capsys,
            [cfg, 'none', '--shape', '64', '64', '--opset',
             str(opset)])
        assert line == (f'error: --opset {opset} is not supported: SOFT '
                        f'exports with opsets {lo} to {hi}; the default is '
                        f'17')
    assert not built and os.listdir(tmp_path) == []


def test_min_opset_wrong_shape_and_dynamo(tmp_path, monkeypatch, cls_wrapper):
    """MIN_OPSET - 1 fails; another shape, --dynamo on torch < 2.5: refused."""
    out = str(tmp_path / 'a.onnx')
    deploy.export_onnx(cls_wrapper, out, deploy.MIN_OPSET)
    with pytest.raises(deploy.ExportError, match='--shape 96 64'):
        deploy.OnnxModel(out)(torch.zeros(1, 3, 96, 64))
    with pytest.raises(Exception):
        deploy.export_onnx(cls_wrapper, str(tmp_path / 'b.onnx'),
                           deploy.MIN_OPSET - 1)
    empty = tmp_path / 'dynamo'
    empty.mkdir()
    monkeypatch.setattr(deploy, 'onnx_export_takes_dynamo', lambda: False)
    with pytest.raises(deploy.ExportError) as info:
        deploy.export_onnx(cls_wrapper, str(empty / 'cls.onnx'), dynamo=True)
    msg = str(info.value)
    assert '\n' not in msg and '--dynamo needs torch >= 2.5' in msg
    assert list(empty.iterdir()) == []


def _cfg(name):
    if name.startswith('demo/'):
        return Config.fromfile(osp.join(CONFIGS, name + '.py'))
    cfg = Config.fromfile(osp.join(CONFIGS, name + '.py'))
    cfg.model.backbone.arch = copy.deepcopy(TINY)
    cfg.model.backbone.init_cfg = None  # a tiny arch: no ImageNet file
    cfg.model.neck.in_channels = TINY['embed_dims']
    return cfg


def _fmap_hw(h, w, stride):
    """SOFT / FPN map size at ``stride``: each stride-2 conv (kernel 3,
    padding 1) takes ceil(n / 2)."""
    for _ in range(int(np.log2(stride))):
        h, w = -(-h // 2), -(-w // 2)
    return h, w


def _predict(model, scope, h, w):
    from mmdet.structures import DetDataSample
    from mmpretrain.structures import DataSample
    from mmseg.structures import SegDataSample
    g = torch.Generator().manual_seed(0)
    img = torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8)
    s = dict(
        mmpretrain=DataSample, mmdet=DetDataSample,
        mmseg=SegDataSample)[scope]()
    meta = dict(img_shape=(h, w), ori_shape=(h, w))
    if scope == 'mmdet':
        s.set_metainfo(
            dict(meta, scale_factor=(1., 1.), batch_input_shape=(h, w)))
    elif scope == 'mmseg':
        s.set_metainfo(dict(meta, pad_shape=(h, w)))
    with torch.no_grad():
        return model.test_step(dict(inputs=[img], data_samples=[s]))[0]


def _expected_shapes(kind, wrapper, h, w):
    m = wrapper.model
    if kind == 'cls':
        return {'cls_score': (1, m.head.num_classes)}
    if kind == 'seg':
        return {'seg_logits': (1, m.decode_head.num_classes, h, w)}
    # FPN output i: the backbone map of neck input start_level + i (stride
    # 4 * 2**stage), the extra levels each a stride-2 step further
    first = 4 * 2**m.backbone.out_indices[m.neck.start_level]
    prefix = 'feat' if kind == 'two_stage' else 'cls_score'
    return {
        f'{prefix}_{i}': _fmap_hw(h, w, first * 2**i)
        for i in range(m.neck.num_outs)
    }


H, W = 64, 96  # not square; both multiples of 32 (mmdet's padding)


@pytest.mark.usefixtures('one_thread')
@pytest.mark.parametrize('name', [
    'demo/retinanet_soft_demo', 'mask_rcnn_soft_tiny_1x',
    'demo/upernet_soft_demo'
])
def test_export_non_square(name, tmp_path):
    """H != W: predictions in its frame, export shapes, ONNX parity (the
    classifier's: test_tool_cli.py::test_benchmark_onnx_tiny_run)."""
    cfg = _cfg(name)
    if launch.import_codebase(cfg) == 'mmdet':  # random weights: 5 boxes
        tc = cfg.model.test_cfg
        (tc.rcnn if 'rcnn' in tc else tc).update(score_thr=0., max_per_img=5)
    model, scope, cfg = deploy.build_model(cfg, None)
    h, w = H, W
    with DefaultScope.overwrite_default_scope(scope):
        pred = _predict(model, scope, h, w)
    if scope == 'mmpretrain':
        assert pred.pred_score.shape == (cfg.model.head.num_classes, )
    elif scope == 'mmseg':
        assert pred.pred_sem_seg.data.shape == (1, h, w)
        assert pred.seg_logits.data.shape[1:] == (h, w)
    else:
        boxes = pred.pred_instances.bboxes
        assert len(boxes) > 0
        assert (boxes[:, 0::2] <= w + 1e-3).all()
        assert (boxes[:, 1::2] <= h + 1e-3).all()
        assert (boxes >= -1e-3).all()
        if 'masks' in pred.pred_instances:
            assert pred.pred_instances.masks.shape[1:] == (h, w)
    wrapper = deploy.ExportWrapper(model, scope, (h, w))
    expected = _expected_shapes(wrapper.kind, wrapper, h, w)
    if wrapper.kind == 'two_stage':  # FPN features, then the RPN's
        assert wrapper.output_names[0] == 'feat_0'
        assert 'rpn_cls_score_0' in wrapper.output_names
    with torch.no_grad():
        outs = dict(
            zip(wrapper.output_names, wrapper(torch.zeros(1, 3, h, w))))
    for key, shape in expected.items():
        got = tuple(outs[key].shape)
        if len(shape) == 2 and wrapper.kind not in ('cls', ):
            got = got[2:]
        assert got == shape, (key, got, shape)
    out = str(tmp_path / 'm.onnx')
    deploy.export_onnx(wrapper, out)
    errs = deploy.verify(wrapper, out)
    assert max(errs.values()) < 1e-4, errs
    assert len(errs) == len(wrapper.output_names)
    onnx_out = deploy.OnnxModel(out)(torch.zeros(1, 3, h, w))
    for name_, o in zip(wrapper.output_names, onnx_out):
        assert tuple(o.shape) == tuple(outs[name_].shape), name_
