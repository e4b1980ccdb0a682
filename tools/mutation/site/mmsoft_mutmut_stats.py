"""pytest plugin of ``make mutations``: in the stats run, the functions a
test's child processes ran (``sitecustomize.py``) count for the test; in a
mutant's run, its tests run fastest first (mutmut's recorded durations)."""
import glob
import json
import os

import pytest

UNKNOWN_SECONDS = 1.0  # a test new since the stats: a guess
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


def pytest_collection_modifyitems(config, items):
    if '__mutmut_' not in os.environ.get('MUTANT_UNDER_TEST', ''):
        return  # the clean run, the stats run: as collected
    global _durations
    if _durations is None:  # once per process; none yet: empty
        try:
            with open('mutmut-stats.json') as f:
                _durations = json.load(f).get('duration_by_test', {})
        except (OSError, ValueError):
            _durations = {}
    items.sort(key=lambda item: _durations.get(item.nodeid, UNKNOWN_SECONDS))
