"""The modules of mmsoft/ import each other without cycles, and
``mmsoft.utils`` imports no model code.

The graph is read from the source with :mod:`ast` (nothing is imported).
A package is the node of its ``__init__.py``. Every ``import`` and
``from ... import`` statement, at module level or inside a function,
absolute or relative, gives the edges that Python's execution of it
follows:

* to the module it names: ``from package import name`` to
  ``package.name`` when that is a module, else to ``package``;
* to every package on the way to that module (``import a.b.c`` runs
  ``a/__init__.py`` and ``a/b/__init__.py`` first), except the packages
  that hold the importing module: they are already being imported when
  its code runs.

So a lazy ``from mmsoft.models.converters.x import f`` inside a function of
``mmsoft.models.backbones`` is an edge to the package
``mmsoft.models.converters`` too, and a cycle through the ``__init__`` of
two sibling packages shows.
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


def enclosing_packages(name, is_package):
    """The packages already being imported while module ``name`` runs: its
    parent packages (and itself, for a package's ``__init__``)."""
    parts = name.split('.')
    last = len(parts) if is_package else len(parts) - 1
    return {'.'.join(parts[:i]) for i in range(1, last + 1)}


def imported(node, name, is_package, modules):
    """The mmsoft modules one import statement of module ``name`` runs."""
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
    skip = enclosing_packages(name, is_package)
    out = set()
    for target in targets:
        # 'import a.b.c' names a.b.c; keep the longest known module
        while target and target not in modules:
            target = target.rpartition('.')[0]
        if not target or target.split('.')[0] != PACKAGE:
            continue
        out.add(target)
        # the packages on the way, whose __init__ Python runs first
        parts = target.split('.')
        out |= {'.'.join(parts[:i]) for i in range(1, len(parts))} - skip
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


def write_package(root, files):
    """Write ``{relative path: source}`` below ``root``."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_graph_reader_sees_every_kind_of_import(tmp_path):
    """The reader finds relative, function-level and submodule imports and
    the packages on their way (and so reports the cycles they make)."""
    write_package(
        tmp_path, {
            'mmsoft/__init__.py': 'from .sub import b\n',
            'mmsoft/sub/__init__.py': 'X = 1\n',
            'mmsoft/sub/b.py':
            'def f():\n    from .. import c\n    from . import X\n',
            'mmsoft/c.py': 'import mmsoft.sub.b as b\n',
        })
    graph = import_graph(str(tmp_path))
    assert graph['mmsoft'] == {'mmsoft.sub', 'mmsoft.sub.b'}
    # its own packages are no edge unless named (``from . import X``)
    assert graph['mmsoft.sub.b'] == {'mmsoft.c', 'mmsoft.sub'}
    assert graph['mmsoft.c'] == {'mmsoft.sub', 'mmsoft.sub.b'}
    assert find_cycle(graph) == ['mmsoft.sub.b', 'mmsoft.c', 'mmsoft.sub.b']
    (tmp_path / 'mmsoft' / 'c.py').write_text('import os\n')
    assert find_cycle(import_graph(str(tmp_path))) is None


# two sibling packages; the second one's module imports the first one's
# class, the first one's module reaches into the second one lazily
SIBLINGS = {
    'mmsoft/__init__.py':
    'from .models import Net\n',
    'mmsoft/models/__init__.py':
    'from .nets import Net\n',
    'mmsoft/models/nets/__init__.py':
    'from .net import Net\nfrom .loading import load\n',
    'mmsoft/models/nets/net.py':
    'class Net:\n    pass\n',
    'mmsoft/models/nets/loading.py':
    'def load():\n    from mmsoft.models.convert.keys import key_map\n',
    'mmsoft/models/convert/__init__.py':
    'from .arch import arch_of\nfrom .keys import key_map\n',
    'mmsoft/models/convert/keys.py':
    'def key_map():\n    pass\n',
    'mmsoft/models/convert/arch.py':
    'from ..nets.net import Net\n\ndef arch_of():\n    return Net\n',
}


def test_cycle_through_a_package_init(tmp_path):
    """``nets.loading`` imports only ``convert.keys`` and ``convert.arch``
    only ``nets.net``: no module-to-module cycle, but importing
    ``convert.keys`` runs ``convert/__init__``, which imports ``arch``,
    whose import of ``nets.net`` runs ``nets/__init__``, which imports
    ``loading``: Python meets the half-imported package. The graph
    reports that cycle and none once either side is gone."""
    write_package(tmp_path, SIBLINGS)
    graph = import_graph(str(tmp_path))
    assert graph['mmsoft.models.nets.loading'] == {
        'mmsoft.models.convert', 'mmsoft.models.convert.keys'
    }
    assert graph['mmsoft.models.convert.arch'] == {
        'mmsoft.models.nets', 'mmsoft.models.nets.net'
    }
    assert find_cycle(graph) == [
        'mmsoft.models.nets', 'mmsoft.models.nets.loading',
        'mmsoft.models.convert', 'mmsoft.models.convert.arch',
        'mmsoft.models.nets'
    ]
    # the class moved to a module outside both packages
    write_package(
        tmp_path, {
            'mmsoft/models/net_arch.py':
            'class Net:\n    pass\n',
            'mmsoft/models/nets/net.py':
            'from ..net_arch import Net\n',
            'mmsoft/models/convert/arch.py':
            'from ..net_arch import Net\n\ndef arch_of():\n'
            '    return Net\n',
        })
    assert find_cycle(import_graph(str(tmp_path))) is None
    # or: the lazy import gone
    write_package(tmp_path, SIBLINGS)
    write_package(tmp_path,
                  {'mmsoft/models/nets/loading.py': 'def load():\n    pass\n'})
    assert find_cycle(import_graph(str(tmp_path))) is None


def test_no_import_cycle_in_mmsoft():
    graph = import_graph()
    assert len(graph) > 20
    cycle = find_cycle(graph)
    assert cycle is None, 'import cycle in mmsoft/: ' + ' -> '.join(cycle)


@pytest.mark.parametrize('layer,forbidden', [
    ('mmsoft.utils', ('mmsoft.models', 'mmsoft.engine')),
    ('mmsoft.models', ('mmsoft.engine', )),
])
def test_layers_do_not_import_upwards(layer, forbidden):
    """``mmsoft.utils`` is free of model code; the models do not import the
    training engine (nothing in mmsoft imports the tools' package:
    tests/test_packaging.py)."""
    graph = import_graph()
    bad = sorted(f'{src} -> {dst}' for src, dsts in graph.items()
                 if src == layer or src.startswith(layer + '.') for dst in dsts
                 if dst.startswith(forbidden))
    assert not bad, f'{layer} imports upwards: {bad}'
