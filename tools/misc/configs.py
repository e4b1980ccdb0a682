"""List, locate or copy mmsoft's shipped configs, to inherit them from your
own project with a relative ``_base_`` (mmengine 0.10 refuses ``mmsoft::``;
docs/en/user_guides/own_config.md)::

    python tools/misc/configs.py list | path NAME | copy NAME --dest DIR
    mim run mmsoft configs list | path NAME | copy NAME --dest DIR  # a wheel
"""
import argparse
import ast
import filecmp
import os
import os.path as osp
import shutil
import sys
from typing import List

from mmsoft.configs import configs_root, get_config_path, list_configs
from mmsoft.utils.atomic import atomic_path


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
    root = osp.realpath(configs_root())
    plan = []
    for src in base_files(get_config_path(name)):
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(
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
