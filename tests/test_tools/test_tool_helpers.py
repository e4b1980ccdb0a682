"""The contract of each helper of ``mmsoft_tools.cli`` / ``launch``."""
import argparse
import builtins
import errno
import io
import itertools
import logging
import os
import os.path as osp
import sys
import tempfile
import urllib.request
from urllib.error import HTTPError, URLError

import mmengine.device as device
import mmengine.dist
import mmengine.utils.dl_utils
import pytest
import torch
import torch.distributed as dist
from conftest import ROOT, load_module
from mmengine.config import Config
from mmengine.registry import DefaultScope

from mmsoft.models.converters import ConversionError
from mmsoft.utils.atomic import temp_path_for
from mmsoft.utils.checkpoint_io import CheckpointWriteError
from mmsoft.utils.strict_load import CheckpointMismatchError
from mmsoft_tools import cli, launch
from model_converters import checkpoint_files as cf

DEMO = load_module(osp.join(ROOT, 'tools', 'demo.py'), 'demo_seed52')
NO_SPACE = 'No space left on device'
FREE = 'free some space or write somewhere else'
WARN, INFO = logging.WARNING, logging.INFO


def raised(fn, *args, exc=cli.ToolError, **kwargs):
    """The message of the ``exc`` that ``fn(*args, **kwargs)`` raises."""
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    return str(e.value)


# ------------------------------------------------------------- one_line
@pytest.mark.parametrize('exc, line', [
    (cli.ToolError('bad\n   value  here'), 'error: bad value here'),
    (CheckpointMismatchError('x'), 'error: x'),
    (CheckpointWriteError(errno.ENOSPC, 'cannot save b.pth'),
     'error: cannot save b.pth'),
    (ValueError('x'), None),
    (OSError(errno.EIO, 'I/O error', '/x'), None),  # no known fix
    (FileNotFoundError('no file a.pth'), 'error: no file a.pth'),
    (OSError('something odd'), None),
    (URLError('Name or service not known'),
     'error: a download failed (Name or service not known): check the URL '
     'and the network, or download the file and pass its path'),
    (HTTPError('http://x', 500, 'boom', {}, None), None),  # mmengine's
    (OSError(errno.EROFS, 'Read-only', temp_path_for('/w/a.b.pth', '.zip')),
     'error: /w/a.b.pth (not replaced): Read-only (errno 30 EROFS); choose '
     'a writable location'),
    (OSError(errno.EACCES, 'Permission denied', '/x/.y.pth'),
     'error: /x/.y.pth: Permission denied (errno 13 EACCES); check the '
     'permissions (ls -l) or choose another path'),
    (OSError(errno.ENOSPC, None), f'error: a write failed: {NO_SPACE} '
     f'(errno 28 ENOSPC; the system named no file); {FREE}'),
    (OSError(errno.EACCES, 'Permission denied', ''), 'error: a file '
     'operation failed: Permission denied (errno 13 EACCES; the system '
     'named no file); check the permissions (ls -l) or choose another path'),
])  # yapf: disable
def test_one_line(exc, line):
    assert cli.one_line(exc) == line


def test_run_main_and_positive_int(capsys, monkeypatch):
    monkeypatch.delenv('MMSOFT_TRACEBACK', raising=False)

    def exits(main, argv=()):
        return raised(cli.run_main, main, list(argv), exc=SystemExit)

    def fails(argv):
        raise cli.ToolError('the config has no key x')

    # main gets the arguments; test.py returns metrics
    assert [exits(len, 'ab'), exits(lambda a: {'a': 1})] == ['2', '0']
    capsys.readouterr()
    assert exits(fails) == '1'
    assert capsys.readouterr().err == 'error: the config has no key x\n'
    monkeypatch.setenv('MMSOFT_TRACEBACK', '1')
    raised(cli.run_main, fails, [])
    for off in ('0', ''):
        monkeypatch.setenv('MMSOFT_TRACEBACK', off)
        assert exits(fails) == '1'
    raised(cli.run_main, lambda argv: 1 / 0, [], exc=ZeroDivisionError)
    assert [cf.positive_int('1'), cf.positive_int('12')] == [1, 12]
    for text in ('0', 'two', None):
        assert raised(
            cf.positive_int, text, exc=argparse.ArgumentTypeError
        ) == f'expected a positive integer, got {text!r}'


# ------------------------------------------------------- input checks
def test_check_readable(tmp_path, monkeypatch):
    cf.check_readable(str(tmp_path / 'missing.pth'))  # the loader's
    cf.check_readable(str(tmp_path))  # message
    good = tmp_path / 'good.pth'
    good.write_bytes(b'x' * 4096)
    sizes, real_open, error = [], builtins.open, [None]

    class Probe(io.FileIO):  # a checkpoint of gigabytes is probed, not read

        def read(self, size=-1):
            sizes.append(size)
            return super().read(size)

    def open_(path, *a, **k):
        if str(path) == str(good) and error[0]:
            raise error[0]
        return (Probe if str(path) == str(good) else real_open)(path, *a, **k)

    monkeypatch.setattr(builtins, 'open', open_)
    cf.check_readable(str(good))
    assert sizes and all(s is not None and 0 < s <= 64 for s in sizes)
    for error[0], reason in ((PermissionError(errno.EACCES,
                                              'Permission denied'),
                              'Permission denied (errno 13)'),
                             (OSError('the file system refused'),
                              'the file system refused')):
        assert raised(
            cf.check_readable, str(good), exc=ConversionError) == (
                f'cannot read {str(good)!r}: {reason}; check its permissions '
                '(ls -l) or copy it somewhere readable')


