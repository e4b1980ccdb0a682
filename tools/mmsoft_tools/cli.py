"""The tools' arguments, pre-flight checks and :func:`run_main`: an expected
failure is one line ``error: ...``, exit 1 (docs/en/faq.md lists them)."""
import argparse
import errno
import os
import os.path as osp
import sys
from collections.abc import Mapping
from typing import Callable, Dict, Iterable, Optional


class ToolError(Exception):
    """A user error found by a tool's own checks: one line, exit 1."""


#: (module, class) of the failures a user can fix (looked up in sys.modules)
EXPECTED = (
    ('mmsoft_tools.cli', 'ToolError'),
    ('mmsoft.utils.checkpoint_io', 'CheckpointError'),  # damaged file
    ('mmsoft.utils.checkpoint_io', 'CheckpointRefused'),  # pickled code
    ('mmsoft.utils.checkpoint_io', 'CheckpointWriteError'),  # disk full
    ('mmsoft.utils.strict_load', 'CheckpointMismatchError'),  # wrong model
    ('mmsoft.engine.hooks.nonfinite_hook', 'NonFiniteLossError'),
    ('mmsoft.models.converters', 'ConversionError'),
    ('mmsoft.models.layers.amp', 'ExportError'),
    ('mmsoft_tools.work_dir_lock', 'WorkDirLockedError'),
    ('demo_synthetic', 'NotDemoDataError'),
)

#: errno -> what to do; other OSErrors keep their traceback
_OS_FIXES = {
    errno.ENOSPC: 'free some space or write somewhere else',
    errno.EDQUOT: 'free some space or write somewhere else',
    errno.EFBIG: 'the file size limit (ulimit -f) or the file system '
    'refuses a file this large; write somewhere else',
    errno.EROFS: 'choose a writable location',
    errno.EACCES: 'check the permissions (ls -l) or choose another path',
    errno.EPERM: 'check the permissions (ls -l) or choose another path',
    errno.ENOENT: 'check the path',
    errno.ENOTDIR: 'a part of the path is a file, not a directory',
    errno.EISDIR: 'give a file, not a directory',
    errno.EEXIST: 'remove it or choose another path',
}

#: errnos that only a write raises (no file named: "a write failed")
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def _expected_types() -> tuple:
    return tuple(
        getattr(sys.modules[m], name) for m, name in EXPECTED
        if m in sys.modules and hasattr(sys.modules[m], name))


def one_line(exc: BaseException) -> Optional[str]:
    """``error: ...`` (one line) for an expected failure, else None."""
    from urllib.error import HTTPError, URLError
    text = ' '.join(str(exc).split())
    if isinstance(exc, _expected_types()):
        return f'error: {text}'
    if isinstance(exc, URLError) and not isinstance(exc, HTTPError):
        return (f'error: a download failed ({exc.reason}): check the URL '
                'and the network, or download the file and pass its path')
    if isinstance(exc, OSError):
        if exc.errno is None:  # our loaders' own messages (no errno)
            return f'error: {text}' if isinstance(exc,
                                                  FileNotFoundError) else None
        fix = _OS_FIXES.get(exc.errno)
        if fix is None:
            return None
        name = _target_of_temp(exc.filename)
        reason = exc.strerror or os.strerror(exc.errno)
        code = f'errno {exc.errno} {errno.errorcode.get(exc.errno, "")}'
        if not name:  # the system named no file (a full disk on flush)
            what = 'a write' if exc.errno in _WRITE_ERRNOS else \
                'a file operation'
            return (f'error: {what} failed: {reason} ({code}; '
                    f'the system named no file); {fix}')
        return f'error: {name}: {reason} ({code}); {fix}'
    return None


def _target_of_temp(path) -> str:
    """An atomic write's temporary as ``<its target> (not replaced)``."""
    import re
    path = '' if path is None else str(path)
    m = re.match(r'^\.(.+)\.\d+\.[0-9a-f]{8}\.mmsoft-tmp', osp.basename(path))
    if m is None:
        return path
    return f'{osp.join(osp.dirname(path), m.group(1))} (not replaced)'


