"""Generated mutants (issue 37): mutmut, one run per module group.

``make mutations`` (all groups) or ``make mutations GROUPS='loading'``.
For each group of :data:`GROUPS` this

1. copies the checkout (tracked and untracked, non-ignored files) into
   ``work_dirs/mutation/<group>/`` (kept: mutmut resumes there and re-tests
   only the functions that changed); ``tools/mmsoft_tools`` goes to
   ``src/mmsoft_tools`` so that mutmut names its mutants after the module
   the tests import (``mmsoft_tools.cli``, not ``tools.mmsoft_tools.cli``);
2. writes the group's ``[mutmut]`` section (the files to mutate, the tests
   to run) into that copy's ``setup.cfg``;
3. runs ``mutmut run`` there within the group's time budget (seconds of a
   2-core machine, both cores for mutmut, one torch thread per worker); a
   run cut by its budget keeps what it finished, the rest is ``not run``;
4. counts killed / survived / timeout / no tests / not run, takes the
   mutants listed in ``tests/mutation/equivalent.txt`` (name, then the
   reason) out as equivalent, and writes the group's result to
   ``tests/mutation/results/<group>.csv`` (local, not committed) and the
   table (group, mutants, killed, equivalent, score) into
   ``docs/en/contributing.md``: the committed record; a group without a
   local result keeps its row there.

Score = (killed + timeout) / (mutants - equivalent): a mutant that makes a
test hang is caught. ``no tests`` (no test reaches the function) and ``not
run`` count as not caught.

    python tests/mutation/run_mutmut.py                  # every group
    python tests/mutation/run_mutmut.py loading safety   # some
    python tests/mutation/run_mutmut.py --table          # table from CSVs
    python tests/mutation/run_mutmut.py --survivors loading   # diffs

Child processes: mutmut sees the functions that ran in its own process
only; ``tests/mutation/site`` (on ``PYTHONPATH`` in these runs alone) makes
a tool run by a test in a child process count for that test.
"""
import argparse
import csv
import dataclasses
import glob
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
if HERE not in sys.path:
    sys.path.insert(0, HERE)
# the checkout's files (tracked and untracked, non-ignored), as the
# hand-written catalogue's runner copies them
from run_mutations import checkout_files  # noqa: E402

CAUGHT = ('killed', 'timeout')
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
# the model's tests, for both model groups (one selection: the two groups
# can share one stats run's mapping of tests to functions)
MODEL_TESTS = (
    'tests/test_models',
    'tests/test_engine/test_optimizers.py',
    # torch.compile's tests stay out: a mutated function is wrapped in a
    # trampoline that dynamo traces differently (the compile cases are
    # hand-written, tests/mutation/mutations.py)
    '--ignore',
    'tests/test_models/test_compile.py',
    '--ignore',
    'tests/test_models/test_backbones/test_loading.py')
GROUPS: Dict[str, Group] = {
    'numerics':
    Group(
        'attention, kernel, inverse',
        tuple(L + f for f in ('nr_iteration.py', 'nr_autograd.py',
                              'nr_config.py', 'soft_attention.py', 'zoo.py')) +
        (H + 'nr_residual_hook.py',
         M + 'engine/optimizers/cpu_amp_optim_wrapper.py'),
        MODEL_TESTS,
        budget=5400),
    'backbone':
    Group(
        'blocks, backbone', (L + 'amp.py', M + 'models/backbones/soft.py'),
        MODEL_TESTS,
        budget=5400),
    'loading':
    Group(
        'weight loading and conversion',
        (M + 'models/loading.py', M + 'models/converters.py',
         M + 'models/arch_zoo.py', M + 'utils/strict_load.py',
         M + 'utils/safe_load.py', M + 'compat.py', H + 'strict_load_hook.py',
         'src/mmsoft_tools/checkpoint_files.py'),
        ('tests/test_models/test_backbones/test_loading.py',
         'tests/test_models/test_backbones/test_official_reference.py',
         'tests/test_utils', 'tests/test_compat.py',
         'tests/test_tools/test_model_converters.py',
         'tests/test_tools/test_strict_load_tools.py',
         'tests/test_tools/test_missing_checkpoint.py',
         'tests/test_tools/test_doors.py',
         'tests/test_configs/test_official_files.py::'
         'test_missing_pretrained_finds_nested_and_listed_entries',
         'tests/test_configs/test_official_files.py::'
         'test_demo_configs_opt_out'),
        budget=3600),
    'safety':
    Group(
        'checkpoints, resume, lock, non-finite stop',
        (H + 'checkpoint_hook.py', H + 'resume.py', H + 'nonfinite_hook.py',
         M + 'utils/atomic.py', M + 'utils/checkpoint_io.py',
         M + 'utils/rng_state.py', 'src/mmsoft_tools/work_dir_lock.py'),
        ('tests/test_engine', 'tests/test_checkpoint_safety.py',
         'tests/test_tools/test_work_dir_lock.py'),
        budget=2400),
    'tools':
    Group(
        "the tools' argument handling",
        ('src/mmsoft_tools/cli.py', 'src/mmsoft_tools/launch.py'),
        ('tests/test_tools/test_tool_helpers.py',
         'tests/test_tools/test_tool_cli.py',
         'tests/test_tools/test_tool_contracts.py',
         'tests/test_tools/test_launch.py',
         'tests/test_tools/test_missing_checkpoint.py',
         'tests/test_tools/test_doors.py'),
        budget=2400),
}


