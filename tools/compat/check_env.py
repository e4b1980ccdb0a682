"""One line on this environment against mmsoft's verified stack.

For an existing OpenMMLab environment into which mmsoft was installed
without touching torch or mmcv::

    pip install --no-deps .             # from a checkout: mmsoft only
    python tools/compat/check_env.py

It names each version that differs from the verified stack (the one
``tools/setup_env.sh`` installs and CI runs; ``tools/compat/stacks.py``)
and, for torch, mmengine, mmcv, mmdet, mmsegmentation and mmpretrain, one
outside the tested range (``requirements/*.txt``), plus whether mmcv's
compiled ops import. Exit 0: the verified stack, or other versions inside
the tested ranges; 1: a version outside them, torch / mmengine / mmcv
missing, or mmcv's ops not importable.
"""
import argparse
import importlib.util
import os.path as osp
import sys
from importlib.metadata import PackageNotFoundError, version

HERE = osp.dirname(osp.abspath(__file__))


def _load(path, name):
    """The module at ``path`` (no package import: no torch)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


stacks = _load(osp.join(HERE, 'stacks.py'), '_mmsoft_compat_stacks')

#: stacks.py key -> distribution name, in the order of the line
DISTS = dict(torch='torch', torchvision='torchvision', numpy='numpy')
DISTS.update(stacks.DISTS)
#: needed by ``import mmsoft`` (the codebases are per task)
CORE = ('torch', 'mmengine', 'mmcv')
#: what each codebase is for, when it is missing
TASK = dict(
    mmdet='detection',
    mmsegmentation='segmentation',
    mmpretrain='classification')


def verified_stack():
    """distribution -> version of the verified stack."""
    stack = next(s for s in stacks.STACKS.values() if s.get('setup_env'))
    return {dist: stack[key] for key, dist in DISTS.items()}


def _key(v):
    return tuple(int(x) for x in v.split('+')[0].split('.')[:3])


def check(installed, ops):
    """(line, exit code) for ``installed`` (distribution -> version or
    None) and ``ops`` (mmcv's compiling CUDA version, 'not available' for
    CPU-only ops; ``'error:'`` and the exception when they do not import;
    None when mmcv is not installed)."""
    verified = verified_stack()
    ranges = stacks.claimed_ranges()
    outside, bad = [], False
    for dist, want in verified.items():
        got = installed.get(dist)
        if got is None:
            if dist in CORE:
                bad = True
                outside.append(f'{dist} not installed (needed)')
            elif dist in TASK:
                outside.append(f'{dist} not installed ({TASK[dist]})')
            else:
                outside.append(f'{dist} not installed')
            continue
        if got.split('+')[0] == want:
            continue
        note = f'verified {want}'
        if dist in ranges:
            lo, hi = ranges[dist]
            if not _key(lo) <= _key(got) < _key(hi):
                bad = True
                note += f'; outside the tested range >={lo},<{hi}'
        outside.append(f'{dist} {got} ({note})')
    broken = ops is not None and ops.startswith('error:')
    if broken:
        bad = True
        outside.append(f"mmcv's compiled ops do not import ({ops[6:]})")
    ops_text = '' if ops is None or broken else (
        'CPU only' if ops == 'not available' else f'CUDA {ops}')
    if not outside:
        parts = [f'{d} {installed[d]}' for d in verified]
        mmcv = parts.index(f'mmcv {installed["mmcv"]}')
        parts[mmcv] += f' (ops: {ops_text})'
        return 'the verified stack: ' + ', '.join(parts), 0
    line = 'outside the verified stack: ' + ', '.join(outside)
    if ops_text:
        line += f'; mmcv ops: {ops_text}'
    return line, int(bad)


def installed_versions():
    out = {}
    for dist in DISTS.values():
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = None
    if out['torch']:  # the build (+cu130, +cpu) as torch reports it
        try:
            import torch
            out['torch'] = torch.__version__
        except Exception:  # noqa: reported through mmcv's ops below
            pass
    return out


def mmcv_ops():
    try:
        from mmcv.ops import get_compiling_cuda_version
        return get_compiling_cuda_version()
    except Exception as e:  # noqa: one line names it
        return f'error:{type(e).__name__}: {e}'.splitlines()[0][:120]


def main(argv=None):
    argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__).parse_args(argv)
    installed = installed_versions()
    ops = mmcv_ops() if installed['mmcv'] else None
    line, rc = check(installed, ops)
    print(line)
    return rc


if __name__ == '__main__':
    sys.exit(main())
