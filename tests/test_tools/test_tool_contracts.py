"""The tools' options against what they promise (issue 30): the views of
``tools/test.py --tta``, inference and ONNX export of H != W inputs for every
task, every config name the READMEs / docs show."""
import copy
import glob
import importlib
import os.path as osp
import re

import numpy as np
import pytest
import torch
from conftest import CONFIGS, ROOT, load_module, tiny_arch, tool_namespace
from mmengine.config import Config
from mmengine.registry import DefaultScope

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
pytest.importorskip('mmpretrain')

from mmsoft_tools import launch  # noqa: E402

pytestmark = pytest.mark.usefixtures('one_thread')

DEMO = osp.join(CONFIGS, 'demo')
TINY = tiny_arch([16, 32, 64, 64], [1, 2, 2, 2], sampling_ratios=[4, 2, 2, 1])
H, W = 64, 96  # not square; both multiples of 32 (mmdet's padding)
NON_SQUARE = ('demo/soft_cls_demo', 'demo/retinanet_soft_demo',
              'mask_rcnn_soft_tiny_1x', 'demo/upernet_soft_demo')


def _tta_views(name, tmp_path):
    """The views ``tools/test.py --tta`` makes of one 40 x 56 image (the
    config's TTA pipeline after ``enable_tta``, built and run)."""
    import mmcv
    from mmengine.dataset import Compose
    test = tool_namespace('test')
    path = osp.join(CONFIGS, name + '.py')
    args = test['parse_args']([path, 'c.pth', '--tta', '--show-dir', 'v'])
    cfg = test['build_cfg'](args)
    scope = launch.import_codebase(cfg)
    test['enable_tta'](cfg, scope)
    assert cfg.model.module.type == Config.fromfile(path).model.type
    assert cfg.model.module.backbone.type == 'SOFT'
    assert cfg.test_dataloader.dataset.pipeline[-1].type == 'TestTimeAug'
    assert cfg.test_dataloader.dataset.pipeline == cfg.tta_pipeline
    test['trigger_visualization_hook'](cfg, args, scope)
    hook = cfg.default_hooks.visualization
    assert hook.get('enable', hook.get('draw')) is True
    g = np.random.default_rng(0)
    mmcv.imwrite(
        g.integers(0, 256, (40, 56, 3), dtype=np.uint8),
        str(tmp_path / 'img.png'))
    mmcv.imwrite(
        g.integers(0, 150, (40, 56), dtype=np.uint8),
        str(tmp_path / 'seg.png'))
    transforms = importlib.import_module(f'{scope}.registry').TRANSFORMS
    with DefaultScope.overwrite_default_scope(scope):
        pipeline = Compose(
            [transforms.build(copy.deepcopy(t)) for t in cfg.tta_pipeline])
        return pipeline(
            dict(
                img_path=str(tmp_path / 'img.png'),
                img_id=0,
                seg_map_path=str(tmp_path / 'seg.png'),
                reduce_zero_label=True,
                seg_fields=[],
                instances=[],
                gt_label=0)), cfg


@pytest.mark.parametrize('name', ['soft_tiny_in1k', 'mask_rcnn_soft_tiny_1x'])
def test_tta_flip_views(name, tmp_path):
    """No TTA of their own: the image flipped, then as it is."""
    out, cfg = _tta_views(name, tmp_path)
    inputs, samples = out['inputs'], out['data_samples']
    assert len(inputs) == len(samples) == 2
    a, b = (t.numpy() for t in inputs)
    assert a.shape == b.shape
    np.testing.assert_array_equal(a, b[:, :, ::-1])  # a horizontal flip
    if name.startswith('mask_rcnn'):
        assert [s.flip for s in samples] == [True, False]
        assert samples[0].flip_direction == 'horizontal'
        assert samples[0].scale_factor == samples[1].scale_factor
        assert cfg.model.type == 'DetTTAModel'
    else:
        assert cfg.model.type == 'mmpretrain.AverageClsScoreTTA'
        # the flip is the only difference from the plain test pipeline
        assert a.shape[1:] == (224, 224)


