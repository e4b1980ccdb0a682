"""Issue 13: ``tools/test.py`` refuses a checkpoint that does not match the
config's model (no metric, non-zero exit) unless ``--partial-load``.

The checkpoints that are tested carry a constant head (zero weights, a
one-hot bias): the model predicts one class for every image, so the
expected top-1 accuracy follows from the data set's labels alone and shows
that the checkpoint's weights (not a random initialisation) were tested."""
import contextlib
import glob
import io
import os.path as osp
import time

import pytest
import torch
from conftest import (CONFIGS, ROOT, cls_demo_config, load_module,
                      random_model, tool_namespace)

pytest.importorskip('mmpretrain')


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """A tiny 5-class demo classifier config, its data and checkpoints."""
    tmp = tmp_path_factory.mktemp('strict_tools')
    cfg = cls_demo_config(tmp, val=4, test=4)
    sd = random_model(cfg).state_dict()
    # a constant classifier: always the class of the first val image
    labels = val_labels(tmp)
    sd['head.fc.weight'] = torch.zeros_like(sd['head.fc.weight'])
    sd['head.fc.bias'] = torch.nn.functional.one_hot(
        torch.tensor(labels[0]), 5).float() * 10
    ckpts = {}

    def save(name, state_dict, wrap='state_dict'):
        path = str(tmp / f'{name}.pth')
        torch.save({wrap: state_dict, 'meta': {}}, path)
        ckpts[name] = path

    save('good', sd)
    # a checkpoint of tools/train.py: SafeCheckpointHook records the
    # model's attn_norm (the demo config: False; test_chain checks it)
    torch.save({
        'state_dict': sd,
        'meta': {
            'mmsoft_attn_norm': [False]
        }
    }, str(tmp / 'trained.pth'))
    ckpts['trained'] = str(tmp / 'trained.pth')
    head1000 = dict(sd)
    head1000['head.fc.weight'] = torch.zeros(1000, 192)
    head1000['head.fc.bias'] = torch.zeros(1000)
    save('head1000', head1000)
    # another model: a detector's keys (0 tensors load)
    save(
        'retinanet', {
            'backbone.layer1.0.conv1.weight': torch.zeros(64, 64, 1, 1),
            'neck.fpn_convs.0.conv.weight': torch.zeros(256, 256, 3, 3),
            'bbox_head.retina_cls.weight': torch.zeros(9, 256, 3, 3)
        })
    # another arch: one more block in stage 3
    other = {k: v for k, v in sd.items() if '.stages.2.blocks.1.' not in k}
    save('other_arch', other)
    # an unconverted official checkpoint (fudan-zvg/SOFT layout)
    official, _ = load_module(
        osp.join(ROOT, 'tools', 'model_converters', 'mmsoft2soft.py'),
        'mmsoft2soft').convert_mmpretrain_to_official(sd)
    save('official', official, wrap='model')
    return cfg, ckpts, tmp


def val_labels(tmp):
    """The labels of the demo val split (``meta/val.txt``: file label)."""
    with open(tmp / 'data' / 'imagenet' / 'meta' / 'val.txt') as f:
        return [int(line.split()[1]) for line in f if line.strip()]


def expected_top1(tmp):
    """Top-1 (%) of the constant classifier of :func:`setup`."""
    labels = val_labels(tmp)
    return 100.0 * labels.count(labels[0]) / len(labels)


def _test(setup, name, *extra, work='work'):
    cfg, ckpts, tmp = setup
    main = tool_namespace('test')['main']
    return main([cfg, ckpts[name], '--work-dir', str(tmp / work), *extra])


def _error(setup, name, *extra):
    """The line tools/test.py stops with, before any metric, as a user
    runs it (``run_main``: the message on stderr, exit status 1)."""
    from mmsoft_tools.cli import run_main
    cfg, ckpts, tmp = setup
    err = io.StringIO()
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stderr(err):
        run_main(
            tool_namespace('test')['main'],
            [cfg, ckpts[name], '--work-dir',
             str(tmp / 'work'), *extra])
    msg = exc.value.code  # sys.exit('error: ...') of the pre-flight
    if not isinstance(msg, str):
        assert msg == 1, err.getvalue()
        msg = [ln for ln in err.getvalue().splitlines() if ln.strip()][-1]
    assert msg.startswith('error: checkpoint ')
    return msg


