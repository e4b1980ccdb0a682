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
    """Config names relative to :func:`configs_root`, sorted."""
    root = configs_root()
    names = (
        osp.relpath(p, root).replace(os.sep, '/')
        for p in glob.glob(osp.join(root, '**', '*.py'), recursive=True))
    return sorted(n for n in names
                  if include_base or '_base_' not in n.split('/')[:-1])


def get_config_path(name: str) -> str:
    """A shipped config's path (``.py``, ``configs/``, sub-folder
    optional)."""
    root = configs_root()
    rel = name.replace('\\', '/')
    rel = rel[len('configs/'):] if rel.startswith('configs/') else rel
    rel += '' if rel.endswith('.py') else '.py'
    path = osp.join(root, *rel.split('/'))
    if osp.isfile(path):
        return path
    known = list_configs(include_base=True)
    by_base = [k for k in known if k.rsplit('/', 1)[-1] == rel]
    if len(by_base) == 1:
        return osp.join(root, *by_base[0].split('/'))
    close = difflib.get_close_matches(rel, known, n=3, cutoff=0.5)
    hint = (f'; did you mean {", ".join(close)}?'
            if close else '; list them with: mim run mmsoft configs list')
    raise FileNotFoundError(f'mmsoft has no config {name!r} in {root}{hint}')


def get_config(name: str):
    """A shipped config as a ``Config``."""
    from mmengine.config import Config
    return Config.fromfile(get_config_path(name))