def _read_only(**kwargs):
    raise OSError(errno.EROFS, 'Read-only file system')


NO_WRITE = [(os, 'access', lambda path, mode: not mode & os.W_OK)]
RO = [(tempfile, 'TemporaryDirectory', _read_only)]


def _cuda(n, available):
    return [(torch.cuda, 'device_count', lambda: n),
            (torch.cuda, 'is_available', lambda: available)]


#: (call on ``t`` (tmp_path, holding the file ``f``), patches, its
#: ToolError's line or result ({t}: tmp_path)); the tools' whole lines of
#: --work-dir, init_cfg / test.py checkpoints, --device: test_faults.py
CHECKS = [
    (lambda t: cli.unwritable_reason(f'{t}/a/b/out.pth'), [], None),
    (lambda t: cli.unwritable_reason(str(t)), [],
     'is a directory; give a file name'),
    (lambda t: cli.unwritable_reason(str(t), directory=True), [], None),
    (lambda t: cli.unwritable_reason(f'{t}/f', directory=True), [],
     'exists and is not a directory'),
    (lambda t: cli.unwritable_reason(f'{t}/f/sub/o.pth'), [],
     '{t}/f is a file, not a directory'),
    (lambda t: cli.unwritable_reason(f'{t}/new/o.pth'), NO_WRITE,
     'directory {t} is not writable'),
    (lambda t: cli.check_work_dir(''), [], None),
    (lambda t: cli.check_work_dir(f'{t}/new/run'), [], None),
    (lambda t: cli.check_work_dir(f'{t}/f/run', option='--out-dir'), [],
     '--out-dir {t}/f/run: {t}/f is a file, not a directory; give another '
     'path'),
    (lambda t: cli.check_work_dir(f'{t}/run'), RO,
     '--work-dir {t}/run: cannot write there (Read-only file system); '
     'choose a writable directory'),
    (lambda t: cli.check_device(None), [], None),
    (lambda t: cli.check_device('cpu'), [], None),
    # (a driver that lists devices it cannot use: still not available)
    (lambda t: cli.check_device('cuda:0'), _cuda(2, False),
     '--device cuda:0: CUDA is not available on this machine '
     '(torch.cuda.is_available() is False); use --device cpu'),
    (lambda t: [cli.check_device(d) for d in ('cuda', 'cuda:1')],
     _cuda(2, True), [None, None]),
    (lambda t: cli.check_device('cuda:2'), _cuda(2, True),
     '--device cuda:2: this machine has 2 CUDA device(s) (cuda:0 .. '
     'cuda:1)'),
    # another scheme is MMEngine's, even where the text names a local path
    (lambda t: [cli.checkpoint_problem(p) for p in (
        'open-mmlab://resnet50', f'{t}/good.pth', f'{t}/missing.pth')], [],
     [None] * 3),
]  # yapf: disable


@pytest.mark.parametrize('call, patches, want', CHECKS)
def test_checks(tmp_path, monkeypatch, call, patches, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'f').write_text('')
    (tmp_path / 'open-mmlab:').mkdir()
    (tmp_path / 'open-mmlab:' / 'resnet50').write_bytes(b'not a zip')
    torch.save(dict(state_dict=dict(w=torch.ones(2))), tmp_path / 'good.pth')
    for patch in patches:
        monkeypatch.setattr(*patch)
    try:
        got = call(tmp_path)
    except cli.ToolError as e:
        got = str(e)
    assert got == (want.format(t=tmp_path) if isinstance(want, str) else want)
    assert sorted(os.listdir(tmp_path)) == [  # no probe left
        'f', 'good.pth', 'open-mmlab:'
    ]


def test_url_problem(tmp_path, monkeypatch):
    """``urlopen`` records the requests and raises ``answer[0]``."""
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))
    requests, timeouts, answer = [], [], [None]

    def urlopen(request, timeout=None):
        requests.append((request.full_url, request.get_method()))
        timeouts.append(timeout)
        if answer[0] is not None:
            raise answer[0]
        return io.BytesIO()  # a response: closed after the HEAD

    monkeypatch.setattr(urllib.request, 'urlopen', urlopen)
    url = 'https://example.org/w/soft_small.pth?raw=1'

    def problem(error, where=url):
        answer[0] = error
        return cli.checkpoint_problem(where)

    assert problem(None) is None and requests == [(url, 'HEAD')]  # reachable
    assert problem(HTTPError(url, 404, 'Not Found', {}, None)) == (
        f'checkpoint {url} cannot be downloaded (HTTP 404); check the URL '
        'and the network, or download the file and pass its path')
    assert '(HTTP 410)' in problem(HTTPError(url, 410, 'Gone', {}, None))
    assert problem(HTTPError(url, 405, 'x', {}, None)) is None  # the GET's
    assert '(Name or service not known)' in problem(
        URLError('Name or service not known'), 'http://example.org/a.pth')
    assert problem(TimeoutError('timed out')).startswith(  # no .reason
        f'checkpoint {url} cannot be downloaded (timed out); ')
    assert all(t is not None and 0 < t <= 30 for t in timeouts)
    # downloaded before (torch.hub's cache, by file name): no request
    (tmp_path / 'hub' / 'checkpoints').mkdir(parents=True)
    (tmp_path / 'hub' / 'checkpoints' / 'soft_small.pth').write_bytes(b'x')
    del requests[:]
    assert cli.checkpoint_problem(url) is None and requests == []


