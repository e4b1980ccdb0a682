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


# ------------------------------------------------------------- one_line
@pytest.mark.parametrize(
    'exc, line',
    [
        (cli.ToolError('bad\n   value  here'), 'error: bad value here'),
        (CheckpointMismatchError('x'), 'error: x'),
        # SafeCheckpointHook's full disk: its own line (the previous
        # checkpoint, the fix), as tools/train.py printed it itself before
        (CheckpointWriteError(errno.ENOSPC,
                              'cannot save epoch_2.pth: kept epoch_1.pth'),
         'error: cannot save epoch_2.pth: kept epoch_1.pth'),
        (ValueError('x'), None),  # a bug: its traceback
        (KeyError('x'), None),
        # an errno without a known fix keeps its traceback
        (OSError(errno.EIO, 'I/O error', '/x'), None),
        # the loaders' own messages: no errno
        (FileNotFoundError('no file a.pth'), 'error: no file a.pth'),
        (OSError('something odd'), None),
        (URLError('Name or service not known'),
         'error: a download failed (Name or service not known): check the URL '
         'and the network, or download the file and pass its path'),
        # an HTTP error keeps mmengine's own handling
        (HTTPError('http://x', 500, 'boom', {}, None), None),
        # an atomic write's temporary is named by its target
        (OSError(errno.ENOSPC, 'No space left on device',
                 temp_path_for('/w/epoch_3.pth')),
         'error: /w/epoch_3.pth (not replaced): No space left on device '
         '(errno 28 ENOSPC); free some space or write somewhere else'),
        (OSError(errno.EACCES, 'Permission denied', '/x/y.pth'),
         'error: /x/y.pth: Permission denied (errno 13 EACCES); check the '
         'permissions (ls -l) or choose another path'),
    ])
def test_one_line(exc, line):
    assert cli.one_line(exc) == line


@pytest.mark.parametrize('err, what', [
    (errno.ENOSPC, 'a write'),
    (errno.EFBIG, 'a write'),
    (errno.EACCES, 'a file operation'),
])
def test_one_line_os_error_without_a_file(err, what):
    """No file name (a full disk on close): no ``error: :`` (issue 52)."""
    strerror = os.strerror(err)
    for filename in (None, ''):
        line = cli.one_line(OSError(err, strerror, filename))
        assert line.startswith(
            f'error: {what} failed: {strerror} (errno {err} '
            f'{errno.errorcode[err]}; the system named no file); '), line
        assert not line.startswith('error: :') and ': :' not in line
    line = cli.one_line(OSError(errno.ENOSPC, None))
    assert 'failed: [Errno 28] None' not in line and 'None (' not in line


@pytest.mark.parametrize(
    'path, target',
    [
        (temp_path_for('/w/a.b.pth'), '/w/a.b.pth (not replaced)'),
        (temp_path_for('/w/a.b.pth', '.zip'), '/w/a.b.pth (not replaced)'),
        ('/x/.hidden.pth', '/x/.hidden.pth'),
        (None, ''),
    ],
    # the temp names hold the pid and a random part: ids that are the same
    # in every xdist worker
    ids=['temp', 'temp-zip', 'hidden', 'none'])
def test_target_of_temp(path, target):
    assert cli._target_of_temp(path) == target


# ------------------------------------------------------------- run_main
def test_run_main_exit_codes(capsys, monkeypatch):
    monkeypatch.delenv('MMSOFT_TRACEBACK', raising=False)

    def exits(main):
        with pytest.raises(SystemExit) as e:
            cli.run_main(main, [])
        return e.value.code

    assert exits(lambda argv: 3) == 3
    with pytest.raises(SystemExit) as e:  # main gets the arguments
        cli.run_main(lambda argv: len(argv), ['a', 'b'])
    assert e.value.code == 2
    assert exits(lambda argv: dict(acc=1.0)) == 0  # test.py: metrics
    assert exits(lambda argv: None) == 0
    capsys.readouterr()

    def fails(argv):
        raise cli.ToolError('the config has no key x')

    assert exits(fails) == 1
    assert capsys.readouterr().err == 'error: the config has no key x\n'
    monkeypatch.setenv('MMSOFT_TRACEBACK', '1')
    with pytest.raises(cli.ToolError):
        cli.run_main(fails, [])
    for off in ('0', ''):
        monkeypatch.setenv('MMSOFT_TRACEBACK', off)
        assert exits(fails) == 1

    def bug(argv):
        raise ZeroDivisionError('a bug')

    with pytest.raises(ZeroDivisionError):
        cli.run_main(bug, [])


# ------------------------------------------------------ argparse types
@pytest.mark.parametrize('text, value', [('1', 1), ('12', 12), ('0', None),
                                         ('-2', None), ('two', None),
                                         ('1.5', None), (None, None)])
def test_positive_int(text, value):
    if value is not None:
        assert cli.positive_int(text) == value
        return
    with pytest.raises(
            argparse.ArgumentTypeError, match='expected a positive integer'):
        cli.positive_int(text)


# ------------------------------------------------------- input checks
def test_check_readable(tmp_path, monkeypatch):
    cli.check_readable(str(tmp_path / 'missing.pth'))  # the loader's
    cli.check_readable(str(tmp_path))  # message
    good = tmp_path / 'good.pth'
    good.write_bytes(b'x' * 4096)
    sizes, real_open = [], builtins.open

    class Probe(io.FileIO):  # a checkpoint of gigabytes is probed, not read

        def read(self, size=-1):
            sizes.append(size)
            return super().read(size)

    monkeypatch.setattr(
        builtins, 'open', lambda path, *a, **k: Probe(path)
        if str(path) == str(good) else real_open(path, *a, **k))
    cli.check_readable(str(good))
    assert sizes and all(s is not None and 0 < s <= 64 for s in sizes)
    for error, reason in (
        (PermissionError(errno.EACCES,
                         'Permission denied'), 'Permission denied (errno 13)'),
        (OSError('the file system refused'), 'the file system refused'),
    ):

        def refusing(path, *args, error=error, **kwargs):
            if str(path) == str(good):  # ``good`` only
                raise error
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(builtins, 'open', refusing)
        with pytest.raises(ConversionError) as e:
            cli.check_readable(str(good))
        assert str(e.value) == (
            f'cannot read {str(good)!r}: {reason}; check its permissions '
            '(ls -l) or copy it somewhere readable')


