"""mmsoft's shipped configs (docs/en/user_guides/own_config.md)."""
import difflib
import glob
import os
import os.path as osp
from typing import List

_PKG_DIR = osp.dirname(osp.abspath(__file__))


def configs_root() -> str:
    """``<checkout>/configs`` or, installed, ``<package>/.mim/configs``."""
    repo = osp.dirname(_PKG_DIR)
    candidates = [osp.join(repo, 'configs')] * osp.isfile(
        osp.join(repo, 'setup.py')) + [osp.join(_PKG_DIR, '.mim', 'configs')]
    for found in filter(osp.isdir, candidates):
        return found
    raise FileNotFoundError(
        f'mmsoft configs/ not found (looked in {" and ".join(candidates)})'
        '; reinstall mmsoft (pip install mmsoft / pip install -e '
        '<checkout>) so that its configs are shipped')


def list_configs(include_base: bool = False) -> List[str]:
    """Config names relative to :func:`configs_root`, sorted."""
    root = configs_root()
    names = (
        osp.relpath(p, root).replace(os.sep, '/')
        for p in glob.glob(osp.join(root, '**', '*.py'), recursive=True))
    return sorted(n for n in names
                  if include_base or '_base_' not in n.split('/')[:-1])


def get_config_path(name: str) -> str:
    """A shipped config's path (``.py``, ``configs/``, folder optional)."""
    root, rel = configs_root(), name.replace('\\', '/')
    rel = rel[len('configs/'):] if rel.startswith('configs/') else rel
    rel += '' if rel.endswith('.py') else '.py'
    every = list_configs(include_base=True)
    known = [rel] if osp.isfile(osp.join(
        root, rel)) else [k for k in every if k.rsplit('/', 1)[-1] == rel]
    if len(known) == 1:
        return osp.join(root, *known[0].split('/'))
    close = difflib.get_close_matches(rel, every, n=3, cutoff=0.5)
    hint = (f'; did you mean {", ".join(close)}?'
            if close else '; list them with: mim run mmsoft configs list')
    raise FileNotFoundError(f'mmsoft has no config {name!r} in {root}{hint}')


def get_config(name: str):
    """A shipped config as a ``Config``."""
    from mmengine.config import Config
    return Config.fromfile(get_config_path(name))