# ------------------------------------------------------------- the copy
def sync_copy(ws: str) -> None:
    """The checkout into ``ws`` (``tools/mmsoft_tools`` as
    ``src/mmsoft_tools``); unchanged files keep their time stamps."""
    for rel in checkout_files():
        src = osp.join(ROOT, rel)
        if not osp.isfile(src):
            continue
        if rel.startswith(TOOLS_PKG):
            rel = 'src/mmsoft_tools/' + rel[len(TOOLS_PKG):]
        dst = osp.join(ws, rel)
        if osp.isfile(dst) and _same(src, dst):
            continue
        os.makedirs(osp.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)


def _same(a: str, b: str) -> bool:
    with open(a, 'rb') as fa, open(b, 'rb') as fb:
        return fa.read() == fb.read()


def write_config(ws: str, group: Group) -> None:
    """The repository's ``setup.cfg`` plus the group's ``[mutmut]``."""
    with open(osp.join(ROOT, 'setup.cfg')) as f:
        text = f.read()
    top = sorted({
        p.split('/')[0]
        for p in checkout_files()
        if p.split('/')[0] not in ('mmsoft', 'src', 'setup.cfg')
    })
    lines = dict(
        source_paths=['mmsoft', 'src'],
        only_mutate=list(group.mutate),
        also_copy=top,
        pytest_add_cli_args=[
            '-p', 'no:cacheprovider', '-p', 'mmsoft_mutmut_stats'
        ],
        pytest_add_cli_args_test_selection=list(group.tests),
        process_isolation=['forkserver'],
        use_git_change_detection=['false'],
        log_to_file=['true'],
        timeout_multiplier=['3'],
        timeout_constant=['30'])
    section = '\n[mutmut]\n' + ''.join(
        f'{k}=\n' + ''.join(f'    {v}\n'
                            for v in vals) if len(vals) > 1 or k in
        ('source_paths', 'only_mutate', 'also_copy') else f'{k}={vals[0]}\n'
        for k, vals in lines.items())
    with open(osp.join(ws, 'setup.cfg'), 'w') as f:
        f.write(text + section)


