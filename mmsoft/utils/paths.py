"""Where mmsoft's shipped configs are: ``<checkout>/configs`` or, installed,
``<package>/.mim/configs`` (where ``mim`` looks)."""
import difflib
import os
import os.path as osp
import warnings
from typing import List

__all__ = ['configs_root', 'get_config_path', 'list_configs']

_PKG_DIR = osp.dirname(osp.dirname(osp.abspath(__file__)))


def configs_root() -> str:
    """The folder of mmsoft's configs (a checkout: ``setup.py`` next to the
    package, never an unrelated ``configs`` folder in site-packages)."""
    repo = osp.dirname(_PKG_DIR)
    candidates = [osp.join(_PKG_DIR, '.mim', 'configs')]
    if osp.isfile(osp.join(repo, 'setup.py')):
        candidates.insert(0, osp.join(repo, 'configs'))
    for cand in candidates:
        if osp.isdir(cand):
            return cand
    raise FileNotFoundError(
        f'mmsoft configs/ not found (looked in {" and ".join(candidates)}); '
        'reinstall mmsoft (pip install mmsoft / pip install -e <checkout>) '
        'so that its configs are shipped')


def list_configs(include_base: bool = False) -> List[str]:
    """Config names relative to :func:`configs_root`, sorted; ``_base_``
    fragments only if asked."""
    root = configs_root()
    names = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames[:] = sorted(
            d for d in dirnames
            if d != '__pycache__' and (include_base or d != '_base_'))
        for fn in filenames:
            if fn.endswith('.py'):
                names.append(
                    osp.relpath(osp.join(dirpath, fn),
                                root).replace(os.sep, '/'))
    return sorted(names)


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


def __getattr__(name):
    # removed after 0.3.0 (issue 34); the user guide named it: one release
    if name == 'package_root':
        warnings.warn(
            'mmsoft.utils.paths.package_root is deprecated and will be '
            'removed; use os.path.dirname(mmsoft.__file__)',
            DeprecationWarning,
            stacklevel=2)
        return lambda: _PKG_DIR
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
