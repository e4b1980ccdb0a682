"""The suite's random order (pytest-randomly; docs/en/contributing.md): the
seed alone gives the order, a module's tests stay together, the seed is
printed at the end also under ``-q`` (``tests/conftest.py``), and
``make test`` runs in a random order and passes ``SEED`` on."""
import subprocess
import sys

from conftest import ROOT, run

FILES = ('tests/test_import_graph.py', 'tests/test_setup_env.py')


def collected(*args):
    """(the collected test ids in their order, the 'test order:' lines)
    of ``pytest -q --co`` on :data:`FILES` with ``args``."""
    proc = run([
        sys.executable, '-m', 'pytest', *FILES, '-q', '--co', '-p',
        'no:cacheprovider', *args
    ])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    return ([ln for ln in lines if '::' in ln],
            [ln for ln in lines if ln.startswith('test order:')])


def test_the_seed_gives_the_order_and_is_printed():
    order, printed = collected('-p', 'randomly', '--randomly-seed=7')
    assert printed == [
        'test order: random, --randomly-seed=7 (make test SEED=7 replays it)'
    ]
    assert collected('-p', 'randomly', '--randomly-seed=7')[0] == order
    plain, printed = collected('-p', 'no:randomly')
    assert printed == []
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
        return proc.stdout.replace('\\\n', ' ')

    assert '-p randomly' in make_test()
    assert '--randomly-seed' not in make_test()
    assert '--randomly-seed=3' in make_test('SEED=3')
    # on two pytest-xdist workers, a module's tests on one worker (its
    # module fixtures are built once); JOBS=0: in one process
    assert '-n 2 --dist loadfile' in ' '.join(make_test().split())
    assert '-n 0 ' in make_test('JOBS=0')
