"""mutmut's generated mutants per group.

mutmut runs once per group of :data:`GROUPS` (``make mutations
[GROUPS='loading safety']``), in ``work_dirs/mutation/<group>/``
(kept: mutmut resumes; ``tools/mmsoft_tools`` as ``src/mmsoft_tools``) with
the group's ``[mutmut]`` section, within its budget (what a cut run did not
finish is ``not run``); ``equivalent.txt`` (name, reason) counts as
equivalent; statuses to ``results/<group>.csv`` and the table of
``docs/en/contributing.md`` (``--table``: from the local results). Score =
(killed + timeout) / (mutants - equivalent). ``site/`` (on ``PYTHONPATH``
here only) credits a test with what its child processes ran.

    python tests/mutation/run_mutmut.py [GROUP ...] [--retest] [--table]
    python tests/mutation/run_mutmut.py --survivors loading   # as diffs
"""
import argparse
import ast
import csv
import dataclasses
import glob
import hashlib
import io
import json
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import sys
import time
from typing import Dict, Tuple

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
RESULTS = osp.join(HERE, 'results')
EQUIVALENT = osp.join(HERE, 'equivalent.txt')
DOC = osp.join(ROOT, 'docs', 'en', 'contributing.md')
TABLE_START = '<!-- mutmut table: tests/mutation/run_mutmut.py --table -->'
TABLE_END = '<!-- end of mutmut table -->'
TOOLS_PKG = 'tools/mmsoft_tools/'

SKIPPED = 34  # mutmut's exit code for a mutant it was told to skip
NO_MUTANT = 'mmsoft-generate-only'  # a filter that matches no mutant


@dataclasses.dataclass(frozen=True)
class Group:
    what: str
    mutate: Tuple[str, ...]  # paths as mutmut sees them (src/mmsoft_tools)
    tests: Tuple[str, ...]  # pytest selection, relative to the root
    budget: int  # seconds on a 2-core machine


M = 'mmsoft/'
L = M + 'models/layers/'
H = M + 'engine/hooks/'
T = 'tests/'
# both model groups' tests (one selection: one stats run serves both);
# test_compile stays out: dynamo traces mutmut's trampolines differently
MODEL_TESTS = tuple(f"""{T}test_models {T}test_projects
    {T}test_engine/test_optimizers.py
    --ignore {T}test_models/test_compile.py
    --ignore {T}test_models/test_backbones/test_loading.py""".split())
GROUPS: Dict[str, Group] = {
    'numerics':
    Group(
        'attention, kernel, inverse',
        tuple(f"""{L}nr_iteration.py {L}nr_autograd.py {L}nr_config.py
        {L}soft_attention.py {H}nr_residual_hook.py
        {M}engine/optimizers.py""".split()), MODEL_TESTS, 5400),
    'backbone':
    Group('blocks, backbone', (L + 'amp.py', M + 'models/backbones/soft.py'),
          MODEL_TESTS, 5400),
    'loading':
    Group(
        'weight loading and conversion',
        tuple(f"""{M}models/loading.py {M}models/converters.py
        {M}models/arch_zoo.py {M}utils/strict_load.py {M}utils/safe_load.py
        {M}compat.py {H}strict_load_hook.py""".split()),
        tuple(f"""{T}test_models/test_backbones/test_loading.py
        {T}test_models/test_backbones/test_official_reference.py
        {T}test_utils {T}test_compat.py
        {T}test_tools/test_model_converters.py
        {T}test_tools/test_strict_load_tools.py
        {T}test_tools/test_missing_checkpoint.py {T}test_tools/test_doors.py
        {T}test_configs/test_official_files.py::test_missing_pretrained_finds_nested_and_listed_entries
        {T}test_configs/test_official_files.py::test_demo_configs_opt_out
        {T}test_engine/test_hooks/test_checkpoint_hook.py
        {T}test_checkpoint_safety.py""".split()),  # noqa: E501
        3600),
    'safety':
    Group(
        'checkpoints, resume, lock, non-finite stop',
        tuple(f"""{H}checkpoint_hook.py {H}resume.py {H}nonfinite_hook.py
        {M}utils/atomic.py {M}utils/checkpoint_io.py
        src/mmsoft_tools/work_dir_lock.py""".split()),
        tuple(f"""{T}test_engine {T}test_checkpoint_safety.py
        {T}test_tools/test_work_dir_lock.py""".split()), 2400),
    'tools':
    Group(
        "the tools' argument handling",
        ('src/mmsoft_tools/cli.py', 'src/mmsoft_tools/launch.py'),
        tuple(f"""{T}test_tools/test_tool_helpers.py
        {T}test_tools/test_tool_cli.py {T}test_tools/test_tool_contracts.py
        {T}test_tools/test_launch.py {T}test_tools/test_missing_checkpoint.py
        {T}test_tools/test_doors.py""".split()), 2400),
}


