"""ONNX export (tools/deployment/pytorch2onnx.py, deploy.py): H != W inputs
of each task family, onnxruntime parity with the normal forward (no eigh:
test_chain.py's ONNX test); one error line for what cannot be exported."""
import copy
import os
import os.path as osp

import numpy as np
import pytest
import torch
from conftest import CONFIGS, ROOT, load_module, tiny_arch
from mmengine.config import Config
from mmengine.registry import DefaultScope

for _m in ('onnx', 'onnxruntime', 'mmdet', 'mmseg', 'mmpretrain'):
    pytest.importorskip(_m)

import mmsoft  # noqa: E402,F401
from deployment import deploy  # noqa: E402
from mmsoft_tools import launch  # noqa: E402

DEMO = osp.join(ROOT, 'configs', 'demo')
TINY = tiny_arch([16, 32, 64, 64], [1, 2, 2, 2], sampling_ratios=[4, 2, 2, 1])
P2O = osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py')


def _error_line(capsys, argv):
    """The tool's whole stderr (less :mod:`logging`'s reports of a failed
    emit: an earlier test's logger may hold a closed captured stream): one
    error line, exit 2."""
    rc = load_module(P2O, 'pytorch2onnx').main(argv)
    lines, inside = [], False
    for ln in capsys.readouterr().err.strip().splitlines():
        if ln == '--- Logging error ---':
            inside = True
        elif inside:
            inside = not ln.startswith('Arguments: ')
        else:
            lines.append(ln)
    assert not inside and rc == 2  # a report is complete
    assert len(lines) == 1 and lines[0].startswith('error: '), lines
    return lines[0]


CLS = '{demo}/soft_cls_demo.py none --shape 64 64 '
ATTN = CLS + '--out {tmp}/x.onnx --cfg-options model.backbone.attn_cfg.'
#: (id, arguments, parts of the line ('error: ...': all of it)); the
#: random-weights nr_method row: test_error_is_all_the_output_...
ERRORS = [
    ('max-landmarks', ATTN + 'max_landmarks=7', ['max_landmarks', '--dynamo']),
    ('landmark-hw', ATTN + 'landmark_hw=[2,2]',
     ['landmark_hw=(2, 2)', '--dynamo']),
    ('other-model', '{demo}/retinanet_soft_demo.py {tmp}/cls.pth --shape 160 '
     '160 --out {tmp}/x.onnx', ['does not match the model (RetinaNet)',
                                'missing from the checkpoint',
                                '--partial-load']),
    ('no-checkpoint', '{demo}/soft_cls_demo.py {tmp}/nope.pth --shape 64 64',
     ['does not exist']),
    ('det-shape', '{demo}/retinanet_soft_demo.py none --shape 150 160 --out '
     '{tmp}/x.onnx', ['--shape 160 160']),
    ('dynamic', CLS + '--dynamic', ['dynamic input shapes are not supported']),
    # issue 27: refused before the model is built
    ('out-dir', CLS + '--out {tmp}', [
        'error: --out {tmp} is a directory; give a file name, e.g. --out '
        '{tmp}/soft_cls_demo_64x64.onnx']),
    *[(f'opset-{o}', CLS + f'--opset {o}', [
        f'error: --opset {o} is not supported: SOFT exports with opsets '
        '{lo} to {hi}; the default is 17']) for o in ('5', '{hi1}')],
]  # yapf: disable


@pytest.mark.parametrize(
    'name, args, parts', ERRORS, ids=[e[0] for e in ERRORS])
def test_error_line(tmp_path, capsys, monkeypatch, name, args, parts):
    """What cannot be exported: one line naming it, nothing written."""
    lo, hi = deploy.opset_range()
    assert lo == deploy.MIN_OPSET and hi >= deploy.DEFAULT_OPSET
    names = dict(demo=DEMO, tmp=tmp_path, lo=lo, hi=hi, hi1=hi + 1)
    if name == 'other-model':  # the classifier's weights (they load exactly)
        cls = f'{DEMO}/soft_cls_demo.py'
        sd = deploy.build_model(cls, None)[0].state_dict()
        torch.save({'state_dict': sd}, tmp_path / 'cls.pth')
        loaded = deploy.build_model(cls, str(tmp_path / 'cls.pth'))[0]
        assert all(
            torch.equal(loaded.state_dict()[k], v) for k, v in sd.items())
    early = name.startswith(('out-', 'opset-'))
    if early:
        monkeypatch.setattr(deploy, 'build_model', lambda *a, **k: 1 / 0)
    line = _error_line(capsys, [a.format(**names) for a in args.split()])
    for p in (p.format(**names) for p in parts):
        assert line == p if p.startswith('error: ') else p in line, line
    assert not (tmp_path / 'x.onnx').exists()
    assert not early or os.listdir(tmp_path) == []


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
    proc = script_server(P2O, [
        osp.join(DEMO, 'soft_cls_demo.py'), 'none', '--shape', '64', '64',
        '--out', tmp_path / 'x.onnx', '--cfg-options',
        'model.backbone.attn_cfg.nr_method=spectral'
    ], tmp_path)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2 and len(out) <= 3, '\n'.join(out[:20])
    assert out[-1].startswith('error: ') and "nr_method='spectral'" in out[
        -1] and 'model.backbone.attn_cfg.nr_method=auto' in out[-1], out


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