def test_unwritable_reason(tmp_path, monkeypatch):
    f = tmp_path / 'file'
    f.write_text('')
    assert cli.unwritable_reason(str(tmp_path / 'a' / 'b' / 'out.pth')) \
        is None  # missing parents are created
    assert cli.unwritable_reason(str(tmp_path)) == \
        'is a directory; give a file name'
    assert cli.unwritable_reason(str(tmp_path), directory=True) is None
    assert cli.unwritable_reason(str(f), directory=True) == \
        'exists and is not a directory'
    assert cli.unwritable_reason(str(f / 'sub' / 'out.pth')) == \
        f'{f} is a file, not a directory'
    # (write permission missing; the directory exists and can be entered)
    monkeypatch.setattr(os, 'access', lambda path, mode: not mode & os.W_OK)
    assert cli.unwritable_reason(str(tmp_path / 'new' / 'out.pth')) == \
        f'directory {tmp_path} is not writable'


def test_check_work_dir(tmp_path, monkeypatch):
    cli.check_work_dir(None)
    cli.check_work_dir('')
    before = sorted(os.listdir(tmp_path))
    cli.check_work_dir(str(tmp_path / 'new' / 'run'))
    assert sorted(os.listdir(tmp_path)) == before  # the probe is gone
    f = tmp_path / 'file'
    f.write_text('')
    with pytest.raises(cli.ToolError) as e:
        cli.check_work_dir(str(f))
    assert str(e.value) == (f'--work-dir {f}: exists and is not a directory; '
                            'give a directory (it is created if needed)')
    with pytest.raises(cli.ToolError) as e:
        cli.check_work_dir(str(f / 'run'), option='--out-dir')
    assert str(e.value) == (f'--out-dir {f / "run"}: {f} is a file, not a '
                            'directory; give another path')

    def read_only(**kwargs):
        raise OSError(errno.EROFS, 'Read-only file system')

    monkeypatch.setattr(tempfile, 'TemporaryDirectory', read_only)
    with pytest.raises(cli.ToolError) as e:
        cli.check_work_dir(str(tmp_path / 'run'))
    assert str(e.value) == (
        f'--work-dir {tmp_path / "run"}: cannot write there (Read-only file '
        'system); choose a writable directory')


def test_check_device(monkeypatch):
    cli.check_device(None)
    cli.check_device('cpu')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    # (a driver that lists devices it cannot use: still not available)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    with pytest.raises(cli.ToolError) as e:
        cli.check_device('cuda:0')
    assert str(
        e.value) == ('--device cuda:0: CUDA is not available on this machine '
                     '(torch.cuda.is_available() is False); use --device cpu')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    cli.check_device('cuda')
    cli.check_device('cuda:1')
    with pytest.raises(cli.ToolError) as e:
        cli.check_device('cuda:2')
    assert str(e.value) == ('--device cuda:2: this machine has 2 CUDA '
                            'device(s) (cuda:0 .. cuda:1)')


# ----------------------------------------------------------- checkpoints
def test_checkpoint_problem_local(tmp_path, monkeypatch):
    assert cli.checkpoint_problem(tmp_path) == (
        f'checkpoint {tmp_path} is a directory, not a file; pass a .pth '
        'checkpoint file (e.g. <work_dir>/epoch_N.pth)')
    # another scheme is MMEngine's to load, even where the same text
    # names a local path ('open-mmlab:/resnet50')
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'open-mmlab:').mkdir()
    (tmp_path / 'open-mmlab:' / 'resnet50').write_bytes(b'not a zip')
    assert cli.checkpoint_problem('open-mmlab://resnet50') is None
    good = tmp_path / 'good.pth'
    torch.save(dict(state_dict=dict(w=torch.ones(2))), good)
    assert cli.checkpoint_problem(good) is None
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(good.read_bytes()[:-200])
    problem = cli.checkpoint_problem(bad)
    assert problem.startswith(f'checkpoint {bad} ')
    assert problem.endswith('it was not loaded (use an earlier or a fresh '
                            'copy)')
    assert cli.checkpoint_problem(tmp_path / 'missing.pth') is None
    assert cli.checkpoint_problem('open-mmlab://resnet50') is None
    assert cli.checkpoint_problem('s3://bucket/a.pth') is None


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """torch.hub's download cache in ``tmp_path``; ``urlopen`` records the
    requests and raises what ``hub.answer`` holds (None: success)."""
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(tmp_path / 'hub'))

    class Hub:
        answer = None
        requests = []  # (url, method)
        timeouts = []

    def urlopen(request, timeout=None):
        Hub.requests.append((request.full_url, request.get_method()))
        Hub.timeouts.append(timeout)
        if Hub.answer is not None:
            raise Hub.answer
        return io.BytesIO()  # a response: closed after the HEAD

    monkeypatch.setattr(urllib.request, 'urlopen', urlopen)
    return Hub


