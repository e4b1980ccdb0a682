"""The suite's random order (pytest-randomly; docs/en/contributing.md): the
seed alone gives the order, a module's tests stay together, the seed is
printed at the end also under ``-q`` (``tests/conftest.py``), and
``make test`` runs in a random order and passes ``SEED`` on."""
import subprocess
import sys

from conftest import ROOT, run

#: ``pytest -q --co`` of two files, once per argument (one interpreter)
COLLECT = '''import sys, pytest
for args in sys.argv[1:]:
    print('=== run', flush=True)
    pytest.main(['tests/test_import_graph.py', 'tests/test_setup_env.py',
                 '-q', '--co', '-p', 'no:cacheprovider', *args.split()])
'''


def test_the_seed_gives_the_order_and_is_printed():
    seven = '-p randomly --randomly-seed=7'
    proc = run([sys.executable, '-c', COLLECT, seven, seven, '-p no:randomly'])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (order, printed), again, (plain, unprinted) = (([
        ln for ln in out.splitlines() if '::' in ln
    ], [ln for ln in out.splitlines() if ln.startswith('test order:')
        ]) for out in proc.stdout.split('=== run\n')[1:])
    assert printed == [
        'test order: random, --randomly-seed=7 (make test SEED=7 replays it)'
    ]
    assert again == (order, printed) and unprinted == []
    assert len(order) > 10 and order != plain
    assert sorted(order) == sorted(plain)
    # the tests of a module stay together (module fixtures are built once)
    files = [i.split('::')[0] for i in order]
    assert sum(a != b for a, b in zip(files, files[1:])) == 1, order


def test_make_test_runs_in_a_random_order():

    def make_test(*args):
        proc = subprocess.run(['make', '-n', 'test', *args],
                              cwd=ROOT,
                              capture_output=True,
                              text=True)
        assert proc.returncode == 0, proc.stderr
        return ' '.join(proc.stdout.replace('\\\n', ' ').split())

    assert '-p randomly' in make_test()
    assert '--randomly-seed' not in make_test()
    assert '--randomly-seed=3' in make_test('SEED=3')
    # on two pytest-xdist workers, a module's tests on one worker (its
    # module fixtures are built once); JOBS=0: in one process
    assert '-n 2 --dist loadfile' in make_test()
    assert '-n 0 ' in make_test('JOBS=0')
