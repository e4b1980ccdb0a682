"""``make mutations`` stays applicable and scores right: the groups' files
exist; the runner's config, table, equivalents, re-test and child-process
bridge."""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
from conftest import ROOT

SITE = osp.join(ROOT, 'tests', 'mutation', 'site')
sys.path.insert(0, osp.join(ROOT, 'tests', 'mutation'))
import run_mutmut  # noqa: E402
from run_mutmut import GROUPS, TOOLS_PKG  # noqa: E402


def _read(path):
    with open(osp.join(ROOT, path)) as f:
        return f.read()


def test_group_files_exist_and_the_groups_are_disjoint():
    """numerics and backbone share one test selection (one stats run)."""
    seen = {}
    for name, group in GROUPS.items():
        assert group.mutate and group.budget > 0
        for path in group.mutate:  # mutmut's copy has the tools under src/
            assert path not in seen, f'{path} in {seen.get(path)} and {name}'
            seen[path] = name
            path = path.replace('src/mmsoft_tools/', TOOLS_PKG)
            assert osp.isfile(osp.join(ROOT, path)), path
        for sel in (s for s in group.tests if not s.startswith('-')):
            path, _, test = sel.partition('::')
            assert osp.exists(osp.join(ROOT, path)), sel
            assert not test or f'def {test}(' in _read(path), sel
    assert GROUPS['numerics'].tests == GROUPS['backbone'].tests


def test_config_section_reads_as_mutmut_reads_it(tmp_path, monkeypatch):
    """One value per line (mutmut reads one line as a one-item list)."""
    import configparser
    monkeypatch.setattr(run_mutmut, 'checkout_files',
                        lambda: ['mmsoft/a.py', 'tests/t.py', 'setup.cfg'])
    group = GROUPS['loading']
    run_mutmut.write_config(str(tmp_path), group)
    cp = configparser.ConfigParser()
    cp.read(tmp_path / 'setup.cfg')
    assert cp.has_section('flake8') and cp.has_section('mutmut')

    def as_list(key):
        value = cp.get('mutmut', key)
        return [v for v in value.split('\n')
                if v] if '\n' in value else [value]

    assert as_list('only_mutate') == list(group.mutate)
    assert as_list('pytest_add_cli_args_test_selection') == list(group.tests)
    assert as_list('source_paths') == ['mmsoft', 'src']
    assert as_list('also_copy') == ['tests']
    args = as_list('pytest_add_cli_args')
    assert args[args.index('-p', 2) + 1] == 'mmsoft_mutmut_stats'
    assert cp.get('mutmut', 'process_isolation') == 'forkserver'


def test_table_scores_each_group(tmp_path, monkeypatch):
    """killed + timeout over mutants - equivalent; a group without results
    keeps the guide's row; an equivalent needs a reason."""
    monkeypatch.setattr(run_mutmut, 'RESULTS', str(tmp_path))
    doc = tmp_path / 'doc.md'
    kept = '| safety | 1 | 2 | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 100.0% | 100.0% |'
    doc.write_text(f'| tools | x |\n{run_mutmut.TABLE_START}\n| group |\n'
                   f'{kept}\n{run_mutmut.TABLE_END}\n')
    monkeypatch.setattr(run_mutmut, 'DOC', str(doc))
    eq = tmp_path / 'equivalent.txt'
    eq.write_text('# comment\nmmsoft.a.x_f__mutmut_4 same value\n')
    monkeypatch.setattr(run_mutmut, 'EQUIVALENT', str(eq))
    status = {
        f'mmsoft.a.x_f__mutmut_{i}': s
        for i, s in
        enumerate(['killed'] * 6 +
                  ['timeout', 'survived', 'no tests', 'not run', 'survived'])
    }
    run_mutmut.write_results('loading', status, 12.4)
    back, seconds = run_mutmut.read_results('loading')
    assert seconds == 12 and back['mmsoft.a.x_f__mutmut_4'] == 'equivalent'

    def cells():
        row = next(r for r in run_mutmut.table().splitlines()
                   if r.startswith('| loading |'))
        return [c.strip() for c in row.strip('|').split('|')]

    # group budget ran mutants killed timeout survived no-tests not-run eq
    assert cells()[2:] == [
        '12', '11', '5', '1', '2', '1', '1', '1', '60.0%', '66.6%'
    ]
    # a mutant found equivalent after the run counts in the next table
    eq.write_text(eq.read_text() + 'mmsoft.a.x_f__mutmut_7 same value\n')
    assert cells()[4:] == ['5', '1', '1', '1', '1', '2', '66.6%', '75.0%']
    rows = run_mutmut.table().splitlines()
    assert kept in rows and '| tools | 2400 | not run |' + ' |' * 9 in rows
    run_mutmut.update_doc()  # the loading row replaces the table's
    assert run_mutmut.doc_rows() == {
        name: row + '\n'
        for row in rows
        for name in GROUPS if row.startswith(f'| {name} |')
    }
    eq.write_text('mmsoft.a.x_f__mutmut_4\n')
    with pytest.raises(SystemExit, match='has no reason'):
        run_mutmut.equivalents()


