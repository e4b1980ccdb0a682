"""The fault table of issues 36 / 52: each row runs a tool as a user does
(conftest's ``script_server``; ``.sh`` through bash) on the classifier demo
config on tiny data: exit non-zero, stderr's last lines the row's message
(``<...>``: any text), nothing written; our doors print the message alone,
the host tools (``<codebase>/.mim/tools``) stop through the configs' hooks."""
import contextlib
import importlib.util
import inspect
import os
import os.path as osp
import re
import shutil

import pytest
import torch
from conftest import (CONFIGS, ROOT, child_env, cls_demo_config, load_tool,
                      random_model, run, tiny_demo_data, work_dir_holder)

for _codebase in ('mmpretrain', 'mmdet', 'mmseg'):
    pytest.importorskip(_codebase)

# the messages several rows share
SYNTAX = 'error: config <file>:<line>: syntax error: <what>'
PORT = 'error: <script>: PORT=<port> is in use on this machine'
TYPO = 'error: --cfg-options <key>: the config has no key <name> under <key>;'
IS_DIR = 'error: checkpoint <path> is a directory, not a file; pass a .pth ' \
    'checkpoint file (e.g. <work_dir>/epoch_N.pth)'
DAMAGED = 'error: checkpoint <path> is truncated or corrupt <...>; it was ' \
    'not loaded (use an earlier or a fresh copy)'
OFFLINE = 'error: checkpoint <url> cannot be downloaded'
FULL = 'error: <path> (not replaced): No space left on device (errno 28 ' \
    'ENOSPC); free some space or write somewhere else'
LIST = '<file> [<key>]: cannot be loaded: <error>'  # the data check's line
OTHER = 'error: checkpoint <path> does not match the model'
#: the data check's heading, its lines below it
DATA = 'mmsoft: damaged data (fix or remove these files, or set ' \
    'MMSOFT_SKIP_DATA_CHECK=1):\n'


def no_data(mode, split):
    """The data check's message: ``data_root=no_data`` (relative) of the
    ``mode`` dataloader (``split``: its ImageNet folder)."""
    purpose = dict(train='training', test='testing')[mode]
    return (f'mmsoft: data for {purpose} not found: no_data (relative to the '
            'current directory <cwd>) [{mode}_dataloader.dataset.data_root]\n'
            '  expected ImageNet layout: no_data/{{{{{split}/}}}}\n'
            '  link your copy there: ln -s /path/to/no_data no_data\n'
            '  or point the config at it: --cfg-options '
            '{mode}_dataloader.dataset.data_root=/path/to/no_data\n'
            '  (see docs/en/user_guides/data_preparation.md)').format(
                mode=mode, split=split)


MISMATCH = 'mmsoft.utils.strict_load.CheckpointMismatchError: '


def authors(model):
    """The line of the authors' file: the converter command closes it."""
    return (
        'checkpoint {official} does not match the model (%s): 0 of its 1 '
        'tensors would load (none: a checkpoint of another model?). <n> of '
        "the model's <n> tensors are missing from the checkpoint: <keys>; 1 "
        "of the checkpoint's 1 tensors are not in the model (unexpected): "
        'model. {official} is an official SOFT checkpoint (fudan-zvg/SOFT key'
        " layout, e.g. 'pos_embed1'); convert it first: python "
        'tools/model_converters/soft2mmsoft.py {official} '
        'weights/official.pth [--norm for soft_norm_* weights], and load the '
        'converted file (the SOFT backbone alone reads it directly: '
        "init_cfg=dict(type='Pretrained', checkpoint={official})).") % model


#: (id, tool, arguments (split at spaces, then formatted), message (None:
#: exit 0), what ran: 'nothing' (no Runner run dir, no checkpoint),
#: 'runner' (the Runner was built, no checkpoint written) or, exit 0, a text
#: of the output). tool: a door's file name or a host tool
#: ``<codebase>/<name>``. Placeholders: :func:`files`' names, {work} (the
#: row's work dir), {out} (an existing result file), {shared} (a checkpoint
#: out_dir; :func:`_prepare` fills it)
W = '{cfg} --work-dir {work} '
OPT = W + '--cfg-options '
INIT = (
    OPT + 'model.backbone.init_cfg._delete_=True '
    'model.backbone.init_cfg.type=Pretrained ')