@pytest.mark.parametrize(
    'name,model_type,flips,shorts',
    [
        # mmdet's own RetinaNet TTA (inherited): shorter sides 800, 400, 1200
        ('retinanet_soft_tiny_1x', 'DetTTAModel', [True, False] * 3,
         [800, 400, 1200]),
        # the config's own TTA (mmseg's ADE20K): 6 scales (0.5 .. 1.75), rising
        ('upernet_soft_small_512x512_160k_ade20k', 'SegTTAModel',
         [False, True] * 6, None),
    ])
def test_tta_multiscale_views(name, model_type, flips, shorts, tmp_path):
    """Multi-scale TTA: each scale flipped and not, merged by the TTA model."""
    out, cfg = _tta_views(name, tmp_path)
    inputs, samples = out['inputs'], out['data_samples']
    assert len(inputs) == len(flips)
    assert [bool(s.flip) for s in samples] == flips
    sizes = [tuple(t.shape[1:]) for t in inputs]
    assert sizes[0::2] == sizes[1::2]
    got = [min(s) for s in sizes[0::2]]
    assert got == (shorts or sorted(set(got))) and len(got) == len(flips) // 2
    for a, b in zip(inputs[0::2], inputs[1::2]):
        np.testing.assert_array_equal(a.numpy(), b.numpy()[:, :, ::-1])
    assert cfg.model.type == model_type


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


@pytest.mark.parametrize('name', NON_SQUARE)
def test_export_non_square(name, tmp_path):
    """H != W: predictions in its frame, export shapes, ONNX parity."""
    pytest.importorskip('onnxruntime')
    from deployment import deploy
    cfg = _cfg(name)
    if launch.import_codebase(cfg) == 'mmdet':  # random weights: all boxes
        tc = cfg.model.test_cfg
        (tc.rcnn if 'rcnn' in tc else tc).update(score_thr=0.0)
    model, scope, cfg = deploy.build_model(cfg, None)
    for h, w in ((H, W), (W, H)):
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
        if (h, w) == (H, W):
            out = str(tmp_path / 'm.onnx')
            deploy.export_onnx(wrapper, out)
            errs = deploy.verify(wrapper, out)
            assert max(errs.values()) < 1e-4, errs
            assert len(errs) == len(wrapper.output_names)
            onnx_out = deploy.OnnxModel(out)(torch.zeros(1, 3, h, w))
            for name_, o in zip(wrapper.output_names, onnx_out):
                assert tuple(o.shape) == tuple(outs[name_].shape), name_


_NAME = re.compile(r'\b((?:[a-z0-9]+_)*soft(?:_[a-z0-9]+)*_(?:in1k|1x|3x_ms|'
                   r'ade20k|demo))\b(?!\.yml)')


def _doc_names():
    """{config name: the first file (README / docs page) that names it}."""
    names = {}
    for path in [osp.join(d, 'README.md') for d in (ROOT, CONFIGS, DEMO)] + \
            sorted(glob.glob(f'{ROOT}/docs/en/**/*.md', recursive=True)):
        if osp.isfile(path):
            with open(path, encoding='utf-8') as f:
                for name in _NAME.findall(f.read()):
                    names.setdefault(name, osp.relpath(path, ROOT))
    return names


def test_every_config_name_in_the_docs_builds():
    from mmsoft.configs import get_config_path, list_configs
    base_files = load_module(
        osp.join(ROOT, 'tools', 'misc', 'configs.py'), '_configs').base_files
    names = _doc_names()
    shipped = {osp.splitext(n)[0] for n in list_configs()}
    assert len(names) >= 20, names  # the docs do name configs
    for name, where in sorted(names.items()):
        if name.endswith('_demo'):
            path = osp.join(DEMO, name + '.py')
            assert osp.isfile(path), f'{where} names {name}: {path} missing'
            cfg = Config.fromfile(path)
            assert cfg.model.backbone.type in ('SOFT', 'mmsoft.SOFT'), name
        else:
            assert name in shipped, f'{where} names {name}: no such config'
            assert all(
                osp.isfile(f) for f in base_files(get_config_path(name))), name