def test_an_edited_function_unpins_its_equivalents(tmp_path, monkeypatch,
                                                   capsys):
    (tmp_path / 'mmsoft').mkdir()
    src = tmp_path / 'mmsoft' / 'a.py'
    src.write_text('class C:\n    def f(self):\n        """d"""\n'
                   '        return 1\n')
    monkeypatch.setattr(run_mutmut, 'ROOT', str(tmp_path))
    key = 'mmsoft.a.xǁCǁf__mutmut_2'
    assert run_mutmut.function_of(key) == ('mmsoft.a', 'C.f')
    eq = tmp_path / 'equivalent.txt'
    monkeypatch.setattr(run_mutmut, 'EQUIVALENT', str(eq))
    pin = f'= {run_mutmut.fingerprint("mmsoft.a", "C.f")} mmsoft.a C.f\n'
    eq.write_text(f'{pin}{key} same\n')
    assert run_mutmut.equivalents() == {key: 'same'}
    # comments and docstrings do not count; code does (said once)
    src.write_text('class C:\n    def f(self):  # c\n        """e"""\n'
                   '        return 1\n')
    assert run_mutmut.equivalents() == {key: 'same'}
    src.write_text('class C:\n    def f(self):\n        return 2\n')
    assert run_mutmut.equivalents() == {} == run_mutmut.equivalents()
    assert capsys.readouterr().err.count('mmsoft.a.C.f changed since') == 1
    eq.write_text(f'{key} same\n')  # never pinned
    assert run_mutmut.equivalents() == {}


def test_listed_equivalents_are_skipped_and_groups_share_a_copy(
        tmp_path, monkeypatch):
    """Listed, not run: skipped (34); off the list: back to mutmut; a
    result stands; a group's status from its own files' ``.meta``."""
    pytest.importorskip('mutmut')
    eq = tmp_path / 'equivalent.txt'
    eq.write_text('mmsoft.a.x_f__mutmut_1 same\nmmsoft.a.x_f__mutmut_2 same\n')
    monkeypatch.setattr(run_mutmut, 'EQUIVALENT', str(eq))
    (tmp_path / 'mutants' / 'mmsoft').mkdir(parents=True)
    # listed, not run: skipped; listed, ran: stays; off the list: runs again
    codes = dict(a=[None, 0, 34, 1], b=[None])
    for mod, by_key in codes.items():
        (tmp_path / 'mutants' / 'mmsoft' / f'{mod}.py.meta').write_text(
            json.dumps(
                dict(
                    exit_code_by_key={
                        f'mmsoft.{mod}.x_f__mutmut_{i}': c
                        for i, c in enumerate(by_key, 1)
                    },
                    other=1)))
    group = run_mutmut.Group('a', ('mmsoft/a.py', ), ('tests', ), 1)
    assert run_mutmut.skip_equivalents(str(tmp_path), group) == 1
    meta = json.loads(
        (tmp_path / 'mutants' / 'mmsoft' / 'a.py.meta').read_text())
    assert meta['other'] == 1 and list(
        meta['exit_code_by_key'].values()) == [34, 0, None, 1]
    assert list(run_mutmut.mutant_status(str(tmp_path), group).items()) == [
        (f'mmsoft.a.x_f__mutmut_{i}', s)
        for i, s in enumerate(['skipped', 'survived', 'not run', 'killed'], 1)
    ]
    assert len(run_mutmut.mutant_status(str(tmp_path))) == 5