CASES = [
    # tools/train.py
    ('train-config-missing', 'train.py', 'configs/no_such_config.py',
     'error: configs/no_such_config.py: No such file or directory (errno 2 '
     'ENOENT); check the path', 'nothing'),
    ('train-cfg-typo', 'train.py', OPT + 'train_cfg.max_epoch=1', TYPO,
     'nothing'),
    ('train-config-syntax-in-base', 'train.py',
     '{syntax_child} --work-dir {work}', SYNTAX, 'nothing'),
    ('train-cfg-options-dict', 'train.py',
     OPT + 'model.head.loss=dict(type=CrossEntropyLoss,loss_weight=1.0)',
     'error: --cfg-options <key>=<value>: a dict is no --cfg-options '
     'value', 'nothing'),
    ('train-amp-optim-wrapper-no-gpu', 'train.py',
     OPT + 'optim_wrapper.type=AmpOptimWrapper',
     'error: optim_wrapper.type=AmpOptimWrapper (mmengine\'s fp16 AMP) '
     'needs a GPU', 'nothing'),
    ('train-launcher-without-torchrun', 'train.py', W + '--launcher pytorch',
     'error: --launcher pytorch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT '
     'not set (the process was not started by torchrun)', 'nothing'),
    ('train-work-dir-file', 'train.py', '{cfg} --work-dir {file}',
     'error: --work-dir <path>: exists and is not a directory; give a '
     'directory (it is created if needed)', 'nothing'),
    ('train-work-dir-read-only', 'train.py', '{cfg} --work-dir {ro}',
     'error: --work-dir <path>: cannot write there', 'nothing'),
    ('train-work-dir-in-use', 'train.py', W,
     'error: work dir {work} is in use by another training run (pid <pid> '
     'on host <host>, started <when>; lock file {work}/.mmsoft-train.lock): '
     "two runs in one work dir overwrite and delete each other's checkpoints."
     ' Wait for it to finish, or pass another --work-dir; if that run is '
     'gone, remove {work}/.mmsoft-train.lock', 'nothing'),
    ('train-init-cfg-directory', 'train.py',
     INIT + 'model.backbone.init_cfg.checkpoint={dir}',
     IS_DIR + ' [model.backbone.init_cfg.checkpoint]', 'nothing'),
    ('train-missing-data', 'train.py',
     OPT + 'train_dataloader.dataset.data_root=no_data',
     no_data('train', 'train'), 'nothing'),
    # the checkpoint files of a training run: the config's hooks refuse
    # them (SafeCheckpointHook)
    ('train-load-from-missing', 'train.py', OPT + 'load_from={work}/no.pth',
     'error: load_from <path>: no such file; pass an existing checkpoint '
     '(e.g. <work_dir>/epoch_N.pth), or leave load_from out', 'runner'),
    # (its option: a str for a str passes the value check)
    ('train-resume-missing', 'train.py', W + '--resume {work}/no.pth '
     '--cfg-options optim_wrapper.optimizer.type=SGD',
     'error: --resume <path>: no such file (omit the path to resume from '
     'the newest checkpoint of the work dir)', 'runner'),
    ('train-resume-truncated', 'train.py', W + '--resume {trunc}', DAMAGED,
     'runner'),
    ('train-resume-all-damaged', 'train.py', W + '--resume',
     "error: resume: no complete checkpoint in <path>; damaged: "
     "['{work}/epoch_2.pth', '{work}/epoch_1.pth']. Remove them to train "
     'from scratch.', 'runner'),
    ('train-shared-out-dir', 'train.py',
     OPT + 'default_hooks.checkpoint.out_dir={shared}',
     'error: checkpoint directory <path> (default_hooks.checkpoint.out_dir'
     ' / the work dir\'s name) belongs to the run in work dir <...>',
     'runner'),
    ('train-class-index-out-of-range', 'train.py',
     OPT + 'train_dataloader.dataset.ann_file={label_9}',
     DATA + '<file> [<key>]: class index <n> of <image> is out of range: the '
     'model has <n> classes', 'nothing'),
    ('train-non-finite-loss', 'train.py',
     OPT + 'model.data_preprocessor.std=[0,0,0]',
     'error: NonFiniteLossHook: non-finite training loss', 'runner'),
    # tools/test.py
    ('test-checkpoint-directory', 'test.py', '{cfg} {dir} --work-dir {work}',
     IS_DIR, 'nothing'),
    ('test-truncated-legacy-checkpoint', 'test.py',
     '{cfg} {legacy_trunc} --work-dir {work}', DAMAGED, 'nothing'),
    ('test-config-syntax', 'test.py', '{syntax} {ckpt} --work-dir {work}',
     SYNTAX, 'nothing'),
    ('test-offline-url', 'test.py', '{cfg} {url} --work-dir {work}', OFFLINE,
     'nothing'),
    ('test-malformed-list-line', 'test.py',
     '{cfg} {ckpt} --work-dir {work} --cfg-options '
     'test_dataloader.dataset.ann_file={bad_line}', DATA + LIST, 'nothing'),
    ('test-other-arch', 'test.py', '{cfg} {other_arch} --work-dir {work}',
     OTHER + ' (ImageClassifier): <...>', 'runner'),
    ('test-authors-file', 'test.py', '{cfg} {official} --work-dir {work}',
     'error: ' + authors('ImageClassifier'), 'runner'),
    ('test-norm-weights', 'test.py', '{cfg} {norm} --work-dir {work}',
     'error: checkpoint {norm} holds soft_norm_* weights (converted with '
     'attn_norm=True<...>but the model of {cfg} has attn_norm=False<...>'
     'model.backbone.attn_cfg.attn_norm=True', 'runner'),
    ('test-missing-data', 'test.py', '{cfg} {ckpt} --work-dir {work} '
     '--cfg-options test_dataloader.dataset.data_root=no_data',
     no_data('test', 'val'), 'nothing'),
    ('test-out-disk-full', 'test.py',
     '{cfg} {ckpt} --work-dir {work} --out {out}', FULL, 'runner'),
    # the launch scripts (the typo: once, before torchrun starts the ranks;
    # the missing data: stderr is the message alone, default warnings)
    ('dist_train-no-gpus', 'dist_train.sh', '{cfg} --work-dir {work}',
     'error: dist_train.sh: GPUS must be the number of processes', 'nothing'),
    ('dist_train-port-in-use', 'dist_train.sh', '{cfg} 2 --work-dir {work}',
     PORT, 'nothing'),
    ('dist_train-missing-data', 'dist_train.sh',
     '{cfg} 2 --work-dir {work} --cfg-options '
     'train_dataloader.dataset.data_root=no_data', no_data('train', 'train'),
     'nothing'),
    ('dist_test-cfg-typo', 'dist_test.sh', '{cfg} {ckpt} 2 --work-dir {work} '
     '--cfg-options test_dataloader.batch_sizes=1', TYPO, 'nothing'),
    # demo/image_demo.py
    ('image_demo-no-cuda', 'image_demo.py',
     '{data} {cfg} {ckpt} --device cuda --out-dir {work}',
     'image_demo.py: error: --device <device>: CUDA is not available',
     'nothing'),
    # the analysis tools that read a config
    ('get_flops-config-syntax', 'get_flops.py',
     '--config {syntax} --out {work}', SYNTAX, 'nothing'),
    # the converters, the ONNX export, the demo data
    ('soft2mmsoft-truncated', 'soft2mmsoft.py', '{trunc} {work}/o.pth',
     "error: checkpoint '<path>' is truncated or corrupt", 'nothing'),
    ('mmsoft2soft-file-too-large', 'mmsoft2soft.py', '{good} {work}/o.pth',
     'error: cannot write <path>: File too large', 'nothing'),
    ('pytorch2onnx-cfg-typo', 'pytorch2onnx.py',
     '{cfg} {ckpt} --shape 64 64 --out {work}/m.onnx --cfg-options '
     'model.backbone.attn_cfg.atn_norm=True', TYPO, 'nothing'),
    ('pytorch2onnx-authors-file', 'pytorch2onnx.py',
     '{cfg} {official} --shape 64 64 --out {work}/m.onnx',
     'error: ' + authors('ImageClassifier'), 'nothing'),
    ('make_demo_data-out-file', 'make_demo_data.py',
     '--out {file} --tasks cls --num-train 1 --num-val 1',
     'error: --out <path>: exists and is not a directory', 'nothing'),
    # the host codebases' tools: a traceback whose last line is mmsoft's
    ('host-other-arch', 'mmpretrain/test', '{cfg} {other_arch} --work-dir '
     '{work}', MISMATCH + 'checkpoint {other_arch} does not match the model '
     '(ImageClassifier): ', 'runner'),
    ('host-weights-to-resume', 'mmdet/train', '{cfg} --resume {good} '
     '--work-dir {work}', MISMATCH + '--resume {good}: not a training '
     'checkpoint (it has no meta, message_hub)', 'runner'),
    ('host-other-optimizer-resume', 'mmdet/train',
     '{cfg} --resume {ckpt} --work-dir {work} --cfg-options '
     'optim_wrapper.optimizer.type=SGD train_cfg.max_epochs=2',
     MISMATCH + '--resume {ckpt}: the checkpoint was trained with another '
     "optimizer than the config's optim_wrapper.optimizer (SGD): ", 'runner'),
    ('host-new-lr-resume', 'mmdet/train',
     '{cfg} --resume {ckpt} --work-dir {work} --cfg-options '
     'optim_wrapper.optimizer.lr=0.01 train_cfg.max_epochs=2',
     MISMATCH + "--resume {ckpt}: the config's optim_wrapper.optimizer.lr "
     'is 0.01, the checkpoint was trained with 0.001: ', 'runner'),
    ('host-missing-imagenet-file', 'mmdet/train', '{missing_cfg} --work-dir '
     '{work}', 'FileNotFoundError: checkpoints/soft_norm_tiny.pth '
     "(model.backbone.init_cfg.checkpoint) does not exist: download the "
     "authors' soft_norm_tiny ImageNet file", 'runner'),
    ('host-nonfinite-test-outputs', 'mmpretrain/test',
     '{cfg} {ckpt} --work-dir {work} --cfg-options '
     'model.data_preprocessor.std=[0,0,0]',
     'mmsoft.engine.hooks.nonfinite_hook.NonFiniteLossError: '
     'NonFiniteLossHook: the test outputs of batch 1 hold nan / inf '
     '(pred_score; first image ', 'runner'),
    # the case (was: 0 tensors loaded, exit 0, top-1 at chance;
    # ``mim test mmpretrain`` runs this tool)
    ('host-cls-authors-file', 'mmpretrain/test', '{cfg} {official} '
     '--work-dir {work}', MISMATCH + authors('ImageClassifier'), 'runner'),
    ('host-det-authors-file', 'mmdet/test', '{det_cfg} {official} --work-dir '
     '{work}', MISMATCH + authors('RetinaNet'), 'runner'),
    ('host-seg-authors-file', 'mmseg/test', '{seg_cfg} {official} --work-dir '
     '{work}', MISMATCH + authors('EncoderDecoder'), 'runner'),
    # the right files run: a training checkpoint tested (mmengine's objects
    # allowed for the Runner's load only) and resumed, without the ImageNet
    # file (a resume replaces every weight)
    ('host-trained-test', 'mmpretrain/test', '{cfg} {ckpt} --work-dir {work}',
     None, 'accuracy/top1: '),
    ('host-resume-missing-imagenet-file', 'mmdet/train',
     '{missing_cfg} --resume {ckpt} --work-dir {work} --cfg-options '
     'train_cfg.max_epochs=2', None, 'resumed epoch: 1, iter: 1'),
]

