"""tools/compat/check_env.py: one line on an environment against the
verified stack (get_started.md: ``pip install --no-deps .``, then this)."""
import pytest
from conftest import load_tool

TOOL = load_tool('compat/check_env.py', '_compat_check_env')
WANT = TOOL.verified_stack()
FMT = dict(WANT, **{f'{e}_{d}': v for d in ('torch', 'mmdet') for e, v in zip(
    ('lo', 'hi'), TOOL.stacks.claimed_ranges()[d])})  # yapf: disable


def line_of(changes, ops='13.0'):
    return TOOL.check({**WANT, **changes}, ops)


def test_the_verified_stack_is_one_line(capsys):
    line, rc = line_of({'torch': WANT['torch'] + '+cu130'})
    assert rc == 0 and '\n' not in line
    assert line.startswith(f'the verified stack: torch {WANT["torch"]}+cu130,')
    assert f'mmcv {WANT["mmcv"]} (ops: CUDA 13.0)' in line
    assert line_of({}, 'not available')[0].count('(ops: CPU only)') == 1
    # this environment: the verified stack (tools/setup_env.sh) or, in
    # make compat's older stacks, another tested one (not an error)
    have = TOOL.installed_versions()
    verified = all((have[k] or '').split('+')[0] == v.split('+')[0]
                   for k, v in WANT.items())
    assert TOOL.main([]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(
        ('' if verified else 'outside ') + 'the verified stack: '), out


@pytest.mark.parametrize(
    'changes,ops,rc,parts',
    [
        # another tested stack: named, not an error
        (dict(torch='2.4.1', mmdet='3.2.0'), '12.1', 0, [
            'torch 2.4.1 (verified {torch})', 'mmdet 3.2.0 (verified {mmdet})',
            '; mmcv ops: CUDA 12.1'
        ]),
        # past the tested range: an error
        (dict(torch='2.15.0'), '13.0', 1, [
            'torch 2.15.0 (verified {torch}; outside the tested range '
            '>={lo_torch},<{hi_torch})'
        ]),
        (dict(mmdet='3.1.0'), '13.0', 1, [
            'mmdet 3.1.0 (verified {mmdet}; outside the tested range '
            '>={lo_mmdet},<{hi_mmdet})'
        ]),
        # a codebase missing: its task named, not an error; the core: an error
        (dict(mmpretrain=None), '13.0', 0,
         ['mmpretrain not installed (classification)']),
        (dict(numpy='2.1.0'), 'not available', 0,
         ['numpy 2.1.0 (verified {numpy})', '; mmcv ops: CPU only']),
        (dict(mmcv=None), None, 1, ['mmcv not installed (needed)']),
        ({}, 'error:ImportError: libc10_cuda.so: cannot open', 1, [
            "mmcv's compiled ops do not import (ImportError: libc10_cuda.so: "
            'cannot open)'
        ]),
    ])
def test_each_version_outside_is_named(changes, ops, rc, parts):
    line, code = line_of(changes, ops)
    assert code == rc and '\n' not in line, line
    assert line.startswith('outside the verified stack: '), line
    assert all(part.format(**FMT) in line for part in parts), line
    assert {d for d in WANT if f' {d} ' in f' {line} '} >= set(changes), line
    # nothing at its verified version is named
    assert not [
        d for d in set(WANT) - set(changes) if f'{d} {WANT[d]}' in line
    ]
