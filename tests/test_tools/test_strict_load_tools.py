"""Issue 13: ``tools/test.py`` refuses a checkpoint that does not match the
config's model unless ``--partial-load``; the tools' fault table (one line,
exit 1). The tested checkpoints carry a constant head (one class for every
image): the expected top-1 follows from the labels alone and shows the
checkpoint's weights were tested."""
import errno
import glob
import os
import os.path as osp
import pickle
import time
import types

import pytest
import torch
from conftest import TOOLS, cls_demo_config, random_model, run, tool_namespace

from mmsoft.models.loading import missing_weights_message

pytest.importorskip('mmpretrain')
CONFIG = 'configs/upernet_soft_small_512x512_160k_ade20k.py'


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    """A tiny 5-class demo classifier config, its data and checkpoints."""
    tmp = tmp_path_factory.mktemp('strict_tools')
    cfg = cls_demo_config(tmp, val=4, test=4)
    sd = random_model(cfg).state_dict()
    # a constant classifier: always the class of the first val image
    sd['head.fc.weight'] = torch.zeros_like(sd['head.fc.weight'])
    sd['head.fc.bias'] = torch.nn.functional.one_hot(
        torch.tensor(val_labels(tmp)[0]), 5).float() * 10
    head1000 = dict(sd)
    head1000.update({
        'head.fc.weight': torch.zeros(1000, 192),
        'head.fc.bias': torch.zeros(1000)
    })
    ckpts = {
        name: str(tmp / f'{name}.pth')
        for name in ('trained', 'head1000')
    }
    # trained: a checkpoint of tools/train.py (SafeCheckpointHook records
    # the model's attn_norm: the demo config's False; test_chain checks it)
    torch.save(
        dict(state_dict=sd, meta=dict(mmsoft_attn_norm=[False])),
        ckpts['trained'])
    torch.save(dict(state_dict=head1000, meta={}), ckpts['head1000'])
    missing = tmp / 'missing.py'  # an ImageNet file not downloaded
    missing.write_text(
        f'_base_ = {cfg!r}\n'
        "model = dict(backbone=dict(init_cfg=dict(_delete_=True, "
        "type='Pretrained', prefix='backbone.', "
        "checkpoint='checkpoints/soft_norm_small.pth')))\n")
    return cfg, ckpts, tmp, str(missing)


def val_labels(tmp):
    """The labels of the demo val split (``meta/val.txt``: file label)."""
    with open(tmp / 'data' / 'imagenet' / 'meta' / 'val.txt') as f:
        return [int(line.split()[1]) for line in f if line.strip()]


def expected_top1(tmp):
    """Top-1 (%) of the constant classifier of :func:`setup`."""
    labels = val_labels(tmp)
    return 100.0 * labels.count(labels[0]) / len(labels)


def _test(setup, name, *extra, work='work'):
    cfg, ckpts, tmp, _ = setup
    main = tool_namespace('test')['main']
    return main([cfg, ckpts[name], '--work-dir', str(tmp / work), *extra])


def _read_logs(tmp, work):
    logs = glob.glob(osp.join(tmp, work, '*', '*.log'))
    assert len(logs) == 1, (work, logs)
    with open(logs[0]) as f:
        return f.read()


def test_partial_load_opt_in(setup, monkeypatch):
    """A matching checkpoint is tested (its constant head scored every
    image); ``--partial-load`` loads the backbone, logs the two skipped head
    tensors, tests. Issue 30: two runs of one process in the same second
    (mmengine's run name ``<config>_<YYYYmmdd_HHMMSS>``) shared the logger;
    with the Runner's clock frozen each logs into its own work dir."""
    import mmengine.runner.runner as runner_module
    now = time.time()
    monkeypatch.setattr(
        runner_module, 'time',
        types.SimpleNamespace(**{
            **vars(time), 'time': lambda: now
        }))
    tmp = setup[2]
    out = str(tmp / 'trained_preds.pkl')
    metrics = _test(setup, 'trained', '--out', out, work='second_a')
    assert metrics == {'accuracy/top1': pytest.approx(expected_top1(tmp))}
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert [int(p['gt_label']) for p in preds] == val_labels(tmp)
    bias = torch.load(setup[1]['trained'])['state_dict']['head.fc.bias']
    for p in preds:
        torch.testing.assert_close(p['pred_score'], bias.softmax(0))
    metrics = _test(setup, 'head1000', '--partial-load', work='second_b')
    assert set(metrics) == {'accuracy/top1'}, metrics
    assert metrics['accuracy/top1'] in [25.0 * k for k in range(5)]  # 4 images
    log_a, log = _read_logs(tmp, 'second_a'), _read_logs(tmp, 'second_b')
    assert 'partial load (allowed)' in log
    assert 'head.fc.weight (checkpoint [1000, 192] vs model [5, 192])' in log
    assert 'partial load (allowed)' not in log_a and 'second_b' not in log_a


