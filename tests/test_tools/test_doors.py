"""One line at every door (issue 36): each entry point (:data:`CASES`, run
as a user runs it, through conftest's ``script_server``) given a bad input
exits non-zero, its last stderr line starts as docs/en/faq.md lists it, no
traceback, no checkpoint or Runner run dir where the input can be checked
first (inputs other tests drive through a door are left out)."""
import inspect
import os
import os.path as osp
import re
import shutil

import pytest
import torch
from conftest import ROOT, child_env, cls_demo_config, random_model, run

pytest.importorskip('mmpretrain')

FAQ = osp.join(ROOT, 'docs', 'en', 'faq.md')

# the --cfg-options / checkpoint / config messages several doors share
SYNTAX = 'error: config <file>:<line>: syntax error: <what>'
PORT = 'error: <script>: PORT=<port> is in use on this machine'
TYPO = 'error: --cfg-options <key>: the config has no key <name> under <key>;'
IS_DIR = 'error: checkpoint <path> is a directory, not a file;'
DAMAGED = 'error: checkpoint <path> is truncated or corrupt'
OFFLINE = 'error: checkpoint <url> cannot be downloaded'
FULL = 'error: <path> (not replaced): No space left on device (errno 28'
LIST = '<file> [<key>]: cannot be loaded: <error>'  # the data check's line
#: (id, door, arguments (split at spaces, then formatted), message, what
#: ran: 'nothing' (no Runner run dir, no checkpoint) or 'runner' (the
#: Runner was built, no checkpoint written)). Placeholders: {cfg} (the
#: classifier demo config on tiny data), {ckpt} (a training checkpoint of
#: it), {trunc} (that file cut short), {legacy_trunc} (it in torch's legacy
#: format, cut short), {syntax} (a config with a syntax error),
#: {syntax_child} (one whose _base_ is that), {dir}, {file}, {ro} (a
#: directory that cannot be written), {url} (nothing listens there), {work}
#: (the row's work dir), {out} (an existing result file), {shared} (a
#: checkpoint out_dir; :data:`PREPARE` fills it), {bad_line} /
#: {label_9} / {empty_list} (annotation lists)
W = '{cfg} --work-dir {work} '
OPT = W + '--cfg-options '
INIT = (
    OPT + 'model.backbone.init_cfg._delete_=True '
    'model.backbone.init_cfg.type=Pretrained ')
CASES = [
    # tools/train.py
    ('train-cfg-typo', 'train.py', OPT + 'train_cfg.max_epoch=1', TYPO,
     'nothing'),
    ('train-config-syntax-in-base', 'train.py',
     '{syntax_child} --work-dir {work}', SYNTAX, 'nothing'),
    ('train-cfg-options-not-a-number', 'train.py',
     OPT + 'train_cfg.max_epochs=abc',
     "error: --cfg-options <key>=<value>: the config's <key> is <kind>",
     'nothing'),
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
     'error: --work-dir <path>: exists and is not a directory', 'nothing'),
    ('train-work-dir-read-only', 'train.py', '{cfg} --work-dir {ro}',
     'error: --work-dir <path>: cannot write there', 'nothing'),
    ('train-init-cfg-directory', 'train.py',
     INIT + 'model.backbone.init_cfg.checkpoint={dir}', IS_DIR, 'nothing'),
    # the checkpoint files of a training run: checked before the Runner
    ('train-load-from-missing', 'train.py', OPT + 'load_from={work}/no.pth',
     'error: load_from <path>: no such file;', 'nothing'),
    # (its option: a str for a str passes the value check)
    ('train-resume-missing', 'train.py', W + '--resume {work}/no.pth '
     '--cfg-options optim_wrapper.optimizer.type=SGD',
     'error: --resume <path>: no such file', 'nothing'),
    ('train-resume-truncated', 'train.py', W + '--resume {trunc}', DAMAGED,
     'nothing'),
    ('train-resume-all-damaged', 'train.py', W + '--resume',
     'error: resume: no complete checkpoint in <path>; damaged:', 'nothing'),
    ('train-shared-out-dir', 'train.py',
     OPT + 'default_hooks.checkpoint.out_dir={shared}',
     'error: checkpoint directory <path> (default_hooks.checkpoint.out_dir'
     ' / the work dir\'s name) belongs to the run in work dir', 'nothing'),
    ('train-class-index-out-of-range', 'train.py',
     OPT + 'train_dataloader.dataset.ann_file={label_9}',
     '<file> [<key>]: class index <n> of <image> is out of range: the '
     'model has <n> classes', 'nothing'),
    ('train-empty-list', 'train.py',
     OPT + 'train_dataloader.dataset.ann_file={empty_list}',
     '<file> [<key>]: has no samples', 'nothing'),
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
     'test_dataloader.dataset.ann_file={bad_line}', LIST, 'nothing'),
    ('test-out-disk-full', 'test.py',
     '{cfg} {ckpt} --work-dir {work} --out {out}', FULL, 'runner'),
    # the launch scripts (the typo: once, before torchrun starts the ranks;
    # dist_train.sh's pre-flight is train.py's (train-cfg-typo), run once
    # with MMSOFT_PREFLIGHT=1 (passed, in dist_train-port-in-use))
    ('dist_train-no-gpus', 'dist_train.sh', '{cfg} --work-dir {work}',
     'error: dist_train.sh: GPUS must be the number of processes', 'nothing'),
    ('dist_train-port-in-use', 'dist_train.sh', '{cfg} 2 --work-dir {work}',
     PORT, 'nothing'),
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
    ('mmsoft2soft-file-too-large', 'mmsoft2soft.py', '{ckpt} {work}/o.pth',
     'error: cannot write <path>: File too large', 'nothing'),
    ('pytorch2onnx-cfg-typo', 'pytorch2onnx.py',
     '{cfg} {ckpt} --shape 64 64 --out {work}/m.onnx --cfg-options '
     'model.backbone.attn_cfg.atn_norm=True', TYPO, 'nothing'),
    ('make_demo_data-out-file', 'make_demo_data.py',
     '--out {file} --tasks cls --num-train 1 --num-val 1',
     'error: --out <path>: exists and is not a directory', 'nothing'),
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