def run_main(main: Callable, argv=None):
    """``sys.exit(main(argv))``; an expected failure: one line, exit 1."""
    try:
        code = main(argv)
    except Exception as e:  # noqa: BLE001 - the table decides
        line = one_line(e)
        if line is None or os.environ.get('MMSOFT_TRACEBACK',
                                          '0') not in ('', '0'):
            raise
        print(line, file=sys.stderr, flush=True)
        code = 1
    sys.exit(code if isinstance(code, int) else 0)  # test.py: metrics


def config_syntax_error(path: str, _seen=None) -> Optional[str]:
    """``<file>:<line>: syntax error: <what>`` in ``path`` or its bases."""
    import ast
    _seen = set() if _seen is None else _seen
    if path in _seen:
        return None
    _seen.add(path)
    try:
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=path)
    except SyntaxError as e:
        return f'{osp.normpath(path)}:{e.lineno}: syntax error: {e.msg}'
    except (OSError, ValueError):
        return None
    for node in tree.body:  # _base_ = 'a.py' / ['a.py', 'mmdet::b.py']
        if isinstance(node, ast.Assign) and any(
                getattr(t, 'id', None) == '_base_' for t in node.targets):
            try:
                bases = ast.literal_eval(node.value)
            except ValueError:
                return None
            for base in [bases] if isinstance(bases, str) else bases:
                if isinstance(base, str) and '::' not in base:
                    found = config_syntax_error(
                        osp.join(osp.dirname(path), base), _seen)
                    if found:
                        return found
    return None


def load_config(path: str):
    """``Config.fromfile(path)``; a syntax error is a :class:`ToolError`."""
    from mmengine.config import Config
    try:
        return Config.fromfile(path)
    except SyntaxError as e:
        where = config_syntax_error(path) or (
            f'{path} (or a file of its _base_):{e.lineno}: syntax error: '
            f'{e.msg}')
        raise ToolError(f'config {where}') from None


def _existing(path: str) -> str:
    """``path`` or its nearest existing parent."""
    while not osp.exists(path) and osp.dirname(path) != path:
        path = osp.dirname(path)
    return path


def unwritable_reason(path: str, directory: bool = False):
    """Why a file (or ``directory``) cannot be written at ``path``, or None."""
    path = osp.abspath(path)
    if not directory and osp.isdir(path):
        return 'is a directory; give a file name'
    if directory and osp.exists(path) and not osp.isdir(path):
        return 'exists and is not a directory'
    parent = _existing(osp.dirname(path))
    if not osp.isdir(parent):
        return f'{parent} is a file, not a directory'
    if not os.access(parent, os.W_OK | os.X_OK):
        return f'directory {parent} is not writable'
    return None