def test_url_problem(hub, tmp_path):
    url = 'https://example.org/w/soft_small.pth?raw=1'
    assert cli.checkpoint_problem(url) is None  # reachable
    assert hub.requests == [(url, 'HEAD')]
    hub.answer = HTTPError(url, 404, 'Not Found', {}, None)
    assert cli.checkpoint_problem(url) == (
        f'checkpoint {url} cannot be downloaded (HTTP 404); check the URL '
        'and the network, or download the file and pass its path')
    hub.answer = HTTPError(url, 410, 'Gone', {}, None)
    assert '(HTTP 410)' in cli.checkpoint_problem(url)
    for code in (403, 405):  # HEAD refused: the download decides
        hub.answer = HTTPError(url, code, 'x', {}, None)
        assert cli.checkpoint_problem(url) is None
    hub.answer = URLError('Name or service not known')
    assert '(Name or service not known)' in cli.checkpoint_problem(
        'http://example.org/a.pth')
    hub.answer = TimeoutError('timed out')  # an OSError without .reason
    assert cli.checkpoint_problem(url).startswith(
        f'checkpoint {url} cannot be downloaded (timed out); ')
    # a check never waits for ever on a silent server
    assert all(t is not None and 0 < t <= 30 for t in hub.timeouts)
    # downloaded before (torch.hub's cache, by file name): no request
    cache = tmp_path / 'hub' / 'checkpoints'
    cache.mkdir(parents=True)
    (cache / 'soft_small.pth').write_bytes(b'x')
    del hub.requests[:]
    assert cli.checkpoint_problem(url) is None
    assert hub.requests == []


def test_init_checkpoints_and_their_problems(tmp_path):
    cfg = Config(
        dict(
            model=dict(
                backbone=dict(
                    type='SOFT',
                    init_cfg=dict(type='Pretrained', checkpoint='a.pth')),
                neck=[
                    dict(init_cfg=[
                        dict(type='Normal', std=0.01),
                        dict(type='Pretrained', checkpoint=str(tmp_path)),
                        dict(type='Pretrained', checkpoint=None),
                    ])
                ],
                head=dict(init_cfg=dict(type='Kaiming')))))
    assert list(cli.init_checkpoints(cfg)) == [
        ('model.backbone.init_cfg.checkpoint', 'a.pth'),
        ('model.neck.0.init_cfg.1.checkpoint', str(tmp_path)),
    ]
    assert list(cli.init_checkpoints(Config(dict()))) == []
    with pytest.raises(cli.ToolError) as e:
        cli.check_init_checkpoints(cfg)
    assert str(e.value).endswith('[model.neck.0.init_cfg.1.checkpoint]')
    assert 'is a directory' in str(e.value)


def test_set_partial_load():
    """--partial-load sets the config's StrictLoadHook, adds none."""
    hooks = [dict(type='EMAHook'), dict(type='mmsoft.StrictLoadHook')]
    cfg = Config(dict(custom_hooks=hooks))
    cli.set_partial_load(cfg, partial_load=True)
    assert cfg.custom_hooks == [
        hooks[0],
        dict(hooks[1], allow_partial=True, opt_in='pass --partial-load')
    ] and hooks[1] == dict(type='mmsoft.StrictLoadHook')
    cfg = Config(dict(custom_hooks=[dict(type='StrictLoadHook')]))
    cli.set_partial_load(cfg, partial_load=False)
    assert cfg.custom_hooks[0]['allow_partial'] is False
    cfg = Config(
        dict(custom_hooks=[dict(type='StrictLoadHook', allow_partial=True)]))
    cli.set_partial_load(cfg, partial_load=False)  # the config's choice
    assert cfg.custom_hooks[0]['allow_partial'] is True
    cfg = Config(dict())
    cli.set_partial_load(cfg, partial_load=True)
    assert 'custom_hooks' not in cfg


# ---------------------------------------------------- runner arguments
def test_runner_parser_and_args(tmp_path, monkeypatch):
    parser = cli.runner_parser(
        'Train a model.',
        dict(config='the config file', checkpoint='the weights'),
        'where to write', 'the checkpoint')
    text = ' '.join(parser.format_help().split())
    for part in ('Train a model.', 'config the config file',
                 'checkpoint the weights',
                 '--work-dir WORK_DIR where to write',
                 '--launcher {none,pytorch,slurm,mpi} job launcher',
                 '--local_rank LOCAL_RANK, --local-rank LOCAL_RANK'):
        assert part in text, part
    helps = {a.dest: a.help for a in parser._actions}
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
    args = cli.parse_runner_args(parser,
                                 ['a.py', 'b.pth', '--local-rank', '3'])
    assert (args.config, args.checkpoint, args.launcher, args.work_dir,
            args.partial_load, args.cfg_options) == ('a.py', 'b.pth', 'none',
                                                     None, False, None)
    assert os.environ['LOCAL_RANK'] == '3' and args.local_rank == 3
    monkeypatch.delenv('LOCAL_RANK')
    assert cli.parse_runner_args(parser, ['a.py', 'b.pth']).local_rank == 0
    assert os.environ['LOCAL_RANK'] == '0'
    with pytest.raises(SystemExit):  # a rank is a number
        parser.parse_args(['a.py', 'b.pth', '--local-rank', 'x'])
    monkeypatch.setenv('LOCAL_RANK', '1')  # torchrun's wins
    cli.parse_runner_args(parser, ['a.py', 'b.pth', '--local_rank', '2'])
    assert os.environ['LOCAL_RANK'] == '1'
    with pytest.raises(SystemExit):
        parser.parse_args(['a.py', 'b.pth', '--launcher', 'ssh'])

    cfg_file = tmp_path / 'my_cfg.py'
    cfg_file.write_text('train_cfg = dict(max_epochs=2)\n')
    args = parser.parse_args([
        str(cfg_file), 'b.pth', '--launcher', 'pytorch', '--cfg-options',
        'train_cfg.max_epochs=5'
    ])
    cfg = cli.apply_runner_args(Config.fromfile(str(cfg_file)), args)
    assert (cfg.launcher, cfg.train_cfg.max_epochs,
            cfg.work_dir) == ('pytorch', 5, './work_dirs/my_cfg')
    cfg = Config(dict(work_dir='from_cfg'))
    args.cfg_options = None
    assert cli.apply_runner_args(cfg, args).work_dir == 'from_cfg'
    args.work_dir = 'given'
    assert cli.apply_runner_args(cfg, args).work_dir == 'given'
    # --work-dir wins over --cfg-options work_dir=... (as mmdet's train.py)
    args.cfg_options = dict(work_dir='from_options')
    assert cli.apply_runner_args(cfg, args).work_dir == 'given'
    args.work_dir = None
    assert cli.apply_runner_args(cfg, args).work_dir == 'from_options'


