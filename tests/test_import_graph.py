"""setup.cfg's import-linter contracts (``acyclic``; ``layers``: engine >
models > utils; ``plugin``: no mmsoft_tools in mmsoft) and :func:`init_cycles`
on mmsoft/ and tools/mmsoft_tools, and on small packages that break them."""
import configparser
import inspect
import os
import re
import sys

import pytest
from conftest import ROOT, run

CONTRACTS = ('acyclic', 'layers', 'plugin')


def run_in(root, code, *args):
    """``python -c code args`` with ``root``'s mmsoft and mmsoft_tools."""
    path = os.pathsep.join(p for p in (str(root), os.path.join(
        root, 'tools'), os.environ.get('PYTHONPATH')) if p)  # yapf: disable
    return run([sys.executable, '-c', code, *args], cwd=root,
               PYTHONPATH=path, COLUMNS='200')  # yapf: disable


def lint_imports(root):
    """(exit code, {contract: 'KEPT' / 'BROKEN'}, report) on ``root``."""
    code = ('import sys\nfrom importlinter.cli import lint_imports\n'
            'sys.exit(lint_imports(sys.argv[1], no_cache=True, '
            'no_logo=True))\n')
    proc = run_in(root, code, os.path.join(ROOT, 'setup.cfg'))
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, 'setup.cfg'))
    prefix = 'importlinter:contract:'
    names = {cfg[s]['name']: s[len(prefix):]  # the report names them
             for s in cfg.sections() if s.startswith(prefix)}  # yapf: disable
    found = (re.match(r'(.+) (KEPT|BROKEN)\b', ln)
             for ln in proc.stdout.splitlines())  # yapf: disable
    status = {names[m[1]]: m[2] for m in found if m and m[1] in names}
    return proc.returncode, status, proc.stdout + proc.stderr


def init_cycles(*packages):
    """The cycles through an enclosing ``__init__`` (first == last)."""
    import grimp
    graph = grimp.build_graph(*packages, cache_dir=None)
    cycles = set()
    for module in sorted(graph.modules):
        parts = module.split('.')
        for package in ('.'.join(parts[:i]) for i in range(1, len(parts))):
            up = graph.find_shortest_chain(importer=module, imported=package)
            back = graph.find_shortest_chain(importer=package, imported=module)
            if up and back:
                cycle = tuple(up) + tuple(back[1:-1])
                first = cycle.index(min(cycle))  # one rotation of each
                cycles.add(cycle[first:] + cycle[:first + 1])
    return sorted(list(c) for c in cycles)


def run_init_cycles(root):
    proc = run_in(root, inspect.getsource(init_cycles) +
                  'print(init_cycles("mmsoft", "mmsoft_tools"))\n'
                  )  # yapf: disable
    assert proc.returncode == 0, proc.stderr[-2000:]
    return eval(proc.stdout.strip().splitlines()[-1])


def test_mmsoft_keeps_the_import_rules():
    rc, status, report = lint_imports(ROOT)
    assert rc == 0 and status == dict.fromkeys(CONTRACTS, 'KEPT'), report
    assert int(re.search(r'Analyzed (\d+) files', report)[1]) > 30, report
    cycles = run_init_cycles(ROOT)
    assert cycles == [], 'import cycles through an __init__'


def files(text):  # ``path: line | line`` per line -> {path: its text}
    lines = (ln.partition(':') for ln in text.splitlines())
    return {path: code.strip().replace(' | ', '\n') + '\n'
            for path, _, code in lines if path}  # yapf: disable


#: a small mmsoft and mmsoft_tools that keep every rule
TREE = files("""
mmsoft/__init__.py: from .engine import Hook | from .models import Net
mmsoft/engine/__init__.py: from .hook import Hook
mmsoft/engine/hook.py: from mmsoft.models import Net | class Hook: pass
mmsoft/models/__init__.py: from .nets import Net
mmsoft/models/nets/__init__.py: from .loading import load | from .net import Net
mmsoft/models/nets/net.py: from ...utils.atomic import save | class Net: pass
mmsoft/models/nets/loading.py: def load(): from mmsoft.models.convert.keys import key_map
mmsoft/models/convert/__init__.py: from .keys import key_map
mmsoft/models/convert/keys.py: def key_map(): pass
mmsoft/utils/__init__.py:
mmsoft/utils/atomic.py: def save(): pass
tools/mmsoft_tools/__init__.py: import mmsoft
tools/mmsoft_tools/launch.py: from . import cli
tools/mmsoft_tools/cli.py: import mmsoft.models
""")  # noqa: E501

#: edits of TREE -> the contracts they break
BREAKS = {
    # convert.keys runs convert/__init__ -> arch -> nets.net runs
    # nets/__init__ -> loading -> convert.keys: a sibling-package cycle
    'package-init cycle': ("""
mmsoft/models/convert/__init__.py: from .arch import arch_of | from .keys import key_map
mmsoft/models/convert/arch.py: from ..nets.net import Net | def arch_of(): return Net
""", {'acyclic'}),  # noqa: E501
    'module cycle in the tools':
    ('tools/mmsoft_tools/cli.py: def main(): from .launch import x',
     {'acyclic'}),
    'utils import a model (relative, in a function)':
    ('mmsoft/utils/atomic.py: def save(): from ..models import Net',
     {'layers', 'acyclic'}),
    'mmsoft imports the tools':
    ('mmsoft/models/nets/loading.py: def load(): from mmsoft_tools import '
     'launch', {'plugin'}),
}


def write_tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize('edit', [None] + list(BREAKS))
def test_contracts_break_on_their_violations(tmp_path, edit):
    write_tree(tmp_path, TREE)
    edits, broken = BREAKS[edit] if edit else ('', set())
    write_tree(tmp_path, files(edits))
    rc, status, report = lint_imports(tmp_path)
    assert status == {c: 'BROKEN' if c in broken else 'KEPT'
                      for c in CONTRACTS}, report  # yapf: disable
    assert rc == (1 if broken else 0), report


def test_init_cycle_check_sees_an_import_of_the_own_package(tmp_path):
    """No contract breaks on it; the check reports it."""
    write_tree(tmp_path, TREE)
    assert run_init_cycles(tmp_path) == []
    write_tree(tmp_path,
               files("""
mmsoft/models/nets/net.py: from mmsoft.models import convert | from .. import key_map | class Net: pass
mmsoft/models/__init__.py: from .convert import key_map | from .nets import Net
"""))  # noqa: E501
    assert lint_imports(tmp_path)[1] == dict.fromkeys(CONTRACTS, 'KEPT')
    assert run_init_cycles(tmp_path) == [[
        'mmsoft.models', 'mmsoft.models.nets', 'mmsoft.models.nets.net',
        'mmsoft.models']]  # yapf: disable
    write_tree(tmp_path, files(
        'mmsoft/models/__init__.py: from .convert import key_map'
    ))  # yapf: disable
    assert run_init_cycles(tmp_path) == []
