"""The hand-written mutations (``tests/mutation/mutations.py``): each is
applied alone to a copy of the checkout (tracked and untracked non-ignored
files; no bytecode written there) and its tests run with ``pytest -x``:
exit 1 is ``killed``, 0 ``SURVIVED``, anything else (a collection error, a
timeout) ``error``. First the tests run unmutated, as each mutation runs
them: this baseline must pass with nothing skipped. A markdown table goes to
``--out`` (pytest's output to ``logs/`` beside it); exit 1 unless every
mutation is killed.

    python tests/mutation/run_mutations.py [NAME ...] [--list]

(that each applies: tests/test_mutation_catalogue.py)
"""
import argparse
import os
import os.path as osp
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))
sys.path.insert(0, HERE)
from mutations import MUTATIONS, by_name  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('names', nargs='*', help='mutations (default: all)')
    p.add_argument('--list', action='store_true', help='list them, exit')
    p.add_argument('--python', default=sys.executable, help='runs pytest')
    p.add_argument(
        '--out',
        default=osp.join(ROOT, 'work_dirs', 'mutation', 'mutations.md'))
    p.add_argument('--timeout', type=float, default=1200, help='per run (s)')
    p.add_argument(
        '--no-baseline', action='store_true', help='skip the unmutated run')
    return p.parse_args(argv)


def checkout_files():
    """Tracked files plus untracked files that git does not ignore."""
    out = subprocess.run(
        ['git', 'ls-files', '-co', '--exclude-standard', '-z'],
        cwd=ROOT,
        check=True,
        capture_output=True).stdout
    return sorted(p for p in out.decode().split('\0') if p)


def child_env(copy, python):
    return dict(
        os.environ,
        PYTHONPATH=copy,
        PYTHON=python,
        PYTHONDONTWRITEBYTECODE='1',
        MPLBACKEND='Agg')


def apply(copy, m):
    """Replace ``m.old`` (exactly once) by ``m.new``: the original bytes."""
    path = osp.join(copy, m.path)
    with open(path, 'rb') as f:
        original = f.read()
    n = original.decode().count(m.old)
    if n != 1:
        raise ValueError(f'{m.name}: the old text occurs {n} times in '
                         f'{m.path} (must be once)')
    with open(path, 'wb') as f:
        f.write(original.decode().replace(m.old, m.new).encode())
    return original


def run_pytest(copy, python, tests, timeout, log):
    """(exit status, None on a timeout; output; seconds); output -> log."""
    cmd = [python, '-m', 'pytest', '-q', '-x', '-p', 'no:cacheprovider']
    t0 = time.time()
    # a session of its own: a timeout ends the launch scripts' children too
    proc = subprocess.Popen(
        cmd + list(tests),
        cwd=copy,
        env=child_env(copy, python),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True)
    try:
        out, rc = proc.communicate(timeout=timeout)[0], proc.returncode
    except BaseException as e:  # a timeout, Ctrl-C
        os.killpg(proc.pid, signal.SIGKILL)
        out, rc = proc.communicate()[0], None
        if not isinstance(e, subprocess.TimeoutExpired):
            raise
    os.makedirs(osp.dirname(log), exist_ok=True)
    with open(log, 'w') as f:
        f.write(' '.join(cmd + list(tests)) + '\n\n' + out)
    return rc, out, time.time() - t0


def baseline(copy, python, mutations, timeout, logs):
    """Each distinct set of tests, unmutated: passed, nothing skipped."""
    ok = True
    for i, tests in enumerate(dict.fromkeys(m.tests for m in mutations)):
        log = osp.join(logs, f'_baseline_{i}.log')
        rc, out, secs = run_pytest(copy, python, tests, timeout, log)
        last = (out.strip().splitlines() or [''])[-1].strip('= ')
        good = rc == 0 and 'skipped' not in last
        ok &= good
        print(
            f'baseline {"passed" if good else "FAILED (" + log + ")"}: '
            f'{" ".join(tests)} ({last}; {secs:.0f} s)',
            flush=True)
    return ok


def main(argv=None):
    args = parse_args(argv)
    if os.sep in args.python:  # relative to here, a venv's link kept
        args.python = osp.abspath(args.python)
    known = by_name()
    unknown = [n for n in args.names if n not in known]
    if unknown:
        sys.exit(f'unknown mutation(s): {", ".join(unknown)} (see --list)')
    mutations = [known[n] for n in args.names] or list(MUTATIONS)
    if args.list:
        for m in mutations:
            print(f'{m.name}: {m.what}\n    {m.path}\n    tests: '
                  f'{" ".join(m.tests)}')
        return 0
    copy = tempfile.mkdtemp(prefix='mmsoft_mutation_')
    try:
        for rel in checkout_files():
            if osp.lexists(osp.join(ROOT, rel)):  # not deleted in the tree
                os.makedirs(osp.dirname(osp.join(copy, rel)), exist_ok=True)
                shutil.copy2(
                    osp.join(ROOT, rel),
                    osp.join(copy, rel),
                    follow_symlinks=False)
        where = subprocess.run(
            [args.python, '-c', 'import mmsoft; print(mmsoft.__file__)'],
            cwd=copy,
            env=child_env(copy, args.python),
            capture_output=True,
            text=True).stdout.strip()
        if osp.realpath(where) != osp.join(
                osp.realpath(copy), 'mmsoft', '__init__.py'):
            sys.exit(f'error: {args.python} imports {where!r}, not the copy')
        logs = osp.join(osp.dirname(osp.abspath(args.out)), 'logs')
        if not args.no_baseline and not baseline(copy, args.python, mutations,
                                                 args.timeout, logs):
            return 1
        rows = ['| mutation | what | file | caught by | result | s |',
                '|---|---|---|---|---|---|']  # yapf: disable
        killed = 0
        for i, m in enumerate(mutations, 1):
            original = apply(copy, m)
            try:
                rc, out, secs = run_pytest(copy, args.python, m.tests,
                                           args.timeout,
                                           osp.join(logs, m.name + '.log'))
            finally:
                with open(osp.join(copy, m.path), 'wb') as f:
                    f.write(original)
            result = {
                1: 'killed',
                0: 'SURVIVED',
                None: 'error (timeout)'
            }.get(rc, f'error (exit {rc})')
            killed += result == 'killed'
            caught = [
                c.rsplit('/', 1)[-1]
                for c in re.findall(r'^(?:FAILED|ERROR) (\S+)', out, re.M)
            ] if rc == 1 else []
            what = m.what.replace('|', '\\|')
            rows.append(f'| {m.name} | {what} | `{m.path}` | '
                        f'{", ".join(caught) or "-"} | {result} | '
                        f'{secs:.0f} |')
            print(
                f'[{i}/{len(mutations)}] {m.name}: {result} ({secs:.0f} s)'
                f' {" ".join(caught)}',
                flush=True)
        rows.append(f'\n{killed} of {len(mutations)} mutations killed')
        os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)
        with open(args.out, 'w') as f:
            f.write('\n'.join(rows) + '\n')
        print('\n'.join(rows) + f'\nwritten: {args.out}; pytest output: '
              f'{logs}')
        return int(killed < len(mutations))
    finally:
        shutil.rmtree(copy, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