@pytest.mark.parametrize('seed, ok', [('0', True), ('4294967295', True),
                                      ('-1', False), ('4294967296', False),
                                      ('abc', False), ('True', False)])
def test_cfg_options_seed_range(seed, ok, monkeypatch):
    """A seed outside numpy's 0 .. 2**32 - 1: one line (issue 52)."""
    monkeypatch.setenv('LOCAL_RANK', '0')
    parser = cli.runner_parser('T.', dict(config='c'), 'w', 'ckpt')
    argv = ['a.py', '--cfg-options', f'randomness.seed={seed}']
    if ok:
        args = cli.parse_runner_args(parser, argv)
        assert args.cfg_options['randomness.seed'] == int(seed)
        assert cli.seed_int(seed) == int(seed)
        return
    with pytest.raises(cli.ToolError) as exc:
        cli.parse_runner_args(parser, argv)
    assert str(exc.value).startswith('--cfg-options randomness.seed='), \
        exc.value
    assert ': a seed must be an integer from 0 to 4294967295 (2**32 - 1, ' \
        "numpy's limit), got " in str(exc.value)
    with pytest.raises(argparse.ArgumentTypeError, match='from 0 to'):
        cli.seed_int(seed)
    # a tool's own --seed option: argparse's one usage error
    p = argparse.ArgumentParser()
    p.add_argument('--seed', type=cli.seed_int, default=0)
    with pytest.raises(SystemExit):
        p.parse_args(['--seed', seed])


@pytest.mark.parametrize('typed, refused', [
    ('/path/with a space', True),
    ("'/path/with a space'", True),
    ('/path/with\ta\ttab', True),
    ('[a b, c]', True),
    ('/plain/path', False),
    (' /padded ', False),
    ('[1, 2, 3]', False),
    ('[(1, 2), (3, 4)]', False),
])
def test_cfg_options_value_that_lost_spaces(typed, refused, monkeypatch,
                                            tmp_path):
    """A space mmengine's DictAction would drop is refused (issue 52);
    spaces after a list's commas lose nothing; argv None: sys.argv."""
    monkeypatch.setenv('LOCAL_RANK', '0')
    parser = cli.runner_parser('T.', dict(config='c'), 'w', 'ckpt')
    key = 'default_hooks.checkpoint.out_dir'
    for argv in (['a.py', '--cfg-options', 'x=1',
                  f'{key}={typed}'], ['a.py', f'--cfg-options={key}={typed}']):
        monkeypatch.setattr(sys, 'argv', ['train.py'] + argv)
        for given in (argv, None):
            if not refused:
                cli.parse_runner_args(parser, given)
                continue
            with pytest.raises(cli.ToolError) as exc:
                cli.parse_runner_args(parser, given)
            msg = str(exc.value)
            assert msg.startswith(
                f'--cfg-options {key}: the value {typed!r} contains spaces, '
                "which mmengine's --cfg-options parser removes (it would be "
            ), msg
            assert 'set ' + key + ' in a config file instead' in msg
            assert '\n' not in msg


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
        return
    with pytest.raises(cli.ToolError) as e:
        cli.load_config(path)
    assert str(
        e.value).startswith(f'config {tmp_path / where}: syntax error: '), str(
            e.value)
    assert cli.config_syntax_error(path).startswith(
        f'{tmp_path / where}: syntax error')


@pytest.mark.parametrize(
    'item, error',
    [
        # a number / boolean of the config replaced by what is none
        ('train_cfg.max_epochs=abc', "--cfg-options train_cfg.max_epochs="
         "'abc': the config's train_cfg.max_epochs is a number (12); give a "
         'number (e.g. train_cfg.max_epochs=12)'),
        ('optim.lr=abc', "--cfg-options optim.lr='abc': the config's "
         'optim.lr is a number (0.01); give a number (e.g. optim.lr=0.01)'),
        ('train_cfg.max_epochs=true', '--cfg-options train_cfg.max_epochs='
         "True: the config's train_cfg.max_epochs is a number (12)"),
        ('model.frozen=yes', "--cfg-options model.frozen='yes': the "
         "config's model.frozen is true or false (False); give true or "
         'false'),
        ('pipeline.0.scale=big', "--cfg-options pipeline.0.scale='big': "
         "the config's pipeline.0.scale is a number (1)"),
        # mmengine's parser: a dict is a string or a RecursionError
        ('model.loss=dict(type=CE)', '--cfg-options model.loss=dict(type=CE)'
         ': a dict is no --cfg-options value'),
        ('model.loss=dict(a=1,b=[1,2])', '--cfg-options model.loss=dict(a=1,'
         'b=[1,2]): a dict is no --cfg-options value'),
        ("model.loss={'a':1}", "--cfg-options model.loss={'a':1}: a dict is "
         'no --cfg-options value'),
        ('model.x=[1,2', "--cfg-options model.x=[1,2: mmengine's parser "
         'cannot read it (AssertionError: Imbalanced brackets'),
        # accepted: what the config's value can be, new keys, structures
        ('train_cfg.max_epochs=3', None),
        ('optim.lr=1e-3', None),
        ('train_cfg.max_epochs=2.5', None),
        ('model.frozen=false', None),
        ('model.frozen=None', None),
        ('model.name=abc', None),
        ('model.new_key=abc', None),
        ('pipeline.0.scale=[1,2]', None),
    ])