def checkout_files():
    """Tracked files plus untracked files that git does not ignore."""
    out = subprocess.run(
        ['git', 'ls-files', '-co', '--exclude-standard', '-z'],
        cwd=ROOT,
        check=True,
        capture_output=True).stdout
    return sorted(p for p in out.decode().split('\0') if p)


def sync_copy(ws: str) -> None:
    """The checkout into ``ws`` (the tools' package in src/);
    unchanged files keep their time stamps."""
    for rel in checkout_files():
        src = osp.join(ROOT, rel)
        if not osp.isfile(src):
            continue
        if rel.startswith(TOOLS_PKG):
            rel = 'src/mmsoft_tools/' + rel[len(TOOLS_PKG):]
        dst = osp.join(ws, rel)
        if osp.isfile(dst):
            with open(src, 'rb') as a, open(dst, 'rb') as b:
                if a.read() == b.read():
                    continue
        os.makedirs(osp.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


def write_config(ws: str, group: Group) -> None:
    """``setup.cfg`` plus the group's ``[mutmut]`` (lists one per line)."""
    with open(osp.join(ROOT, 'setup.cfg')) as f:
        text = f.read()
    top = sorted({p.split('/')[0]
                  for p in checkout_files()} - {'mmsoft', 'src', 'setup.cfg'})
    lists = dict(
        source_paths=['mmsoft', 'src'],
        only_mutate=list(group.mutate),
        also_copy=top,
        pytest_add_cli_args=[
            '-p', 'no:cacheprovider', '-p', 'mmsoft_mutmut_stats'
        ],
        pytest_add_cli_args_test_selection=list(group.tests))
    text += '\n[mutmut]\n' + ''.join(f'{k}=\n' + ''.join(f'    {v}\n'
                                                         for v in vals)
                                     for k, vals in lists.items())
    text += ('process_isolation=forkserver\nuse_git_change_detection=false\n'
             'log_to_file=true\ntimeout_multiplier=3\ntimeout_constant=30\n')
    with open(osp.join(ws, 'setup.cfg'), 'w') as f:
        f.write(text)


def run_group(name: str,
              group: Group,
              work: str,
              children: int,
              retest: bool = False) -> float:
    """mutmut on ``group`` in ``work/name`` within its budget: seconds."""

    def say(text):
        print(f'[{name}] {text}', flush=True)

    ws = osp.join(work, name)
    os.makedirs(osp.join(ws, 'hits'), exist_ok=True)
    sync_copy(ws)
    write_config(ws, group)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([
            osp.join(ws, 'mutants', 'src'),
            osp.join(ws, 'tests', 'mutation', 'site')
        ]),
        MMSOFT_MUTMUT_HITS=osp.join(ws, 'hits'),
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
        PYTHONDONTWRITEBYTECODE='1',
        MPLBACKEND='Agg')
    cmd = [sys.executable, '-m', 'mutmut', 'run', f'--max-children={children}']
    if retest:  # mutmut re-tests changed functions, not changed tests
        eq = equivalents()
        again = sorted(
            k for k, v in (read_results(name)[0] or {}).items()
            if v in ('survived', 'no tests', 'not run') and k not in eq)
        if not again:
            say('no survivor to re-test')
            return 0.0
        cmd += again
    say(f'{group.what}: {len(group.mutate)} files, budget {group.budget} s, '
        f'{len(cmd) - 5 or "no"} survivors re-tested, in {ws}')
    start = time.time()

    def left():
        return max(1, group.budget - (time.time() - start))

    if not retest and not _metas(ws, group):
        # a fresh copy: make the mutants (a filter matching none) first,
        # so that the listed equivalents can be skipped
        with open(osp.join(ws, 'generate.log'), 'w') as log:
            subprocess.Popen(
                cmd[:5] + [NO_MUTANT],
                cwd=ws,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT).wait(timeout=group.budget)
    say(f'{skip_equivalents(ws, group)} listed equivalents skipped')
    proc = subprocess.Popen(cmd, cwd=ws, env=env, start_new_session=True)
    try:
        proc.wait(timeout=left())
        if proc.returncode == 1 and not osp.isfile(
                osp.join(ws, 'mutants', 'mutmut-stats.json')):
            # a first run under load can fail its stats run: once more
            say('no stats collected: once more')
            proc = subprocess.Popen(
                cmd, cwd=ws, env=env, start_new_session=True)
            proc.wait(timeout=left())
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


