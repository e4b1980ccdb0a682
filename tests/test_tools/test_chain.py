"""The user's chain on real artifacts (issue 27): what one tool writes, the
next one reads. Per task (the demo configs on small synthetic data) a
module-scoped fixture trains a few iterations with ``tools/train.py``; the
tests feed that checkpoint to ``tools/test.py``, the codebase's inferencers
and ``demo/image_demo.py``, ONNX export, the converters; and
``dist_train.sh`` -> ``kill -9`` -> ``--resume`` -> ``dist_test.sh`` on CPU.
"""
import contextlib
import glob
import io
import json
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import textwrap
import time
import types

import pytest
import torch
from conftest import ROOT, child_env, free_port, load_tool, run, run_python
from conftest import tool_namespace as tool
from conftest import work_dir_holder

pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
pytest.importorskip('mmpretrain')

pytestmark = pytest.mark.usefixtures('one_thread')

DEMO_CFGS = osp.join(ROOT, 'configs', 'demo')
DEMO = osp.join(ROOT, 'demo', 'image_demo.py')


def _load(path):
    """A training checkpoint, weights only (mmengine's objects allowed)."""
    from mmsoft.compat import mmengine_checkpoints_allowed
    with mmengine_checkpoints_allowed():
        return torch.load(path, map_location='cpu')


#: the demo configs at 64 x 64 on a few images, a few iterations:
#: task: (demo config, data folder, config body, (loop, n) of SHORT_RUN)
SMALL = {
    'det': ('retinanet_soft_demo.py', 'coco', """
img_size = 64
data_root = {root!r} + '/'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(img_size, img_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs', meta_keys=('img_id', 'img_path', 'ori_shape',
                                          'img_shape', 'scale_factor')),
]
train_dataloader = dict(batch_size=2, dataset=dict(
    data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(batch_size=2, dataset=dict(
    data_root=data_root, pipeline=test_pipeline))
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
model = dict(backbone=dict(pretrain_img_size=img_size),
             test_cfg=dict(score_thr=0.0, max_per_img=20))
""", ('max_epochs', 1)),
    'seg': ('upernet_soft_demo.py', 'ade', """
img_size = 64
crop_size = (img_size, img_size)
data_root = {root!r}
model = dict(data_preprocessor=dict(size=crop_size),
             backbone=dict(pretrain_img_size=img_size))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs'),
]
train_dataloader = dict(batch_size=2, dataset=dict(
    data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(batch_size=2, dataset=dict(data_root=data_root))
""", ('max_iters', 2)),
    'cls': ('soft_cls_demo.py', 'imagenet', """
data_root = {root!r} + '/'
train_dataloader = dict(batch_size=5, dataset=dict(data_root=data_root))
val_dataloader = dict(batch_size=5, dataset=dict(data_root=data_root))
""", ('max_epochs', 1)),
}
#: the end of each SMALL config: a run of ``{n}`` epochs / iterations
#: (SMALL's last entry) that writes one checkpoint, at its end
SHORT_RUN = """test_dataloader = val_dataloader
train_cfg = dict({loop}={n}, val_interval=1000)
param_scheduler = [dict(type='ConstantLR', factor=1.0, by_epoch=False)]
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval={n}, max_keep_ckpts=1))
"""
DENSE = dict(num_train=4, num_val=2, size=64, radius=(6, 16))
DATA = dict(det=DENSE, seg=DENSE, cls=dict(num_train=10, num_val=5))


def small_config(tmp, task):
    """The demo config of ``task`` on freshly generated data in ``tmp``."""
    from mmsoft_tools import demo_synthetic
    base, folder, body, (loop, n) = SMALL[task]
    kw = dict(tasks=(task, ), overrides={task: dict(DATA[task])}, log=None)
    demo_synthetic.make_demo_data(str(tmp / 'data'), workers=1, **kw)
    root = str(tmp / 'data' / folder)
    path = tmp / f'{task}.py'
    path.write_text(f'_base_ = {osp.join(DEMO_CFGS, base)!r}\n' +
                    body.format(root=root) + SHORT_RUN.format(loop=loop, n=n))
    return str(path), root


