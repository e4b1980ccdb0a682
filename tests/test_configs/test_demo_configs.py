"""The demo configs (``configs/demo``): contents, a short run of each task
(``demo_tasks.run_task``), the results table and ``tools/demo.py --smoke``."""
import json
import os.path as osp

import cv2
import pytest
from conftest import demo_support, random_model, tiny_demo_data, tool_namespace

from mmsoft.models.layers.soft_attention import landmark_grid

S, T = demo_support()

TINY_DATA = tiny_demo_data(num_train=4)

#: task: (model, dataset, metric, demo image size)
EXPECTED = {
    'det': ('RetinaNet', 'CocoDataset', 'CocoMetric', 160),
    'seg': ('EncoderDecoder', 'ADE20KDataset', 'IoUMetric', 160),
    'cls': ('ImageClassifier', 'ImageNet', 'Accuracy', 64),
}


@pytest.fixture(scope='module')
def tiny_data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('demo_tiny'))
    return S.make_demo_data(root, overrides=TINY_DATA, workers=1, log=None)


def _type(x):
    return x['type'].split('.')[-1]


@pytest.mark.parametrize('task', sorted(T.TASKS))
def test_config_contents(task):
    cfg = T.load_demo_config(task)
    model, dataset, metric, size = EXPECTED[task]
    assert _type(cfg.model) == model
    assert cfg.model.backbone.type in ('SOFT', 'mmsoft.SOFT')
    assert 'mmsoft' in cfg.custom_imports['imports']
    for key in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        assert _type(cfg[key].dataset) == dataset
    assert _type(cfg.test_evaluator) == metric
    # every SOFT stage keeps >= 4 bottleneck tokens at the demo size
    arch = cfg.model.backbone.arch
    hw = size // 4
    for i, r in enumerate(arch['sampling_ratios'][:3]):
        gh, gw = landmark_grid((hw, hw), r)
        assert gh * gw >= 4, (task, i, hw, r)
        hw = (hw + 1) // 2
    # the model builds and its heads match the backbone's channels
    model = random_model(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    assert n_params < 5e6, n_params  # small enough to train on a CPU


@pytest.mark.parametrize('task', sorted(T.TASKS))
def test_short_training_run(task, tiny_data, tmp_path):
    cfg = T.load_demo_config(task)
    T.shrink_for_smoke(cfg, iters=2, batch_size=2)
    data = tiny_data[task]['path']
    r = T.run_task(task, data, str(tmp_path / task), cfg=cfg, n_draw=2)
    spec = T.TASKS[task]
    assert spec['metric'] in r['metrics']
    # the reported value is the evaluator's metric (as a fraction)
    assert r['value'] == r['metrics'][spec['metric']] * spec['scale']
    assert r['train_s'] > 0 and r['test_s'] > 0
    img = cv2.imread(r['png'])
    assert img is not None and img.shape[0] > 100 and img.shape[1] > 100
    logs = list((tmp_path / task).glob('*/*.log'))
    assert logs and 'Iter(train) [2/2]' in logs[0].read_text()


def test_set_data_root(tmp_path):
    cfg = T.load_demo_config('det')
    T.set_data_root(cfg, str(tmp_path / 'x'))
    root = str(tmp_path / 'x') + '/'
    assert cfg.train_dataloader.dataset.data_root == root
    assert cfg.test_dataloader.dataset.data_root == root
    assert cfg.val_evaluator.ann_file == \
        root + 'annotations/instances_val.json'


def test_format_table():
    row = ('task', 'metric', 'value', 'target', 'seconds')
    text = T.format_table([
        dict(zip(row, r))
        for r in (('detection', 'bbox mAP@0.5', 0.61, 0.5,
                   200.0), ('detection', 'bbox mAP', 0.3, None),
                  ('classification', 'top-1', 0.85, 0.9,
                   150.0), ('segmentation', 'mIoU', None, 0.6))
    ])
    lines = text.splitlines()
    assert lines[0].startswith('| task') and len(lines) == 6
    assert 'PASS' in lines[2] and '0.610' in lines[2] and '>= 0.5' in lines[2]
    assert 'PASS' not in lines[3] and 'FAIL' not in lines[3]
    assert 'FAIL' in lines[4]
    assert 'ERROR' in lines[5]
    # a value equal to its target passes ('>='), one just below fails
    edge = T.format_table([
        dict(zip(row, ('t', 'm', v, 0.5))) for v in (0.5, 0.4999)
    ]).splitlines()
    assert '| PASS ' in edge[2] and '| FAIL ' in edge[3]


@pytest.mark.parametrize('amp', [False, True])
def test_demo_smoke(tmp_path, capsys, amp):
    """tools/demo.py end to end (one task, tiny data); ``--amp``: the AMP
    optim wrapper of ``tools/train.py --amp``, results in ``<wd>-amp``."""
    import torch
    demo = tool_namespace('demo', run_name='demo')
    rc = demo['main'](
        ['--smoke', '--tasks', 'cls', '--threads', '1'] + ['--amp'] * amp +
        ['--data',
         str(tmp_path / 'data'), '--work-dir',
         str(tmp_path / 'wd')])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert '| classification | top-1' in out
    assert 'predictions:' in out and 'cls_predictions.png' in out
    assert ('mixed precision (--amp)' in out) == amp
    wd = tmp_path / ('wd-smoke-amp' if amp else 'wd-smoke')
    with open(wd / 'results.json') as f:
        res = json.load(f)
    assert res['smoke'] and res['tasks'] == ['cls'] and res['amp'] == amp
    assert res['results']['cls']['optim_wrapper'] == (
        'OptimWrapper' if not amp else 'AmpOptimWrapper'
        if torch.cuda.is_available() else 'CPUAmpOptimWrapper')
    assert 'accuracy/top1' in res['results']['cls']['metrics']
    assert osp.isfile(res['results']['cls']['png'])
    assert (wd / 'results.md').read_text().startswith('| task')
    assert (tmp_path / 'data-smoke' / 'imagenet' / S.MANIFEST).is_file()