DOORS = {
    osp.basename(p): p
    for p in ('tools/train.py', 'tools/test.py', 'tools/dist_train.sh',
              'tools/dist_test.sh', 'demo/image_demo.py',
              'tools/model_converters/soft2mmsoft.py',
              'tools/model_converters/mmsoft2soft.py',
              'tools/deployment/pytorch2onnx.py',
              'tools/misc/make_demo_data.py', 'tools/analysis/get_flops.py')
}
#: rows whose message has an own FAQ section (or none), not a table row
NOT_IN_TABLE = {
    'train-config-missing', 'train-work-dir-in-use', 'train-missing-data',
    'test-authors-file', 'test-norm-weights', 'dist_train-missing-data',
    'test-missing-data', 'pytorch2onnx-authors-file'
}


def _file_size_limit():
    import resource  # the output may not grow beyond 64 KiB
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))


#: rows' code run first in the tool's process (as a sitecustomize.py would);
#: test.py --out: its atomic temporary ('.mmsoft-tmp') hits a full disk (a
#: small RLIMIT_FSIZE would stop the log file first)
SETUP = {
    'test-out-disk-full':
    """
import errno, os
from mmengine.fileio.backends import local_backend
_put = local_backend.LocalBackend.put
def put(self, obj, filepath):
    if '.mmsoft-tmp' in str(filepath):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filepath))
    return _put(self, obj, filepath)
local_backend.LocalBackend.put = put
""",
    'mmsoft2soft-file-too-large':
    inspect.getsource(_file_size_limit) + '_file_size_limit()\n',
}