def train(cfg, work, *extra):
    """``tools/train.py`` (in this process); the checkpoint it wrote."""
    tool('train')['main'](
        [cfg, '--work-dir', work, '--cfg-options', 'randomness.seed=0'] +
        list(extra))
    with open(osp.join(work, 'last_checkpoint')) as f:
        return f.read().strip()


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    """``trained(task)``: the task's config, data root, validation images,
    work dir and checkpoint of tools/train.py, once per module."""
    done = {}

    def get(task):
        if task not in done:
            tmp = tmp_path_factory.mktemp(f'chain_{task}')
            cfg, root = small_config(tmp, task)
            sub = 'images/validation' if task == 'seg' else 'val'
            work = str(tmp / 'work')
            done[task] = types.SimpleNamespace(
                cfg=cfg,
                root=root,
                val_images=osp.join(root, sub),
                work=work,
                ckpt=train(cfg, work))
        return done[task]

    return get


# ------------------------------------------------------------ the chain
def test_train_writes_a_full_training_checkpoint(trained):
    """What the next tools get: mmengine's message hub (HistoryBuffer,
    numpy), the optimizer, mmsoft's RNG states; undamaged (zip CRC-32)."""
    t = trained('det')
    ckpt = _load(t.ckpt)
    assert {'meta', 'state_dict', 'message_hub', 'optimizer'} <= set(ckpt)
    assert 'mmsoft_rng' in ckpt['meta']
    # what loading.check_attn_norm reads (the det demo: attn_norm=True)
    assert ckpt['meta']['mmsoft_attn_norm'] == [True]
    from mmsoft.utils.checkpoint_io import describe_damage
    assert describe_damage(t.ckpt) is None
    # the lock of the finished run is gone
    assert not osp.exists(osp.join(t.work, '.mmsoft-train.lock'))


@pytest.mark.parametrize('task,keys', [
    ('det', ['coco/bbox_mAP', 'coco/bbox_mAP_50']),
    ('seg', ['mIoU', 'aAcc']),
    ('cls', ['accuracy/top1']),
])
def test_test_tool_on_trained_checkpoint(trained, task, keys, tmp_path):
    t = trained(task)
    work = str(tmp_path / 'test')
    metrics = tool('test')['main']([t.cfg, t.ckpt, '--work-dir', work])
    assert set(keys) <= set(metrics), sorted(metrics)


#: the codebase's Python API, in a fresh interpreter, with nothing of
#: mmsoft imported but its allow-list context and what the config's
#: custom_imports imports
API = {
    'det':
    """
from mmdet.apis import DetInferencer, inference_detector, init_detector
res = DetInferencer(model=CFG, weights=CKPT, device='cpu')(IMG)
out['n'] = len(res['predictions'][0]['scores'])
model = init_detector(CFG, CKPT, device='cpu')
res = inference_detector(model, IMG)
out['boxes'] = tuple(res.pred_instances.bboxes.shape)
""",
    'seg':
    """
from mmseg.apis import MMSegInferencer, inference_model, init_model
res = MMSegInferencer(model=CFG, weights=CKPT, device='cpu')(IMG)
out['n'] = int(res['predictions'].size)
model = init_model(CFG, CKPT, device='cpu')
out['boxes'] = tuple(inference_model(model, IMG).pred_sem_seg.data.shape)
""",
    'cls':
    """
from mmpretrain import ImageClassificationInferencer
res = ImageClassificationInferencer(CFG, pretrained=CKPT, device='cpu')(IMG)
out['n'] = len(res[0]['pred_scores'])
""",
}


