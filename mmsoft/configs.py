"""Find, list and copy mmsoft's shipped configs (``<checkout>/configs``;
installed: ``<package>/.mim/configs``, where ``mim`` looks), to inherit them
from your own project with a relative ``_base_`` (mmengine 0.10 refuses
``mmsoft::``)::

    python -m mmsoft.configs list | path NAME | copy NAME --dest DIR

(docs/en/user_guides/own_config.md).
"""
import argparse
import ast
import difflib
import filecmp
import glob
import os
import os.path as osp
import shutil
import sys
from typing import List, Optional

__all__ = [
    'configs_root', 'get_config', 'get_config_path', 'list_configs',
    'base_files', 'copy_config'
]

_PKG_DIR = osp.dirname(osp.abspath(__file__))


def configs_root() -> str:
    """The folder of mmsoft's configs (a checkout: ``setup.py`` next to the
    package, never an unrelated ``configs`` folder in site-packages)."""
    repo = osp.dirname(_PKG_DIR)
    candidates = [osp.join(_PKG_DIR, '.mim', 'configs')]
    if osp.isfile(osp.join(repo, 'setup.py')):
        candidates.insert(0, osp.join(repo, 'configs'))
    found = next((c for c in candidates if osp.isdir(c)), None)
    if found is None:
        raise FileNotFoundError(
            f'mmsoft configs/ not found (looked in {" and ".join(candidates)})'
            '; reinstall mmsoft (pip install mmsoft / pip install -e '
            '<checkout>) so that its configs are shipped')
    return found


def list_configs(include_base: bool = False) -> List[str]:
    """Config names relative to :func:`configs_root`, sorted; ``_base_``
    fragments only if asked."""
    root = configs_root()
    names = (
        osp.relpath(p, root).replace(os.sep, '/')
        for p in glob.glob(osp.join(root, '**', '*.py'), recursive=True))
    return sorted(n for n in names
                  if include_base or '_base_' not in n.split('/')[:-1])


def get_config_path(name: str) -> str:
    """Absolute path of a shipped config.

    Args:
        name (str): relative to the configs folder, ``.py`` and a leading
            ``configs/`` optional; a bare file name is also looked up in the
            sub-folders (``'retinanet_soft_small_1x'``, ``'demo/x.py'``).

    Raises:
        FileNotFoundError: one line naming the config and the closest names.
    """
    root = configs_root()
    rel = name.replace('\\', '/')
    if rel.startswith('configs/'):
        rel = rel[len('configs/'):]
    if not rel.endswith('.py'):
        rel += '.py'
    path = osp.join(root, *rel.split('/'))
    if osp.isfile(path):
        return path
    known = list_configs(include_base=True)
    by_base = [k for k in known if k.rsplit('/', 1)[-1] == rel]
    if len(by_base) == 1:
        return osp.join(root, *by_base[0].split('/'))
    close = difflib.get_close_matches(rel, known, n=3, cutoff=0.5)
    hint = (f'; did you mean {", ".join(close)}?'
            if close else '; list them with: python -m mmsoft.configs list')
    raise FileNotFoundError(f'mmsoft has no config {name!r} in {root}{hint}')


def get_config(name: str):
    """A shipped config (see :func:`get_config_path` for ``name``) as an
    ``mmengine.config.Config``."""
    from mmengine.config import Config
    return Config.fromfile(get_config_path(name))


def base_files(path: str) -> List[str]:
    """``path`` and the local files it inherits, recursively (``path``
    first; ``pkg::`` bases left out); ``_base_`` is read, not run."""
    order, todo = [], [osp.abspath(path)]
    while todo:
        cur = todo.pop(0)
        if cur in order:
            continue
        order.append(cur)
        with open(cur, encoding='utf-8') as f:
            tree = ast.parse(f.read(), filename=cur)
        bases = next((ast.literal_eval(n.value)
                      for n in tree.body if isinstance(n, ast.Assign)
                      and getattr(n.targets[0], 'id', None) == '_base_'), [])
        todo += [
            osp.abspath(osp.join(osp.dirname(cur), b))
            for b in ([bases] if isinstance(bases, str) else bases)
            if '::' not in b
        ]
    return order


def copy_config(name: str, dest: str, force: bool = False) -> List[str]:
    """Copy a shipped config and its local bases into ``dest`` (keeping
    their layout; atomically; a differing file only with ``force``).

    Returns:
        The written (or already identical) files, the config first.

    Raises:
        FileNotFoundError: unknown config.
        FileExistsError: a differing file exists and ``force`` is False.
    """
    from mmsoft.utils.atomic import atomic_path
    root = osp.realpath(configs_root())
    files = base_files(get_config_path(name))
    plan = []
    for src in files:
        rel = osp.relpath(osp.realpath(src), root)
        if rel.startswith('..'):
            raise FileNotFoundError(
                f'{src} inherits a file outside {root}: {rel}')
        tar = osp.join(dest, rel)
        if (osp.exists(tar) and not force
                and not filecmp.cmp(src, tar, shallow=False)):
            raise FileExistsError(
                f'{tar} exists and differs from the shipped {rel}; pass '
                '--force to overwrite it or choose another --dest')
        plan.append((src, tar))
    for src, tar in plan:
        with atomic_path(tar, makedirs=True) as tmp:
            shutil.copyfile(src, tmp)
    return [tar for _, tar in plan]


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog='python -m mmsoft.configs',
        description='List, locate or copy the configs shipped with mmsoft '
        '(to inherit them from your own config).')
    sub = p.add_subparsers(dest='cmd', required=True)
    sub.add_parser(
        'list', help='the shipped configs').add_argument(
            '--base', action='store_true', help='include the _base_ fragments')
    sub.add_parser(
        'path', help='the absolute path of a config').add_argument('name')
    cp = sub.add_parser('copy', help='copy a config and its local bases')
    cp.add_argument('name')
    cp.add_argument(
        '--dest',
        default='mmsoft_configs',
        help='target folder (default: ./mmsoft_configs)')
    cp.add_argument('--force', action='store_true', help='overwrite files')
    args = p.parse_args(argv)
    try:
        if args.cmd == 'list':
            print('\n'.join(list_configs(include_base=args.base)))
        elif args.cmd == 'path':
            print(get_config_path(args.name))
        else:
            written = copy_config(args.name, args.dest, force=args.force)
            print('\n'.join(written))
            rel = osp.relpath(written[0]).replace(os.sep, '/')
            print(
                f"inherit it with: _base_ = ['./{rel}']  (path relative "
                'to your config file)',
                file=sys.stderr)
    except (FileNotFoundError, FileExistsError) as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
