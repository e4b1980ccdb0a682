"""Run the mutation check of issues 20 and 22: every mutation must be killed.

Issue 20 ("tests that can fail"): each fixed test must fail on a
deliberately broken implementation; done when no test passes on the
mutations listed. Issue 22: the device / AMP / compile tests must fail on a
device-unsafe change. The mutations are in ``tests/mutation/mutations.py``.

What this does:

1. copies the checkout (``git ls-files -co --exclude-standard``: tracked
   files plus untracked, non-ignored ones) into a temporary folder, once;
2. checks that a child process in that copy (``PYTHONPATH`` = the copy)
   imports ``mmsoft`` from the copy, and stops if not;
3. runs the tests of the selected mutations there, unmutated, as each
   mutation runs them: this baseline must pass, with nothing skipped;
4. per mutation: replaces ``old`` by ``new`` in the copy (``old`` must occur
   exactly once), runs
   ``python -m pytest -q -x -p no:cacheprovider <its tests>`` in the copy,
   restores the file. pytest's exit status 1 (a test failed) is
   ``killed``, 0 is ``SURVIVED``, anything else (e.g. 2, a collection
   error) is ``error``: not proven;
5. prints a markdown table (mutation, what, file, caught by, result,
   seconds) and writes it, and a CSV beside it, atomically to ``--out``
   (pytest's output of each run goes to ``<out folder>/logs``; the CSV
   also has the first error line of each killed mutation).

Exit status 1 when the baseline fails or a mutation is not killed.

    python tests/mutation/run_mutations.py                 # all
    python tests/mutation/run_mutations.py nr_soft_shift stem_strides
    python tests/mutation/run_mutations.py --list
    python tests/mutation/run_mutations.py --check         # apply only

The interpreter that runs pytest is ``--python`` (default: this one), e.g.
``.venv/bin/python``. Bytecode is not written in the copy
(``PYTHONDONTWRITEBYTECODE``), so a restored file is never run from a stale
cache of its mutated version.
"""
import argparse
import csv
import io
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

#: pytest's exit statuses: tests ran and some failed / all passed
FAILED, PASSED = 1, 0


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='apply each mutation of tests/mutation/mutations.py to '
        'a copy of the checkout and check that its tests fail')
    parser.add_argument(
        'names', nargs='*', help='mutations to run (default: all)')
    parser.add_argument(
        '--list', action='store_true', help='list the mutations and exit')
    parser.add_argument(
        '--check',
        action='store_true',
        help='only check that every mutation applies (old text found once)')
    parser.add_argument(
        '--python',
        default=sys.executable,
        help='interpreter that runs pytest (default: this one)')
    parser.add_argument(
        '--out',
        default=osp.join(ROOT, 'work_dirs', 'mutation', 'mutations.md'),
        help='markdown table (a .csv is written beside it)')
    parser.add_argument(
        '--timeout',
        type=float,
        default=1200,
        help='seconds per pytest run (default: 1200)')
    parser.add_argument(
        '--no-baseline',
        action='store_true',
        help='skip the unmutated run (only when it passed just before)')
    parser.add_argument(
        '--keep', action='store_true', help='keep the copy of the checkout')
    return parser.parse_args(argv)


def select(names):
    if not names:
        return list(MUTATIONS)
    known = by_name()
    unknown = [n for n in names if n not in known]
    if unknown:
        sys.exit(f'unknown mutation(s): {", ".join(unknown)} (see --list)')
    return [known[n] for n in names]


# ----------------------------------------------------------- the copy
def checkout_files():
    """Tracked files plus untracked files that git does not ignore."""
    out = subprocess.run(
        ['git', 'ls-files', '-co', '--exclude-standard', '-z'],
        cwd=ROOT,
        check=True,
        capture_output=True).stdout
    return sorted(p for p in out.decode().split('\0') if p)


def copy_checkout(dst):
    """Copy the checkout's files to ``dst``; returns how many."""
    n = 0
    for rel in checkout_files():
        src = osp.join(ROOT, rel)
        if not osp.lexists(src):  # deleted in the work tree
            continue
        target = osp.join(dst, rel)
        os.makedirs(osp.dirname(target), exist_ok=True)
        shutil.copy2(src, target, follow_symlinks=False)
        n += 1
    return n


