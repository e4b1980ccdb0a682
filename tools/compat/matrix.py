"""Write the support matrix table from the results of ``make compat``.

    python tools/compat/matrix.py [--results DIR] [--out-dir DIR]

Reads ``<results>/<stack>.json`` (written by noxfile.py) for each stack of
tools/compat/stacks.py and writes ``matrix.md`` and ``matrix.csv`` into
``docs/en/compat/`` atomically (mmsoft.utils.atomic). A stack without a
result keeps its row of the table already in ``--out-dir`` (its last run,
with its date; said on stderr), else it is listed as "not run": a partial
or interrupted ``make compat`` never erases a recorded result. Standard
library only (the nox venv runs it). Exits 1 when a stack has failures or
no result.
"""
import argparse
import csv
import importlib.util
import io
import json
import os
import os.path as osp
import sys

HERE = osp.dirname(osp.abspath(__file__))
ROOT = osp.dirname(osp.dirname(HERE))


def _load(path, name):
    """The module at ``path`` (mmsoft is not imported: no torch)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


STACKS = _load(osp.join(HERE, 'stacks.py'), '_mmsoft_compat_stacks').STACKS

# the results right after the stack: a narrow page shows them first
COLUMNS = ('stack', 'passed', 'skipped', 'failed', 'torch', 'mmengine', 'mmcv',
           'mmdet', 'mmseg', 'mmpretrain', 'python', 'time', 'date')


def _atomic():
    """mmsoft/utils/atomic.py without importing mmsoft (and torch)."""
    return _load(
        osp.join(ROOT, 'mmsoft', 'utils', 'atomic.py'), '_mmsoft_atomic')


def default_results():
    cache = os.environ.get('MMSOFT_CACHE') or osp.join(
        os.environ.get('XDG_CACHE_HOME') or osp.expanduser('~/.cache'),
        'mmsoft')
    return osp.join(cache, 'compat', 'results')


def _minutes(seconds):
    return f'{seconds / 60:.1f} min'


def _previous(out_dir):
    """The rows of the table already in ``out_dir`` (stack -> row)."""
    path = osp.join(out_dir or '', 'matrix.csv')
    if not out_dir or not osp.isfile(path):
        return {}
    with open(path, newline='') as f:
        return {r['stack']: r for r in csv.DictReader(f)}


def rows(results, out_dir=None):
    out, previous = [], _previous(out_dir)
    for name, stack in STACKS.items():
        path = osp.join(results, f'{name}.json')
        old = previous.get(name, {})
        if not osp.exists(path) and old.get('passed', 'not run') != 'not run':
            print(
                f'{name}: no result in {results}; keeping its row of '
                f'{old.get("date") or "an earlier run"}',
                file=sys.stderr)
            out.append(dict({k: old.get(k, '') for k in COLUMNS}))
            continue
        if not osp.exists(path):
            out.append(
                dict({k: stack.get(k, '')
                      for k in COLUMNS},
                     stack=name,
                     passed='not run',
                     skipped='',
                     failed='',
                     time='',
                     date=''))
            continue
        with open(path) as f:
            r = json.load(f)
        out.append(
            dict({k: r.get(k, '')
                  for k in COLUMNS},
                 time=_minutes(r['seconds'])))
    return out


def render(table):
    md = io.StringIO()
    md.write('# Support matrix\n\n'
             'The test suite (`pytest tests -rs`, CPU) on each stack mmsoft '
             'claims, as run by `make compat` (noxfile.py; each stack in its '
             'own virtualenv under `~/.cache/mmsoft/compat/venvs`, mmcv built '
             'with its C++ ops). Written by `tools/compat/matrix.py`; do not '
             'edit by hand.\n\n')
    md.write('| ' + ' | '.join(COLUMNS) + ' |\n')
    md.write('|' + '---|' * len(COLUMNS) + '\n')
    for r in table:
        md.write('| ' + ' | '.join(str(r[c]) for c in COLUMNS) + ' |\n')
    csv_out = io.StringIO()
    w = csv.writer(csv_out, lineterminator='\n')
    w.writerow(COLUMNS)
    for r in table:
        w.writerow([r[c] for c in COLUMNS])
    return md.getvalue(), csv_out.getvalue()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument('--results', default=default_results())
    p.add_argument('--out-dir', default=osp.join(ROOT, 'docs', 'en', 'compat'))
    args = p.parse_args(argv)
    table = rows(args.results, args.out_dir)
    md, csv_text = render(table)
    os.makedirs(args.out_dir, exist_ok=True)
    atomic = _atomic()
    atomic.atomic_write(osp.join(args.out_dir, 'matrix.md'), md)
    atomic.atomic_write(osp.join(args.out_dir, 'matrix.csv'), csv_text)
    print(md)
    bad = [
        r['stack'] for r in table
        if r['passed'] == 'not run' or r['failed'] not in (0, '0')
    ]
    if bad:
        print(
            f'make compat: failures or no result on {", ".join(bad)}',
            file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main())
