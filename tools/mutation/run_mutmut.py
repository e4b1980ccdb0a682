"""``make mutations``: mutmut's generated mutants per group of :data:`GROUPS`
in ``work_dirs/mutation/<group>/`` (kept: mutmut resumes; the tools' package
as ``src/mmsoft_tools``), each within its budget (unfinished: ``not run``);
``equivalent.txt`` counts as equivalent; statuses to ``results/<group>.csv``
and the table of ``docs/en/contributing.md``. Score = (killed + timeout) /
(mutants - equivalent). ``site/`` credits a test with its children's hits.

    python tools/mutation/run_mutmut.py [GROUP ...] [--retest] [--table]
    python tools/mutation/run_mutmut.py --survivors loading   # as diffs
"""
import argparse
import ast
import csv
import glob
import hashlib
import json
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import NamedTuple, Tuple

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
RESULTS = osp.join(HERE, 'results')
EQUIVALENT = osp.join(HERE, 'equivalent.txt')
DOC = osp.join(ROOT, 'docs', 'en', 'contributing.md')
TABLE_START = '<!-- mutmut table: tools/mutation/run_mutmut.py --table -->'
TABLE_END = '<!-- end of mutmut table -->'
TOOLS_PKG = 'tools/mmsoft_tools/'
SKIPPED = 34  # mutmut's exit code for a mutant it was told to skip
NO_MUTANT = 'mmsoft-generate-only'  # a filter that matches no mutant
STATES = ('killed', 'timeout', 'survived', 'no tests', 'not run', 'equivalent')


class Group(NamedTuple):
    what: str
    mutate: Tuple[str, ...]  # paths as mutmut sees them (src/mmsoft_tools)
    tests: Tuple[str, ...]  # pytest selection, relative to the root
    budget: int  # seconds on a 2-core machine


def _paths(text):
    return tuple(text.split())


M, L, H, T = ('mmsoft/', 'mmsoft/models/layers/', 'mmsoft/engine/hooks/',
              'tests/')
# both model groups' tests (one selection: one stats run serves both);
# test_compile stays out: dynamo traces mutmut's trampolines differently
MODEL_TESTS = _paths(f"""{T}test_models {T}test_projects
    {T}test_engine/test_optimizers.py
    --ignore {T}test_models/test_compile.py
    --ignore {T}test_models/test_backbones/test_loading.py""")
GROUPS = {
    'numerics': Group(
        'attention, kernel, inverse',
        _paths(f"""{L}nr.py {L}nr_spectral.py
        {L}soft_attention.py {M}engine/optimizers.py"""), MODEL_TESTS, 5400),
    'backbone': Group(
        'blocks, backbone',
        _paths(f'{L}amp.py {M}models/backbones/soft.py'), MODEL_TESTS, 5400),
    'loading': Group(
        'weight loading and conversion',
        _paths(f"""{M}models/loading.py {M}models/converters.py
        {M}models/arch_zoo.py {M}utils/strict_load.py {M}utils/safe_load.py
        {M}compat.py {H}strict_load_hook.py"""),
        _paths(f"""{T}test_models/test_backbones/test_loading.py
        {T}test_models/test_backbones/test_official_reference.py
        {T}test_utils {T}test_compat.py
        {T}test_tools/test_model_converters.py
        {T}test_tools/test_strict_load_tools.py
        {T}test_tools/test_faults.py
        {T}test_configs/test_official_files.py::test_missing_pretrained_names_the_backbone
        {T}test_configs/test_official_files.py::test_demo_configs_opt_out
        {T}test_engine/test_hooks/test_checkpoint_hook.py
        {T}test_checkpoint_safety.py"""), 3600),  # noqa: E501
    'safety': Group(
        'checkpoints, resume, lock, non-finite stop',
        _paths(f"""{H}checkpoint_hook.py {H}nonfinite_hook.py
        {M}utils/atomic.py {M}utils/checkpoint_io.py
        src/mmsoft_tools/work_dir_lock.py"""),
        _paths(f"""{T}test_engine {T}test_checkpoint_safety.py
        {T}test_tools/test_work_dir_lock.py"""), 2400),
    'tools': Group(
        "the tools' argument handling",
        _paths('src/mmsoft_tools/cli.py src/mmsoft_tools/launch.py'),
        _paths(f"""{T}test_tools/test_tool_helpers.py
        {T}test_tools/test_tool_cli.py {T}test_tools/test_train_test.py
        {T}test_tools/test_deploy.py {T}test_tools/test_faults.py"""), 2400),
}  # yapf: disable