def child_env(copy, python):
    """The copy's mmsoft first on the path; the launch scripts use
    ``python``; no bytecode written."""
    env = dict(os.environ)
    env.update(
        PYTHONPATH=copy,
        PYTHON=python,
        PYTHONDONTWRITEBYTECODE='1',
        MPLBACKEND='Agg')
    return env


def check_imports_copy(copy, python):
    """Fail loudly unless ``import mmsoft`` in the copy finds the copy."""
    code = 'import mmsoft; print(mmsoft.__file__)'
    proc = subprocess.run([python, '-c', code],
                          cwd=copy,
                          env=child_env(copy, python),
                          capture_output=True,
                          text=True)
    expected = osp.join(osp.realpath(copy), 'mmsoft', '__init__.py')
    got = proc.stdout.strip()
    if proc.returncode != 0 or osp.realpath(got) != expected:
        sys.exit(f'error: {python} does not import mmsoft from the copy\n'
                 f'  expected {expected}\n  got {got!r}\n{proc.stderr}')
    return got


def apply(copy, mutation):
    """Replace ``old`` by ``new`` in the copy; returns the original
    bytes. ``old`` must occur exactly once."""
    path = osp.join(copy, mutation.path)
    with open(path, 'rb') as f:
        original = f.read()
    text = original.decode('utf-8')
    n = text.count(mutation.old)
    if n != 1:
        raise ValueError(f'{mutation.name}: the old text occurs {n} times in '
                         f'{mutation.path} (must be once)')
    with open(path, 'wb') as f:
        f.write(text.replace(mutation.old, mutation.new).encode('utf-8'))
    return original


def restore(copy, mutation, original):
    with open(osp.join(copy, mutation.path), 'wb') as f:
        f.write(original)


