"""The tested version ranges of mmsoft's dependencies (tools' data).

:func:`check_versions` warns (never raises) for each installed package
outside its tested range; mmsoft's tools call it
(:func:`mmsoft_tools.launch.import_codebase`), ``import mmsoft`` does not
(``mmsoft.deps`` in 0.3.0; docs/gen_tables.py reads its two
tables). It reads versions with :mod:`importlib.metadata` only. The ranges
equal the ``requirements/*.txt`` specifiers and span the support matrix
(tools/compat/stacks.py; upper bound: the next minor release).
"""
import re
import warnings
from importlib import metadata
from typing import Dict, List, Optional, Tuple

__all__ = ['TESTED', 'VERIFIED', 'check_versions', 'installed_version']

#: distribution -> (lowest tested, first untested) version: the hull of the
#: support matrix (tools/compat/stacks.py)
TESTED: Dict[str, Tuple[str, str]] = {
    'torch': ('2.1.2', '2.15.0'),
    'mmengine': ('0.10.4', '0.11.0'),
    'mmcv': ('2.1.0', '2.2.0'),
    'mmdet': ('3.2.0', '3.4.0'),
    'mmsegmentation': ('1.2.1', '1.3.0'),
    'mmpretrain': ('1.1.0', '1.3.0'),
}

#: the stack tools/setup_env.sh installs and CI runs
VERIFIED: Dict[str, str] = {
    'torch': '2.14.1',
    'mmengine': '0.10.7',
    'mmcv': '2.1.0',
    'mmdet': '3.3.0',
    'mmsegmentation': '1.2.2',
    'mmpretrain': '1.2.0',
}

#: other distribution names that provide the same module
_ALIASES = {'mmcv': ('mmcv', 'mmcv-lite')}


def _key(version: str) -> Tuple[int, ...]:
    """(major, minor, patch, ...) of a version string ('2.1.0rc1' -> 2.1.0).
    """
    m = re.match(r'\d+(\.\d+)*', version.strip())
    if m is None:
        return ()
    return tuple(int(x) for x in m.group().split('.'))


def installed_version(dist: str) -> Optional[str]:
    """The installed version of ``dist`` (or an alias), None if absent."""
    for name in _ALIASES.get(dist, (dist, )):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def check_versions(versions: Optional[Dict[str, Optional[str]]] = None,
                   warn: bool = True) -> List[str]:
    """Messages for installed packages outside :data:`TESTED`.

    Args:
        versions: distribution -> version (None: not installed); default:
            read with :mod:`importlib.metadata`.
        warn: emit each message with :func:`warnings.warn`.

    Returns:
        The messages (empty when everything installed is in range).
    """
    if versions is None:
        versions = {d: installed_version(d) for d in TESTED}
    msgs = []
    for dist, (lo, hi) in TESTED.items():
        got = versions.get(dist)
        if got is None:
            continue
        key = _key(got)
        if not key or _key(lo) <= key < _key(hi):
            continue
        spec = f'{dist}>={lo},<{hi}'
        msgs.append(
            f'mmsoft was tested with {spec} (verified: {dist} '
            f'{VERIFIED[dist]}) but {dist} {got} is installed; it may not '
            f"work. To use a tested version: pip install '{spec}'")
    if warn:
        for msg in msgs:
            warnings.warn(msg, UserWarning, stacklevel=3)
    return msgs