@pytest.mark.parametrize('task', ['det', 'seg', 'cls'])
def test_inferencer_api_and_image_demo(trained, task, tmp_path):
    """Issue 27 (1): the inferencers load a tools/train.py checkpoint inside
    mmsoft's allow-list context (``import mmsoft`` widens nothing, issue
    50); then demo/image_demo.py on the validation folder."""
    t = trained(task)
    imgs = sorted(
        glob.glob(osp.join(t.val_images, '**', '*.*'), recursive=True))
    imgs = [i for i in imgs if i.endswith(('.jpg', '.png', '.JPEG'))]
    out_dir = str(tmp_path / 'demo')
    code = textwrap.dedent(f"""
        import json, runpy, sys
        CFG, CKPT, IMG = {t.cfg!r}, {t.ckpt!r}, {imgs[0]!r}
        out = {{'mmsoft_before': 'mmsoft' in sys.modules}}
        from mmsoft.compat import mmengine_checkpoints_allowed
        with mmengine_checkpoints_allowed():  # a training run's checkpoint
    """) + textwrap.indent(textwrap.dedent(API[task]), '    ') + \
        textwrap.dedent(f"""
        print('API ' + json.dumps(out), flush=True)
        sys.argv = ['image_demo.py', {t.val_images!r}, CFG, CKPT,
                    '--out-dir', {out_dir!r}, '--device', 'cpu']
        try:
            runpy.run_path({DEMO!r}, run_name='__main__')
        except SystemExit as e:
            assert not e.code, e.code
    """)
    res = run_python(code, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    found = re.search(r'API (\{.*?\})\n', res.stdout)
    assert found, res.stdout[-3000:]
    out = json.loads(found.group(1))
    assert out['mmsoft_before'] is False and out['n'] > 0, out
    preds = glob.glob(
        osp.join(out_dir, 'preds', '**', '*.json'), recursive=True)
    assert len(preds) == len(imgs), (preds, imgs)
    with open(preds[0]) as f:
        assert json.load(f)['checkpoint'] == t.ckpt


@pytest.mark.parametrize('task', ['det', 'seg', 'cls'])
def test_onnx_export_verify(trained, task, tmp_path, capsys):
    pytest.importorskip('onnx')
    pytest.importorskip('onnxruntime')
    t = trained(task)
    out = str(tmp_path / f'{task}.onnx')
    rc = load_tool('deployment/pytorch2onnx.py').main(
        [t.cfg, t.ckpt, '--shape', '64', '64', '--out', out, '--verify'])
    text = capsys.readouterr().out
    assert rc == 0, text
    assert 'verify: max relative error' in text and 'PASS' in text
    assert osp.isfile(out)


def _convert(script, *args):
    return load_tool(f'model_converters/{script}.py').main(list(args))


def _stop_line(name, argv):
    """The line ``tools/<name>.py`` stops with (``run_main``: exit 1)."""
    from mmsoft_tools.cli import run_main
    err = io.StringIO()
    with pytest.raises(SystemExit) as e, contextlib.redirect_stderr(err):
        run_main(tool(name)['main'], argv)
    if isinstance(e.value.code, str):  # sys.exit('error: ...')
        return e.value.code
    assert e.value.code == 1, err.getvalue()
    return [ln for ln in err.getvalue().splitlines() if ln.strip()][-1]


def test_converters_both_ways_classifier(trained, tmp_path, capsys):
    """Trained -> official -> mmsoft: the same tensors and metric; a --norm
    conversion is refused under the soft_* config, naming both (item 4)."""
    t = trained('cls')
    official = str(tmp_path / 'official.pth')
    back = str(tmp_path / 'back.pth')
    assert _convert('mmsoft2soft', t.ckpt, official) == 0
    assert _convert('soft2mmsoft', official, back) == 0
    capsys.readouterr()
    trained_sd = _load(t.ckpt)['state_dict']
    back_ckpt = _load(back)
    assert back_ckpt['meta']['attn_norm'] is False
    sd = back_ckpt['state_dict']
    assert set(sd) == set(trained_sd)
    assert all(torch.equal(sd[k], trained_sd[k]) for k in sd)
    test = tool('test')['main']
    m1 = test([t.cfg, t.ckpt, '--work-dir', str(tmp_path / 'w1')])
    m2 = test([t.cfg, back, '--work-dir', str(tmp_path / 'w2')])
    assert m1 == m2

    norm = str(tmp_path / 'norm.pth')
    assert _convert('soft2mmsoft', official, norm, '--norm') == 0
    msg = _stop_line('test', [t.cfg, norm, '--work-dir', str(tmp_path / 'w3')])
    assert msg.startswith(f'error: checkpoint {norm} holds soft_norm_* '
                          f'weights (converted with attn_norm=True'), msg
    assert f'but the model of {t.cfg} has attn_norm=False' in msg, msg
    assert 'model.backbone.attn_cfg.attn_norm=True' in msg
    assert len(msg.splitlines()) == 1


@pytest.mark.parametrize('task', ['det', 'seg'])
def test_converter_refuses_dense_checkpoint(trained, task, tmp_path, capsys):
    """A detector / segmentor checkpoint: one line, nothing written."""
    t = trained(task)
    out = str(tmp_path / 'official.pth')
    assert _convert('mmsoft2soft', t.ckpt, out) == 1
    err = capsys.readouterr().err
    assert err.startswith('error: the mmsoft checkpoint has keys with no '
                          'official counterpart'), err
    assert 'Traceback' not in err and not osp.exists(out)


# --------------------------------------- dist_train -> kill -> resume
def _wait_for(path, proc, timeout):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if osp.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.5)
    return False