# ------------------------------------------------------------- pytest
def run_pytest(copy, python, selectors, timeout, log, stop_first=True):
    """(exit status or None on timeout, output, seconds) of pytest on
    ``selectors`` in the copy; the output also goes to ``log``."""
    cmd = [python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider']
    cmd += (['-x'] if stop_first else []) + list(selectors)
    t0 = time.time()
    # a session of its own: a timeout ends the launch scripts' children too
    proc = subprocess.Popen(
        cmd,
        cwd=copy,
        env=child_env(copy, python),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    except BaseException:  # e.g. Ctrl-C, which its own session misses
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    secs = time.time() - t0
    os.makedirs(osp.dirname(log), exist_ok=True)
    with open(log, 'w') as f:
        f.write(' '.join(cmd) + '\n\n' + out)
    return rc, out, secs


def failed_tests(output):
    """The node ids pytest lists as FAILED / ERROR in its summary."""
    return re.findall(r'^(?:FAILED|ERROR) (\S+)', output, re.M)


def first_error(output):
    """The first ``E`` line of pytest's report (why the test failed)."""
    for ln in output.splitlines():
        if ln.startswith('E ') and ln[1:].strip():
            return ln[1:].strip()[:160]
    return ''


def summary_line(output):
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    return lines[-1].strip('= ') if lines else ''


def baseline(copy, python, mutations, timeout, logs):
    """The tests of the mutations, unmutated, as each mutation runs them
    (one pytest process per distinct set: tests can depend on what ran
    before them in a process). All must pass, none be skipped (a skipped
    test proves nothing). Returns (ok, seconds)."""
    sets = list(dict.fromkeys(m.tests for m in mutations))
    ok, total = True, 0.0
    for i, tests in enumerate(sets, 1):
        log = osp.join(logs, f'_baseline_{i}.log')
        rc, out, secs = run_pytest(copy, python, tests, timeout, log)
        total += secs
        last = summary_line(out)
        good = rc == PASSED and 'skipped' not in last
        ok = ok and good
        print(
            f'baseline [{i}/{len(sets)}] {"passed" if good else "FAILED"}: '
            f'{" ".join(short(t) for t in tests)} ({last}; {secs:.0f} s)'
            f'{"" if good else "; see " + log}',
            flush=True)
    print(
        f'baseline: {"passed" if ok else "FAILED"} ({total:.0f} s)',
        flush=True)
    return ok, total


def classify(rc):
    if rc == FAILED:
        return 'killed'
    if rc == PASSED:
        return 'SURVIVED'
    return 'error (timeout)' if rc is None else f'error (exit {rc})'


def short(node):
    """A selector without its folders: ``file.py::test[param]``."""
    return node.rsplit('/', 1)[-1]


# ------------------------------------------------------------- report
def markdown(rows, total, baseline_secs):
    lines = [
        '| mutation | what | file | caught by | result | s |',
        '|---|---|---|---|---|---|'
    ]
    for r in rows:
        what = r['what'].replace('|', '\\|')  # a cell, not a column
        lines.append(f"| {r['name']} | {what} | `{r['path']}` | "
                     f"{r['caught_by']} | {r['result']} | "
                     f"{r['seconds']:.0f} |")
    killed = sum(r['result'] == 'killed' for r in rows)
    base = ('' if baseline_secs is None else
            f'; baseline (unmutated) passed in {baseline_secs:.0f} s')
    lines.append('')
    lines.append(f'{killed} of {len(rows)} mutations killed; total '
                 f'{total:.0f} s{base}')
    return '\n'.join(lines) + '\n'


def write_report(out, rows, total, baseline_secs):
    from mmsoft.utils.atomic import atomic_write
    table = markdown(rows, total, baseline_secs)
    atomic_write(out, table, makedirs=True)
    buf = io.StringIO()
    fields = [
        'name', 'what', 'path', 'tests', 'caught_by', 'result', 'seconds',
        'error'
    ]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator='\n')
    writer.writeheader()
    for r in rows:
        writer.writerow({k: r[k] for k in fields})
    atomic_write(osp.splitext(out)[0] + '.csv', buf.getvalue(), makedirs=True)
    return table


# --------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    # pytest runs in the copy: a relative --python is relative to here (not
    # resolved further: a venv's python is a link that must stay one)
    if os.sep in args.python:
        args.python = osp.abspath(args.python)
    mutations = select(args.names)
    if args.list:
        for m in mutations:
            print(f'{m.name}: {m.what}\n    {m.path}\n    tests: '
                  f'{" ".join(m.tests)}')
        return 0
    t_start = time.time()
    copy = tempfile.mkdtemp(prefix='mmsoft_mutation_')
    try:
        n = copy_checkout(copy)
        if args.check:
            bad = 0
            for m in mutations:
                try:
                    restore(copy, m, apply(copy, m))
                except ValueError as e:
                    print(f'error: {e}')
                    bad += 1
            print(f'{len(mutations) - bad} of {len(mutations)} mutations '
                  f'apply ({n} files copied)')
            return 1 if bad else 0
        where = check_imports_copy(copy, args.python)
        print(
            f'copied {n} files to {copy}; {args.python} imports {where}',
            flush=True)
        logs = osp.join(osp.dirname(osp.abspath(args.out)), 'logs')
        baseline_secs = None
        if not args.no_baseline:
            ok, baseline_secs = baseline(copy, args.python, mutations,
                                         args.timeout, logs)
            if not ok:
                return 1
        rows = []
        for i, m in enumerate(mutations, 1):
            original = apply(copy, m)
            try:
                rc, out, secs = run_pytest(copy, args.python, m.tests,
                                           args.timeout,
                                           osp.join(logs, m.name + '.log'))
            finally:
                restore(copy, m, original)
            result = classify(rc)
            caught = failed_tests(out) if rc == FAILED else []
            rows.append(
                dict(
                    name=m.name,
                    what=m.what,
                    path=m.path,
                    tests=' '.join(m.tests),
                    caught_by=', '.join(short(c) for c in caught) or '-',
                    result=result,
                    seconds=round(secs, 1),
                    error=first_error(out) if caught else ''))
            print(
                f'[{i}/{len(mutations)}] {m.name}: {result} '
                f'({secs:.0f} s) {" ".join(short(c) for c in caught)}',
                flush=True)
        table = write_report(args.out, rows,
                             time.time() - t_start, baseline_secs)
        print('\n' + table)
        print(f'written: {args.out} (+ .csv); pytest output: {logs}')
        return 0 if all(r['result'] == 'killed' for r in rows) else 1
    finally:
        if args.keep:
            print(f'copy kept: {copy}')
        else:
            shutil.rmtree(copy, ignore_errors=True)


if __name__ == '__main__':
    sys.exit(main())
