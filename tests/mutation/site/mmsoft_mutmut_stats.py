"""pytest plugin of ``make mutations`` (``-p mmsoft_mutmut_stats``):

* in mutmut's stats run, the mutated functions that a test's child
  processes ran (written by ``sitecustomize.py`` in each child) count for
  that test;
* in a mutant's run, the tests run fastest first (mutmut's recorded
  durations, ``mutmut-stats.json``): mutmut 3.8 hands them over as a set,
  in no order, and stops at the first failure (``-x``), so a mutant that a
  0.01 s test kills no longer waits for a 10 s tool run drawn first.
"""
import glob
import json
import os

import pytest

#: a test without a recorded duration (new since the stats): a guess
UNKNOWN_SECONDS = 1.0
_durations = None


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


def durations(path='mutmut-stats.json'):
    """test id -> seconds, from mutmut's stats (read once per process;
    empty when there are none yet)."""
    global _durations
    if _durations is None:
        try:
            with open(path) as f:
                _durations = json.load(f).get('duration_by_test', {})
        except (OSError, ValueError):
            _durations = {}
    return _durations


def pytest_collection_modifyitems(config, items):
    if '__mutmut_' not in os.environ.get('MUTANT_UNDER_TEST', ''):
        return  # the clean run, the stats run: as collected
    known = durations()
    items.sort(key=lambda item: known.get(item.nodeid, UNKNOWN_SECONDS))
