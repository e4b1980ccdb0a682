"""Issue 13: ``tools/test.py`` refuses a checkpoint that does not match the
config's model unless ``--partial-load``; the tools' one-line faults. The
checkpoints' constant head (one class for every image) fixes the top-1."""
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
    """A tiny 5-class demo classifier config, its data and checkpoints:
    ``trained`` (as tools/train.py writes it: SafeCheckpointHook records the
    demo config's attn_norm False), ``head1000`` (another head),
    ``headless``."""
    tmp = tmp_path_factory.mktemp('strict_tools')
    cfg = cls_demo_config(tmp, val=4, test=4)
    sd = random_model(cfg).state_dict()
    sd['head.fc.weight'] = torch.zeros_like(sd['head.fc.weight'])
    sd['head.fc.bias'] = torch.nn.functional.one_hot(  # the first val label
        torch.tensor(val_labels(tmp)[0]), 5).float() * 10
    ckpts = {n: str(tmp / f'{n}.pth') for n in ('trained', 'head1000')}
    ckpts['headless'] = str(tmp / 'headless.pth')
    torch.save(dict(state_dict=sd, meta=dict(mmsoft_attn_norm=[False])),
               ckpts['trained'])  # yapf: disable
    big = dict(sd)
    big.update({'head.fc.weight': torch.zeros(1000, 192),
                'head.fc.bias': torch.zeros(1000)})  # yapf: disable
    torch.save(dict(state_dict=big, meta={}), ckpts['head1000'])
    torch.save({'state_dict': {k: v for k, v in sd.items()
                               if not k.startswith('head.')}},
               ckpts['headless'])  # yapf: disable
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


def _test(setup, name, *extra, work='work'):
    cfg, ckpts, tmp, _ = setup
    return tool_namespace('test')['main'](
        [cfg, ckpts[name], '--work-dir',
         str(tmp / work), *extra])


def _log(tmp, work):
    logs = glob.glob(osp.join(tmp, work, '*', '*.log'))
    assert len(logs) == 1, (work, logs)
    return open(logs[0]).read()


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
    out, labels = str(tmp / 'trained_preds.pkl'), val_labels(tmp)
    metrics = _test(setup, 'trained', '--out', out, work='second_a')
    assert metrics == {
        'accuracy/top1':
        pytest.approx(100.0 * labels.count(labels[0]) / len(labels))
    }
    with open(out, 'rb') as f:
        preds = pickle.load(f)
    assert [int(p['gt_label']) for p in preds] == labels
    bias = torch.load(setup[1]['trained'])['state_dict']['head.fc.bias']
    for p in preds:
        torch.testing.assert_close(p['pred_score'], bias.softmax(0))
    metrics = _test(setup, 'head1000', '--partial-load', work='second_b')
    assert set(metrics) == {'accuracy/top1'}, metrics
    assert metrics['accuracy/top1'] in [25.0 * k for k in range(5)]  # 4 images
    log_a, log = _log(tmp, 'second_a'), _log(tmp, 'second_b')
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
    "error: checkpoint '{tmp}/no_such_dir/epoch_12.pth' not found: give the "
    'path of a trained model (work_dirs/<config>/epoch_N.pth or iter_N.pth); '
    "mmsoft releases no trained weights (the authors' ImageNet classifiers, "
    'converted: docs/en/user_guides/official_weights.md)')
NO_CKPT = '{tmp}/no_such_dir/epoch_12.pth'
#: (id, tool, arguments (split; placeholders: setup's names, {tmp}), parts
#: of the one line: 'error: ...' the start, else contained); the attn_norm
#: record (issue 36 (4)): test_faults.py's test-norm-weights
FAULTS = [
    ('head', 'test', '{cfg} {head1000}', [
        'error: checkpoint {head1000} does not match the model '
        '(ImageClassifier)', '--partial-load',
        'head.fc.weight (checkpoint [1000, 192] vs model [5, 192])',
        '2 tensors have another shape'
    ]),
    # tools/train.py (--partial-load training: test_chain.py)
    ('load-from-headless', 'train', '{cfg} --cfg-options load_from='
     '{headless}', [
         'error: checkpoint {headless} does not match the model '
         '(ImageClassifier)', 'pass --partial-load'
     ]),
    # before the config is loaded or any worker starts; no model zoo
    # (issue 51): the authors' ImageNet files are on the official page
    ('missing-checkpoint', 'test', '{cfg} ' + NO_CKPT, [NOT_FOUND]),
    ('missing-checkpoint-dist', 'dist_test.sh', f'{CONFIG} {NO_CKPT} 8',
     [NOT_FOUND]),
    ('missing-checkpoint-slurm', 'slurm_test.sh',
     f'part job {CONFIG} {NO_CKPT}', [NOT_FOUND]),
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
    test_strict_load.py); nothing tested, nothing in the work dir; the
    launchers (.sh): their own line alone, before any worker starts."""
    from mmengine.runner import Runner

    from mmsoft_tools.cli import run_main
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    (tmp_path / 'a_file').write_text('x')
    (tmp_path / 'a_dir.pkl').mkdir()
    if name.startswith('out-'):  # refused before the inference
        monkeypatch.setattr(Runner, 'test', lambda self: 1 / 0)
    names = dict(setup[1], cfg=setup[0], tmp=tmp_path, missing=setup[3])
    work = tmp_path / 'work'
    argv = [a.format(**names) for a in args.split()] + ['--work-dir', work]
    if script.endswith('.sh'):
        proc = run(['bash', osp.join(TOOLS, script), *map(str, argv)],
                   timeout=300)
        out, err, msg = proc.stdout, proc.stderr, proc.stderr.strip()
        assert proc.returncode == 1, err
    else:
        with pytest.raises(SystemExit) as exc:
            run_main(tool_namespace(script)['main'], [str(a) for a in argv])
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
    if name.startswith('missing-checkpoint'):
        assert msg == NOT_FOUND.format(**names)
        assert out == '' and not osp.exists(work)
