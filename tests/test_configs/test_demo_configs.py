"""The demo configs (``configs/demo``): contents, a short run of each task
(``demo_tasks.run_task``), the results table and ``tools/demo.py --smoke``."""
import json
import os.path as osp

import cv2
import pytest
from conftest import (check_hooks, demo_support, random_model, tiny_demo_data,
                      tool_namespace)
from mmengine.optim import build_optim_wrapper

from mmsoft.models.layers.soft_attention import landmark_grid

S, T = demo_support()
#: task: (model, dataset, metric, demo image size)
EXPECTED = {
    'det': ('RetinaNet', 'CocoDataset', 'CocoMetric', 160),
    'seg': ('EncoderDecoder', 'ADE20KDataset', 'IoUMetric', 160),
    'cls': ('ImageClassifier', 'ImageNet', 'Accuracy', 64),
}


@pytest.fixture(scope='module')
def tiny_data(tmp_path_factory):
    root = str(tmp_path_factory.mktemp('demo_tiny'))
    return S.make_demo_data(
        root,
        tasks=['det', 'seg'],
        overrides=tiny_demo_data(num_train=4),
        workers=1,
        log=None)


@pytest.mark.parametrize('task', sorted(T.TASKS))
def test_config_contents(task):
    cfg = T.load_demo_config(task)
    model, dataset, metric, size = EXPECTED[task]
    types = [
        x['type'].split('.')[-1]
        for x in (cfg.model, cfg.train_dataloader.dataset,
                  cfg.val_dataloader.dataset, cfg.test_dataloader.dataset,
                  cfg.test_evaluator)
    ]
    assert types == [model, dataset, dataset, dataset, metric]
    assert cfg.model.backbone.type in ('SOFT', 'mmsoft.SOFT')
    assert 'mmsoft' in cfg.custom_imports['imports']
    check_hooks(cfg)
    # every SOFT stage keeps >= 4 bottleneck tokens at the demo size
    hw = size // 4
    for i, r in enumerate(cfg.model.backbone.arch['sampling_ratios'][:3]):
        gh, gw = landmark_grid((hw, hw), r)
        assert gh * gw >= 4, (task, i, hw, r)
        hw = (hw + 1) // 2
    # the model builds (heads match the backbone's channels), CPU-sized
    model = random_model(cfg)
    assert sum(p.numel() for p in model.parameters()) < 5e6
    # no weight decay on the position embeddings / cls token
    decay = {
        id(p): g['weight_decay']
        for g in build_optim_wrapper(model, cfg.optim_wrapper).optimizer.
        param_groups for p in g['params']
    }  # yapf: disable
    bb = model.backbone
    assert [decay[id(s.pos_embed)] for s in bb.stages] == [0] * 4
    assert decay[id(bb.stages[3].cls_token)] == 0
    assert decay[id(bb.stages[0].blocks[0].attn.q.weight)] > 0


def _check_run(task, r, work_dir, iters):
    """A run_task result: the reported value is the evaluator's metric (as
    a fraction), timings, a drawing of the predictions, the training log."""
    spec = T.TASKS[task]
    assert r['value'] == r['metrics'][spec['metric']] * spec['scale']
    assert r['train_s'] > 0 and r['test_s'] > 0
    img = cv2.imread(r['png'])
    assert img is not None and img.shape[0] > 100 and img.shape[1] > 100
    logs = list(work_dir.glob('*/*.log'))
    assert logs and f'Iter(train) [{iters}/{iters}]' in logs[0].read_text()


@pytest.mark.parametrize('task', ['det', 'seg'])  # cls: test_demo_smoke
def test_short_training_run(task, tiny_data, tmp_path):
    cfg = T.load_demo_config(task)
    T.shrink_for_smoke(cfg, iters=2, batch_size=2)
    r = T.run_task(
        task, tiny_data[task]['path'], str(tmp_path / task), cfg=cfg,
        n_draw=2)  # yapf: disable
    _check_run(task, r, tmp_path / task, 2)


def test_set_data_root(tmp_path):
    cfg = T.load_demo_config('det')
    root = str(tmp_path / 'x') + '/'
    T.set_data_root(cfg, root[:-1])
    assert cfg.train_dataloader.dataset.data_root == root
    assert cfg.test_dataloader.dataset.data_root == root
    assert cfg.val_evaluator.ann_file == \
        root + 'annotations/instances_val.json'


def test_format_table():
    """PASS / FAIL / no target / ERROR rows; a value equal to its target
    passes ('>='), one just below fails."""
    row = ('task', 'metric', 'value', 'target', 'seconds')
    lines = T.format_table([
        dict(zip(row, r))
        for r in (('detection', 'bbox mAP@0.5', 0.61, 0.5,
                   200.0), ('detection', 'bbox mAP', 0.3,
                            None), ('segmentation', 'mIoU', None, 0.6),
                  ('t', 'm', 0.5, 0.5), ('t', 'm', 0.4999, 0.5))
    ]).splitlines()
    assert lines[0].startswith('| task') and len(lines) == 7
    assert 'PASS' in lines[2] and '0.610' in lines[2] and '>= 0.5' in lines[2]
    assert 'PASS' not in lines[3] and 'FAIL' not in lines[3]
    assert 'ERROR' in lines[4]
    assert '| PASS ' in lines[5] and '| FAIL ' in lines[6]


@pytest.mark.parametrize('amp', [False, True])
def test_demo_smoke(tmp_path, capsys, amp):
    """tools/demo.py end to end (one task, tiny data; the classifier's
    run_task checks); ``--amp``: the AMP optim wrapper of ``tools/train.py
    --amp``, results in ``<wd>-amp``."""
    import torch
    rc = tool_namespace(
        'demo', run_name='demo')['main']([
            '--smoke', '--tasks', 'cls', '--threads', '1', '--data',
            str(tmp_path / 'data'), '--work-dir',
            str(tmp_path / 'wd')
        ] + ['--amp'] * amp)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert '| classification | top-1' in out
    assert 'predictions:' in out and 'cls_predictions.png' in out
    assert ('mixed precision (--amp)' in out) == amp
    wd = tmp_path / ('wd-smoke-amp' if amp else 'wd-smoke')
    with open(wd / 'results.json') as f:
        res = json.load(f)
    assert res['smoke'] and res['tasks'] == ['cls'] and res['amp'] == amp
    cls = res['results']['cls']
    assert cls['optim_wrapper'] == (
        'OptimWrapper' if not amp else
        'AmpOptimWrapper' if torch.cuda.is_available() else
        'CPUAmpOptimWrapper')  # yapf: disable
    assert 'accuracy/top1' in cls['metrics'] and osp.isfile(cls['png'])
    _check_run('cls', cls, wd / 'cls', 3)
    assert (wd / 'results.md').read_text().startswith('| task')
    assert (tmp_path / 'data-smoke' / 'imagenet' / S.MANIFEST).is_file()