def _replace(path, write):
    """``write(f)`` to ``path.part``, then renamed over ``path``."""
    with open(path + '.part', 'w') as f:
        write(f)
    os.replace(path + '.part', path)


def checkout_files():
    """Tracked files plus untracked files that git does not ignore."""
    out = subprocess.run(
        ['git', 'ls-files', '-co', '--exclude-standard', '-z'],
        cwd=ROOT,
        check=True,
        capture_output=True).stdout
    return sorted(p for p in out.decode().split('\0') if p)


def sync_copy(ws):
    """The checkout into ``ws`` (the tools' package in src/); unchanged
    files keep their time stamps."""
    for rel in checkout_files():
        src = osp.join(ROOT, rel)
        if rel.startswith(TOOLS_PKG):
            rel = 'src/mmsoft_tools/' + rel[len(TOOLS_PKG):]
        dst = osp.join(ws, rel)
        if not osp.isfile(src) or osp.isfile(dst) and open(
                src, 'rb').read() == open(dst, 'rb').read():
            continue
        os.makedirs(osp.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


def write_config(ws, group):
    """``setup.cfg`` plus the group's ``[mutmut]`` (lists one per line)."""
    with open(osp.join(ROOT, 'setup.cfg')) as f:
        text = f.read() + '\n[mutmut]\n'
    top = {p.split('/')[0] for p in checkout_files()}
    for key, vals in dict(
            source_paths=['mmsoft', 'src'],
            only_mutate=group.mutate,
            also_copy=sorted(top - {'mmsoft', 'src', 'setup.cfg'}),
            pytest_add_cli_args=[
                '-p', 'no:cacheprovider', '-p', 'mmsoft_mutmut_stats'
            ],
            pytest_add_cli_args_test_selection=group.tests).items():
        text += f'{key}=\n' + ''.join(f'    {v}\n' for v in vals)
    text += ('process_isolation=forkserver\nuse_git_change_detection=false\n'
             'log_to_file=true\ntimeout_multiplier=3\ntimeout_constant=30\n')
    with open(osp.join(ws, 'setup.cfg'), 'w') as f:
        f.write(text)


def run_group(name, group, work, children, retest=False):
    """mutmut on ``group`` in ``work/name`` within its budget: seconds."""

    def say(text):
        print(f'[{name}] {text}', flush=True)

    ws = osp.join(work, name)
    os.makedirs(osp.join(ws, 'hits'), exist_ok=True)
    sync_copy(ws)
    write_config(ws, group)
    path = [
        osp.join(ws, 'mutants', 'src'),
        osp.join(ws, 'tools/mutation/site')
    ]
    env = dict(
        os.environ,
        MMSOFT_MUTMUT_HITS=osp.join(ws, 'hits'),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
        MPLBACKEND='Agg',
        PYTHONDONTWRITEBYTECODE='1',
        PYTHONPATH=os.pathsep.join(path))
    cmd = [sys.executable, '-m', 'mutmut', 'run', f'--max-children={children}']
    if retest:  # mutmut re-tests changed functions, not changed tests
        eq = equivalents()
        again = sorted(k for k, v in (read_results(name)[0] or {}).items()
                       if v in STATES[2:5] and k not in eq)
        if not again:
            say('no survivor to re-test')
            return 0.0
        cmd += again
    say(f'{group.what}: {len(group.mutate)} files, budget {group.budget} s, '
        f'{len(cmd) - 5 or "no"} survivors re-tested, in {ws}')
    start = time.time()

    def popen(args, **kw):
        return subprocess.Popen(args, cwd=ws, env=env, **kw)

    def wait(proc):
        proc.wait(timeout=max(1, group.budget - (time.time() - start)))

    if not retest and not _metas(ws, group):
        # a fresh copy: the mutants first (a filter matching none), so that
        # the listed equivalents can be skipped
        with open(osp.join(ws, 'generate.log'), 'w') as log:
            wait(popen(cmd[:5] + [NO_MUTANT], stdout=log, stderr=log))
    say(f'{skip_equivalents(ws, group)} listed equivalents skipped')
    proc = popen(cmd, start_new_session=True)
    try:
        wait(proc)
        if proc.returncode == 1 and not osp.isfile(
                osp.join(ws, 'mutants', 'mutmut-stats.json')):
            say('no stats collected: once more')
            wait(proc := popen(cmd, start_new_session=True))
    except subprocess.TimeoutExpired:
        say('budget spent: stopping (finished mutants keep their result)')
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode not in (0, -signal.SIGINT, 130):
        say(f'mutmut stopped with exit status {proc.returncode} (log: '
            f'{ws}/mutants/mutmut-debug.log)')
    return time.time() - start


def _metas(ws, group=None):
    """mutmut's ``.meta`` files in ``ws`` (of ``group``'s files, if given)."""
    root = osp.join(ws, 'mutants')
    if group is None:
        return sorted(
            glob.glob(osp.join(root, '**/*.py.meta'), recursive=True))
    return [m for m in (osp.join(root, p + '.meta') for p in group.mutate)
            if osp.isfile(m)]  # yapf: disable


def mutant_status(ws, group=None):
    """mutant name -> status, from mutmut's ``.meta`` files."""
    from mutmut.stats import status_by_exit_code
    found = {}
    for meta in _metas(ws, group):
        with open(meta) as f:
            for key, code in json.load(f)['exit_code_by_key'].items():
                found[key] = 'not run' if code is None else \
                    status_by_exit_code[code]
    return found


def skip_equivalents(ws, group):
    """Listed equivalents not yet run: skipped (mutmut's 34); one taken off
    the list: back to mutmut. Returns how many are skipped."""
    eq, marked = equivalents(), 0
    for meta in _metas(ws, group):
        with open(meta) as f:
            data = json.load(f)
        codes = data['exit_code_by_key']
        before = dict(codes)
        for key, code in codes.items():
            if code is None and key in eq:
                codes[key] = SKIPPED
            elif code == SKIPPED and key not in eq:
                codes[key] = None
            marked += codes[key] == SKIPPED
        if codes != before:
            _replace(meta, lambda f: json.dump(data, f, indent=4))
    return marked


def function_of(key):
    """``m.x_f__mutmut_3`` -> ('m', 'f'), ``m.xǁCǁf__mutmut_3`` ->
    ('m', 'C.f')."""
    mod, _, fn = re.sub(r'__mutmut_\d+$', '', key).rpartition('.')
    return mod, fn[2:].replace('ǁ', '.').strip('.')


def fingerprint(mod, qual):
    """A hash of the function's ``ast`` without its docstring (comments,
    docstrings, layout do not count); None if not found."""
    rel = mod.replace('.', '/') + '.py'
    path = osp.join(ROOT, 'tools/' * mod.startswith('mmsoft_tools') + rel)
    if not osp.isfile(path):
        return None
    with open(path) as f:
        node = ast.parse(f.read())
    for name in qual.split('.'):
        node = next((n for n in node.body if getattr(n, 'name', '') == name),
                    None)
        if node is None:
            return None
    if ast.get_docstring(node, clean=False) is not None:
        node.body = node.body[1:]
    return hashlib.sha1(ast.dump(node).encode()).hexdigest()[:10]


_STALE_SAID = set()


def equivalents():
    """``equivalent.txt``: ``mutant reason`` per line, ``#`` comments;
    ``= HASH module function`` pins the code its entries were checked on
    (:func:`fingerprint`). Entries of a function edited since (an edit
    renumbers its mutants) or never pinned do not count (said once)."""
    out, pins = {}, {}
    lines = open(EQUIVALENT).read().splitlines() if osp.isfile(
        EQUIVALENT) else []
    for line in lines:
        key, _, reason = line.strip().partition(' ')
        if key == '=':
            digest, mod, qual = reason.split()
            pins[mod, qual] = digest
        elif key and not key.startswith('#'):
            if not reason.strip():
                sys.exit(f'{EQUIVALENT}: {key} has no reason')
            out[key] = reason.strip()
    for key in list(out):
        fn = function_of(key)
        now = fingerprint(*fn)
        if now is not None and pins.get(fn) != now:
            del out[key]
            if (*fn, now) not in _STALE_SAID:
                _STALE_SAID.add((*fn, now))
                print(
                    f'{EQUIVALENT}: {".".join(fn)} changed since its '
                    'equivalents were checked: they count as mutants '
                    'again; check them (--survivors) and pin the new code '
                    f'with "= {now} {fn[0]} {fn[1]}"',
                    file=sys.stderr)
    return out


def write_results(name, status, seconds):
    eq = equivalents()
    rows = [['mutant', 'status', 'seconds=%d' % seconds]
            ] + [[k, 'equivalent' if k in eq else status[k], '']
                 for k in sorted(status)]
    os.makedirs(RESULTS, exist_ok=True)
    _replace(
        osp.join(RESULTS, f'{name}.csv'),
        lambda f: csv.writer(f, lineterminator='\n').writerows(rows))


def read_results(name):
    """(mutant -> status, seconds) of ``results/<name>.csv``, or Nones."""
    path = osp.join(RESULTS, f'{name}.csv')
    if not osp.isfile(path):
        return None, None
    with open(path) as f:
        rows = list(csv.reader(f))
    return {r[0]: r[1] for r in rows[1:]}, int(rows[0][2].split('=')[1])


def doc_rows():
    """group -> its row of the table now in the contributing guide."""
    if not osp.isfile(DOC):
        return {}
    block = open(DOC).read().partition(TABLE_START)[2].partition(TABLE_END)[0]
    return {line.split(' | ')[0][2:]: line + '\n'
            for line in block.splitlines()
            if line.split(' | ')[0][2:] in GROUPS}  # yapf: disable


def _percent(part, whole):
    """One decimal, rounded down: 1,190 of 1,192 is 99.8%, not 100%."""
    return f'{1000 * part // whole / 10:.1f}%' if whole else '-'


def table():
    """One row per group from its results (``equivalent.txt`` applied now;
    ``of those run``: without ``not run``), else the guide's row."""
    eq, kept = equivalents(), doc_rows()
    rows = [
        '| group | budget (s) | ran (s) | mutants | killed | timeout | '
        'survived | no tests | not run | equivalent | score | '
        'of those run |\n' + '|---' * 12 + '|\n'
    ]
    for name, group in GROUPS.items():
        status, seconds = read_results(name)
        if status is None:
            rows.append(
                kept.get(
                    name, f'| {name} | {group.budget} | not run '
                    '|' + ' |' * 9 + '\n'))
            continue
        got = ['equivalent' if k in eq else v for k, v in status.items()]
        n = {s: got.count(s) for s in STATES}
        n['survived'] += len(got) - sum(n.values())  # any other status
        caught, live = n['killed'] + n['timeout'], len(got) - n['equivalent']
        cells = [
            name, group.budget, seconds,
            len(got), *n.values(),
            _percent(caught, live),
            _percent(caught, live - n['not run'])
        ]
        rows.append('| ' + ' | '.join(map(str, cells)) + ' |\n')
    return ''.join(rows)


def update_doc():
    text = open(DOC).read()
    pattern = re.compile(
        re.escape(TABLE_START) + '.*?' + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        sys.exit(f'{DOC}: the markers {TABLE_START!r} ... {TABLE_END!r} '
                 'are missing')
    text = pattern.sub(lambda _: f'{TABLE_START}\n{table()}{TABLE_END}', text)
    _replace(DOC, lambda f: f.write(text))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('groups', nargs='*', help=f'of {", ".join(GROUPS)}')
    for flag, text in (('--table',
                        'only rewrite the table from tools/mutation/results'),
                       ('--survivors', 'print survivors as diffs'),
                       ('--retest',
                        'run only the mutants that survived, had no test or '
                        'did not run last time (e.g. after adding tests)')):
        p.add_argument(flag, action='store_true', help=text)
    p.add_argument(
        '--work-dir', default=osp.join(ROOT, 'work_dirs', 'mutation'))
    p.add_argument('--max-children', type=int, default=os.cpu_count() or 2)
    p.add_argument(
        '--budget-scale', type=float, default=1.0, help='times each budget')
    args = p.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        p.error(f'unknown group(s) {", ".join(unknown)}; the groups are '
                f'{", ".join(GROUPS)}')
    args.groups = args.groups or list(GROUPS)
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.survivors:
        for name in args.groups:
            for key, s in sorted((read_results(name)[0] or {}).items()):
                if s in ('survived', 'no tests'):
                    print(f'--- {key} ({s})', flush=True)
                    subprocess.run(
                        [sys.executable, '-m', 'mutmut', 'show', key],
                        cwd=osp.join(args.work_dir, name))
        return 0
    if not args.table:
        try:
            import mutmut  # noqa: F401
        except ImportError:
            sys.exit('mutmut is not installed in this interpreter: run '
                     '`make mutations` (installs requirements/mutation.txt)')
    for name in args.groups * (not args.table):
        group = GROUPS[name]._replace(
            budget=int(GROUPS[name].budget * args.budget_scale))
        ran = read_results(name)[1] or 0
        seconds = run_group(name, group, args.work_dir, args.max_children,
                            args.retest)
        status = mutant_status(osp.join(args.work_dir, name), group)
        write_results(name, status, seconds + ran * args.retest)
    update_doc()
    print(table(), end='')
    return 0


if __name__ == '__main__':
    sys.exit(main())