def test_init_checkpoints_missing_pretrained_and_partial_load(tmp_path):
    pre = dict(type='Pretrained', checkpoint='a.pth')
    neck = [dict(type='Normal', std=0.01), dict(pre, checkpoint=str(tmp_path))]
    cfg = Config(dict(model=dict(
        backbone=dict(type='SOFT', init_cfg=pre),
        neck=[dict(init_cfg=neck + [dict(pre, checkpoint=None)])],
        head=dict(init_cfg=dict(type='Kaiming')))))  # yapf: disable
    assert list(cli.init_checkpoints(cfg)) == [
        ('model.backbone.init_cfg.checkpoint', 'a.pth'),
        ('model.neck.0.init_cfg.1.checkpoint', str(tmp_path)),
    ]
    assert list(cli.init_checkpoints(Config(dict()))) == []
    # (check_init_checkpoints' line: test_faults.py's init-cfg-directory)
    # missing_pretrained: the first missing local file of a SOFT's init_cfg
    assert cli.missing_pretrained(cfg).startswith(
        'a.pth (model.backbone.init_cfg.checkpoint) does not exist: ')
    soft = [dict(type='mmsoft.SOFT', init_cfg=[pre]), dict(type='X')]
    cfg = dict(model=dict(parts=[3, dict(teacher=soft)], other=dict(pre)))
    assert cli.missing_pretrained(cfg).startswith(
        'a.pth (model.parts[1].teacher[0].init_cfg[0].checkpoint) does not')
    for fine in ('https://x/a.pth', str(tmp_path), None):
        pre['checkpoint'] = fine
        assert cli.missing_pretrained(cfg) is None, fine
    # --partial-load sets the config's StrictLoadHook, adds none
    hooks = [dict(type='EMAHook'), dict(type='mmsoft.StrictLoadHook')]

    def hooks_after(partial_load, *hooks):
        cfg = Config(dict(custom_hooks=list(hooks)))
        cli.set_partial_load(cfg, partial_load=partial_load)
        return cfg.custom_hooks

    assert hooks_after(True, *hooks) == [
        hooks[0],
        dict(hooks[1], allow_partial=True, opt_in='pass --partial-load')
    ] and hooks[1] == dict(type='mmsoft.StrictLoadHook')
    strict = dict(type='StrictLoadHook')
    assert hooks_after(False, strict)[0]['allow_partial'] is False
    assert hooks_after(False, dict(strict, allow_partial=True))[0][
        'allow_partial'] is True  # the config's choice  # yapf: disable
    cfg = Config(dict())
    cli.set_partial_load(cfg, partial_load=True)
    assert 'custom_hooks' not in cfg


# ---------------------------------------------------- runner arguments
def test_runner_parser_and_args(tmp_path, monkeypatch):
    p = cli.runner_parser('Train a model.', dict(config='the config file',
                          checkpoint='the weights'), 'where to write',
                          'the checkpoint')  # yapf: disable
    text = ' '.join(p.format_help().split())
    for part in ('Train a model.', 'checkpoint the weights',
                 '--work-dir WORK_DIR where to write',
                 '--launcher {none,pytorch,slurm,mpi} job launcher',
                 '--local_rank LOCAL_RANK, --local-rank LOCAL_RANK'):
        assert part in text, part
    helps = {a.dest: a.help for a in p._actions}
    assert helps['partial_load'] == (
        'allow the checkpoint that matches the model only in part (e.g. '
        'another head): load the matching tensors and print what was '
        'skipped. Without it a mismatch (missing / unexpected / mis-shaped '
        'keys) is an error')
    assert helps['cfg_options'] == (
        'override some settings in the used config, the key-value pair in '
        'xxx=yyy format will be merged into config file. If the value to be '
        'overwritten is a list, it should be like key="[a,b]" or key=a,b It '
        'also allows nested list/tuple values, e.g. key="[(a,b),(c,d)]" Note '
        'that the quotation marks are necessary and that no white space is '
        'allowed.')
    monkeypatch.delenv('LOCAL_RANK', raising=False)
    args = cli.parse_runner_args(p, ['a.py', 'b.pth', '--local-rank', '3'])
    assert (args.config, args.checkpoint, args.launcher, args.work_dir,
            args.partial_load, args.cfg_options, args.local_rank,
            os.environ['LOCAL_RANK']) == ('a.py', 'b.pth', 'none', None, False,
                                          None, 3, '3')
    monkeypatch.setenv('LOCAL_RANK', '1')  # torchrun's wins
    cli.parse_runner_args(p, ['a.py', 'b.pth', '--local_rank', '2'])
    assert os.environ['LOCAL_RANK'] == '1'
    raised(
        p.parse_args, ['a.py', 'b.pth', '--launcher', 'ssh'], exc=SystemExit)
    cfg_file = tmp_path / 'my_cfg.py'
    cfg_file.write_text('train_cfg = dict(max_epochs=2)\n')
    args = p.parse_args([
        str(cfg_file), 'b.pth', '--launcher', 'pytorch', '--cfg-options',
        'train_cfg.max_epochs=5'
    ])
    cfg = cli.apply_runner_args(Config.fromfile(str(cfg_file)), args)
    assert (cfg.launcher, cfg.train_cfg.max_epochs,
            cfg.work_dir) == ('pytorch', 5, './work_dirs/my_cfg')
    # --work-dir wins over --cfg-options work_dir=... (as mmdet's train.py)
    cfg, opt = Config(dict(work_dir='from_cfg')), dict(work_dir='opt')
    for work_dir, options, want in ((None, None, 'from_cfg'),
                                    ('given', opt, 'given'), (None, opt,
                                                              'opt')):
        args.work_dir, args.cfg_options = work_dir, options
        assert cli.apply_runner_args(cfg, args).work_dir == want


