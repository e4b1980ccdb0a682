"""pytest plugin of ``make mutations`` (``-p mmsoft_mutmut_stats``): in
mutmut's stats run, the mutated functions that a test's child processes ran
(written by ``sitecustomize.py`` in each child) count for that test."""
import glob
import os

import pytest


@pytest.hookimpl(tryfirst=True)  # before mutmut's collector reads the hits
def pytest_runtest_teardown(item, nextitem):
    folder = os.environ.get('MMSOFT_MUTMUT_HITS')
    if not folder or os.environ.get('MUTANT_UNDER_TEST') != 'stats':
        return
    from mutmut.state import state
    for path in glob.glob(os.path.join(folder, '*.txt')):
        with open(path) as f:
            state()._stats.update(f.read().split())
        os.remove(path)