# --------------------------------------------------------------- a run
def run_group(name: str,
              group: Group,
              work: str,
              children: int,
              retest: bool = False) -> float:
    ws = osp.join(work, name)
    os.makedirs(ws, exist_ok=True)
    sync_copy(ws)
    write_config(ws, group)
    hits = osp.join(ws, 'hits')
    os.makedirs(hits, exist_ok=True)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([
            osp.join(ws, 'mutants', 'src'),
            osp.join(ws, 'tests', 'mutation', 'site')
        ]),
        MMSOFT_MUTMUT_HITS=hits,
        OMP_NUM_THREADS='1',
        MKL_NUM_THREADS='1',
        PYTHONDONTWRITEBYTECODE='1',
        MPLBACKEND='Agg')
    cmd = [sys.executable, '-m', 'mutmut', 'run', f'--max-children={children}']
    if retest:  # mutmut re-tests changed functions, not changed tests
        status, _ = read_results(name)
        eq = equivalents()  # listed since that run: not again
        again = sorted(
            k for k, v in (status or {}).items()
            if v in ('survived', 'no tests', 'not run') and k not in eq)
        if not again:
            print(f'[{name}] no survivor to re-test', flush=True)
            return 0.0
        print(f'[{name}] re-testing {len(again)} survivors', flush=True)
        cmd += again
    print(
        f'[{name}] {group.what}: {len(group.mutate)} files, budget '
        f'{group.budget} s, in {ws}',
        flush=True)
    start = time.time()
    if not retest and not any(_metas(ws, group)):
        # a fresh copy: mutmut makes the mutants (and collects its stats)
        # first, stopped by a filter that matches none of them, so that
        # the listed equivalents can be skipped in the run proper
        with open(osp.join(ws, 'generate.log'), 'w') as log:
            subprocess.Popen(
                cmd[:5] + [NO_MUTANT],
                cwd=ws,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT).wait(timeout=group.budget)
    print(
        f'[{name}] {skip_equivalents(ws, group)} mutants listed as '
        'equivalent are skipped',
        flush=True)
    proc = subprocess.Popen(cmd, cwd=ws, env=env, start_new_session=True)
    try:
        proc.wait(timeout=max(1, group.budget - (time.time() - start)))
        if proc.returncode == 1 and not osp.isfile(
                osp.join(ws, 'mutants', 'mutmut-stats.json')):
            # a first run under load has failed its stats run (a test with
            # a time limit, cold caches); the second has not, so far
            print(
                f'[{name}] mutmut could not collect its stats: once more',
                flush=True)
            proc = subprocess.Popen(
                cmd, cwd=ws, env=env, start_new_session=True)
            proc.wait(timeout=max(1, group.budget - (time.time() - start)))
    except subprocess.TimeoutExpired:
        print(
            f'[{name}] budget of {group.budget} s spent: stopping '
            '(finished mutants keep their result)',
            flush=True)
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode not in (0, -signal.SIGINT, 130):
        log = osp.join(ws, 'mutants', 'mutmut-debug.log')
        print(
            f'[{name}] mutmut stopped with exit status {proc.returncode} '
            f'(its log: {log}); the results below are what it finished',
            flush=True)
    return time.time() - start


def _metas(ws: str, group: Group = None):
    """mutmut's ``.meta`` files in ``ws`` (one per mutated file; those of
    ``group``'s files only, when given: two groups can share a copy)."""
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
            codes = json.load(f)['exit_code_by_key']
        for key, code in codes.items():
            status = status_by_exit_code[code]
            found[key] = 'not run' if code is None else status
    return found


def skip_equivalents(ws: str, group: Group) -> int:
    """Mark the listed equivalents that mutmut has not run as skipped
    (mutmut's exit code 34), so that a run does not spend a surviving
    mutant's time (every test of its function) on them, and give a mutant
    taken off the list back to mutmut (not run). mutmut itself resets the
    mutants of a function that changed, so a stale entry runs again."""
    eq = equivalents()
    marked = 0
    for meta in _metas(ws, group):
        with open(meta) as f:
            data = json.load(f)
        codes = data['exit_code_by_key']
        changed = False
        for key, code in codes.items():
            if code is None and key in eq:
                codes[key], changed = SKIPPED, True
            elif code == SKIPPED and key not in eq:
                codes[key], changed = None, True
            marked += codes[key] == SKIPPED
        if changed:
            with open(meta + '.part', 'w') as f:
                json.dump(data, f, indent=4)
            os.replace(meta + '.part', meta)
    return marked


def equivalents() -> Dict[str, str]:
    """``equivalent.txt``: ``mutant name  reason`` per line, ``#`` comments."""
    out = {}
    if osp.isfile(EQUIVALENT):
        with open(EQUIVALENT) as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith('#'):
                    key, _, reason = line.partition(' ')
                    if not reason.strip():
                        sys.exit(f'{EQUIVALENT}: {key} has no reason')
                    out[key] = reason.strip()
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
    path = osp.join(RESULTS, f'{name}.csv')
    if not osp.isfile(path):
        return None, None
    with open(path) as f:
        rows = list(csv.reader(f))
    seconds = int(rows[0][2].split('=')[1])
    return {r[0]: r[1] for r in rows[1:]}, seconds