@pytest.mark.parametrize(
    'files, where',
    [
        # the config itself; its line, not mmengine's "<unknown>"
        ([('c.py', 'a = 1\nb = dict(\n    x=1,,\n)\n')], 'c.py:3'),
        ([('c.py', 'a = dict(\n')], 'c.py:1'),  # '(' was never closed
        # a file of its _base_ (a string or a list; mmdet:: bases skipped)
        ([('c.py', "_base_ = ['mmdet::_base_/default_runtime.py', "
           "'./b/base.py']\n"), ('b/base.py', '_base_ = "base2.py"\n'),
          ('b/base2.py', 'x = = 1\n')], 'b/base2.py:1'),
        ([('c.py', 'a = dict(x=1)\n')], None),  # valid
    ])
def test_load_config_names_a_syntax_error(tmp_path, files, where):
    for name, text in files:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(text)
    path = str(tmp_path / 'c.py')
    if where is None:
        assert cli.load_config(path).a.x == 1
        assert cli.config_syntax_error(path) is None
        # a base of itself, a statement, an attribute target: no error
        loop = tmp_path / 'loop.py'
        loop.write_text("_base_ = 'loop.py'\nimport os\nos.x = 1\n")
        assert cli.config_syntax_error(str(loop)) is None
        return
    assert raised(
        cli.load_config,
        path).startswith(f'config {tmp_path / where}: syntax error: ')
    assert cli.config_syntax_error(path).startswith(
        f'{tmp_path / where}: syntax error')


def test_seed_range(capsys):
    """tools/demo.py's --seed: numpy's 0 .. 2**32 - 1 (:data:`RUNNER_ARGS`)"""
    for seed in ('0', '4294967295'):  # both ends accepted
        assert DEMO.parse_args(['--seed', seed]).seed == cli.seed_int(seed) \
            == int(seed)
    for seed in ('-1', '4294967296', 'abc'):
        raised(DEMO.parse_args, ['--seed', seed], exc=SystemExit)
        assert f'error: argument --seed: {SEED}' in capsys.readouterr().err


UNSET = '--launcher pytorch: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not ' \
    'set (the process was not started by torchrun): start the processes with '
ONE = ', or leave --launcher out for one process'
SEED = ('a seed must be an integer from 0 to 4294967295 (2**32 - 1, numpy\'s '
        'limit), got ')
OUT = 'default_hooks.checkpoint.out_dir'
SPACES = ("contains spaces, which mmengine's --cfg-options parser removes "
          '(it would be ')