def test_out_is_written_atomically(setup, monkeypatch):
    """Issue 36 (3): a full disk while dumping keeps an existing ``--out``
    (it was truncated); no temporary file is left."""
    import mmengine.evaluator.metric as metric
    out = setup[2] / 'kept' / 'preds.pkl'
    out.parent.mkdir()
    out.write_bytes(b'earlier results')

    def full_disk(obj, path, **kwargs):
        with open(path, 'wb') as f:
            f.write(b'partial')
        raise OSError(errno.ENOSPC, 'No space left on device')

    monkeypatch.setattr(metric, 'dump', full_disk)
    with pytest.raises(OSError, match='No space left'):
        _test(setup, 'trained', '--out', str(out))
    assert out.read_bytes() == b'earlier results'
    assert os.listdir(out.parent) == ['preds.pkl']


NOT_FOUND = (
    "error: checkpoint '{}' not found: give the path of a trained model "
    '(work_dirs/<config>/epoch_N.pth or iter_N.pth); mmsoft releases no '
    "trained weights (the authors' ImageNet classifiers, converted: "
    'docs/en/user_guides/official_weights.md)')
#: (id, tool, arguments (split; placeholders: setup's names, {tmp}), parts
#: of the one line: 'error: ...' the start, else contained)
FAULTS = [
    ('head', 'test', '{cfg} {head1000}', [
        'error: checkpoint {head1000} does not match the model '
        '(ImageClassifier)', '--partial-load',
        'head.fc.weight (checkpoint [1000, 192] vs model [5, 192])',
        '2 tensors have another shape'
    ]),
    # attn_norm (issue 36 (4)): test_faults.py's test-norm-weights
    # before the config is loaded or any worker starts; no model zoo
    # (issue 51): the authors' ImageNet files are on the official page
    ('missing-checkpoint', 'test', '{cfg} {tmp}/no_such_dir/epoch_12.pth',
     [NOT_FOUND.format('{tmp}/no_such_dir/epoch_12.pth')]),
    # issue 36 (3): --out that cannot be written: before the inference
    ('out-under-a-file', 'test', '{cfg} {trained} --out {tmp}/a_file/p.pkl',
     ['error: --out {tmp}/a_file/p.pkl: ', 'is a file, not a directory']),
    ('out-is-a-folder', 'test', '{cfg} {trained} --out {tmp}/a_dir.pkl',
     ['error: --out {tmp}/a_dir.pkl: ', 'is a directory; give a file name']),
    # the backbone's own initialiser, as mmdet's tools/train.py shows it
    ('missing-imagenet-file', 'train', '{missing}',
     ['error: ' + missing_weights_message('checkpoints/soft_norm_small.pth')]),
]


@pytest.mark.parametrize(
    'name, script, args, parts', FAULTS, ids=[f[0] for f in FAULTS])
def test_fault_stops_with_one_line(setup, tmp_path, monkeypatch, capsys, name,
                                   script, args, parts):
    """Exit 1 and one line (the other templates: tests/test_utils/
    test_strict_load.py); nothing tested, nothing in the work dir."""
    from mmengine.runner import Runner

    from mmsoft_tools.cli import run_main
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    (tmp_path / 'a_file').write_text('x')
    (tmp_path / 'a_dir.pkl').mkdir()
    if name.startswith('out-'):  # refused before the inference
        monkeypatch.setattr(Runner, 'test', lambda self: 1 / 0)
    names = dict(setup[1], cfg=setup[0], tmp=tmp_path, missing=setup[3])
    argv = [a.format(**names) for a in args.split()]
    work = tmp_path / 'work'
    with pytest.raises(SystemExit) as exc:
        run_main(
            tool_namespace(script)['main'],
            argv + ['--work-dir', str(work)])
    msg = exc.value.code  # sys.exit('error: ...') of the pre-flight
    out, err = capsys.readouterr()
    if not isinstance(msg, str):
        assert msg == 1, err
        msg = [ln for ln in err.splitlines() if ln.strip()][-1]
    assert '\n' not in msg and 'Traceback' not in err, err
    for part in (p.format(**names) for p in parts):
        assert msg.startswith(part) if part.startswith('error: ') else \
            part in msg, msg
    assert not glob.glob(str(work / '**' / '*.pth'), recursive=True)
    if name == 'missing-checkpoint':
        assert out == '' and not osp.exists(work)


@pytest.mark.parametrize('tool', ['dist_test.sh', 'slurm_test.sh'])
def test_shell_tools_stop_on_a_missing_checkpoint(tool, tmp_path):
    """The launchers' own line, before any worker starts."""
    ckpt, work = str(tmp_path / 'no_such_dir' / 'epoch_12.pth'), tmp_path / 'w'
    part = ['part', 'job'] if tool == 'slurm_test.sh' else []
    args = [CONFIG, ckpt, '8'] if tool == 'dist_test.sh' else [CONFIG, ckpt]
    proc = run(
        ['bash',
         osp.join(TOOLS, tool), *part, *args, '--work-dir',
         str(work)],
        timeout=300)
    assert proc.returncode == 1 and proc.stdout == '' and not osp.exists(work)
    assert proc.stderr.strip() == NOT_FOUND.format(ckpt)