def _prepare(name, row_dir, files, held):
    """What the row's folder holds before the tool runs (``held``: an
    ExitStack closed after it); environment changes (None: removed)."""
    work = osp.join(row_dir, 'work')
    if name == 'train-resume-all-damaged':  # two checkpoints, cut short
        os.makedirs(work)
        for n in (1, 2):
            shutil.copy(files['trunc'], osp.join(work, f'epoch_{n}.pth'))
    elif name == 'train-shared-out-dir':  # another work dir's out_dir
        os.makedirs(osp.join(row_dir, 'shared', 'work'))
        with open(osp.join(row_dir, 'shared/work/.mmsoft-work-dir'), 'w') as f:
            f.write(osp.join(row_dir, 'other', 'work') + '\n')
    elif name == 'train-work-dir-in-use':  # a live run holds the lock
        held.enter_context(work_dir_holder(work))
    elif name == 'dist_train-port-in-use':  # the pre-flight skipped
        import socket
        s = held.enter_context(socket.socket())
        s.bind(('127.0.0.1', 0))
        s.listen()
        return dict(PORT=str(s.getsockname()[1]), PYTHON='true')
    elif name == 'dist_train-missing-data':
        return dict(PYTHONWARNINGS=None)
    elif name == 'mmsoft2soft-file-too-large':
        os.makedirs(work)
    return {}