#: (arguments after the config, environment, the tool, the start of the
#: ToolError's line (None: accepted)) of ``parse_runner_args`` (argv from
#: sys.argv) and ``merge_cfg_options`` into :func:`_values_cfg`
RUNNER_ARGS = [
    # --launcher outside its starter (torchrun / srun); mpi: not checked
    (['--launcher', 'pytorch'], {}, 'train.py', UNSET + 'tools/dist_train.sh'
     ' CONFIG GPUS [options] (or torchrun)' + ONE),
    (['--launcher', 'pytorch'], dict(RANK='0', WORLD_SIZE='2'), 'test.py',
     '--launcher pytorch: MASTER_ADDR, MASTER_PORT not set (the process was '
     'not started by torchrun): start the processes with tools/dist_test.sh '
     'CONFIG CHECKPOINT GPUS [options] (or torchrun)' + ONE),
    (['--launcher', 'slurm'], dict(SLURM_PROCID='0'), 'train.py',
     '--launcher slurm: SLURM_NTASKS, SLURM_NODELIST not set (the process '
     'was not started by srun): start the processes with '
     'tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR (or srun)' +
     ONE),
    (['--launcher', 'pytorch'], {}, 'other.py', UNSET + 'torchrun' + ONE),
    (['--launcher', 'pytorch'],
     dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='h', MASTER_PORT='1'),
     'train.py', None),
    (['--launcher', 'mpi'], {}, 'train.py', None),
    # randomness.seed: numpy's 0 .. 2**32 - 1
    *[(['--cfg-options', f'randomness.seed={v}'], {}, 't', None)
      for v in ('0', '4294967295')],
    *[(['--cfg-options', f'randomness.seed={v}'], {}, 't',
       f'--cfg-options randomness.seed={value!r}: {SEED}{value!r}')
      for v, value in (('-1', -1), ('4294967296', 4294967296),
                       ('abc', 'abc'), ('True', True))],
    # a space DictAction would drop
    *[(['--cfg-options', 'x=1', f'{OUT}={v}'], {}, 't',
       f'--cfg-options {OUT}: the value {v!r} {SPACES}')
      for v in ("'/path/with a space'", '/path/with\ta\ttab')],
    *[(['--cfg-options', f'{OUT}={v}'], {}, 't', None)
      for v in (' /padded ', '[(1, 2), (3, 4)]')],
    # a number / boolean of the config replaced by what is none
    (['--cfg-options', 'optim.lr=abc'], {}, 't', "--cfg-options optim.lr="
     "'abc': the config's optim.lr is a number (0.01); give a number (e.g. "
     'optim.lr=0.01)'),
    (['--cfg-options', 'train_cfg.max_epochs=true'], {}, 't',
     "--cfg-options train_cfg.max_epochs=True: the config's "
     'train_cfg.max_epochs is a number (12)'),
    (['--cfg-options', 'model.frozen=yes'], {}, 't', "--cfg-options "
     "model.frozen='yes': the config's model.frozen is true or false "
     '(False); give true or false (e.g. model.frozen=False)'),
    (['--cfg-options', 'pipeline.0.scale=big'], {}, 't', "--cfg-options "
     "pipeline.0.scale='big': the config's pipeline.0.scale is a number (1)"),
    # mmengine's parser: a dict is a string or a RecursionError
    (['--cfg-options', 'model.loss=dict(a=1,b=[1,2])'], {}, 't',
     "--cfg-options model.loss=dict(a=1,b=[1,2]): a dict is no --cfg-options "
     "value (mmengine's parser takes numbers, strings, true / false / None "
     'and lists or tuples: key=a,b or key="[a,(b,c)]"); set its keys one by '
     'one (model.loss.type=... model.loss.<name>=...) or write the dict in a '
     'config file'),
    (['--cfg-options', "model.loss={'a':1}"], {}, 't',
     "--cfg-options model.loss={'a':1}: a dict is no --cfg-options value"),
    (['--cfg-options', 'model.x=[1,2'], {}, 't', "--cfg-options model.x=[1,2"
     ": mmengine's parser cannot read it (AssertionError: Imbalanced "
     'brackets'),
    # what the config's value can be, new keys, structures
    *[(['--cfg-options', item], {}, 't', None)
      for item in ('train_cfg.max_epochs=2.5', 'model.frozen=None',
                   'model.new_key=abc', 'pipeline.0.scale=[1,2]',
                   'train_cfg.epochs=1', 'model._scope_=x')],
    # a near-miss key: the closest one named, nothing merged
    *[(['--cfg-options', 'train_cfg.max_epochs=3', f'{key}=1'], {}, 't',
       f'--cfg-options {key}: the config has no key {name!r} under {where}; '
       f'did you mean {mean}?') for key, name, where, mean in (
           ('train_cfgs.max_epochs', 'train_cfgs', 'the top level',
            'train_cfg'),
           ('pipeline.0.scales', 'scales', 'pipeline.0', 'pipeline.0.scale'),
           ('train_cfg.max_epoc', 'max_epoc', 'train_cfg',
            'train_cfg.max_epochs'))],
    # what mmengine cannot merge: one line that starts with the option
    (['--cfg-options', 'model.loss.type=FPN'], {}, 't', "--cfg-options: "
     "loss={'type': 'FPN'} in child config cannot inherit from base"),
]  # yapf: disable


@pytest.mark.parametrize('argv, env, prog, line', RUNNER_ARGS)
def test_runner_args_refused(monkeypatch, argv, env, prog, line):
    for name in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',
                 'SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'):
        monkeypatch.delenv(name, raising=False)
    for name, value in dict(env, LOCAL_RANK='0').items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, 'argv', [prog, 'c.py'] + argv)
    cfg = Config(dict(
        train_cfg=dict(max_epochs=12, max_epoch_s=2), optim=dict(lr=0.01),
        model=dict(frozen=False, name='m', loss=None, x=None),
        pipeline=[dict(type='A', scale=1)]))  # yapf: disable
    try:
        p = cli.runner_parser('t', dict(config='config'), 'w', 'c')
        p.prog = prog
        args = cli.parse_runner_args(p, None)
        cli.merge_cfg_options(cfg, args.cfg_options)
    except cli.ToolError as e:
        assert line is not None and str(e).startswith(line), str(e)
        assert '\n' not in str(e) and cfg.train_cfg.max_epochs == 12
        if '--launcher' in argv:  # launcher_problem's line
            assert cli.launcher_problem(argv[1], prog) == str(e)
        if SPACES in line:
            assert str(e).endswith(f'set {OUT} in a config file instead (a '
                                   'small config with _base_ = [<your '
                                   'config>])')
    else:
        assert line is None, argv
        if argv[-1].startswith('randomness.seed='):
            assert args.cfg_options['randomness.seed'] == int(argv[-1][16:])
        if argv[-1] == 'train_cfg.max_epochs=2.5':
            assert cfg.train_cfg.max_epochs == 2.5


