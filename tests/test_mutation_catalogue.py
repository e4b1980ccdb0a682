"""The mutation catalogue (``tests/mutation/mutations.py``, run by
``make mutations``) stays applicable: every mutation's text occurs exactly
once in its file and changes it, and every test it names exists, so that a
refactor cannot silently retire a mutation."""
import ast
import os.path as osp
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, osp.join(ROOT, 'tests', 'mutation'))
from mutations import MUTATIONS, by_name  # noqa: E402


def test_names_are_unique():
    assert len(by_name()) == len(MUTATIONS) > 0


@pytest.mark.parametrize('m', MUTATIONS, ids=lambda m: m.name)
def test_mutation_applies_and_names_real_tests(m):
    with open(osp.join(ROOT, m.path)) as f:
        text = f.read()
    assert text.count(m.old) == 1, f'{m.name}: old text not found once'
    assert m.old != m.new
    assert m.tests
    for sel in m.tests:
        path, _, name = sel.partition('::')
        name = name.split('[')[0]
        with open(osp.join(ROOT, path)) as f:
            tree = ast.parse(f.read())
        defined = {
            n.name
            for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)
        }
        assert not name or name in defined, f'{m.name}: no test {sel}'
