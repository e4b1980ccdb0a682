"""configs/demo: contents, a short run (det: test_tool_cli.py), the results
table and ``tools/demo.py --smoke``."""
import json
import os.path as osp

import cv2
import pytest
import torch
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


@pytest.mark.parametrize('task', sorted(T.TASKS))
def test_config_contents(task):
    cfg = T.load_demo_config(task)
    model, dataset, metric, size = EXPECTED[task]
    parts = [cfg.model, cfg.test_evaluator] + [
        cfg[f'{s}_dataloader'].dataset for s in ('train', 'val', 'test')
    ]
    types = [x['type'].split('.')[-1] for x in parts]  # yapf: disable
    assert types == [model, metric] + [dataset] * 3
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
    opt = build_optim_wrapper(model, cfg.optim_wrapper).optimizer
    decay = {id(p): g['weight_decay']
             for g in opt.param_groups for p in g['params']}  # yapf: disable
    st = model.backbone.stages
    assert [decay[id(p)] for p in [s.pos_embed for s in st] + [
        st[3].cls_token]] == [0] * 5  # yapf: disable
    assert decay[id(st[0].blocks[0].attn.q.weight)] > 0


def _check_run(task, r, work_dir, iters):
    """run_task's value (the metric), timings, drawing, training log."""
    spec = T.TASKS[task]
    assert r['value'] == r['metrics'][spec['metric']] * spec['scale']
    assert r['train_s'] > 0 and r['test_s'] > 0
    img = cv2.imread(r['png'])
    assert img is not None and img.shape[0] > 100 and img.shape[1] > 100
    logs = list(work_dir.glob('*/*.log'))
    assert logs and f'Iter(train) [{iters}/{iters}]' in logs[0].read_text()


def test_short_training_run_and_data_root(tmp_path):
    """seg (det: test_tool_cli.py; cls: test_demo_smoke); set_data_root."""
    data = S.make_demo_data(str(tmp_path / 'data'), tasks=['seg'], workers=1,
                            overrides=tiny_demo_data(num_train=4),
                            log=None)  # yapf: disable
    cfg = T.shrink_for_smoke(T.load_demo_config('seg'), iters=2, batch_size=2)
    r = T.run_task('seg', data['seg']['path'], str(tmp_path / 'seg'),
                   cfg=cfg, n_draw=2)  # yapf: disable
    _check_run('seg', r, tmp_path / 'seg', 2)
    cfg, root = T.load_demo_config('det'), str(tmp_path / 'x') + '/'
    T.set_data_root(cfg, root[:-1])
    assert (cfg.train_dataloader.dataset.data_root,
            cfg.test_dataloader.dataset.data_root,
            cfg.val_evaluator.ann_file) == (root, root, root +
                                            'annotations/instances_val.json')


def test_format_table():
    """PASS / FAIL / no target / ERROR rows; '>=' its target passes."""
    rows = (('detection', 'bbox mAP@0.5', 0.61, 0.5, 200.0),
            ('detection', 'bbox mAP', 0.3, None),
            ('segmentation', 'mIoU', None, 0.6), ('t', 'm', 0.5, 0.5),
            ('t', 'm', 0.4999, 0.5))  # yapf: disable
    keys = ('task', 'metric', 'value', 'target', 'seconds')
    lines = T.format_table([dict(zip(keys, r)) for r in rows]).splitlines()
    assert lines[0].startswith('| task') and len(lines) == 7
    assert 'PASS' in lines[2] and '0.610' in lines[2] and '>= 0.5' in lines[2]
    assert 'PASS' not in lines[3] and 'FAIL' not in lines[3]
    assert 'ERROR' in lines[4]
    assert '| PASS ' in lines[5] and '| FAIL ' in lines[6]


def _demo(tmp_path, capsys, *args):
    rc = tool_namespace('demo', run_name='demo')['main'](
        ['--smoke', '--threads', '1', '--data', str(tmp_path / 'data'),
         '--work-dir', str(tmp_path / 'wd'), *args])  # yapf: disable
    return rc, capsys.readouterr().out


def test_demo_smoke(tmp_path, capsys, monkeypatch):
    """tools/demo.py end to end; ``--amp``: the AMP wrapper, ``<wd>-amp``."""
    rc, out = _demo(tmp_path, capsys, '--tasks', 'cls', '--amp')
    assert rc == 0, out
    assert '| classification | top-1' in out
    assert 'predictions:' in out and 'cls_predictions.png' in out
    assert 'mixed precision (--amp)' in out
    wd = tmp_path / 'wd-smoke-amp'
    res = json.loads((wd / 'results.json').read_text())
    assert res['smoke'] and res['tasks'] == ['cls'] and res['amp']
    cls = res['results']['cls']
    assert cls['optim_wrapper'] == ('AmpOptimWrapper'
                                    if torch.cuda.is_available() else
                                    'CPUAmpOptimWrapper')
    assert 'accuracy/top1' in cls['metrics'] and osp.isfile(cls['png'])
    _check_run('cls', cls, wd / 'cls', 3)
    assert (wd / 'results.md').read_text().startswith('| task')
    assert (tmp_path / 'data-smoke' / 'imagenet' / S.MANIFEST).is_file()
    monkeypatch.setattr(
        T, 'run_task', lambda *a, **k: dict(
            metrics={'accuracy/top1': 95.0}, value=0.95, train_s=1, test_s=1))
    rc, out = _demo(tmp_path, capsys, '--tasks', 'cls')
    assert rc == 0 and 'mixed precision' not in out, out
    res = json.loads((tmp_path / 'wd-smoke' / 'results.json').read_text())
    assert not res['amp']
    assert res['results']['cls']['optim_wrapper'] == 'OptimWrapper'
