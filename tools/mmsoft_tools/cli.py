"""Command-line helpers shared by the tools (argparse types, input checks,
the arguments of ``tools/train.py`` and ``tools/test.py``)."""
import argparse
import os
import os.path as osp
from typing import Dict

__all__ = [
    'positive_int', 'check_readable', 'runner_parser', 'parse_runner_args',
    'apply_runner_args', 'add_strict_load_hook', 'exit_if_missing_weights',
    'unwritable_reason'
]


def positive_int(text: str) -> int:
    """argparse type of counts such as ``--stage4-heads``."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(
            f'expected a positive integer, got {text!r}')
    return value


def check_readable(path: str) -> None:
    """An existing input file that cannot be opened (permissions, ...)
    raises a one-line ``ConversionError`` naming it and the reason, instead
    of a ``PermissionError`` traceback; a missing file or a directory is
    left to the loader's own message."""
    from mmsoft.models.converters import ConversionError
    if not osp.isfile(path):
        return
    try:
        with open(path, 'rb') as f:
            f.read(1)
    except OSError as e:
        raise ConversionError(
            f'cannot read {path!r}: {e.strerror or e}' +
            (f' (errno {e.errno})' if e.errno else '') +
            '; check its permissions (ls -l) or copy it somewhere readable'
        ) from None


def unwritable_reason(path: str, directory: bool = False):
    """Why a file (``directory``: a directory) cannot be written at
    ``path``, or None: checked before heavy work. Missing parents are fine
    (writers create them) unless the nearest existing one is a file or not
    writable."""
    path = osp.abspath(path)
    if not directory and osp.isdir(path):
        return 'is a directory; give a file name'
    if directory and osp.exists(path) and not osp.isdir(path):
        return 'exists and is not a directory'
    parent = osp.dirname(path)
    while not osp.exists(parent) and osp.dirname(parent) != parent:
        parent = osp.dirname(parent)
    if not osp.isdir(parent):
        return f'{parent} is a file, not a directory'
    if not os.access(parent, os.W_OK | os.X_OK):
        return f'directory {parent} is not writable'
    return None


def runner_parser(description: str, positionals: Dict[str,
                                                      str], work_dir_help: str,
                  checkpoint: str) -> argparse.ArgumentParser:
    """The parser of ``tools/train.py`` and ``tools/test.py``: the
    positional arguments (``{name: help}``, in order), ``--work-dir``,
    ``--partial-load`` (for :func:`add_strict_load_hook`; ``checkpoint``
    names the checkpoint it applies to) and the options both hand to
    mmengine's runner: ``--cfg-options``, ``--launcher`` and
    ``--local-rank``. The tool adds its own options and parses with
    :func:`parse_runner_args`."""
    from mmengine.config import DictAction
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
        action=DictAction,
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
    # torch.distributed.launch passes --local-rank (torch >= 2.0; before:
    # --local_rank), torchrun the LOCAL_RANK variable
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    return parser


def parse_runner_args(parser: argparse.ArgumentParser,
                      argv=None) -> argparse.Namespace:
    """``parser.parse_args(argv)`` for a :func:`runner_parser`; sets
    ``LOCAL_RANK`` from ``--local-rank`` where the launcher did not."""
    args = parser.parse_args(argv)
    if 'LOCAL_RANK' not in os.environ:
        os.environ['LOCAL_RANK'] = str(args.local_rank)
    return args


def apply_runner_args(cfg, args: argparse.Namespace):
    """``cfg`` (the config file ``args.config``, loaded by the tool) with
    the arguments of a :func:`runner_parser`: ``--launcher``,
    ``--cfg-options`` and the work dir (``--work-dir``, else the config's
    ``work_dir``, else ``./work_dirs/<config name>``). Returns ``cfg``."""
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    if args.work_dir is not None:
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir', None) is None:
        cfg.work_dir = osp.join('./work_dirs',
                                osp.splitext(osp.basename(args.config))[0])
    return cfg


def add_strict_load_hook(cfg, partial_load: bool) -> None:
    """Append mmsoft's ``StrictLoadHook`` to ``cfg.custom_hooks``: the
    Runner loads ``load_from`` / ``resume`` with ``strict=False`` (a
    WARNING only); the hook checks the checkpoint against the model first
    and refuses a partial match unless ``partial_load`` (``--partial-load``,
    which its message names)."""
    cfg.custom_hooks = list(cfg.get('custom_hooks', None) or []) + [
        dict(
            type='StrictLoadHook',
            allow_partial=partial_load,
            opt_in='pass --partial-load')
    ]


def exit_if_missing_weights(cfg) -> None:
    """Stop with one line (exit 1) before the Runner is built when a SOFT
    backbone's ``init_cfg`` names a local checkpoint that is not there
    (:func:`mmsoft.models.loading.missing_pretrained`)."""
    import sys

    from mmsoft.models.loading import missing_pretrained
    msg = missing_pretrained(cfg)
    if msg:
        sys.exit(f'error: {msg}')