def test_cfg_option_problem_passes_what_it_cannot_judge(monkeypatch):
    cfg = Config(dict(train_cfg=dict(max_epochs=12), pipeline=[dict(a=1)],
                      model=dict(backbone=dict(depth=50))))  # yapf: disable
    assert [cli.cfg_option_problem(cfg, key) for key in (
        'train_cfg.max_epochs', 'pipeline.5.scales', 'train_cfg.max_epochs.x',
        'model.backbone.0')] == [None] * 4  # yapf: disable
    # the types of run_main's one line: only of the modules imported
    monkeypatch.delitem(sys.modules, 'mmsoft_tools.work_dir_lock', False)
    types = {t.__name__ for t in cli._expected_types()}
    assert 'ToolError' in types and 'WorkDirLockedError' not in types


# =================================================================== launch
def test_dicts_codebase_and_compile_refusal():
    node = dict(type='A', norm=dict(type='SyncBN'), other='SyncBN',
                layers=[dict(type='MMSyncBN'),
                        (dict(type='BN'), 3)])  # yapf: disable
    assert [d.get('type') for d in launch._dicts(node)] == \
        ['A', 'SyncBN', 'MMSyncBN', 'BN']
    assert launch._sync_bn_to_bn(node) == 2
    assert [d.get('type') for d in launch._dicts(node)] == ['A'] + ['BN'] * 3
    assert launch._types_in(dict(type='X', sub=[dict(type=dict)])) == {'X'}
    assert launch.codebase_of(Config(dict(default_scope='mmseg'))) == 'mmseg'
    assert raised(
        launch.codebase_of, Config(dict()), exc=ValueError) == (
            "cannot tell which codebase runs this config: default_scope is "
            "None, expected one of ['mmdet', 'mmpretrain', 'mmseg'] (configs "
            "inherit it from e.g. 'mmdet::_base_/default_runtime.py')")
    refusal = launch.compile_refusal
    for cfg, version in ((dict(), '2.1.2'), (dict(compile=False), '2.1.2'),
                         (dict(compile=True), '2.4.0'),
                         (dict(compile=True), '2.14.1+cpu')):  # yapf: disable
        assert refusal(Config(cfg), version) is None, (cfg, version)
    assert refusal(
        Config(dict(compile=dict(backend='inductor'))),
        '2.3.1') == ("error: compile={'backend': 'inductor'} needs torch "
                     ">= 2.4: with torch 2.3.1 mmengine's compiled "
                     'train_step crashes (a torch bug); remove compile from '
                     'the config (or its --cfg-options) or upgrade torch')


def _amp_cfg(wrapper='OptimWrapper', roi=False):
    model = dict(type='M', roi_head=dict(type='RoIAlign')) if roi else \
        dict(type='M')
    return Config(dict(model=model, optim_wrapper=dict(
        type=wrapper, optimizer=dict(type='SGD'))))  # yapf: disable


@pytest.fixture
def logged(monkeypatch):
    """The tools' log lines (``print_log``) as ``(level, message)``."""
    lines = []

    def print_log(msg, logger=None, level=INFO):
        assert logger == 'current'
        lines.append((level, msg))

    monkeypatch.setattr(launch, 'print_log', print_log)
    monkeypatch.delenv('RANK', raising=False)
    monkeypatch.delenv('SLURM_PROCID', raising=False)
    return lines