def _process_tree(pid):
    """``pid`` and all its descendants (from /proc), parents first."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in glob.glob(f'/proc/{p}/task/*/children'):
            try:
                with open(task) as f:
                    todo += [int(c) for c in f.read().split()]
            except OSError:
                pass
    return out


def _launch(script, *args):
    """``tools/<script>.sh args`` on a free port; its output (exit 0)."""
    res = run(['bash', f'tools/{script}.sh', *args], PORT=str(free_port()))
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    return out


def test_dist_train_kill_resume_dist_test(tmp_path):
    """2 CPU processes (test_train_test's ``seg_config``) SIGKILLed after the
    first checkpoint; ``--resume`` takes over the dead run's lock and ends
    bit-identical to an uninterrupted run (each rank's RNG restored, with
    diff_rank_seed); ``tools/dist_test.sh`` evaluates it."""
    from test_train_test import make_ade, seg_config
    data = make_ade(str(tmp_path / 'ade' / 'ADEChallengeData2016'))
    cfg = seg_config(tmp_path, data)
    work = str(tmp_path / 'work')
    seed = ['randomness.seed=0', 'randomness.diff_rank_seed=True']
    cmd = [
        'bash', 'tools/dist_train.sh', cfg, '2', '--work-dir', work,
        '--cfg-options', *seed, 'train_cfg.max_iters=40'
    ]
    log = str(tmp_path / 'dist_train.log')
    # a launch that dies before its first checkpoint (seen once in ~6 runs
    # on a loaded 2-core machine, e.g. a rendezvous port taken between
    # free_port() and torchrun's bind) is retried once on a new port; the
    # failure message carries the launcher's output
    for attempt in range(2):
        with open(log, 'w') as out:
            proc = subprocess.Popen(
                cmd,
                cwd=ROOT,
                env=child_env(PORT=str(free_port())),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True)
        started = _wait_for(osp.join(work, 'iter_2.pth'), proc, 400)
        if started or proc.poll() is None or attempt == 1:
            break
        shutil.rmtree(work, ignore_errors=True)
    try:
        assert started, 'no checkpoint written:\n' + open(log).read()[-3000:]
        time.sleep(0.5)
    finally:
        # the launcher and its workers (torchrun starts each worker in a
        # session of its own: a killpg would leave them running)
        for pid in _process_tree(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    out = open(log).read()
    assert "backend 'nccl' -> 'gloo'" in out  # SyncBN and nccl on the CPU
    assert 'Distributed training: True' in out and 'GPU number: 2' in out
    # tools/train.py made the hook mmsoft's: both ranks' RNG states saved
    import mmsoft  # noqa: F401  (allow-lists mmengine checkpoints)
    rng = _load(osp.join(work, 'iter_2.pth'))['meta']['mmsoft_rng']
    assert rng['world_size'] == 2 and len(rng['states']) == 2
    lock = osp.join(work, '.mmsoft-train.lock')
    assert osp.exists(lock)  # left behind by the killed rank 0
    done = sorted(
        int(osp.basename(p)[5:-4])
        for p in glob.glob(osp.join(work, 'iter_*.pth')))
    assert done and done[-1] < 40
    end = done[-1] + 2
    out = _launch('dist_train', cfg, '2', '--work-dir', work, '--resume',
                  '--cfg-options', f'train_cfg.max_iters={end}')
    assert 'taking over the work dir lock of a run that is gone' in out
    assert 'resumed' in out.lower()
    assert re.search(rf'Iter\(train\) \[\s*{done[-1] + 1}/{end}\]',
                     out), out[-3000:]
    assert 'Iter(train) [1/' not in out
    ckpt = osp.join(work, f'iter_{end}.pth')
    assert osp.isfile(ckpt) and not osp.exists(lock)
    # the uninterrupted run to the same iteration
    ref = str(tmp_path / 'ref')
    out = _launch('dist_train', cfg, '2', '--work-dir', ref, '--cfg-options',
                  *seed, f'train_cfg.max_iters={end}')
    assert f'Iter(train) [{end}/{end}]' in out
    resumed = _load(ckpt)['state_dict']
    uninterrupted = _load(osp.join(ref, f'iter_{end}.pth'))['state_dict']
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in resumed)
    out = _launch('dist_test', cfg, ckpt, '2', '--work-dir', tmp_path / 'test')
    assert 'per class results' in out and re.search(r'\|\s+wall\s+\|', out)
    assert re.search(r'mIoU: \d', out), out[-3000:]


# ----------------------------------------------- strict loads in train
def test_load_from_other_arch_fails_partial_opt_in(trained, tmp_path, capsys):
    """Item 2: load_from of another model stops (was: trained from random
    weights, exit 0); a headless classifier loads with --partial-load."""
    det, cls = trained('det'), trained('cls')
    work = str(tmp_path / 'w')
    msg = _stop_line('train', [
        cls.cfg, '--work-dir', work, '--cfg-options', f'load_from={det.ckpt}'
    ])
    assert msg.startswith(f'error: checkpoint {det.ckpt} does not match the '
                          f'model (ImageClassifier)'), msg
    assert not glob.glob(osp.join(work, 'epoch_*.pth'))
    # a classifier without its head: partial with --partial-load
    sd = _load(cls.ckpt)['state_dict']
    headless = str(tmp_path / 'headless.pth')
    sd = {k: v for k, v in sd.items() if not k.startswith('head.')}
    torch.save({'state_dict': sd}, headless)
    assert 'pass --partial-load' in _stop_line('train', [
        cls.cfg, '--work-dir', work, '--cfg-options', f'load_from={headless}'
    ])
    part = str(tmp_path / 'part')
    train(cls.cfg, part, f'load_from={headless}', '--partial-load')
    logs = glob.glob(osp.join(part, '*', '*.log'))
    log = ''.join(open(p).read() for p in logs)
    assert 'partial load (allowed)' in log and 'head.fc.weight' in log


def test_resume_from_weights_only_file_is_refused_first(trained, tmp_path):
    """Item 2: ``--resume`` of a weights-only file: one line from the
    config's StrictLoadHook before anything is trained or saved."""
    cls = trained('cls')
    weights = str(tmp_path / 'weights.pth')
    sd = _load(cls.ckpt)['state_dict']
    torch.save({'state_dict': sd, 'meta': {'attn_norm': False}}, weights)
    work = str(tmp_path / 'w')
    msg = _stop_line('train',
                     [cls.cfg, '--work-dir', work, '--resume', weights])
    assert msg == (
        f'error: --resume {weights}: not a training checkpoint (it has no '
        f'message_hub, meta.epoch, meta.iter); --resume continues a run from '
        f'an epoch_N.pth / iter_N.pth written by tools/train.py. To start '
        f'training from these weights, pass --cfg-options '
        f'load_from={weights} instead')
    assert not glob.glob(osp.join(work, '*.pth'))


def test_second_run_in_work_dir_is_refused(trained, tmp_path):
    """Item 3: a second run in a live run's work dir: one line naming the
    holder (pid, host) and the fix; nothing of the first run touched."""
    import socket
    cls = trained('cls')
    work = str(tmp_path / 'w')
    with work_dir_holder(work) as holder:
        before = sorted(os.listdir(work))
        msg = _stop_line('train', [cls.cfg, '--work-dir', work])
        assert msg.startswith(
            f'error: work dir {work} is in use by another training run (pid '
            f'{holder.pid} on host {socket.gethostname()}, started '), msg
        assert 'pass another --work-dir' in msg and len(msg.splitlines()) == 1
        assert sorted(os.listdir(work)) == before
    # the holder is gone (killed): its lock no longer blocks
    ckpt = train(cls.cfg, work)
    assert osp.isfile(ckpt)
