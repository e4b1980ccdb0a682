"""A pytest plugin that runs the tests in a shuffled order (issue 30: find
tests that depend on their order or on the clock).

The test modules are shuffled, then the tests inside each module (a
module's tests stay together, so module-scoped fixtures are built once)::

    python -m pytest --shuffle-seed 3 tests/test_tools

(``tests/conftest.py`` loads the plugin.)

Without ``--shuffle-seed`` the order is unchanged. The seed is printed in
the header, so a failing order can be replayed.
"""
import random


def pytest_addoption(parser):
    parser.addoption(
        '--shuffle-seed',
        type=int,
        default=None,
        help='shuffle the test modules and the tests in each module with '
        'this seed (shuffle_order plugin)')


def pytest_report_header(config):
    seed = config.getoption('--shuffle-seed')
    return None if seed is None else f'shuffle_order: seed {seed}'


def pytest_collection_modifyitems(session, config, items):
    seed = config.getoption('--shuffle-seed')
    if seed is None:
        return
    rng = random.Random(seed)
    modules = {}
    for item in items:
        modules.setdefault(item.nodeid.split('::')[0], []).append(item)
    order = list(modules)
    rng.shuffle(order)
    shuffled = []
    for name in order:
        group = modules[name]
        rng.shuffle(group)
        shuffled.extend(group)
    items[:] = shuffled
