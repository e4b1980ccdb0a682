"""tools/mutation/run_mutmut.py: groups, config, table, equivalents,
re-test and the child-process bridge (tools/mutation/site)."""
import configparser
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
from conftest import ROOT, load_module

SITE = osp.join(ROOT, 'tools', 'mutation', 'site')
R = load_module(osp.join(ROOT, 'tools', 'mutation', 'run_mutmut.py'), '_rm')


@pytest.fixture
def rm(tmp_path, monkeypatch):  # results, equivalents, guide in tmp_path
    for name, rel in (('RESULTS', ''), ('EQUIVALENT', 'equivalent.txt'),
                      ('DOC', 'doc.md'), ('ROOT', '')):
        monkeypatch.setattr(R, name, str(tmp_path / rel))
    monkeypatch.setattr(R, '_STALE_SAID', set())
    return R


def test_group_files_exist_and_the_groups_are_disjoint():
    """numerics and backbone share one test selection."""
    seen = {}
    for name, group in R.GROUPS.items():
        assert group.mutate and group.budget > 0
        for path in group.mutate:  # mutmut's copy has the tools under src/
            assert seen.setdefault(path, name) == name, path
            path = path.replace('src/mmsoft_tools/', R.TOOLS_PKG)
            assert osp.isfile(osp.join(ROOT, path)), path
        for sel in (s for s in group.tests if not s.startswith('-')):
            path, _, test = sel.partition('::')
            assert osp.exists(osp.join(ROOT, path)), sel
            assert not test or f'def {test}(' in open(osp.join(
                ROOT, path)).read(), sel
    assert R.GROUPS['numerics'].tests == R.GROUPS['backbone'].tests


def test_config_section_reads_as_mutmut_reads_it(tmp_path, monkeypatch):
    """One value per line (mutmut reads one line as a one-item list)."""
    monkeypatch.setattr(R, 'checkout_files',
                        lambda: ['mmsoft/a.py', 'tests/t.py', 'setup.cfg'])
    group = R.GROUPS['loading']
    R.write_config(str(tmp_path), group)
    cp = configparser.ConfigParser()
    cp.read(tmp_path / 'setup.cfg')
    assert cp.has_section('flake8')
    got = {k: v.split() for k, v in cp['mutmut'].items()}
    assert got['only_mutate'] == list(group.mutate)
    assert got['pytest_add_cli_args_test_selection'] == list(group.tests)
    assert got['source_paths'] == ['mmsoft', 'src']
    assert got['also_copy'] == ['tests']
    assert got['pytest_add_cli_args'][-2:] == ['-p', 'mmsoft_mutmut_stats']
    assert got['process_isolation'] == ['forkserver']


def test_table_scores_each_group(rm, tmp_path):
    """killed + timeout over mutants - equivalent; rows kept; reasons."""
    kept = '| safety | 1 | 2 | 3 | 3 | 0 | 0 | 0 | 0 | 0 | 100.0% | 100.0% |'
    (tmp_path / 'doc.md').write_text(
        f'| tools | x |\n{rm.TABLE_START}\n| group |\n{kept}\n'
        f'{rm.TABLE_END}\n')
    eq = tmp_path / 'equivalent.txt'
    eq.write_text('# comment\nmmsoft.a.x_f__mutmut_4 same value\n')
    states = ['killed'] * 6 + ['timeout', 'survived', 'no tests', 'not run',
                               'survived']  # yapf: disable
    rm.write_results('loading', {
        f'mmsoft.a.x_f__mutmut_{i}': s
        for i, s in enumerate(states)
    }, 12.4)
    back, seconds = rm.read_results('loading')
    assert seconds == 12 and back['mmsoft.a.x_f__mutmut_4'] == 'equivalent'

    def cells():
        row = next(r for r in rm.table().splitlines()
                   if r.startswith('| loading |'))
        return [c.strip() for c in row.strip('|').split('|')]

    # group budget ran mutants killed timeout survived no-tests not-run eq
    assert cells()[2:] == '12 11 5 1 2 1 1 1 60.0% 66.6%'.split()
    # a mutant found equivalent after the run counts in the next table
    eq.write_text(eq.read_text() + 'mmsoft.a.x_f__mutmut_7 same value\n')
    assert cells()[4:] == '5 1 1 1 1 2 66.6% 75.0%'.split()
    rows = rm.table().splitlines()
    assert kept in rows and '| tools | 2400 | not run |' + ' |' * 9 in rows
    rm.update_doc()  # the loading row replaces the table's
    assert rm.doc_rows() == {name: row + '\n' for row in rows
                             for name in rm.GROUPS
                             if row.startswith(f'| {name} |')}  # yapf: disable
    (tmp_path / 'doc.md').write_text('no markers\n')
    with pytest.raises(SystemExit, match='markers'):
        rm.update_doc()
    eq.write_text('mmsoft.a.x_f__mutmut_4\n')
    with pytest.raises(SystemExit, match='has no reason'):
        rm.equivalents()


