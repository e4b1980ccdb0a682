"""The support matrix: mmsoft's test suite on each stack it claims.

``make compat`` (``bash tools/compat/run.sh``) runs every session below
with nox, each stack in its own virtualenv under
``${MMSOFT_CACHE:-~/.cache/mmsoft}/compat/venvs/<stack>`` (reused: a second
run only checks the installed versions), and then writes the table
``docs/en/compat/matrix.md`` / ``matrix.csv`` (tools/compat/matrix.py).

Each session:

1. installs the stack's pinned versions (:data:`STACKS`); mmcv 2.1.0 is
   built with its C++ ops from the sdist once per torch version
   (``tools/compat/build_mmcv.sh``, cached in ``wheels/torch-<version>``);
   the verified stack is set up by ``tools/setup_env.sh`` itself;
2. installs mmsoft from this checkout (editable) with its extras
   ``[all,tests,deploy]``: pip checks that the claimed ranges
   (``requirements/*.txt``) admit the stack;
3. runs ``pytest tests -rs`` (the skip reasons are printed) and stores the
   counts in ``compat/results/<stack>.json``. A result is reused while
   neither the checkout's files nor the stack changed
   (``MMSOFT_COMPAT_RERUN=1`` runs the suite again;
   ``MMSOFT_COMPAT_SETUP_ONLY=1`` only sets the stacks up).

The claimed ranges (``requirements/*.txt``) are the
hull of :data:`STACKS`; ``tests/test_compat_matrix.py`` keeps them equal.
"""
import hashlib
import json
import os
import os.path as osp
import runpy
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import nox

ROOT = osp.dirname(osp.abspath(__file__))
CACHE = os.environ.get('MMSOFT_CACHE') or osp.join(
    os.environ.get('XDG_CACHE_HOME') or osp.expanduser('~/.cache'), 'mmsoft')
COMPAT = osp.join(CACHE, 'compat')
RESULTS = osp.join(COMPAT, 'results')
LOGS = osp.join(COMPAT, 'logs')

sys.path.insert(0, osp.join(ROOT, 'tools', 'compat'))
from stacks import COMMON_PINS, STACKS  # noqa: E402

nox.options.envdir = osp.join(COMPAT, 'venvs')
nox.options.reuse_existing_virtualenvs = True
nox.options.default_venv_backend = 'venv'
nox.options.error_on_missing_interpreters = True


def _tree_key(stack):
    """Hash of the checkout's files (tracked and untracked, not ignored;
    not docs/ and the top-level *.md) and the stack: a stored result is
    reused while it is unchanged."""
    files = subprocess.run([
        'git', 'ls-files', '-z', '--cached', '--others', '--exclude-standard'
    ],
                           cwd=ROOT,
                           capture_output=True,
                           check=True).stdout.split(b'\0')
    h = hashlib.sha256(json.dumps(stack, sort_keys=True).encode())
    for name in sorted(f for f in files if f):
        top_md = b'/' not in name and name.endswith(b'.md')
        if name.startswith(b'docs/') or top_md:
            continue  # the table itself and the docs do not change results
        path = osp.join(ROOT, name.decode())
        if not osp.isfile(path):
            continue
        h.update(name + b'\0')
        with open(path, 'rb') as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


def _installed(session, pins):
    """True when every ``name==version`` of ``pins`` is installed."""
    code = ('import sys\n'
            'from importlib.metadata import version, PackageNotFoundError\n'
            'for spec in sys.argv[1:]:\n'
            '    name, _, want = spec.partition("==")\n'
            '    try:\n'
            '        got = version(name)\n'
            '    except PackageNotFoundError:\n'
            '        sys.exit(1)\n'
            '    if got.split("+")[0] != want:\n'
            '        sys.exit(1)\n')
    try:
        session.run('python', '-c', code, *pins, silent=True)
        return True
    except nox.command.CommandFailed:
        return False


def _pins(stack):
    return [
        f'{name}=={stack[key]}'
        for key, name in (('torch', 'torch'), ('torchvision', 'torchvision'),
                          ('mmengine', 'mmengine'), ('mmcv', 'mmcv'),
                          ('mmdet', 'mmdet'), ('mmseg', 'mmsegmentation'),
                          ('mmpretrain', 'mmpretrain'), ('numpy', 'numpy'))
    ]


def _setup(session, name, stack):
    env = {'PIP_DISABLE_PIP_VERSION_CHECK': '1'}
    if stack.get('setup_env'):
        # the verified stack: the project's own setup, in this venv
        session.run(
            'bash',
            osp.join(ROOT, 'tools', 'setup_env.sh'),
            env=dict(env, MMSOFT_VENV=session.virtualenv.location),
            external=True)
        return
    pins = _pins(stack)
    if _installed(session, pins + _test_pins(stack) +
                  ['mmsoft==' + _mmsoft_version()]) and \
            _mmcv_ops(session):
        session.log(f'{name}: stack up to date')
        return
    cons = osp.join(session.virtualenv.location, 'constraints.txt')
    with open(cons, 'w') as f:
        f.write('\n'.join(pins + COMMON_PINS) + '\n')
    pip = [
        'python', '-m', 'pip', 'install', '--progress-bar', 'off', '-c', cons
    ]
    session.run(
        *pip,
        f'torch=={stack["torch"]}',
        f'torchvision=={stack["torchvision"]}',
        'setuptools>=77.0.3,<81',
        'wheel',
        'ninja',
        'packaging',
        f'numpy=={stack["numpy"]}',
        env=env)
    whl = session.run(
        'bash',
        osp.join(ROOT, 'tools', 'compat', 'build_mmcv.sh'),
        osp.join(session.bin, 'python'),
        stack['mmcv'],
        silent=True,
        external=True).strip().splitlines()[-1]
    session.run(
        *pip,
        '--no-build-isolation',
        whl,
        '-e',
        f'{ROOT}[all,tests,deploy]',
        env=env)