def _metas(ws: str, group: Group = None):
    """mutmut's ``.meta`` files in ``ws`` (of ``group``'s files, if given)."""
    root = osp.join(ws, 'mutants')
    if group is None:
        return sorted(
            glob.glob(osp.join(root, '**', '*.py.meta'), recursive=True))
    metas = (osp.join(root, path + '.meta') for path in group.mutate)
    return [meta for meta in metas if osp.isfile(meta)]


def mutant_status(ws: str, group: Group = None) -> Dict[str, str]:
    """mutant name -> status, from mutmut's ``.meta`` files."""
    from mutmut.stats import status_by_exit_code
    found = {}
    for meta in _metas(ws, group):
        with open(meta) as f:
            for key, code in json.load(f)['exit_code_by_key'].items():
                found[key] = ('not run'
                              if code is None else status_by_exit_code[code])
    return found


def skip_equivalents(ws: str, group: Group) -> int:
    """Listed equivalents not yet run: skipped (mutmut's code 34); one
    taken off the list: back to mutmut. Returns how many are skipped."""
    eq = equivalents()
    marked = 0
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
            with open(meta + '.part', 'w') as f:
                json.dump(data, f, indent=4)
            os.replace(meta + '.part', meta)
    return marked


def function_of(key: str) -> Tuple[str, str]:
    """A mutant's module and function: ``m.x_f__mutmut_3`` -> ('m', 'f'),
    ``m.xǁCǁf__mutmut_3`` -> ('m', 'C.f')."""
    mod, _, fn = re.sub(r'__mutmut_\d+$', '', key).rpartition('.')
    return mod, fn[2:].replace('ǁ', '.').strip('.')


def fingerprint(mod: str, qual: str):
    """A hash of the function's code (its ``ast`` without the docstring:
    comments, docstrings and layout do not count); None if not found."""
    rel = mod.replace('.', '/') + '.py'
    path = osp.join(ROOT,
                    'tools/' + rel if mod.startswith('mmsoft_tools') else rel)
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


def equivalents() -> Dict[str, str]:
    """``equivalent.txt``: ``mutant name  reason`` per line, ``#`` comments,
    ``= HASH module function`` pins the code its entries were checked on
    (:func:`fingerprint`). The entries of a function edited since (mutmut
    numbers a function's mutants in order: an edit shifts them) or never
    pinned are stale: not counted, reported once."""
    out, pins = {}, {}
    if osp.isfile(EQUIVALENT):
        with open(EQUIVALENT) as f:
            for line in f:
                key, _, reason = line.strip().partition(' ')
                if key == '=':
                    digest, mod, qual = reason.split()
                    pins[mod, qual] = digest
                elif key and not key.startswith('#'):
                    if not reason.strip():
                        sys.exit(f'{EQUIVALENT}: {key} has no reason')
                    out[key] = reason.strip()
    stale = {}
    for key in list(out):
        now = fingerprint(*function_of(key))
        if now is not None and pins.get(function_of(key)) != now:
            stale[function_of(key)] = now
            del out[key]
    for (mod, qual), now in sorted(stale.items()):
        if (mod, qual, now) not in _STALE_SAID:
            _STALE_SAID.add((mod, qual, now))
            print(
                f'{EQUIVALENT}: {mod}.{qual} changed since its equivalents '
                'were checked: they count as mutants again; check them '
                f'(--survivors) and pin the new code with "= {now} {mod} '
                f'{qual}"',
                file=sys.stderr)
    return out