def test_an_edited_function_unpins_its_equivalents(rm, tmp_path, capsys):
    (tmp_path / 'mmsoft').mkdir()
    src = tmp_path / 'mmsoft' / 'a.py'
    src.write_text('class C:\n    def f(self):\n        """d"""\n'
                   '        return 1\n')
    key = 'mmsoft.a.xǁCǁf__mutmut_2'
    assert rm.function_of(key) == ('mmsoft.a', 'C.f')
    eq = tmp_path / 'equivalent.txt'
    eq.write_text(f'= {rm.fingerprint("mmsoft.a", "C.f")} mmsoft.a C.f\n'
                  f'{key} same\n')
    assert rm.equivalents() == {key: 'same'}
    # comments and docstrings do not count; code does (said once)
    src.write_text('class C:\n    def f(self):  # c\n        """e"""\n'
                   '        return 1\n')
    assert rm.equivalents() == {key: 'same'}
    src.write_text('class C:\n    def f(self):\n        return 2\n')
    assert rm.equivalents() == {} == rm.equivalents()
    assert capsys.readouterr().err.count('mmsoft.a.C.f changed since') == 1
    eq.write_text(f'{key} same\n')  # never pinned
    assert rm.equivalents() == {}


def test_listed_equivalents_are_skipped_and_groups_share_a_copy(rm, tmp_path):
    """Skipped (34) if not run; a group's status from its own ``.meta``."""
    pytest.importorskip('mutmut')
    (tmp_path / 'equivalent.txt'
     ).write_text('mmsoft.a.x_f__mutmut_1 same\nmmsoft.a.x_f__mutmut_2 same\n')
    (tmp_path / 'mutants' / 'mmsoft').mkdir(parents=True)
    for mod, codes in dict(a=[None, 0, 34, 1], b=[None]).items():
        (tmp_path / 'mutants' / 'mmsoft' / f'{mod}.py.meta').write_text(
            json.dumps(dict(other=1, exit_code_by_key={
                f'mmsoft.{mod}.x_f__mutmut_{i}': c
                for i, c in enumerate(codes, 1)})))  # yapf: disable
    group = rm.Group('a', ('mmsoft/a.py', ), ('tests', ), 1)
    assert rm.skip_equivalents(str(tmp_path), group) == 1
    meta = json.loads(
        (tmp_path / 'mutants' / 'mmsoft' / 'a.py.meta').read_text())
    assert meta['other'] == 1
    assert list(meta['exit_code_by_key'].values()) == [34, 0, None, 1]
    assert list(rm.mutant_status(str(tmp_path), group).items()) == [
        (f'mmsoft.a.x_f__mutmut_{i}', s)
        for i, s in enumerate(['skipped', 'survived', 'not run', 'killed'], 1)
    ]
    assert len(rm.mutant_status(str(tmp_path))) == 5


def test_retest_runs_only_last_survivors(rm, tmp_path, monkeypatch):
    """Survived / no tests / not run, less equivalents; fresh: mutants only."""
    monkeypatch.setattr(rm, 'sync_copy', lambda ws: None)
    monkeypatch.setattr(rm, 'write_config', lambda ws, g: None)
    states = ('killed', 'survived', 'no tests', 'timeout', 'survived',
              'not run')
    rm.write_results('loading', {
        f'm.x_f__mutmut_{i}': s
        for i, s in enumerate(states, 1)
    }, 3)
    (tmp_path / 'equivalent.txt').write_text('m.x_f__mutmut_5 same value\n')
    cmds = []

    class Proc:
        pid = returncode = 0

        def __init__(self, cmd, **kwargs):
            cmds.append(cmd[3:])

        def wait(self, timeout=None):
            return 0

    monkeypatch.setattr(rm.subprocess, 'Popen', Proc)
    run = ['run', '--max-children=2']
    rm.run_group('loading', rm.GROUPS['loading'], str(tmp_path), 2, True)
    assert cmds == [run + [f'm.x_f__mutmut_{i}' for i in (2, 3, 6)]]
    rm.run_group('loading', rm.GROUPS['loading'], str(tmp_path), 2)
    assert cmds[1:] == [run + [rm.NO_MUTANT], run]


def test_child_process_hits_count_for_the_test(tmp_path, monkeypatch):
    """In the stats run only; a mutant's tests run fastest first."""
    pytest.importorskip('mutmut')
    env = dict(os.environ, MUTANT_UNDER_TEST='stats', PYTHONPATH=SITE,
               MMSOFT_MUTMUT_HITS=str(tmp_path))  # yapf: disable
    code = ('from mutmut.mutation import trampoline; '
            "trampoline.record_trampoline_hit('mmsoft.a.x_f')")
    subprocess.run([sys.executable, '-c', code], env=env, check=True,
                   cwd=str(tmp_path))  # yapf: disable
    assert [p.read_text() for p in tmp_path.glob('*.txt')] == ['mmsoft.a.x_f']
    plugin = load_module(osp.join(SITE, 'mmsoft_mutmut_stats.py'), '_stats')
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
    (tmp_path / 'mutmut-stats.json').write_text(
        json.dumps(dict(duration_by_test={
            't::slow': 9.0,
            't::fast': 0.01
        })))
    monkeypatch.chdir(tmp_path)

    def order(mutant):
        monkeypatch.setenv('MUTANT_UNDER_TEST', mutant)
        items = [
            type('Item', (), dict(nodeid=n))
            for n in ('t::slow', 't::new', 't::fast')
        ]
        plugin.pytest_collection_modifyitems(None, items)
        return [i.nodeid for i in items]

    assert order('mmsoft.a.x_f__mutmut_3') == ['t::fast', 't::new', 't::slow']
    for other in ('', 'stats', 'fail'):
        assert order(other) == ['t::slow', 't::new', 't::fast']