def runner_parser(description: str, positionals: Dict[str,
                                                      str], work_dir_help: str,
                  checkpoint: str) -> argparse.ArgumentParser:
    """The parser of ``tools/train.py`` and ``tools/test.py``."""
    parser = argparse.ArgumentParser(description=description)
    for name, text in positionals.items():
        parser.add_argument(name, help=text)
    parser.add_argument('--work-dir', help=work_dir_help)
    parser.add_argument(
        '--partial-load',
        action='store_true',
        help=f'allow {checkpoint} that matches the model only in part (e.g. '
        'another head): load the matching tensors and print what was '
        'skipped. Without it a mismatch (missing / unexpected / mis-shaped '
        'keys) is an error')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=cfg_options_action(),
        help='override some settings in the used config, the key-value pair '
        'in xxx=yyy format will be merged into config file. If the value to '
        'be overwritten is a list, it should be like key="[a,b]" or key=a,b '
        'It also allows nested list/tuple values, e.g. key="[(a,b),(c,d)]" '
        'Note that the quotation marks are necessary and that no white space '
        'is allowed.')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def parse_runner_args(parser: argparse.ArgumentParser,
                      argv=None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` checked; ``LOCAL_RANK`` set if unset."""
    args = parser.parse_args(argv)
    problem = launcher_problem(args.launcher, parser.prog)
    if problem:
        raise ToolError(problem)
    seed = (args.cfg_options or {}).get('randomness.seed', None)
    if seed is not None and seed_problem(seed):
        raise ToolError(f'--cfg-options randomness.seed={seed!r}: '
                        f'{seed_problem(seed)}')
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


#: launcher -> (its environment variables, its starter, the launch scripts)
_LAUNCHERS = {
    'pytorch':
    (('RANK', 'WORLD_SIZE', 'MASTER_ADDR', 'MASTER_PORT'), 'torchrun', {
        'train': 'tools/dist_train.sh CONFIG GPUS [options]',
        'test': 'tools/dist_test.sh CONFIG CHECKPOINT GPUS '
        '[options]'
    }),
    'slurm': (('SLURM_PROCID', 'SLURM_NTASKS', 'SLURM_NODELIST'), 'srun', {
        'train':
        'tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR',
        'test':
        'tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT'
    }),
}


def launcher_problem(launcher: str, prog: str = '') -> Optional[str]:
    """Why ``--launcher`` cannot start here (no torchrun / srun), or None."""
    if launcher not in _LAUNCHERS:
        return None
    names, starter, scripts = _LAUNCHERS[launcher]
    missing = [n for n in names if n not in os.environ]
    if not missing:
        return None
    script = scripts.get(osp.splitext(osp.basename(prog))[0])
    how = f'{script} (or {starter})' if script else starter
    return (f'--launcher {launcher}: {", ".join(missing)} not set (the '
            f'process was not started by {starter}): start the processes '
            f'with {how}, or leave --launcher out for one process')


MAX_SEED = 2**32 - 1


def seed_problem(value) -> Optional[str]:
    """Why ``value`` is no numpy seed, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or \
            not 0 <= value <= MAX_SEED:
        return (f'a seed must be an integer from 0 to {MAX_SEED} '
                f'(2**32 - 1, numpy\'s limit), got {value!r}')
    return None


def seed_int(text: str) -> int:
    """argparse type of ``--seed``."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = text
    problem = seed_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def _lost_whitespace(key: str, typed: str, parsed: dict) -> Optional[str]:
    """Why ``typed`` lost its inner spaces to mmengine's DictAction."""
    import re
    value = parsed.get(key, typed)
    inner = typed.strip().strip('\'"').strip()
    if not re.search(r'[^\s,\[\]()]\s+[^\s,\[\]()]', inner):
        return None
    return (f'--cfg-options {key}: the value {typed!r} contains spaces, '
            f'which mmengine\'s --cfg-options parser removes (it would be '
            f'{value!r}) and no quoting keeps; set {key} in a config file '
            f'instead (a small config with _base_ = [<your config>])')


def apply_runner_args(cfg, args: argparse.Namespace):
    """``cfg`` with a :func:`runner_parser`'s arguments applied."""
    cfg.launcher = args.launcher
    merge_cfg_options(cfg, args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    return cfg


def _unsupported_value(key: str, value: str) -> Optional[str]:
    """Why ``key=value`` (a dict) is no --cfg-options item, or None."""
    text = value.strip().strip('\'"').strip()
    if text.startswith(('dict(', '{')):
        return (f'--cfg-options {key}={value}: a dict is no --cfg-options '
                f'value (mmengine\'s parser takes numbers, strings, true / '
                f'false / None and lists or tuples: key=a,b or '
                f'key="[a,(b,c)]"); set its keys one by one ({key}.type=... '
                f'{key}.<name>=...) or write the dict in a config file')
    return None


def cfg_options_action():
    """mmengine's ``DictAction``; an item it cannot read: a ToolError."""
    from mmengine.config import DictAction

    class CfgOptions(DictAction):

        def __call__(self, parser, namespace, values, option_string=None):
            for item in values:
                key, _, typed = item.partition('=')
                problem, one = _unsupported_value(key, typed), None
                try:
                    if not problem:
                        one = argparse.Namespace()
                        super().__call__(parser, one, [item], option_string)
                except (RecursionError, AssertionError, ValueError) as e:
                    problem = (f'--cfg-options {item}: mmengine\'s parser '
                               f'cannot read it ({type(e).__name__}: '
                               f'{" ".join(str(e).split())}); check the '
                               f'brackets and quotes')
                problem = problem or _lost_whitespace(key, typed,
                                                      getattr(one, self.dest))
                if problem:
                    raise ToolError(problem)
            super().__call__(parser, namespace, values, option_string)

    return CfgOptions


#: a config value's kind -> what may replace it
_VALUE_KINDS = (
    (bool, (bool, ), 'true or false'),
    ((int, float), (int, float), 'a number'),
)


def cfg_option_problem(cfg, key: str, value=None) -> Optional[str]:
    """Why ``key=value`` looks wrong (a near-miss key, a wrong kind)."""
    import difflib
    node, done = cfg, []
    for part in key.split('.'):
        if isinstance(node, (list, tuple)) and part.isdigit():
            if int(part) >= len(node):
                return None
            node = node[int(part)]
        elif hasattr(node, 'keys') and not part.startswith('_'):
            if part not in node:
                names = [k for k in node.keys() if isinstance(k, str)]
                close = difflib.get_close_matches(part, names, 1, 0.8)
                if not close:
                    return None
                where = '.'.join(done) or 'the top level'
                return (f'--cfg-options {key}: the config has no key '
                        f'{part!r} under {where}; did you mean '
                        f'{".".join(done + close)}?')
            node = node[part]
        else:
            return None
        done.append(part)
    if node is None or value is None or isinstance(value, (list, tuple, dict)):
        return None  # a new structure: the config's business
    for kind, takes, what in _VALUE_KINDS:
        if isinstance(node, kind):
            if isinstance(value, takes) and (kind is bool) == isinstance(
                    value, bool):
                return None
            return (f'--cfg-options {key}={value!r}: the config\'s {key} is '
                    f'{what} ({node!r}); give {what} (e.g. {key}={node})')
    return None


def merge_cfg_options(cfg, options: Optional[dict]) -> None:
    """``cfg.merge_from_dict(options)``; problems as a :class:`ToolError`."""
    if not options:
        return
    for key, value in options.items():
        problem = cfg_option_problem(cfg, key, value)
        if problem:
            raise ToolError(problem)
    try:
        cfg.merge_from_dict(options)
    except (TypeError, KeyError, IndexError, ValueError) as e:
        raise ToolError(f'--cfg-options: {" ".join(str(e).split())}') \
            from None


def check_work_dir(path: Optional[str], option: str = '--work-dir') -> None:
    """An output directory that cannot be written: a :class:`ToolError`."""
    if not path:
        return
    import tempfile
    path = osp.abspath(path)
    if osp.exists(path) and not osp.isdir(path):
        raise ToolError(f'{option} {path}: exists and is not a directory; '
                        'give a directory (it is created if needed)')
    parent = _existing(path)
    if not osp.isdir(parent):
        raise ToolError(f'{option} {path}: {parent} is a file, not a '
                        'directory; give another path')
    try:
        with tempfile.TemporaryDirectory(dir=parent, prefix='.mmsoft-probe-'):
            pass
    except OSError as e:
        raise ToolError(f'{option} {path}: cannot write there '
                        f'({e.strerror or e}); choose a writable '
                        'directory') from None


def checkpoint_problem(path: str) -> Optional[str]:
    """Why ``path`` cannot be loaded (a folder, damaged, unreachable)."""
    path = str(path)
    if path.startswith(('http://', 'https://')):
        return _url_problem(path)
    if '://' in path:
        return None  # open-mmlab://, s3:// ...: MMEngine's loaders
    if osp.isdir(path):
        return f'checkpoint {path} is a directory, not a file; pass a .pth ' \
            'checkpoint file (e.g. <work_dir>/epoch_N.pth)'
    if osp.isfile(path):
        from mmsoft.utils.checkpoint_io import describe_damage
        damage = describe_damage(path)
        if damage:
            return f'checkpoint {path} {damage}; it was not loaded (use an ' \
                'earlier or a fresh copy)'
    return None


def _url_problem(url: str) -> Optional[str]:
    from urllib.error import HTTPError, URLError
    from urllib.request import Request, urlopen

    from torch.hub import get_dir
    name = osp.basename(url.split('?')[0])
    if osp.isfile(osp.join(get_dir(), 'checkpoints', name)):
        return None  # downloaded before: no network needed
    try:
        urlopen(Request(url, method='HEAD'), timeout=20).close()
    except HTTPError as e:
        if e.code not in (404, 410):
            return None  # HEAD refused (405, 403 ...): leave it to the GET
        why = f'HTTP {e.code}'
    except (URLError, OSError) as e:
        why = str(getattr(e, 'reason', e))
    else:
        return None
    return (f'checkpoint {url} cannot be downloaded ({why}); check the URL '
            'and the network, or download the file and pass its path')


def check_device(device: Optional[str]) -> None:
    """``--device cuda[:N]`` that this machine lacks: a ToolError."""
    if not device or not str(device).startswith('cuda'):
        return
    import torch
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = str(device).partition(':')[2]
    if n == 0:
        raise ToolError(f'--device {device}: CUDA is not available on this '
                        'machine (torch.cuda.is_available() is False); use '
                        '--device cpu')
    if index.isdigit() and int(index) >= n:
        raise ToolError(f'--device {device}: this machine has {n} CUDA '
                        f'device(s) (cuda:0 .. cuda:{n - 1})')


def init_cfg_entries(cfg, key: str = 'model') -> Iterable:
    """``(path parts, node, index or None, entry)`` of each init_cfg entry."""
    todo = [((key, ), cfg.get(key))]
    while todo:
        parts, node = todo.pop(0)
        if isinstance(node, (list, tuple)):
            todo[:0] = [(parts + (i, ), v) for i, v in enumerate(node)]
        elif isinstance(node, Mapping):
            init = node.get('init_cfg')
            listed = isinstance(init, (list, tuple))
            for i, c in enumerate(init if listed else [init]):
                if isinstance(c, Mapping):
                    yield parts, node, i if listed else None, c
            todo[:0] = [(parts + (k, ), v) for k, v in node.items()
                        if k != 'init_cfg']


def init_checkpoints(cfg, key: str = 'model') -> Iterable:
    """``(config key, checkpoint)`` of each Pretrained init_cfg."""
    for parts, _, i, c in init_cfg_entries(cfg, key):
        if 'Pretrained' in str(c.get('type')) and c.get('checkpoint'):
            where = '' if i is None else f'.{i}'
            yield (f'{".".join(map(str, parts))}.init_cfg{where}.checkpoint',
                   c['checkpoint'])


def missing_pretrained(cfg, key: str = 'model') -> Optional[str]:
    """The missing-weights message of the first SOFT init_cfg, or None."""
    from mmsoft.models.loading import PRETRAINED, missing_weights_message
    for parts, node, i, c in init_cfg_entries(cfg, key):
        t, ckpt = node.get('type'), c.get('checkpoint')
        path = osp.expanduser(str(ckpt))
        if getattr(t, '__name__', str(t)).split('.')[-1] == 'SOFT' and \
                c.get('type') in PRETRAINED and ckpt is not None and \
                '://' not in path and not osp.exists(path):
            owner = ''.join(f'[{p}]' if isinstance(p, int) else f'.{p}'
                            for p in parts)[1:]
            where = '' if i is None else f'[{i}]'
            return missing_weights_message(ckpt, owner,
                                           f'init_cfg{where}.checkpoint')
    return None


def set_partial_load(cfg, partial_load: bool) -> None:
    """``--partial-load`` onto the config's ``StrictLoadHook``."""
    for hook in cfg.get('custom_hooks', None) or []:
        if hasattr(hook, 'get') and str(
                hook.get('type')).split('.')[-1] == 'StrictLoadHook':
            hook['opt_in'] = 'pass --partial-load'
            hook['allow_partial'] = partial_load or hook.get(
                'allow_partial', False)


def check_init_checkpoints(cfg) -> None:
    """An ``init_cfg`` checkpoint with a problem: a :class:`ToolError`."""
    for key, path in init_checkpoints(cfg):
        problem = checkpoint_problem(path)
        if problem:
            raise ToolError(f'{problem} [{key}]')