def test_enable_amp(monkeypatch, logged):
    already = [(WARN, 'AMP training is already enabled in your config.')]

    def amp(cfg, want, log):
        del logged[:]
        assert launch.enable_amp(cfg) == want == cfg.optim_wrapper.type
        assert logged == log
        return cfg.optim_wrapper

    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cpu = [(WARN, '--amp without CUDA: training under bfloat16 CPU autocast '
            '(CPUAmpOptimWrapper, no loss scaling); fp16 AMP needs a GPU.')]
    # a wrapper without a type is mmengine's OptimWrapper
    amp(Config(dict(model=dict(), optim_wrapper=dict(optimizer=dict()))),
        'CPUAmpOptimWrapper', cpu)  # yapf: disable
    amp(_amp_cfg('CPUAmpOptimWrapper'), 'CPUAmpOptimWrapper', already)
    # the config's fp16 AMP cannot run here: --amp makes it bfloat16's
    cfg = _amp_cfg('AmpOptimWrapper')
    cfg.optim_wrapper.loss_scale = 'dynamic'
    assert 'loss_scale' not in amp(cfg, 'CPUAmpOptimWrapper', cpu)
    assert raised(
        launch.enable_amp, _amp_cfg('OtherWrapper'), exc=ValueError) == (
            '`--amp` is only supported when the optimizer wrapper '
            'type is `OptimWrapper`, but got OtherWrapper.')
    assert raised(
        launch.enable_amp, _amp_cfg(roi=True), exc=ValueError
    ) == ("--amp without CUDA trains under bfloat16 autocast, but this model "
          "uses ['RoIAlign'], whose mmcv CPU kernel has no bfloat16 version; "
          'train it without --amp (or on a GPU).')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    # fp16 RoIAlign exists on CUDA
    assert amp(_amp_cfg(roi=True), 'AmpOptimWrapper',
               []).loss_scale == 'dynamic'
    amp(_amp_cfg('AmpOptimWrapper'), 'AmpOptimWrapper', already)
    # amp_refusal: a config's fp16 AMP without a GPU
    for name in ('is_npu_available', 'is_mlu_available', 'is_musa_available'):
        monkeypatch.setattr(device, name, lambda: False)
    for wrapper, cuda, refused in (('mmengine.AmpOptimWrapper', False,
                                    True), ('AmpOptimWrapper', True, False),
                                   ('CPUAmpOptimWrapper', False, False)):
        monkeypatch.setattr(device, 'is_cuda_available', lambda: cuda)
        assert launch.amp_refusal(_amp_cfg(wrapper)) == (
            refused and
            (f"optim_wrapper.type={wrapper} (mmengine's fp16 AMP) needs a GPU "
             'and this machine has none (torch.cuda.is_available() is False): '
             "pass --amp instead (without CUDA: mmsoft's CPUAmpOptimWrapper, "
             'bfloat16 autocast), or train in fp32 '
             '(optim_wrapper.type=OptimWrapper)') or None)


def test_name_run(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, '_RUNS', itertools.count(1))
    cfg_file = tmp_path / 'retina_cfg.py'
    cfg_file.write_text('a = 1\n')
    cfgs = [Config.fromfile(str(cfg_file)) for _ in range(2)]
    assert [launch.name_run(cfg) for cfg in cfgs] == \
        ['retina_cfg', 'retina_cfg_2']
    assert cfgs[1].experiment_name == 'retina_cfg_2'
    assert launch.name_run(Config(dict(experiment_name='exp'))) == 'exp_3'


GLOO = (INFO, "CUDA is not available: distributed backend 'nccl' -> 'gloo'")


def _sync_bn(n):
    return WARN, (
        f'CUDA is not available: {n} SyncBN setting(s) of the config '
        'replaced by BN (SyncBatchNorm has no CPU implementation)')


DDP = 'MMDistributedDataParallel'
#: (config, launcher, RANK / SLURM_PROCID, what the config has after it,
#: log) of setup_cpu_distributed without CUDA in a process group
DIST = [
    (dict(env_cfg=dict(dist_cfg=dict(backend='nccl')), sync_bn='torch',
          model=dict(norm_cfg=dict(type='SyncBN'))), 'pytorch', '0',
     dict(env_cfg=dict(dist_cfg=dict(backend='gloo')), sync_bn=None,
          model=dict(norm_cfg=dict(type='BN')),
          model_wrapper_cfg=dict(type=DDP, device_ids=None,
                                 broadcast_buffers=False,
                                 find_unused_parameters=False)),
     [GLOO, _sync_bn(2)]),
    (dict(find_unused_parameters=True), 'pytorch', '0',
     dict(model_wrapper_cfg=dict(type=DDP, device_ids=None,
                                 broadcast_buffers=False,
                                 find_unused_parameters=True)), [GLOO]),
    # the config's own wrapper is kept, only device_ids changes; rank 1
    # logs nothing
    (dict(model_wrapper_cfg=dict(type=DDP, broadcast_buffers=True,
                                 device_ids=[0])), 'slurm', '1',
     dict(model_wrapper_cfg=dict(type=DDP, broadcast_buffers=True,
                                 device_ids=None)), []),
    # (no backend given: mmengine's default, nccl)
    (dict(env_cfg=dict(cudnn_benchmark=False)), 'pytorch', '0',
     dict(env_cfg=dict(cudnn_benchmark=False,
                       dist_cfg=dict(backend='gloo'))), [GLOO]),
    # the rest of dist_cfg is kept; gloo already: nothing to say
    (dict(env_cfg=dict(dist_cfg=dict(backend='gloo', timeout=600))),
     'pytorch', '0',
     dict(env_cfg=dict(dist_cfg=dict(backend='gloo', timeout=600))), []),
    # a wrapper without a type is mmengine's DDP: device_ids=None; one that
    # is not a DistributedDataParallel takes no device_ids
    (dict(model_wrapper_cfg=dict(broadcast_buffers=True)), 'pytorch', '0',
     dict(model_wrapper_cfg=dict(broadcast_buffers=True, device_ids=None)),
     [GLOO]),
    (dict(model_wrapper_cfg=dict(type='MMFullyShardedDataParallel')),
     'pytorch', '0',
     dict(model_wrapper_cfg=dict(type='MMFullyShardedDataParallel')),
     [GLOO]),
    # one SyncBN, no sync_bn key: one replaced, the count in the warning
    (dict(env_cfg=dict(dist_cfg=dict(backend='gloo')),
          model=dict(neck=dict(norm_cfg=dict(type='MMSyncBN')))), 'pytorch',
     '0', dict(model=dict(neck=dict(norm_cfg=dict(type='BN'))), sync_bn=None),
     [_sync_bn(1)]),
]  # yapf: disable