def _plugin():
    sys.path.insert(0, SITE)
    try:
        import mmsoft_mutmut_stats
    finally:
        sys.path.remove(SITE)
    return mmsoft_mutmut_stats


def test_child_process_hits_count_for_the_test(tmp_path, monkeypatch):
    """In the stats run only (site/)."""
    pytest.importorskip('mutmut')
    env = dict(
        os.environ,
        MUTANT_UNDER_TEST='stats',
        MMSOFT_MUTMUT_HITS=str(tmp_path),
        PYTHONPATH=SITE)
    code = ('from mutmut.mutation import trampoline; '
            "trampoline.record_trampoline_hit('mmsoft.a.x_f')")
    subprocess.run([sys.executable, '-c', code],
                   env=env,
                   check=True,
                   cwd=str(tmp_path))
    assert [p.read_text() for p in tmp_path.glob('*.txt')] == ['mmsoft.a.x_f']
    plugin = _plugin()
    from mutmut.state import state
    monkeypatch.setenv('MMSOFT_MUTMUT_HITS', str(tmp_path))
    monkeypatch.setenv('MUTANT_UNDER_TEST', 'other')
    plugin.pytest_runtest_teardown(None, None)
    assert list(tmp_path.glob('*.txt'))
    monkeypatch.setenv('MUTANT_UNDER_TEST', 'stats')
    plugin.pytest_runtest_teardown(None, None)
    assert 'mmsoft.a.x_f' in state()._stats
    assert not list(tmp_path.glob('*.txt'))
    state()._stats.discard('mmsoft.a.x_f')


def test_a_mutant_runs_its_fastest_tests_first(tmp_path, monkeypatch):
    """The clean and stats runs keep pytest's order."""
    plugin = _plugin()
    (tmp_path / 'mutmut-stats.json').write_text(
        json.dumps(dict(duration_by_test={
            't::slow': 9.0,
            't::fast': 0.01
        })))
    monkeypatch.setattr(plugin, '_durations', None)
    monkeypatch.chdir(tmp_path)

    class Item:

        def __init__(self, nodeid):
            self.nodeid = nodeid

    def order(mutant):
        monkeypatch.setenv('MUTANT_UNDER_TEST', mutant)
        items = [Item(n) for n in ('t::slow', 't::new', 't::fast')]
        plugin.pytest_collection_modifyitems(None, items)
        return [i.nodeid for i in items]

    assert order('mmsoft.a.x_f__mutmut_3') == ['t::fast', 't::new', 't::slow']
    for other in ('', 'stats', 'fail'):
        assert order(other) == ['t::slow', 't::new', 't::fast']


def test_retest_runs_only_last_survivors(tmp_path, monkeypatch):
    """Survived, no tests, not run, less equivalents listed since; a fresh
    copy first makes the mutants only."""
    monkeypatch.setattr(run_mutmut, 'RESULTS', str(tmp_path))
    monkeypatch.setattr(run_mutmut, 'EQUIVALENT', str(tmp_path / 'none'))
    monkeypatch.setattr(run_mutmut, 'sync_copy', lambda ws: None)
    monkeypatch.setattr(run_mutmut, 'write_config', lambda ws, g: None)
    states = ('killed', 'survived', 'no tests', 'timeout', 'survived',
              'not run')
    run_mutmut.write_results('loading', {
        f'm.x_f__mutmut_{i}': s
        for i, s in enumerate(states, 1)
    }, 3)
    (tmp_path / 'none').write_text('m.x_f__mutmut_5 same value\n')
    cmds = []

    class Proc:
        pid, returncode = 0, 0

        def __init__(self, cmd, **kwargs):
            cmds.append(cmd)

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(run_mutmut.subprocess, 'Popen', Proc)
    group = GROUPS['loading']
    run_mutmut.run_group('loading', group, str(tmp_path), 2, retest=True)
    assert cmds[-1][3:] == [
        'run', '--max-children=2', 'm.x_f__mutmut_2', 'm.x_f__mutmut_3',
        'm.x_f__mutmut_6'
    ]
    run_mutmut.run_group('loading', group, str(tmp_path), 2)
    assert cmds[-1][3:] == ['run', '--max-children=2']
    assert cmds[-2][3:] == ['run', '--max-children=2', run_mutmut.NO_MUTANT]