def test_matching_checkpoint_is_tested(setup):
    tmp = setup[2]
    out = str(tmp / 'good_preds.pkl')
    metrics = _test(setup, 'good', '--out', out)
    assert set(metrics) == {'accuracy/top1'}, metrics
    assert metrics['accuracy/top1'] == pytest.approx(expected_top1(tmp))
    # every image scored by the checkpoint's constant head: softmax(bias)
    import pickle
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert [int(p['gt_label']) for p in preds] == val_labels(tmp)
    bias = torch.load(setup[1]['good'])['state_dict']['head.fc.bias']
    for p in preds:
        torch.testing.assert_close(p['pred_score'], bias.softmax(0))


def test_trained_checkpoint_of_the_other_attn_norm(setup):
    """Issue 36 (4): a tools/train.py checkpoint (attn_norm=False in its
    meta) tested with attn_norm=True exited 0 with a wrong top-1;
    now an error naming both settings and the fix."""
    msg = _error(setup, 'trained', '--cfg-options',
                 'model.backbone.attn_cfg.attn_norm=True')
    assert '\n' not in msg
    assert 'trained with attn_norm=False' in msg
    assert 'has attn_norm=True' in msg
    assert '--cfg-options model.backbone.attn_cfg.attn_norm=False' in msg
    # the setting it was trained with: tested
    metrics = _test(setup, 'trained')
    assert metrics['accuracy/top1'] == pytest.approx(expected_top1(setup[2]))


def test_out_is_written_atomically(setup, monkeypatch):
    """Issue 36 (3): a full disk while the predictions are dumped truncated
    an existing ``--out`` file; now it keeps its content and no temporary
    file is left."""
    import errno
    import os

    import mmengine.evaluator.metric as metric
    tmp = setup[2]
    out = tmp / 'kept' / 'preds.pkl'
    out.parent.mkdir()
    out.write_bytes(b'earlier results')

    def full_disk(obj, path, **kwargs):
        with open(path, 'wb') as f:
            f.write(b'partial')
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(metric, 'dump', full_disk)
    with pytest.raises(OSError, match='No space left'):
        _test(setup, 'good', '--out', str(out))
    assert out.read_bytes() == b'earlier results'
    assert os.listdir(out.parent) == ['preds.pkl']


@pytest.mark.parametrize('make,problem', [
    ('file_parent', 'is a file, not a directory'),
    ('directory', 'is a directory; give a file name'),
])
def test_out_that_cannot_be_written_stops_before_inference(
        setup, make, problem, monkeypatch):
    """Issue 36 (3): ``--out`` under a file failed after the inference."""
    from mmengine.runner import Runner

    def no_test(self):
        raise AssertionError('inference ran')

    monkeypatch.setattr(Runner, 'test', no_test)
    tmp = setup[2]
    (tmp / 'a_file').write_text('x')
    (tmp / 'a_dir.pkl').mkdir(exist_ok=True)
    out = str(tmp / 'a_file' / 'preds.pkl') if make == 'file_parent' \
        else str(tmp / 'a_dir.pkl')
    with pytest.raises(SystemExit) as exc:
        _test(setup, 'good', '--out', out)
    assert exc.value.code.startswith(f'error: --out {out}: ')
    assert problem in exc.value.code and '\n' not in exc.value.code


def test_1000_class_head_on_5_class_config(setup):
    msg = _error(setup, 'head1000')
    assert 'does not match the model (ImageClassifier)' in msg
    assert 'head.fc.weight (checkpoint [1000, 192] vs model [5, 192])' in msg
    assert '2 tensors have another shape' in msg
    assert '--partial-load' in msg
    assert '\n' not in msg  # one line at the door (issue 36)


def test_other_model_loads_nothing(setup):
    msg = _error(setup, 'retinanet')
    assert '0 of its 3 tensors would load' in msg
    assert 'bbox_head.retina_cls.weight' in msg
    assert 'missing from the checkpoint' in msg
    # loading nothing is an error even with the opt-in
    assert '0 of its 3' in _error(setup, 'retinanet', '--partial-load')


def test_other_arch(setup):
    msg = _error(setup, 'other_arch')
    assert 'missing from the checkpoint: backbone.stages.2.blocks.1.' in msg