def doc_rows() -> Dict[str, str]:
    """group -> its row of the table now in the contributing guide."""
    if not osp.isfile(DOC):
        return {}
    with open(DOC) as f:
        block = f.read().partition(TABLE_START)[2].partition(TABLE_END)[0]
    rows = {}
    for line in block.splitlines():
        name = line.split(' | ')[0][2:]
        if name in GROUPS:
            rows[name] = line + '\n'
    return rows


def table() -> str:
    """One row per group from ``results/<group>.csv``; the mutants of
    ``equivalent.txt`` count as equivalent even if listed after the run.
    ``score``: caught / (mutants - equivalent); ``of those run``: the same
    over the mutants that ran (the budget's cut left out). The results are
    not committed: a group without one keeps its row of the guide."""
    eq = equivalents()
    kept = doc_rows()
    head = ('| group | budget (s) | ran (s) | mutants | killed | timeout | '
            'survived | no tests | not run | equivalent | score | '
            'of those run |\n' + '|---' * 12 + '|\n')
    rows = []
    for name, group in GROUPS.items():
        status, seconds = read_results(name)
        if status is None:
            rows.append(
                kept.get(
                    name, f'| {name} | {group.budget} | not run |' + ' |' * 9 +
                    '\n'))
            continue
        status = {k: 'equivalent' if k in eq else v for k, v in status.items()}
        count = {
            s: sum(v == s for v in status.values())
            for s in ('killed', 'timeout', 'survived', 'no tests', 'not run',
                      'equivalent')
        }
        other = len(status) - sum(count.values())
        caught = count['killed'] + count['timeout']
        live = len(status) - count['equivalent']
        ran = live - count['not run']
        rows.append(f'| {name} | {group.budget} | {seconds} | {len(status)} '
                    f'| {count["killed"]} | {count["timeout"]} | '
                    f'{count["survived"] + other} | {count["no tests"]} | '
                    f'{count["not run"]} | {count["equivalent"]} | '
                    f'{_percent(caught, live)} | {_percent(caught, ran)} |\n')
    return head + ''.join(rows)


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


def show_survivors(name: str, work: str) -> None:
    status, _ = read_results(name)
    ws = osp.join(work, name)
    for key, s in sorted((status or {}).items()):
        if s in ('survived', 'no tests'):
            print(f'--- {key} ({s})', flush=True)
            subprocess.run([sys.executable, '-m', 'mutmut', 'show', key],
                           cwd=ws)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('groups', nargs='*', help=f'of {", ".join(GROUPS)}')
    p.add_argument(
        '--table',
        action='store_true',
        help='only rewrite the table from tests/mutation/results (a '
        'group without a local result keeps its row)')
    p.add_argument(
        '--survivors',
        action='store_true',
        help="print the groups' surviving mutants as diffs")
    p.add_argument(
        '--work-dir', default=osp.join(ROOT, 'work_dirs', 'mutation'))
    p.add_argument(
        '--retest',
        action='store_true',
        help='run only the mutants that survived, had no test or '
        'were not run last time, e.g. after adding tests')
    p.add_argument('--max-children', type=int, default=os.cpu_count() or 2)
    p.add_argument(
        '--budget-scale',
        type=float,
        default=1.0,
        help='multiply every budget (a slower or faster machine)')
    args = p.parse_args(argv)
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        p.error(f'unknown group(s) {", ".join(unknown)}; the groups are '
                f'{", ".join(GROUPS)}')
    args.groups = args.groups or list(GROUPS)
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.table:
        update_doc()
        print(table(), end='')
        return 0
    if args.survivors:
        for name in args.groups:
            show_survivors(name, args.work_dir)
        return 0
    try:
        import mutmut  # noqa: F401
    except ImportError:
        sys.exit('mutmut is not installed in this interpreter: run '
                 '`make mutations` (installs requirements/mutation.txt)')
    for name in args.groups:
        group = GROUPS[name]
        group = dataclasses.replace(
            group, budget=int(group.budget * args.budget_scale))
        _, ran = read_results(name)
        seconds = run_group(name, group, args.work_dir, args.max_children,
                            args.retest)
        status = mutant_status(osp.join(args.work_dir, name), group)
        write_results(name, status, seconds + (ran or 0) * args.retest)
    update_doc()
    print(table(), end='')
    return 0


if __name__ == '__main__':
    sys.exit(main())