def test_cfg_options_values(item, error):
    cfg = Config(
        dict(
            train_cfg=dict(max_epochs=12),
            optim=dict(lr=0.01),
            model=dict(frozen=False, name='m', loss=None, x=None),
            pipeline=[dict(type='A', scale=1)]))
    parser = cli.runner_parser('t', dict(config='config'), 'w', 'c')
    try:
        args = cli.parse_runner_args(parser, ['c.py', '--cfg-options', item])
        cli.merge_cfg_options(cfg, args.cfg_options)
    except cli.ToolError as e:
        assert error is not None and str(e).startswith(error), str(e)
    else:
        assert error is None, item


@pytest.mark.parametrize(
    'launcher, env, prog, problem',
    [
        ('pytorch', {}, 'train.py', '--launcher pytorch: RANK, WORLD_SIZE, '
         'MASTER_ADDR, MASTER_PORT not set (the process was not started by '
         'torchrun): start the processes with tools/dist_train.sh CONFIG '
         'GPUS [options] (or torchrun), or leave --launcher out for one '
         'process'),
        ('pytorch', dict(RANK='0', WORLD_SIZE='2'), 'test.py',
         '--launcher pytorch: MASTER_ADDR, MASTER_PORT not set (the process '
         'was not started by torchrun): start the processes with '
         'tools/dist_test.sh CONFIG CHECKPOINT GPUS [options] (or torchrun)'),
        ('slurm', dict(SLURM_PROCID='0'), 'train.py', '--launcher slurm: '
         'SLURM_NTASKS, SLURM_NODELIST not set (the process was not started '
         'by srun): start the processes with tools/slurm_train.sh PARTITION'),
        ('pytorch', {}, 'other.py', '--launcher pytorch: RANK, WORLD_SIZE, '
         'MASTER_ADDR, MASTER_PORT not set (the process was not started by '
         'torchrun): start the processes with torchrun, or'),
        # started as it should be / no launcher / mpi (not checked)
        ('pytorch',
         dict(RANK='0', WORLD_SIZE='2', MASTER_ADDR='h',
              MASTER_PORT='1'), 'train.py', None),
        ('none', {}, 'train.py', None),
        ('mpi', {}, 'train.py', None),
    ])