def _test_pins(stack):
    """The exact pins of requirements/tests.txt for the stack's Python (a
    venv set up before a pin was added is updated)."""
    from packaging.requirements import Requirement  # a dependency of nox
    with open(osp.join(ROOT, 'requirements', 'tests.txt')) as f:
        reqs = [Requirement(ln) for ln in (r.split('#')[0].strip() for r in f)
                if ln]
    return [
        f'{r.name}{r.specifier}' for r in reqs
        if str(r.specifier).startswith('==') and (r.marker is None or r.marker.
                                                  evaluate(dict(python_version=stack['python'])))
    ]


def _mmsoft_version():
    """``mmsoft.__version__`` of this checkout (mmsoft is not importable in
    nox's own environment)."""
    return runpy.run_path(osp.join(ROOT, 'mmsoft',
                                   'version.py'))['__version__']


def _mmcv_ops(session):
    try:
        session.run('python', '-c', 'import mmcv.ops', silent=True)
        return True
    except nox.command.CommandFailed:
        return False


def _count(junit):
    """(passed, skipped, failed) of a pytest junit XML file; errors count
    as failed."""
    passed = skipped = failed = 0
    for case in ET.parse(junit).getroot().iter('testcase'):
        tags = {child.tag for child in case}
        if tags & {'failure', 'error'}:
            failed += 1
        elif 'skipped' in tags:
            skipped += 1
        else:
            passed += 1
    return passed, skipped, failed


def _suite(session, name, stack):
    os.makedirs(RESULTS, exist_ok=True)
    os.makedirs(LOGS, exist_ok=True)
    result = osp.join(RESULTS, f'{name}.json')
    key = _tree_key(stack)
    if osp.exists(result) and not os.environ.get('MMSOFT_COMPAT_RERUN'):
        with open(result) as f:
            old = json.load(f)
        if old.get('key') == key:
            session.log(f'{name}: checkout and stack unchanged since '
                        f'{old["date"]}: reusing {result} '
                        '(MMSOFT_COMPAT_RERUN=1 runs the suite again)')
            return
    junit = osp.join(LOGS, f'{name}.xml')
    log = osp.join(LOGS, f'{name}.log')
    if osp.exists(junit):  # never count an earlier run's report
        os.remove(junit)
    versions = session.run(
        'python',
        '-c',
        'import platform, torch, mmengine, mmcv, mmdet, mmseg, mmpretrain; '
        'print(platform.python_version(), torch.__version__, '
        'mmengine.__version__, mmcv.__version__, mmdet.__version__, '
        'mmseg.__version__, mmpretrain.__version__)',
        silent=True)
    # the last line: nox's captured output has stderr too (torch 2.4 printed
    # a deprecation warning on import that became the table's columns)
    versions = versions.strip().splitlines()[-1].split()
    if len(versions) != 7 or not all(v[0].isdigit() for v in versions):
        session.error(f'{name}: cannot read the stack versions: {versions}')
    start = time.time()
    args = [
        'python', '-m', 'pytest', 'tests', '-q', '-rs', '-p',
        'no:cacheprovider', f'--junitxml={junit}'
    ]
    args += session.posargs
    rc = 0
    with open(log, 'w') as out:
        rc = subprocess.call(
            [osp.join(session.bin, a) if a == 'python' else a for a in args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(
                os.environ,
                MMSOFT_COMPAT_STACK=name,
                OMP_NUM_THREADS='1',
                PATH=session.bin + os.pathsep + os.environ['PATH']))
    elapsed = time.time() - start
    if rc < 0 or not osp.exists(junit):  # killed, or no report
        session.error(f'{name}: pytest wrote no report (exit {rc}); '
                      f'see {log}')
    passed, skipped, failed = _count(junit)
    with open(log) as f:
        tail = f.read().splitlines()[-1:]
    session.log(f'{name}: {tail[0] if tail else ""} ({elapsed:.0f} s); '
                f'log: {log}')
    data = dict(
        stack=name,
        python=versions[0],
        torch=versions[1].split('+')[0],
        mmengine=versions[2],
        mmcv=versions[3],
        mmdet=versions[4],
        mmseg=versions[5],
        mmpretrain=versions[6],
        passed=passed,
        skipped=skipped,
        failed=failed,
        exit_code=rc,
        seconds=round(elapsed),
        date=time.strftime('%Y-%m-%d', time.gmtime()),
        key=key)
    tmp = result + '.tmp'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, result)


def _make_session(name, stack):

    @nox.session(name=name, python=stack['python'])
    def _run(session):
        _setup(session, name, stack)
        if os.environ.get('MMSOFT_COMPAT_SETUP_ONLY'):
            session.log(f'{name}: set up (MMSOFT_COMPAT_SETUP_ONLY)')
            return
        _suite(session, name, stack)

    _run.__doc__ = (f'torch {stack["torch"]}, mmcv {stack["mmcv"]}, '
                    f'mmdet {stack["mmdet"]}, mmseg {stack["mmseg"]}, '
                    f'mmpretrain {stack["mmpretrain"]}')
    return _run


for _name, _stack in STACKS.items():
    globals()['session_' +
              _name.replace('.', '_')] = _make_session(_name, _stack)