#: a full disk for the result file of tools/test.py --out: writing an
#: atomic temporary (".<name>.<pid>.<hex>.mmsoft-tmp...") fails with ENOSPC
#: (a small RLIMIT_FSIZE would stop the log file first)
DISK_FULL = '''
import errno, os
from mmengine.fileio.backends import local_backend
_put = local_backend.LocalBackend.put
def put(self, obj, filepath):
    if '.mmsoft-tmp' in str(filepath):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(filepath))
    return _put(self, obj, filepath)
local_backend.LocalBackend.put = put
'''


def _damaged_work_dir(row_dir, doors):
    """``work/``: two checkpoints of a run, both cut short."""
    os.makedirs(osp.join(row_dir, 'work'))
    for n in (1, 2):
        shutil.copy(doors['trunc'], osp.join(row_dir, 'work',
                                             f'epoch_{n}.pth'))


def _other_runs_out_dir(row_dir, doors):
    """``shared/work/``: another work dir's checkpoint directory."""
    os.makedirs(osp.join(row_dir, 'shared', 'work'))
    with open(osp.join(row_dir, 'shared/work/.mmsoft-work-dir'), 'w') as f:
        f.write(osp.join(row_dir, 'other', 'work') + '\n')


#: what the rows hold while their tool runs (sockets), closed after it
_HELD = []


def _port_in_use(row_dir, doors):
    """A port another program listens on, as the launch scripts' PORT."""
    import socket
    s = socket.socket()
    s.bind(('127.0.0.1', 0))
    s.listen()
    _HELD.append(s)
    return dict(PORT=str(s.getsockname()[1]))


#: row -> what its folder holds before the tool runs: f(row_dir, doors),
#: which may return environment variables for the row
PREPARE = {
    'train-resume-all-damaged': _damaged_work_dir,
    'train-shared-out-dir': _other_runs_out_dir,
    'dist_train-port-in-use': _port_in_use,
}


def _file_size_limit():
    import resource
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))


def pattern(message):
    """The regex of a FAQ message: ``<...>`` matches any text."""
    parts = re.split(r'<[^<>]*>', message)
    return '.+?'.join(re.escape(p) for p in parts)


@pytest.fixture(scope='session')
def doors(tmp_path_factory):
    """The files of the table's placeholders (tiny data, random weights)."""
    tmp = tmp_path_factory.mktemp('doors')
    cfg = cls_demo_config(tmp, val=4, test=4)
    with open(cfg, 'a') as f:
        f.write('train_cfg = dict(max_epochs=1, val_interval=1)\n')
    from mmengine.config import Config
    config = Config.fromfile(cfg)
    model = random_model(config)
    p = dict(
        ckpt=str(tmp / 'epoch_1.pth'),
        trunc=str(tmp / 'trunc.pth'),
        legacy_trunc=str(tmp / 'legacy_trunc.pth'))
    torch.save(
        dict(state_dict=model.state_dict(), message_hub={},
             meta=dict(epoch=1, iter=1, cfg=config.pretty_text),
             optimizer=torch.optim.AdamW(model.parameters()).state_dict()),
        p['ckpt'])  # yapf: disable
    # it cut short; in torch's legacy (non-zip) format, its end cut short
    data = open(p['ckpt'], 'rb').read()
    (tmp / 'trunc.pth').write_bytes(data[:4000])
    torch.save(
        torch.load(p['ckpt'], weights_only=False),
        tmp / 'legacy.pth',
        _use_new_zipfile_serialization=False)
    (tmp / 'legacy_trunc.pth').write_bytes(
        (tmp / 'legacy.pth').read_bytes()[:-1000])
    meta_dir = tmp / 'data' / 'imagenet' / 'meta'
    val = (meta_dir / 'val.txt').read_text().splitlines()
    train = (meta_dir / 'train.txt').read_text().splitlines()
    texts = [
        # a malformed line, a class index the model (5 classes) lacks
        ('bad_line.txt', val[:1] + ['a_file_without_label'] + val[1:]),
        ('label_9.txt', [train[0].rsplit(' ', 1)[0] + ' 9'] + train[1:]),
        # a config with a syntax error (line 3), one whose _base_ has it
        ('syntax.py', [
            f"_base_ = ['./{osp.basename(cfg)}']", 'x = dict(', '    a=1,,',
            ')'
        ]),
        ('syntax_child.py', ["_base_ = ['./syntax.py']"]),
    ]
    for name, lines in texts:
        (tmp / name).write_text('\n'.join(lines) + '\n')
        p[name.rsplit('.', 1)[0]] = str(tmp / name)
    for name in ('empty_list.txt', 'a_file'):  # no line at all; a file
        (tmp / name).write_text('')
    (tmp / 'a_dir').mkdir()
    if os.geteuid() == 0:  # permission bits do not stop root
        ro = '/sys/mmsoft-read-only'
    else:
        (tmp / 'ro').mkdir(mode=0o555)
        ro = str(tmp / 'ro' / 'work')
    return dict(p, cfg=cfg, empty_list=str(tmp / 'empty_list.txt'), ro=ro,
                dir=str(tmp / 'a_dir'), file=str(tmp / 'a_file'),
                url='http://127.0.0.1:9/soft_norm_small.pth',
                data=str(tmp / 'data' / 'imagenet' / 'val'))  # yapf: disable