def test_launcher_problem(monkeypatch, launcher, env, prog, problem):
    for name in ('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT',
                 'SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    line = cli.launcher_problem(launcher, prog)
    if problem is None:
        assert line is None
    else:
        assert line is not None and line.startswith(problem), line
    # the tools' parser refuses it before anything else
    parser = cli.runner_parser('t', dict(config='config'), 'w', 'c')
    parser.prog = prog
    if problem is None:
        cli.parse_runner_args(parser, ['c.py', '--launcher', launcher])
    else:
        with pytest.raises(cli.ToolError, match='--launcher'):
            cli.parse_runner_args(parser, ['c.py', '--launcher', launcher])


def test_cfg_option_problem():
    cfg = Config(
        dict(
            train_cfg=dict(max_epochs=12),
            model=dict(backbone=dict(depth=50, num_stages=4)),
            pipeline=[dict(type='A', scale=1)]))
    assert cli.cfg_option_problem(cfg, 'train_cfg.max_epoch') == (
        "--cfg-options train_cfg.max_epoch: the config has no key "
        "'max_epoch' under train_cfg; did you mean train_cfg.max_epochs?")
    assert 'under the top level; did you mean train_cfg?' in \
        cli.cfg_option_problem(cfg, 'train_cfgs.max_epochs')
    assert cli.cfg_option_problem(cfg, 'model.backbone.depths') == (
        "--cfg-options model.backbone.depths: the config has no key "
        "'depths' under model.backbone; did you mean model.backbone.depth?")
    # one suggestion, the closest; a name only somewhat like a key is new
    two = Config(dict(train_cfg=dict(max_epochs=1, max_epoch_s=2)))
    assert cli.cfg_option_problem(
        two,
        'train_cfg.max_epoc').endswith('did you mean train_cfg.max_epochs?')
    assert cli.cfg_option_problem(two, 'train_cfg.epochs') is None  # 0.75
    # mmengine's own keys (_delete_, _scope_) are never a typo
    scoped = Config(dict(model=dict(scope='x', delete=True)))
    assert cli.cfg_option_problem(scoped, 'model._scope_') is None
    assert cli.cfg_option_problem(scoped, 'model._delete_') is None
    assert 'did you mean pipeline.0.scale?' in cli.cfg_option_problem(
        cfg, 'pipeline.0.scales')
    for fine in ('train_cfg.max_epochs', 'train_cfg.val_interval',
                 'model.neck', 'pipeline.5.scales', 'pipeline.1.scale',
                 'model._scope_', 'train_cfg.max_epochs.x', 'model.backbone.0',
                 'train_cfg.1'):
        assert cli.cfg_option_problem(cfg, fine) is None, fine


def test_merge_cfg_options():
    cfg = Config(dict(train_cfg=dict(max_epochs=12), neck=None))
    cli.merge_cfg_options(cfg, None)
    cli.merge_cfg_options(cfg, {})
    cli.merge_cfg_options(cfg, {'train_cfg.max_epochs': 3})
    assert cfg.train_cfg.max_epochs == 3
    with pytest.raises(cli.ToolError, match='did you mean'):
        cli.merge_cfg_options(cfg, {'train_cfg.max_epoch': 3})
    assert cfg.train_cfg.max_epochs == 3  # nothing merged
    # what mmengine cannot merge: one line that starts with the option
    with pytest.raises(cli.ToolError) as e:
        cli.merge_cfg_options(cfg, {'neck.type': 'FPN'})
    assert str(e.value).startswith("--cfg-options: neck={'type': 'FPN'} in "
                                   'child config cannot inherit from base')
    assert '\n' not in str(e.value)
    listed = Config(dict(scales=[1, 2]))
    with pytest.raises(cli.ToolError) as e:
        cli.merge_cfg_options(listed, {'scales.5': 3})
    assert str(e.value) == ("--cfg-options: 'Index 5 exceeds the length of "
                            "list [1, 2]'")


def test_expected_types_only_of_imported_modules(monkeypatch):
    monkeypatch.delitem(
        sys.modules, 'mmsoft_tools.work_dir_lock', raising=False)
    types = cli._expected_types()
    assert cli.ToolError in types
    assert all(
        isinstance(t, type) and issubclass(t, BaseException) for t in types)
    assert 'WorkDirLockedError' not in {t.__name__ for t in types}


# =================================================================== launch
def test_dicts_and_sync_bn():
    node = dict(
        type='A',
        norm=dict(type='SyncBN'),
        layers=[dict(type='MMSyncBN'), (dict(type='BN'), 3)],
        other='SyncBN')
    assert [d.get('type') for d in launch._dicts(node)] == \
        ['A', 'SyncBN', 'MMSyncBN', 'BN']
    assert launch._sync_bn_to_bn(node) == 2
    assert [d.get('type') for d in launch._dicts(node)] == \
        ['A', 'BN', 'BN', 'BN']
    assert launch._types_in(dict(type='X', sub=[dict(type=dict)])) == {'X'}


def test_lock_work_dir(tmp_path, monkeypatch):
    from mmsoft_tools.work_dir_lock import WorkDirLockedError
    cfg = Config(dict(work_dir=str(tmp_path / 'run')))
    lock = launch.lock_work_dir(cfg)
    try:
        with pytest.raises(WorkDirLockedError) as e:
            launch.lock_work_dir(cfg)
        assert cli.one_line(e.value).startswith(  # run_main's line
            f'error: work dir {cfg.work_dir} is in use by another training ')
        monkeypatch.setenv('RANK', '1')  # another rank takes no lock
        assert launch.lock_work_dir(cfg, 'pytorch') is None
        monkeypatch.setenv('RANK', '0')
        with pytest.raises(WorkDirLockedError):
            launch.lock_work_dir(cfg, 'pytorch')
    finally:
        lock.release()
    launch.lock_work_dir(cfg).release()  # free again


def test_codebase_of():
    for scope in ('mmpretrain', 'mmdet', 'mmseg'):
        assert launch.codebase_of(Config(dict(default_scope=scope))) == scope
    with pytest.raises(ValueError, match="default_scope is 'mmengine'"):
        launch.codebase_of(Config(dict(default_scope='mmengine')))
    with pytest.raises(ValueError, match='default_scope is None'):
        launch.codebase_of(Config(dict()))


def _amp_cfg(wrapper='OptimWrapper', roi=False):
    model = dict(
        type='M', roi_head=dict(type='RoIAlign')) if roi else dict(type='M')
    return Config(
        dict(
            model=model,
            optim_wrapper=dict(type=wrapper, optimizer=dict(type='SGD'))))


@pytest.fixture
def logged(monkeypatch):
    """The tools' log lines (``print_log``) as ``(level, message)``."""
    lines = []

    def print_log(msg, logger=None, level=logging.INFO):
        assert logger == 'current'
        lines.append((level, msg))

    monkeypatch.setattr(launch, 'print_log', print_log)
    monkeypatch.delenv('RANK', raising=False)
    monkeypatch.delenv('SLURM_PROCID', raising=False)
    return lines


def test_enable_amp(monkeypatch, logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = _amp_cfg()
    assert launch.enable_amp(cfg) == 'CPUAmpOptimWrapper'
    assert cfg.optim_wrapper.type == 'CPUAmpOptimWrapper'
    assert 'loss_scale' not in cfg.optim_wrapper
    assert logged == [(logging.WARNING,
                       '--amp without CUDA: training under bfloat16 CPU '
                       'autocast (CPUAmpOptimWrapper, no loss scaling); fp16 '
                       'AMP needs a GPU.')]
    # a wrapper without a type is mmengine's OptimWrapper
    cfg = Config(dict(model=dict(), optim_wrapper=dict(optimizer=dict())))
    assert launch.enable_amp(cfg) == 'CPUAmpOptimWrapper'
    del logged[:]
    cfg = _amp_cfg('CPUAmpOptimWrapper')
    assert launch.enable_amp(cfg) == 'CPUAmpOptimWrapper'
    assert logged == [(logging.WARNING,
                       'AMP training is already enabled in your config.')]
    # the config's fp16 AMP cannot run here: --amp makes it bfloat16's
    cfg = _amp_cfg('AmpOptimWrapper')
    cfg.optim_wrapper.loss_scale = 'dynamic'
    assert launch.enable_amp(cfg) == 'CPUAmpOptimWrapper'
    assert cfg.optim_wrapper.type == 'CPUAmpOptimWrapper'
    assert 'loss_scale' not in cfg.optim_wrapper
    with pytest.raises(ValueError) as e:
        launch.enable_amp(_amp_cfg('OtherWrapper'))
    assert str(e.value) == ('`--amp` is only supported when the optimizer '
                            'wrapper type is `OptimWrapper`, but got '
                            'OtherWrapper.')
    with pytest.raises(ValueError) as e:
        launch.enable_amp(_amp_cfg(roi=True))
    assert str(e.value) == (
        "--amp without CUDA trains under bfloat16 autocast, but this model "
        "uses ['RoIAlign'], whose mmcv CPU kernel has no bfloat16 version; "
        'train it without --amp (or on a GPU).')
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    cfg = _amp_cfg(roi=True)  # fp16 RoIAlign exists on CUDA
    assert launch.enable_amp(cfg) == 'AmpOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'
    del logged[:]
    cfg = _amp_cfg('AmpOptimWrapper')
    assert launch.enable_amp(cfg) == 'AmpOptimWrapper'
    assert logged == [(logging.WARNING,
                       'AMP training is already enabled in your config.')]


@pytest.mark.parametrize('wrapper, cuda, refused', [
    ('AmpOptimWrapper', False, True),
    ('mmengine.AmpOptimWrapper', False, True),
    ('AmpOptimWrapper', True, False),
    ('CPUAmpOptimWrapper', False, False),
    ('OptimWrapper', False, False),
])
def test_amp_refusal(monkeypatch, wrapper, cuda, refused):
    for name in ('is_cuda_available', 'is_npu_available', 'is_mlu_available',
                 'is_musa_available'):
        monkeypatch.setattr(device, name, lambda: False)
    monkeypatch.setattr(device, 'is_cuda_available', lambda: cuda)
    line = launch.amp_refusal(_amp_cfg(wrapper))
    assert (line is not None) == refused
    if refused:
        assert line.startswith(f"optim_wrapper.type={wrapper} (mmengine's "
                               'fp16 AMP) needs a GPU and this machine has '
                               'none')
        assert 'pass --amp instead' in line and 'CPUAmpOptimWrapper' in line


def test_name_run(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, '_RUNS', itertools.count(1))
    cfg_file = tmp_path / 'retina_cfg.py'
    cfg_file.write_text('a = 1\n')
    names = [launch.name_run(Config.fromfile(str(cfg_file))) for _ in range(3)]
    assert names == ['retina_cfg', 'retina_cfg_2', 'retina_cfg_3']
    assert launch.name_run(Config(dict(experiment_name='exp'))) == 'exp_4'
    monkeypatch.setattr(launch, '_RUNS', itertools.count(1))
    assert launch.name_run(Config(dict())) == 'run'


def test_compile_refusal():
    assert launch.compile_refusal(Config(dict())) is None
    assert launch.compile_refusal(Config(dict()), '2.1.2') is None
    assert launch.compile_refusal(Config(dict(compile=False)), '2.1.2') is None
    refusal = launch.compile_refusal(Config(dict(compile=True)), '2.1.2')
    assert refusal.startswith('error: compile=True needs torch >= 2.4: with '
                              'torch 2.1.2')
    assert launch.compile_refusal(
        Config(dict(compile=dict(backend='inductor'))), '2.3.1').startswith(
            "error: compile={'backend': 'inductor'} needs torch >= 2.4")
    for new in ('2.4.0', '2.14.1+cpu'):
        assert launch.compile_refusal(Config(dict(compile=True)), new) is None


def _to_gloo(backend):
    return (logging.INFO, 'CUDA is not available: distributed backend '
            f"'{backend}' -> 'gloo'")


def _sync_bn_replaced(n):
    return (logging.WARNING,
            f'CUDA is not available: {n} SyncBN setting(s) of the config '
            'replaced by BN (SyncBatchNorm has no CPU implementation)')


def _dist(backend=None, **cfg):
    """A config with ``model=dict()`` and, given, a dist_cfg backend."""
    if backend:
        cfg['env_cfg'] = dict(dist_cfg=dict(backend=backend))
    return Config(dict(model=dict(), **cfg))


def test_setup_cpu_distributed(monkeypatch, logged):
    cfg = Config(dict(model=dict(norm_cfg=dict(type='SyncBN'))))
    assert launch.setup_cpu_distributed(cfg, 'none') is False
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    assert launch.setup_cpu_distributed(cfg, 'pytorch') is False
    assert cfg.model.norm_cfg.type == 'SyncBN'  # untouched with CUDA
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    # a process group that exists already is kept (no init_dist)
    monkeypatch.setattr(mmengine.dist, 'is_distributed', lambda: True)
    cfg = _dist('nccl', sync_bn='torch')
    cfg.model.norm_cfg = dict(type='SyncBN')
    assert launch.setup_cpu_distributed(cfg, 'pytorch') is True
    assert logged == [_to_gloo('nccl'), _sync_bn_replaced(2)]
    assert cfg.env_cfg.dist_cfg.backend == 'gloo'
    assert cfg.model.norm_cfg.type == 'BN'
    assert cfg.sync_bn is None
    ddp = dict(type='MMDistributedDataParallel', device_ids=None)
    assert cfg.model_wrapper_cfg == dict(
        ddp, broadcast_buffers=False, find_unused_parameters=False)
    unused = _dist(find_unused_parameters=True)
    launch.setup_cpu_distributed(unused, 'pytorch')
    assert unused.model_wrapper_cfg.find_unused_parameters is True
    wrapper = dict(type='MMDistributedDataParallel', broadcast_buffers=True)
    own = _dist(
        find_unused_parameters=True,
        model_wrapper_cfg=dict(wrapper, device_ids=[0]))
    del logged[:]
    monkeypatch.setenv('SLURM_PROCID', '1')  # rank 1 logs nothing
    launch.setup_cpu_distributed(own, 'slurm')
    assert logged == []
    assert own.model_wrapper_cfg.device_ids is None
    # the config's own wrapper is kept, only device_ids changes
    assert own.model_wrapper_cfg == dict(wrapper, device_ids=None)
    # a config without env_cfg / dist_cfg gets them (the Runner reads them)
    assert own.env_cfg.dist_cfg.backend == 'gloo'
    monkeypatch.delenv('SLURM_PROCID')
    partial = _dist(env_cfg=dict(cudnn_benchmark=False))
    launch.setup_cpu_distributed(partial, 'pytorch')
    assert partial.env_cfg == dict(
        cudnn_benchmark=False, dist_cfg=dict(backend='gloo'))
    # (no backend given: mmengine's default, nccl)
    assert logged == [_to_gloo('nccl')]
    # the rest of dist_cfg is kept; gloo already: nothing to say
    del logged[:]
    kept = _dist(env_cfg=dict(dist_cfg=dict(backend='gloo', timeout=600)))
    launch.setup_cpu_distributed(kept, 'pytorch')
    assert kept.env_cfg.dist_cfg == dict(backend='gloo', timeout=600)
    assert logged == []
    mpi = _dist('mpi')
    launch.setup_cpu_distributed(mpi, 'mpi')
    assert logged == [_to_gloo('mpi')]


def test_log_rank0(logged, monkeypatch):
    launch._log_rank0('a')
    monkeypatch.setenv('RANK', '1')
    launch._log_rank0('b')
    monkeypatch.setenv('RANK', '0')
    monkeypatch.setenv('SLURM_PROCID', '3')  # RANK wins
    launch._log_rank0('c', level=logging.WARNING)
    monkeypatch.delenv('RANK')
    launch._log_rank0('d')
    assert logged == [(logging.INFO, 'a'), (logging.WARNING, 'c')]


def test_prepare_cfg(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, '_RUNS', itertools.count(1))
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = Config(dict(default_scope='mmpretrain', model=dict(type='M')))
    assert launch.prepare_cfg(cfg) == 'mmpretrain'
    # not distributed by default: the config is left as it was
    assert cfg.experiment_name == 'run'
    assert 'model_wrapper_cfg' not in cfg and 'env_cfg' not in cfg
    monkeypatch.setattr(torch, '__version__', '2.1.2')
    with pytest.raises(SystemExit) as e:
        launch.prepare_cfg(
            Config(dict(default_scope='mmpretrain', compile=True)))
    assert str(e.value.code).startswith(
        'error: compile=True needs torch >= 2.4: with torch 2.1.2 ')


def test_setup_cpu_distributed_wrappers_and_sync_bn(monkeypatch, logged):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    monkeypatch.setattr(mmengine.dist, 'is_distributed', lambda: True)
    # a wrapper without a type is mmengine's DDP: device_ids=None
    untyped = Config(dict(model_wrapper_cfg=dict(broadcast_buffers=True)))
    launch.setup_cpu_distributed(untyped, 'pytorch')
    assert untyped.model_wrapper_cfg == dict(
        broadcast_buffers=True, device_ids=None)
    # a wrapper that is not a DistributedDataParallel takes no device_ids
    other = Config(
        dict(model_wrapper_cfg=dict(type='MMFullyShardedDataParallel')))
    launch.setup_cpu_distributed(other, 'pytorch')
    assert other.model_wrapper_cfg == dict(type='MMFullyShardedDataParallel')
    # one SyncBN, no sync_bn key: one replaced, the count in the warning
    del logged[:]
    one = _dist('gloo')
    one.model = dict(neck=dict(norm_cfg=dict(type='MMSyncBN')))
    launch.setup_cpu_distributed(one, 'pytorch')
    assert one.model.neck.norm_cfg.type == 'BN'
    assert 'sync_bn' not in one
    assert logged == [_sync_bn_replaced(1)]
    del logged[:]
    none = _dist('gloo')
    launch.setup_cpu_distributed(none, 'pytorch')
    assert logged == []  # nothing replaced, nothing said


def test_setup_cpu_distributed_starts_the_group(monkeypatch):
    """No process group: init_dist (gloo), torch.cuda.set_device a no-op."""
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
    cfg = _dist(
        env_cfg=dict(
            mp_cfg=dict(mp_start_method='fork'),
            dist_cfg=dict(backend='nccl', timeout=60)))
    assert launch.setup_cpu_distributed(cfg, 'slurm') is True
    assert calls == [('set_multi_processing',
                      dict(mp_start_method='fork', distributed=True)),
                     ('init_dist', 'slurm', dict(backend='gloo', timeout=60))]
    assert torch.cuda.set_device is real_set_device  # restored
    del calls[:]
    launch.setup_cpu_distributed(_dist(), 'pytorch')
    assert calls == [('set_multi_processing', dict(distributed=True)),
                     ('init_dist', 'pytorch', dict(backend='gloo'))]
    with launch._cuda_set_device_disabled():
        assert torch.cuda.set_device('cuda:7') is None
    assert torch.cuda.set_device is real_set_device


def test_import_codebase_leaves_the_default_scope(monkeypatch):
    """The tools only register; the default scope stays as it was."""
    before = DefaultScope.get_current_instance()
    assert launch.import_codebase(Config(dict(default_scope='mmdet'))) == \
        'mmdet'
    assert DefaultScope.get_current_instance() is before
    with DefaultScope.overwrite_default_scope('mmsoft'):
        inner = DefaultScope.get_current_instance()
        launch.import_codebase(Config(dict(default_scope='mmseg')))
        assert DefaultScope.get_current_instance() is inner


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
    assert logged == [(logging.WARNING,
                       'shutdown_dist: barrier failed (peer gone); tearing '
                       'the process group down anyway')]
    del calls[:]
    try:  # an exception on its way out: no barrier (a peer may be gone)
        raise ValueError('x')
    except ValueError:
        launch.shutdown_dist()
    assert calls == ['destroy']


def test_demo_seed_is_checked(capsys):
    """tools/demo.py --seed -1: argparse's one line, not numpy's error."""
    demo = load_module(osp.join(ROOT, 'tools', 'demo.py'), 'demo_seed52')
    for bad in ('-1', str(2**32)):
        with pytest.raises(SystemExit):
            demo.parse_args(['--seed', bad])
        assert ('error: argument --seed: a seed must be an integer from 0 '
                'to 4294967295') in capsys.readouterr().err
    assert demo.parse_args(['--seed', '7']).seed == 7