def test_unconverted_official_checkpoint(setup):
    msg = _error(setup, 'official')
    assert 'official SOFT checkpoint' in msg
    assert 'python tools/model_converters/soft2mmsoft.py' in msg


def test_partial_load_opt_in(setup):
    """Loads the backbone, logs the two skipped head tensors, tests."""
    metrics = _test(setup, 'head1000', '--partial-load', work='partial')
    assert set(metrics) == {'accuracy/top1'}, metrics
    top1 = metrics['accuracy/top1']
    assert top1 in [100.0 * k / 4 for k in range(5)]  # 4 val images
    logs = glob.glob(osp.join(setup[2], 'partial', '*', '*.log'))
    assert len(logs) == 1, logs
    with open(logs[0]) as f:
        log = f.read()
    assert 'partial load (allowed)' in log
    assert 'head.fc.weight (checkpoint [1000, 192] vs model [5, 192])' in log


class FrozenClock:
    """The ``time`` module with a clock that stands still (``time()``)."""

    def __init__(self, t):
        self._t = t

    def __getattr__(self, name):
        return getattr(time, name)

    def time(self):
        return self._t


def _read_logs(tmp, work):
    logs = glob.glob(osp.join(tmp, work, '*', '*.log'))
    assert len(logs) == 1, (work, logs)
    with open(logs[0]) as f:
        return f.read()


def test_runs_within_one_second_log_apart(setup, monkeypatch):
    """Issue 30: mmengine names a run (and its MMLogger, MessageHub,
    Visualizer) ``<config>_<YYYYmmdd_HHMMSS>``; two tool runs of one process
    within the same second shared the logger, and the second run logged
    into the first run's work dir. With the Runner's clock frozen, two
    tools/test.py runs each log into their own work dir
    (mmsoft_tools.launch.name_run)."""
    import mmengine.runner.runner as runner_module
    monkeypatch.setattr(runner_module, 'time', FrozenClock(time.time()))
    _test(setup, 'good', work='second_a')
    _test(setup, 'head1000', '--partial-load', work='second_b')
    tmp = setup[2]
    log_a, log_b = _read_logs(tmp, 'second_a'), _read_logs(tmp, 'second_b')
    assert 'partial load (allowed)' in log_b
    assert 'partial load (allowed)' not in log_a
    assert 'second_b' not in log_a


def test_name_run_is_unique_per_process():
    from mmengine.config import Config

    from mmsoft_tools import launch
    names = []
    for extra in ({}, {}, dict(experiment_name='mine')):
        cfg = Config(
            dict(extra),
            filename=osp.join(CONFIGS, 'retinanet_soft_small_1x.py'))
        names.append(launch.name_run(cfg))
        assert cfg.experiment_name == names[-1]
    assert len(set(names)) == 3, names
    assert all(n.startswith('retinanet_soft_small_1x') for n in names[:2])
    assert names[2].startswith('mine')


@pytest.mark.parametrize('ckpt,problem', [
    ([1, 2], 'it holds a list, not a dict'),
    ({
        'state_dict': {}
    }, 'it has no meta, message_hub'),
    ({
        'state_dict': {},
        'meta': {
            'attn_norm': False
        },
        'message_hub': {}
    }, 'it has no meta.epoch, meta.iter'),
    ({
        'meta': {
            'epoch': 1
        },
        'message_hub': {}
    }, 'it has no meta.iter'),
    ({
        'meta': {}
    }, 'it has no message_hub, meta.epoch, meta.iter'),
    ({
        'meta': {
            'epoch': 1,
            'iter': 9
        },
        'message_hub': {}
    }, None),
])
def test_resume_refusal(ckpt, problem):
    """``--resume`` of a file that lacks what ``Runner.resume`` reads: one
    line naming what is absent and ``load_from`` instead (the tools print
    it: test_chain.py); a training checkpoint: ''."""
    from mmsoft.engine.hooks.strict_load_hook import resume_refusal
    msg = resume_refusal(ckpt, 'w.pth')
    assert msg == ('' if problem is None else (
        f'--resume w.pth: not a training checkpoint ({problem}); --resume '
        'continues a run from an epoch_N.pth / iter_N.pth written by '
        'tools/train.py. To start training from these weights, pass '
        '--cfg-options load_from=w.pth instead'))