def pattern(message):
    """The regex of a FAQ message: ``<...>`` matches any text."""
    return '.+?'.join(re.escape(p) for p in re.split(r'<[^<>]*>', message))


def host_tool(name):
    """``<codebase>/.mim/tools/<tool>.py`` of the installed package."""
    codebase, tool = name.split('/')
    spec = importlib.util.find_spec(codebase)
    path = osp.join(osp.dirname(spec.origin), '.mim', 'tools', tool + '.py')
    if not osp.isfile(path):
        pytest.skip(f'{codebase} ships no tools/{tool}.py')
    return path


@pytest.fixture(scope='module')
def files(tmp_path_factory, script_server):
    """The classifier demo config on tiny data, ``ckpt`` (its training
    checkpoint, by mmdet's tools/train.py), ``good`` (its weights),
    ``other_arch`` (a block short), ``official`` (the authors' layout),
    ``norm`` (that with --norm), damaged files, bad configs and lists."""
    import demo_synthetic
    tmp = tmp_path_factory.mktemp('faults')
    cfg = cls_demo_config(tmp, val=4, test=4)
    with open(cfg, 'a') as f:
        f.write('train_cfg = dict(max_epochs=1, val_interval=1)\n')
    demo_synthetic.make_demo_data(
        str(tmp / 'data' / 'demo'), tasks=('det', 'seg'), workers=1,
        overrides=tiny_demo_data(num_train=1), log=None)  # yapf: disable
    p = {n: str(tmp / f'{n}.pth')
         for n in ('good', 'other_arch', 'official', 'norm', 'trunc',
                   'legacy_trunc')}  # yapf: disable
    sd = random_model(cfg).state_dict()
    torch.save({'state_dict': sd}, p['good'])
    torch.save({'state_dict': {k: v for k, v in sd.items()
                               if '.stages.2.blocks.1.' not in k}},
               p['other_arch'])  # yapf: disable
    to_official = load_tool('model_converters/mmsoft2soft.py')
    torch.save({'model': to_official.convert_mmpretrain_to_official(sd)[0]},
               p['official'])
    assert load_tool('model_converters/soft2mmsoft.py').main(
        [p['official'], p['norm'], '--norm']) == 0
    proc = script_server(
        host_tool('mmdet/train'), [cfg, '--work-dir', tmp / 'trained'], tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    p['ckpt'] = str(tmp / 'trained' / 'epoch_1.pth')
    # cut short; in torch's legacy (non-zip) format, its end cut short
    (tmp / 'trunc.pth').write_bytes(open(p['ckpt'], 'rb').read()[:4000])
    torch.save(
        torch.load(p['ckpt'], weights_only=False),
        tmp / 'legacy.pth',
        _use_new_zipfile_serialization=False)
    (tmp / 'legacy_trunc.pth').write_bytes(
        (tmp / 'legacy.pth').read_bytes()[:-1000])
    meta = tmp / 'data' / 'imagenet' / 'meta'
    val = (meta / 'val.txt').read_text().splitlines()
    train = (meta / 'train.txt').read_text().splitlines()
    texts = {
        # a malformed line, a class index the model (5 classes) lacks
        'bad_line.txt': val[:1] + ['a_file_without_label'] + val[1:],
        'label_9.txt': [train[0].rsplit(' ', 1)[0] + ' 9'] + train[1:],
        # a syntax error (line 3), a config whose _base_ has it
        'syntax.py': [f"_base_ = ['./{osp.basename(cfg)}']", 'x = dict(',
                      '    a=1,,', ')'],
        'syntax_child.py': ["_base_ = ['./syntax.py']"],
        # the ImageNet file of the backbone's init_cfg is missing
        'missing_cfg.py': [
            f'_base_ = {cfg!r}', "model = dict(backbone=dict(init_cfg=dict("
            "_delete_=True, type='Pretrained', prefix='backbone.', "
            "checkpoint='checkpoints/soft_norm_tiny.pth')))"],
    }  # yapf: disable
    for name, lines in texts.items():
        (tmp / name).write_text(''.join(ln + '\n' for ln in lines))
        p[name.rsplit('.', 1)[0]] = str(tmp / name)
    (tmp / 'a_file').write_text('')
    (tmp / 'a_dir').mkdir()
    if os.geteuid() == 0:  # permission bits do not stop root
        ro = '/sys/mmsoft-read-only'
    else:
        (tmp / 'ro').mkdir(mode=0o555)
        ro = str(tmp / 'ro' / 'work')
    demo = f'{CONFIGS}/demo/'
    return dict(p, cfg=cfg, cwd=str(tmp), ro=ro, dir=str(tmp / 'a_dir'),
                file=str(tmp / 'a_file'),
                url='http://127.0.0.1:9/soft_norm_small.pth',
                data=str(tmp / 'data' / 'imagenet' / 'val'),
                det_cfg=demo + 'retinanet_soft_demo.py',
                seg_cfg=demo + 'upernet_soft_demo.py')  # yapf: disable


def _pths(folder):
    return {osp.join(d, f) for d, _, fs in os.walk(folder) for f in fs
            if f.endswith('.pth')}  # yapf: disable


@pytest.mark.parametrize('case', CASES, ids=[c[0] for c in CASES])
def test_fault(case, files, script_server, tmp_path):
    name, tool, args, message, ran = case
    if name in ('image_demo-no-cuda', 'train-amp-optim-wrapper-no-gpu'
                ) and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    if name.endswith('-read-only') and not os.access('/sys', os.F_OK) \
            and os.geteuid() == 0:
        pytest.skip('no read-only place for root')
    host, work, out = '/' in tool, tmp_path / 'work', tmp_path / 'old.pkl'
    out.write_bytes(b'an earlier result')
    values = dict(
        files, work=str(work), out=str(out), shared=str(tmp_path / 'shared'))
    env = child_env()
    argv = [a.format(**values) for a in args.split()]
    script = host_tool(tool) if host else osp.join(ROOT, DOORS[tool])
    with contextlib.ExitStack() as held:
        for key, value in _prepare(name, str(tmp_path), files, held).items():
            env.pop(key) if value is None else env.update({key: value})
        before = _pths(tmp_path)
        cwd = files['cwd'] if host else str(tmp_path)
        proc = run(['bash', script] + argv, cwd, 300, env) \
            if script.endswith('.sh') else script_server(
                script, argv, cwd, env, SETUP.get(name, ''))
    err = proc.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if message is None:
        assert proc.returncode == 0, err[-3000:]
        assert ran in proc.stdout + err
        assert 'do not match exactly' not in proc.stdout + err
        assert tool.endswith('test') or osp.isfile(work / 'epoch_2.pth')
        return
    assert proc.returncode != 0, err[-3000:]
    expected = message.format(**values).splitlines()
    got = lines[-len(expected):]
    assert len(got) == len(expected), err[-3000:]
    for line, want in zip(got, expected):
        assert re.match(
            pattern(want), line if want[0] == ' ' else
            line.strip()), f'{line!r} is no {want!r}:\n{err}'
    assert 'accuracy/top1' not in proc.stdout
    if not host:  # our doors: the message alone (and the interpreter used)
        assert 'Traceback (most recent call last)' not in err, err
        if script.endswith('.sh') and lines[0] != got[0]:
            assert lines.pop(0).startswith(f'{tool}: python: ')
        assert lines == got, err[-3000:]
    # no checkpoint written; unless the Runner ran, no run dir (timestamp)
    written = {f for f in _pths(tmp_path) - before
               if not osp.basename(f).startswith('o.')}  # yapf: disable
    assert not written, written
    if ran == 'nothing' and work.is_dir():
        runs = [d for d in os.listdir(work) if re.match(r'\d{8}_\d{6}$', d)]
        assert not runs, runs
    assert out.read_bytes() == b'an earlier result'  # never replaced
    assert not [f for f in os.listdir(tmp_path) if 'mmsoft-tmp' in f]


def test_every_door_is_in_the_table_and_its_message_in_the_faq():
    """docs/en/faq.md's table: each door's message start with its doors."""
    assert {c[1] for c in CASES if '/' not in c[1]} == set(DOORS)
    assert all(osp.isfile(osp.join(ROOT, p)) for p in DOORS.values())
    text = open(osp.join(ROOT, 'docs', 'en', 'faq.md')).read()
    rows = {}
    for line in text[text.index('| Message (start of the line) |'):].\
            splitlines()[2:]:
        if not line.startswith('|'):
            break
        cells = [c.strip() for c in line.strip('|').split(' | ')]
        assert len(cells) == 4 and all(cells), line
        rows[cells[0].strip('`')] = cells
    for name, tool, _, message, _ in CASES:
        if tool in DOORS and name not in NOT_IN_TABLE:
            line = message.splitlines()[-1]  # (below the data check's head)
            faq = max((m for m in rows if line.startswith(m)),
                      key=len,
                      default=None)  # the longest start of the line
            assert faq, f'{name}: message not in the FAQ table'
            assert tool in rows[faq][1], (name, rows[faq][1])
