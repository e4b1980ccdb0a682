"""The claimed ranges are the hull of ``make compat``'s stacks, the verified
stack one of them, the committed table shows every stack passing."""
import csv
import json
import os
import os.path as osp
import sys

import pytest
from conftest import ROOT, load_module

sys.path.insert(0, osp.join(ROOT, 'tools', 'compat'))
import matrix  # noqa: E402
import stacks  # noqa: E402

TABLE = osp.join(ROOT, 'docs', 'en', 'compat', 'matrix.csv')
GEN = load_module(osp.join(ROOT, 'docs', 'gen_tables.py'), '_docs_gen_compat')


def test_claims_are_the_matrix_and_the_verified_stack_in_it():
    """The installed package's requirements (mmsoft keeps no copy)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    ranges = GEN.requirement_ranges()
    assert stacks.claimed_ranges() == ranges and set(ranges) == set(
        'torch mmengine mmcv mmdet mmsegmentation mmpretrain'.split())
    installed = [Requirement(r) for r in metadata.requires('mmsoft')]
    for dist, (lo, hi) in ranges.items():
        specs = {str(r.specifier) for r in installed if r.name == dist}
        assert specs == {f'<{hi},>={lo}'}, (dist, specs)
    verified = [s for s in stacks.STACKS.values() if s.get('setup_env')]
    assert len(verified) == 1
    pins = GEN.verified_versions()
    want = {d: verified[0][k] for k, d in stacks.DISTS.items()}
    assert want == {d: pins[d] for d in stacks.DISTS.values()}
    for name, s in stacks.STACKS.items():  # every pin given
        for key in ('python', 'torch', 'torchvision', 'numpy', *stacks.DISTS):
            assert s.get(key), (name, key)


@pytest.mark.skipif(
    bool(os.environ.get('MMSOFT_COMPAT_STACK')),
    reason='make compat is making this table now')
def test_committed_table_shows_every_stack_passing():
    with open(TABLE) as f:
        rows = {r['stack']: r for r in csv.DictReader(f)}
    assert set(rows) == set(stacks.STACKS), 'run make compat'
    for name, stack in stacks.STACKS.items():
        row = rows[name]
        assert row['passed'].isdigit() and int(row['passed']) > 0, row
        assert row['failed'] == '0', row
        for key in stacks.DISTS:
            assert row[key].split('+')[0] == stack[key], (name, key, row)


def test_table_writer(tmp_path):
    """A stack without results keeps its row or is 'not run' (exit 1)."""
    (a, stack), (b, _) = list(stacks.STACKS.items())[:2]
    res, out = tmp_path / 'results', tmp_path / 'out'
    res.mkdir()
    (res / f'{a}.json').write_text(json.dumps(dict(
        stack=a, python='3.11.2', passed=10, skipped=2, failed=0, seconds=90,
        date='2026-01-01', **{k: stack[k] for k in stacks.DISTS}
    )))  # yapf: disable
    assert matrix.rows(str(res))[1]['passed'] == 'not run'  # no table yet
    out.mkdir()
    (out / 'matrix.csv').write_text(f'stack,passed,skipped,failed,date\n'
                                    f'{b},7,1,0,2025-12-31\n')
    assert matrix.main(['--results', str(res), '--out-dir', str(out)]) == 1
    with open(out / 'matrix.csv') as f:
        rows = list(csv.DictReader(f))
    assert [r['stack'] for r in rows] == list(stacks.STACKS)
    assert rows[0]['passed'] == '10' and rows[0]['time'] == '1.5 min'
    assert (rows[1]['passed'], rows[1]['date']) == ('7', '2025-12-31')
    assert rows[2]['passed'] == 'not run'
    md = (out / 'matrix.md').read_text()
    assert '| 7 | 1 | 0 |' in md
    # the results right after the stack (a narrow page shows them first)
    assert f'| {a} | 10 | 2 | 0 | {stack["torch"]} |' in md
    assert md.index('| failed |') < md.index('| python |')
    assert sorted(p.name for p in out.iterdir()) == ['matrix.csv', 'matrix.md']