def write_results(name: str, status: Dict[str, str], seconds: float) -> None:
    eq = equivalents()
    os.makedirs(RESULTS, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator='\n')
    w.writerow(['mutant', 'status', 'seconds=%d' % seconds])
    for key in sorted(status):
        w.writerow([key, 'equivalent' if key in eq else status[key], ''])
    path = osp.join(RESULTS, f'{name}.csv')
    with open(path + '.part', 'w') as f:
        f.write(buf.getvalue())
    os.replace(path + '.part', path)


def read_results(name: str):
    """(mutant -> status, seconds) of ``results/<name>.csv``, or Nones."""
    path = osp.join(RESULTS, f'{name}.csv')
    if not osp.isfile(path):
        return None, None
    with open(path) as f:
        rows = list(csv.reader(f))
    return {r[0]: r[1] for r in rows[1:]}, int(rows[0][2].split('=')[1])


def doc_rows() -> Dict[str, str]:
    """group -> its row of the table now in the contributing guide."""
    if not osp.isfile(DOC):
        return {}
    with open(DOC) as f:
        block = f.read().partition(TABLE_START)[2].partition(TABLE_END)[0]
    rows = {}
    for line in block.splitlines():
        if line.split(' | ')[0][2:] in GROUPS:
            rows[line.split(' | ')[0][2:]] = line + '\n'
    return rows


def table() -> str:
    """One row per group from its results (``equivalent.txt`` applied now;
    ``of those run``: without ``not run``), else the guide's row."""
    eq = equivalents()
    kept = doc_rows()
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
                    name, f'| {name} | {group.budget} | not run |' + ' |' * 9 +
                    '\n'))
            continue
        status = {k: 'equivalent' if k in eq else v for k, v in status.items()}
        n = {
            s: sum(v == s for v in status.values())
            for s in ('killed', 'timeout', 'survived', 'no tests', 'not run',
                      'equivalent')
        }
        other = len(status) - sum(n.values())
        caught = n['killed'] + n['timeout']
        live = len(status) - n['equivalent']
        rows.append(f'| {name} | {group.budget} | {seconds} | {len(status)} '
                    f'| {n["killed"]} | {n["timeout"]} | '
                    f'{n["survived"] + other} | {n["no tests"]} | '
                    f'{n["not run"]} | {n["equivalent"]} | '
                    f'{_percent(caught, live)} | '
                    f'{_percent(caught, live - n["not run"])} |\n')
    return ''.join(rows)


def _percent(part: int, whole: int) -> str:
    """One decimal, rounded down: 1,190 of 1,192 is 99.8%, not 100%."""
    return f'{1000 * part // whole / 10:.1f}%' if whole else '-'


def update_doc() -> None:
    with open(DOC) as f:
        text = f.read()
    pattern = re.compile(
        re.escape(TABLE_START) + '.*?' + re.escape(TABLE_END), re.S)
    if not pattern.search(text):
        sys.exit(f'{DOC}: the markers {TABLE_START!r} ... {TABLE_END!r} '
                 'are missing')
    text = pattern.sub(lambda _: f'{TABLE_START}\n{table()}{TABLE_END}', text)
    with open(DOC + '.part', 'w') as f:
        f.write(text)
    os.replace(DOC + '.part', DOC)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('groups', nargs='*', help=f'of {", ".join(GROUPS)}')
    for flag, text in (('--table',
                        'only rewrite the table from tests/mutation/results'),
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


def main(argv=None) -> int:
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
        group = dataclasses.replace(
            GROUPS[name], budget=int(GROUPS[name].budget * args.budget_scale))
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