def _predict(model, scope, h, w):
    """``test_step`` on one random ``h x w`` image."""
    from mmdet.structures import DetDataSample
    from mmseg.structures import SegDataSample
    img = torch.randint(
        0,
        256, (3, h, w),
        dtype=torch.uint8,
        generator=torch.Generator().manual_seed(0))
    s = dict(mmdet=DetDataSample, mmseg=SegDataSample)[scope]()
    s.set_metainfo(
        dict(img_shape=(h, w), ori_shape=(h, w), pad_shape=(
            h, w)) if scope == 'mmseg' else dict(
                img_shape=(h, w),
                ori_shape=(h, w),
                scale_factor=(1., 1.),
                batch_input_shape=(h, w)))
    with torch.no_grad(), DefaultScope.overwrite_default_scope(scope):
        return model.test_step(dict(inputs=[img], data_samples=[s]))[0]


def _expected_shapes(wrapper, h, w):
    """seg: logits at the input size; FPN output i: the backbone map of neck
    input start_level + i (stride 4 * 2**stage), each extra level a
    stride-2 step further (ceil(n / 2) each)."""
    m = wrapper.model
    if wrapper.kind == 'seg':
        return {'seg_logits': (1, m.decode_head.num_classes, h, w)}
    first = 4 * 2**m.backbone.out_indices[m.neck.start_level]
    prefix = 'feat' if wrapper.kind == 'two_stage' else 'cls_score'
    shapes = {}
    for i in range(m.neck.num_outs):
        n = int(np.log2(first * 2**i))
        shapes[f'{prefix}_{i}'] = (-(-h // 2**n), -(-w // 2**n))
    return shapes


@pytest.mark.usefixtures('one_thread')
@pytest.mark.parametrize('name', [
    'demo/retinanet_soft_demo', 'mask_rcnn_soft_tiny_1x',
    'demo/upernet_soft_demo'
])
def test_export_non_square(name, tmp_path):
    """H != W (64 x 96: multiples of 32, mmdet's padding): predictions in
    its frame, export shapes, ONNX parity (the classifier's:
    test_tool_cli.py::test_benchmark_onnx_tiny_run)."""
    h, w = 64, 96
    cfg = Config.fromfile(osp.join(CONFIGS, name + '.py'))
    if not name.startswith('demo/'):  # a tiny arch: no ImageNet file
        cfg.model.backbone.update(arch=copy.deepcopy(TINY), init_cfg=None)
        cfg.model.neck.in_channels = TINY['embed_dims']
    if launch.import_codebase(cfg) == 'mmdet':  # random weights: 5 boxes
        tc = cfg.model.test_cfg
        (tc.rcnn if 'rcnn' in tc else tc).update(score_thr=0., max_per_img=5)
    model, scope, cfg = deploy.build_model(cfg, None)
    pred = _predict(model, scope, h, w)
    if scope == 'mmseg':
        assert pred.pred_sem_seg.data.shape == (1, h, w)
        assert pred.seg_logits.data.shape[1:] == (h, w)
    else:
        boxes = pred.pred_instances.bboxes
        assert len(boxes) > 0 and (boxes >= -1e-3).all()
        assert (boxes[:, 0::2] <= w + 1e-3).all()
        assert (boxes[:, 1::2] <= h + 1e-3).all()
        if 'masks' in pred.pred_instances:
            assert pred.pred_instances.masks.shape[1:] == (h, w)
    wrapper = deploy.ExportWrapper(model, scope, (h, w))
    if wrapper.kind == 'two_stage':  # FPN features, then the RPN's
        assert wrapper.output_names[0] == 'feat_0'
        assert 'rpn_cls_score_0' in wrapper.output_names
    with torch.no_grad():
        outs = dict(
            zip(wrapper.output_names, wrapper(torch.zeros(1, 3, h, w))))
    for key, shape in _expected_shapes(wrapper, h, w).items():
        got = tuple(outs[key].shape)
        assert (got[2:] if len(shape) == 2 else got) == shape, (key, got)
    out = str(tmp_path / 'm.onnx')
    deploy.export_onnx(wrapper, out)
    errs = deploy.verify(wrapper, out)
    assert max(errs.values()) < 1e-4 and len(errs) == len(
        wrapper.output_names), errs
    onnx_out = deploy.OnnxModel(out)(torch.zeros(1, 3, h, w))
    for key, o in zip(wrapper.output_names, onnx_out):
        assert tuple(o.shape) == tuple(outs[key].shape), key
