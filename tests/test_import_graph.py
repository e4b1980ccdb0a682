"""The modules of mmsoft/ import each other without cycles, and
``mmsoft.utils`` imports no model code.

The graph is read from the source with :mod:`ast` (nothing is imported):
every ``import`` and ``from ... import`` statement, at module level or
inside a function, absolute or relative, gives an edge to the module it
names: ``from package import name`` to ``package.name`` when that is a
module, else to ``package``. The implicit import of a module's parent
packages is not an edge (Python imports them first in any case).
"""
import ast
import os.path as osp
from glob import glob

import pytest
from conftest import ROOT

PACKAGE = 'mmsoft'


def module_name(path, root):
    rel = osp.relpath(path, root)[:-len('.py')].split(osp.sep)
    if rel[-1] == '__init__':
        rel = rel[:-1]
    return '.'.join(rel)


def imported(node, name, is_package, modules):
    """The mmsoft modules one import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        targets = [alias.name for alias in node.names]
    else:
        base = node.module or ''
        if node.level:
            pkg = name.split('.')
            pkg = pkg if is_package else pkg[:-1]
            pkg = pkg[:len(pkg) - (node.level - 1)]
            base = '.'.join(pkg + ([base] if base else []))
        # a submodule, or a name defined by the module ``base``
        targets = [
            f'{base}.{alias.name}'
            if f'{base}.{alias.name}' in modules else base
            for alias in node.names
        ]
    out = set()
    for target in targets:
        # 'import a.b.c' names a.b.c; keep the longest known module
        while target and target not in modules:
            target = target.rpartition('.')[0]
        if target.split('.')[0] == PACKAGE and target:
            out.add(target)
    return out


def import_graph(root=ROOT, package=PACKAGE):
    """{module: set of mmsoft modules it imports} for ``root/package``."""
    files = sorted(glob(osp.join(root, package, '**', '*.py'), recursive=True))
    modules = {module_name(f, root): f for f in files}
    graph = {}
    for name, path in modules.items():
        with open(path, encoding='utf-8') as f:
            tree = ast.parse(f.read(), path)
        is_package = path.endswith('__init__.py')
        edges = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= imported(node, name, is_package, modules)
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph):
    """One cycle as a list of modules (first == last), or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 'open'
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 'open':
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 'done'
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_graph_reader_sees_every_kind_of_import(tmp_path):
    """The reader finds relative, function-level and submodule imports
    (and so reports the cycles they make)."""
    pkg = tmp_path / PACKAGE
    (pkg / 'sub').mkdir(parents=True)
    (pkg / '__init__.py').write_text('from .sub import b\n')
    (pkg / 'sub' / '__init__.py').write_text('X = 1\n')
    (pkg / 'sub' / 'b.py'
     ).write_text('def f():\n    from .. import c\n    from . import X\n')
    (pkg / 'c.py').write_text('import mmsoft.sub.b as b\n')
    graph = import_graph(str(tmp_path))
    assert graph['mmsoft'] == {'mmsoft.sub.b'}
    assert graph['mmsoft.sub.b'] == {'mmsoft.c', 'mmsoft.sub'}
    assert graph['mmsoft.c'] == {'mmsoft.sub.b'}
    assert find_cycle(graph) == ['mmsoft.sub.b', 'mmsoft.c', 'mmsoft.sub.b']
    (pkg / 'c.py').write_text('import os\n')
    assert find_cycle(import_graph(str(tmp_path))) is None


def test_no_import_cycle_in_mmsoft():
    graph = import_graph()
    assert len(graph) > 20
    cycle = find_cycle(graph)
    assert cycle is None, 'import cycle in mmsoft/: ' + ' -> '.join(cycle)


@pytest.mark.parametrize('layer,forbidden', [
    ('mmsoft.utils',
     ('mmsoft.models', 'mmsoft.engine', 'mmsoft.tools_support')),
    ('mmsoft.models', ('mmsoft.engine', 'mmsoft.tools_support')),
])
def test_layers_do_not_import_upwards(layer, forbidden):
    """``mmsoft.utils`` is free of model code; the models do not import the
    training engine or the tools' support code."""
    graph = import_graph()
    bad = sorted(f'{src} -> {dst}' for src, dsts in graph.items()
                 if src == layer or src.startswith(layer + '.') for dst in dsts
                 if dst.startswith(forbidden))
    assert not bad, f'{layer} imports upwards: {bad}'