@pytest.mark.parametrize('case', CASES, ids=[c[0] for c in CASES])
def test_door(case, doors, script_server, tmp_path):
    name, door, args, message, ran = case
    if name in ('image_demo-no-cuda', 'train-amp-optim-wrapper-no-gpu'
                ) and torch.cuda.is_available():
        pytest.skip('CUDA is available here')
    if name.endswith('-read-only') and not os.access('/sys', os.F_OK) \
            and os.geteuid() == 0:
        pytest.skip('no read-only place for root')
    work = tmp_path / 'work'
    out = tmp_path / 'old.pkl'
    out.write_bytes(b'an earlier result')
    values = dict(
        doors, work=str(work), out=str(out), shared=str(tmp_path / 'shared'))
    env = child_env()
    if name in PREPARE:
        env.update(PREPARE[name](str(tmp_path), doors) or {})
    before = {
        osp.join(d, f)
        for d, _, fs in os.walk(tmp_path)
        for f in fs if f.endswith('.pth')
    }
    argv = [a.format(**values) for a in args.split()]
    script = osp.join(ROOT, DOORS[door])
    setup = ''
    if name == 'test-out-disk-full':
        setup = DISK_FULL  # as a sitecustomize.py would, before the tool
    if name == 'mmsoft2soft-file-too-large':
        # the output may not grow beyond 64 KiB
        setup = inspect.getsource(_file_size_limit) + '_file_size_limit()\n'
        work.mkdir()
    try:
        proc = run(['bash', script] + argv, tmp_path, 300, env) \
            if script.endswith('.sh') else script_server(
                script, argv, str(tmp_path), env, setup)
    finally:
        while _HELD:
            _HELD.pop().close()
    err = proc.stderr
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert proc.returncode != 0, err
    assert 'Traceback (most recent call last)' not in err, err
    assert lines, 'nothing on stderr'
    line = lines[-1].strip()
    assert re.match(pattern(message), line), \
        f'{line!r} does not start like {message!r}'
    # no heavy work: no checkpoint anywhere in the row's folder, and
    # unless the Runner had to run, no Runner run dir (<timestamp>/)
    written = [
        osp.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs
        if f.endswith('.pth') and not f.startswith('o.')
        and osp.join(d, f) not in before
    ]
    assert not written, written
    if ran == 'nothing' and work.is_dir():
        runs = [d for d in os.listdir(work) if re.match(r'\d{8}_\d{6}$', d)]
        assert not runs, runs
    assert out.read_bytes() == b'an earlier result'  # never replaced
    assert not [f for f in os.listdir(tmp_path) if 'mmsoft-tmp' in f]


def test_every_door_is_in_the_table():
    """Each entry point has a row (the table is the doors' contract)."""
    assert {c[1] for c in CASES} == set(DOORS)
    for path in DOORS.values():
        assert osp.isfile(osp.join(ROOT, path)), path


def test_every_message_is_in_the_faq():
    """docs/en/faq.md's table: each message with its doors, cause, fix."""
    text = open(FAQ).read()
    table = text[text.index('| Message (start of the line) |'):]
    rows = {}
    for line in table.splitlines()[2:]:
        if not line.startswith('|'):
            break
        cells = [c.strip() for c in line.strip('|').split(' | ')]
        assert len(cells) == 4 and all(cells), line
        rows[cells[0].strip('`')] = cells
    missing = sorted({c[3] for c in CASES} - set(rows))
    assert not missing, f'messages not in the FAQ table: {missing}'
    for case in CASES:
        assert case[1] in rows[case[3]][1], (case[0], rows[case[3]][1])
