"""tools/compat/check_env.py: one line on an existing environment against
the verified stack (the route of get_started.md for an OpenMMLab
environment: ``pip install --no-deps .``, then this check)."""
import subprocess
import sys

import pytest
from conftest import TOOLS, load_tool

TOOL = load_tool('compat/check_env.py', '_compat_check_env')


def verified():
    """The verified stack's versions (a copy)."""
    return dict(TOOL.verified_stack())


def test_verified_stack_comes_from_stacks_py():
    stack = next(s for s in TOOL.stacks.STACKS.values() if s.get('setup_env'))
    got = TOOL.verified_stack()
    assert got['torch'] == stack['torch'] and got['mmcv'] == stack['mmcv']
    assert got['mmsegmentation'] == stack['mmseg']
    assert list(got)[:3] == ['torch', 'torchvision', 'numpy']


def line_of(changes, ops='13.0'):
    installed = verified()
    installed.update(changes)
    return TOOL.check(installed, ops)


def test_the_verified_stack_is_one_line():
    line, rc = line_of({'torch': TOOL.verified_stack()['torch'] + '+cu130'})
    want = TOOL.verified_stack()
    assert rc == 0 and '\n' not in line
    assert line.startswith(f'the verified stack: torch {want["torch"]}+cu130,')
    assert f'mmcv {want["mmcv"]} (ops: CUDA 13.0)' in line
    assert TOOL.check(verified(),
                      'not available')[0].count('(ops: CPU only)') == 1


def lo_hi(dist):
    return TOOL.stacks.claimed_ranges()[dist]


@pytest.mark.parametrize(
    'changes,ops,rc,parts',
    [
        # another tested stack: named, not an error
        ({
            'torch': '2.4.1',
            'mmdet': '3.2.0'
        }, '12.1', 0, [
            'torch 2.4.1 (verified {torch})', 'mmdet 3.2.0 (verified {mmdet})',
            '; mmcv ops: CUDA 12.1'
        ]),
        # past the tested range: an error
        ({
            'torch': '2.15.0'
        }, '13.0', 1, [
            'torch 2.15.0 (verified {torch}; outside the tested range '
            '>={lo_torch},<{hi_torch})'
        ]),
        ({
            'mmdet': '3.1.0'
        }, '13.0', 1, [
            'mmdet 3.1.0 (verified {mmdet}; outside the tested range '
            '>={lo_mmdet},<{hi_mmdet})'
        ]),
        # a codebase missing: its task named, not an error
        ({
            'mmpretrain': None
        }, '13.0', 0, ['mmpretrain not installed (classification)']),
        ({
            'numpy': '2.1.0'
        }, 'not available', 0,
         ['numpy 2.1.0 (verified {numpy})', '; mmcv ops: CPU only']),
        # the core: an error
        ({
            'mmcv': None
        }, None, 1, ['mmcv not installed (needed)']),
        ({}, 'error:ImportError: libc10_cuda.so: cannot open', 1, [
            "mmcv's compiled ops do not import (ImportError: libc10_cuda.so: "
            'cannot open)'
        ]),
    ])
def test_each_version_outside_is_named(changes, ops, rc, parts):
    want = TOOL.verified_stack()
    fmt = dict(want)
    for dist in ('torch', 'mmdet'):
        fmt[f'lo_{dist}'], fmt[f'hi_{dist}'] = lo_hi(dist)
    line, code = line_of(changes, ops)
    assert code == rc and '\n' not in line, line
    assert line.startswith('outside the verified stack: '), line
    for part in parts:
        assert part.format(**fmt) in line, (part, line)
    named = [d for d in want if f' {d} ' in f' {line} ']
    assert set(named) >= set(changes), line
    # nothing at its verified version is named
    for dist in set(want) - set(changes):
        assert f'{dist} {want[dist]}' not in line, (dist, line)


def test_this_environment():
    """The project's environment (tools/setup_env.sh) is the verified
    stack: exit 0, one line."""
    proc = subprocess.run([sys.executable, f'{TOOLS}/compat/check_env.py'],
                          capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith('the verified stack: ')