@pytest.mark.parametrize('cfg, launcher, rank, want, log', DIST)
def test_setup_cpu_distributed(monkeypatch, logged, cfg, launcher, rank, want,
                               log):
    cfg = Config(dict(dict(model=dict()), **cfg))
    monkeypatch.setenv('RANK' if launcher == 'pytorch' else 'SLURM_PROCID',
                       rank)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(mmengine.dist, 'is_distributed', lambda: True)
    assert launch.setup_cpu_distributed(cfg, launcher) is True
    assert {k: cfg.get(k) for k in want} == want and logged == log


def test_setup_cpu_distributed_starts_the_group(monkeypatch):
    """No process group: init_dist (gloo), torch.cuda.set_device a no-op;
    one process or CUDA: nothing done."""
    cfg = Config(dict(model=dict(norm_cfg=dict(type='SyncBN'))))
    assert launch.setup_cpu_distributed(cfg, 'none') is False
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert launch.setup_cpu_distributed(cfg, 'pytorch') is False
    assert cfg.model.norm_cfg.type == 'SyncBN'  # untouched with CUDA
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(mmengine.dist, 'is_distributed', lambda: False)
    calls = []
    real_set_device = torch.cuda.set_device

    def init_dist(launcher, **kwargs):
        torch.cuda.set_device(3)  # as mmengine's does: a no-op here
        calls.append(('init_dist', launcher, kwargs))

    monkeypatch.setattr(mmengine.dist, 'init_dist', init_dist)
    monkeypatch.setattr(
        mmengine.utils.dl_utils, 'set_multi_processing',
        lambda **kwargs: calls.append(('set_multi_processing', kwargs)))
    cfg = Config(dict(model=dict(), env_cfg=dict(
        mp_cfg=dict(mp_start_method='fork'),
        dist_cfg=dict(backend='nccl', timeout=60))))  # yapf: disable
    assert launch.setup_cpu_distributed(cfg, 'slurm') is True
    launch.setup_cpu_distributed(Config(dict(model=dict())), 'pytorch')
    assert calls == [('set_multi_processing',
                      dict(mp_start_method='fork', distributed=True)),
                     ('init_dist', 'slurm', dict(backend='gloo', timeout=60)),
                     ('set_multi_processing', dict(distributed=True)),
                     ('init_dist', 'pytorch', dict(backend='gloo'))]
    assert torch.cuda.set_device is real_set_device  # restored


def test_prepare_cfg_and_import_codebase(monkeypatch):
    """The tools only register; the default scope stays as it was."""
    monkeypatch.setattr(launch, '_RUNS', itertools.count(1))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    before = DefaultScope.get_current_instance()
    cfg = Config(dict(default_scope='mmpretrain', model=dict(type='M')))
    assert launch.prepare_cfg(cfg) == 'mmpretrain'
    # not distributed by default: the config is left as it was
    assert cfg.experiment_name == 'run'
    assert 'model_wrapper_cfg' not in cfg and 'env_cfg' not in cfg
    assert DefaultScope.get_current_instance() is before
    with DefaultScope.overwrite_default_scope('mmsoft'):
        inner = DefaultScope.get_current_instance()
        assert launch.import_codebase(Config(dict(default_scope='mmseg'))) \
            == 'mmseg'
        assert DefaultScope.get_current_instance() is inner
    monkeypatch.setattr(torch, '__version__', '2.1.2')
    assert raised(
        launch.prepare_cfg,
        Config(dict(default_scope='mmpretrain', compile=True)),
        exc=SystemExit).startswith(
            'error: compile=True needs torch >= 2.4: with torch 2.1.2 ')


def test_shutdown_dist(monkeypatch, logged):
    calls = []
    monkeypatch.setattr(dist, 'is_available', lambda: True)
    monkeypatch.setattr(dist, 'is_initialized', lambda: True)
    monkeypatch.setattr(dist, 'destroy_process_group',
                        lambda: calls.append('destroy'))

    def barrier():
        calls.append('barrier')
        raise RuntimeError('peer gone')

    monkeypatch.setattr(dist, 'barrier', barrier)
    launch.shutdown_dist()
    assert calls == ['barrier', 'destroy']
    assert logged == [(WARN, 'shutdown_dist: barrier failed (peer gone); '
                       'tearing the process group down anyway')]
    del calls[:]
    try:  # an exception on its way out: no barrier (a peer may be gone)
        raise ValueError('x')
    except ValueError:
        launch.shutdown_dist()
    assert calls == ['destroy']
    # _log_rank0: RANK, else SLURM_PROCID
    del logged[:]
    launch._log_rank0('a')
    monkeypatch.setenv('RANK', '1')
    launch._log_rank0('b')
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('SLURM_PROCID', '3')  # RANK wins
    launch._log_rank0('c', level=WARN)
    monkeypatch.delenv('RANK')
    launch._log_rank0('d')
    assert logged == [(INFO, 'a'), (WARN, 'c')]
