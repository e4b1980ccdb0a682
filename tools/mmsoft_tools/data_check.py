"""The data a config needs is there and loads (docs/en/user_guides/
data_preparation.md); ``MMSOFT_SKIP_DATA_CHECK=1`` skips the check."""
import contextlib
import io
import os
import os.path as osp
import random
import re
import sys
import warnings

#: decode all up to DECODE_ALL images, else SAMPLE_FILES; check SAMPLE_STAT
DECODE_ALL, SAMPLE_FILES, SAMPLE_SEED, SAMPLE_STAT = 2000, 500, 0, 200000

#: mode -> [(dataloader, evaluator, what it is for)]
_MODES = {
    'train': [('train_dataloader', None, 'training'),
              ('val_dataloader', 'val_evaluator', 'validation')],
    'val': [('val_dataloader', 'val_evaluator', 'validation')],
    'test': [('test_dataloader', 'test_evaluator', 'testing')],
}


def _loaders(cfg, mode):
    if mode not in _MODES:
        raise ValueError(f'mode must be one of {sorted(_MODES)}, got '
                         f'{mode!r}')
    return [(loader, ev, purpose) for loader, ev, purpose in _MODES[mode]
            if cfg.get(loader)
            and not (loader == 'val_dataloader' and mode == 'train' and
                     (cfg.get('val_cfg') is None or cfg.get(ev) is None))]


def _leaves(ds, key):
    """(key, config) of the datasets under wrappers."""
    if ds.get('dataset') is not None:
        return _leaves(ds['dataset'], key + '.dataset')
    if isinstance(ds.get('datasets'), (list, tuple)):
        return [
            leaf for i, sub in enumerate(ds['datasets'])
            for leaf in _leaves(sub, f'{key}.datasets.{i}')
        ]
    return [(key, ds)]


def _remote(ds):
    """A dataset config that reads remote storage (not checked)."""
    backend = (ds.get('backend_args') or {}).get('backend')
    return '://' in str(ds.get('data_root', '')) or \
        backend not in (None, 'local')


def built_datasets(cfg, mode):
    """``[(key, purpose, dataset)]`` ``mode`` reads, built lazily."""
    from mmengine.registry import DATASETS, DefaultScope
    out = []
    # the Runner's own build shows the datasets' warnings, once
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')), \
            warnings.catch_warnings():
        warnings.simplefilter('ignore')
        for loader, _, purpose in _loaders(cfg, mode):
            for key, ds in _leaves(cfg[loader]['dataset'],
                                   f'{loader}.dataset'):
                if not _remote(ds):
                    out.append((key, purpose,
                                DATASETS.build(dict(ds, lazy_init=True))))
    return out


def _paths(ds):
    """[(path, attribute)]: data_root, ann_file, data_prefix of a dataset."""
    root = ds.data_root or ''
    return [(p, attr)
            for p, attr in [(root, 'data_root'), (ds.ann_file, 'ann_file')] +
            [(p, f'data_prefix.{name}') for name, p in ds.data_prefix.items()]
            if isinstance(p, str) and p and (
                attr == 'data_root' or p.rstrip('/') != root.rstrip('/'))]


def _evaluator_files(cfg, mode):
    """[(path, config key, purpose)] of the evaluators' ``ann_file``."""
    out = []
    for _, ev, purpose in _loaders(cfg, mode):
        evs = cfg.get(ev) if ev else None
        items = [(ev, evs)] if isinstance(evs, dict) else \
            [(f'{ev}.{i}', e) for i, e in enumerate(evs or [])]
        out += [(e['ann_file'], f'{k}.ann_file', purpose) for k, e in items
                if isinstance(e, dict) and e.get('ann_file')
                and '://' not in e['ann_file']]
    return out


def missing_data_message(cfg, mode):
    """The first missing path of ``mode``, with the fix, or None."""
    local = built_datasets(cfg, mode)
    evaluated = _evaluator_files(cfg, mode)
    needs = [(p, f'{k}.{attr}', purpose) for k, purpose, ds in local
             for p, attr in _paths(ds)] + evaluated
    missing = [n for n in needs if not osp.exists(n[0])]
    if not missing:
        return None
    path, key, purpose = missing[0]
    where = '' if osp.isabs(path) else \
        f' (relative to the current directory {os.getcwd()})'
    lines = [f'mmsoft: data for {purpose} not found: {path}{where} [{key}]']
    roots = {}  # data_root -> what it holds, in the config's order
    for _, _, ds in (d for d in local if d[2].data_root):
        items = roots.setdefault(ds.data_root, {})
        for p, _ in _paths(ds)[1:]:
            items[osp.relpath(p, ds.data_root) +
                  ('/' if osp.isdir(p) or not osp.splitext(p)[1] else '')] = 1
    if roots:
        lines.append(f'  expected {type(local[0][2]).__name__} layout: ' +
                     '; '.join(f'{r.rstrip("/")}/{{{", ".join(items)}}}'
                               for r, items in roots.items()))
        targets = [r.rstrip('/') for r in roots]
        lines.append('  link your copy there: ' + ' ; '.join(
            (f'mkdir -p {osp.dirname(t)} && ' if osp.dirname(t) else '') +
            f'ln -s /path/to/{osp.basename(t)} {t}' for t in targets))
        new = {
            r: '/path/to/' + osp.basename(t)
            for r, t in zip(roots, targets)
        }
        overrides = [
            f'{k}.data_root={new[ds.data_root]}' +
            ('/' if ds.data_root.endswith('/') else '')
            for k, _, ds in local if ds.data_root
        ] + [
            f'{k}={new[r]}/{p[len(r):].lstrip("/")}' for p, k, _ in evaluated
            for r in roots if p.startswith(r)
        ]
        lines.append('  or point the config at it: --cfg-options ' +
                     ' '.join(dict.fromkeys(overrides)))
    lines.append('  (see docs/en/user_guides/data_preparation.md)')
    return '\n'.join(lines)


def _jpeg_ends(path):
    """Whether the JPEG's segments end in its end-of-image marker."""
    with open(path, 'rb') as f:
        data = f.read()
    i, n = 2, len(data)
    while i + 1 < n:
        if data[i] != 0xFF:
            return False
        marker = data[i + 1]
        if marker == 0xD9:
            return True
        if marker == 0xFF or 0xD0 <= marker <= 0xD7 or marker == 0x01:
            i += 1 if marker == 0xFF else 2
            continue
        if i + 4 > n:
            return False
        i += 2 + int.from_bytes(data[i + 2:i + 4], 'big')
        if marker == 0xDA:  # a scan: its data runs to the next marker
            m = re.compile(rb'\xff(?![\x00\xd0-\xd7])').search(data, i)
            if m is None:
                return False
            i = m.start()
    return False


def _png_ends(path):
    """Whether the PNG ``path`` reaches its IEND chunk, chunk by chunk."""
    with open(path, 'rb') as f:
        data = f.read()
    i = 8
    while i + 8 <= len(data):
        if data[i + 4:i + 8] == b'IEND':
            return True
        i += 12 + int.from_bytes(data[i:i + 4], 'big')
    return False


def image_damage(path, decode=False):
    """Why an image file cannot be used (empty, truncated...), or None."""
    try:
        size = osp.getsize(path)
        with open(path, 'rb') as f:
            head = f.read(8)
            f.seek(max(0, size - 4096))
            tail = f.read().rstrip(b'\0\r\n ')
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if size == 0:
        return 'the file is empty (0 bytes)'
    # the end marker near the end (cheap), else walk the file's structure:
    # bytes after the end marker (a camera's trailer) are allowed
    if head[:2] == b'\xff\xd8' and b'\xff\xd9' not in tail[-2048:] \
            and not _jpeg_ends(path):
        return f'truncated JPEG ({size} bytes, no end-of-image marker)'
    if head == b'\x89PNG\r\n\x1a\n' and b'IEND' not in tail[-64:] \
            and not _png_ends(path):
        return f'truncated PNG ({size} bytes, no IEND chunk)'
    if decode:
        import cv2
        import numpy as np
        with open(path, 'rb') as f:
            buf = np.frombuffer(f.read(), np.uint8)
        if cv2.imdecode(buf, cv2.IMREAD_UNCHANGED) is None:
            return f'not a decodable image ({size} bytes)'
    return None


def decode_sample(files):
    """All files up to :data:`DECODE_ALL`, else a seeded sample."""
    if len(files) <= DECODE_ALL:
        return list(files)
    pick = set(
        random.Random(SAMPLE_SEED).sample(range(len(files)), SAMPLE_FILES))
    return [f for i, f in enumerate(files) if i in pick]


def _no_samples(ann_file) -> str:
    """The problem of a data set without samples."""
    if str(ann_file).endswith('.txt'):
        return ('has no samples (an empty list); write one line per sample '
                '("<image file> <class index>") or point ann_file at the '
                'full list')
    return ('has no samples; check ann_file (and the data set\'s filter_cfg'
            ', which drops images without annotations)')


def _blank(path) -> bool:
    """Whether the local text file ``path`` holds nothing but blanks."""
    try:
        with open(path, 'rb') as f:
            return not f.read(1 << 20).strip()
    except (OSError, TypeError):
        return False


def _num_classes(cfg):
    """(classes, config key) of the model's classification head."""
    model = cfg.get('model', None) or {}
    for key in ('head', 'data_preprocessor'):
        node = model.get(key, None) if hasattr(model, 'get') else None
        n = node.get('num_classes', None) if hasattr(node, 'get') else None
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n, f'model.{key}.num_classes'
    return None, None


def _label_problem(cfg, infos):
    """A class index out of the model's range, or None."""
    import numpy as np
    n, where = _num_classes(cfg)
    labels = [(np.asarray(i['gt_label']).reshape(-1), i.get('img_path', '?'))
              for i in infos if n and i.get('gt_label', None) is not None]
    bad = [(int(a.max()), img) for a, img in labels
           if a.size and np.issubdtype(a.dtype, np.integer) and a.max() >= n]
    if not bad:
        return None
    label, img = bad[0]
    more = f' (and {len(bad) - 1} more samples)' if len(bad) > 1 else ''
    return (f'class index {label} of {img}{more} is out of range: the model '
            f'has {n} classes (0 .. {n - 1}, {where}); fix the list or '
            f'raise {where}')


def damaged_data_message(cfg, mode):
    """One line per problem (at most 5) of the loaded datasets."""
    problems = []
    for key, purpose, ds in built_datasets(cfg, mode):
        what = ds.ann_file or ', '.join(map(str, ds.data_prefix.values()))
        try:  # pycocotools prints its progress: not the user's business
            with contextlib.redirect_stdout(io.StringIO()):
                ds.full_init()
        except Exception as e:  # noqa: BLE001 (any reason it cannot load)
            problems.append(f'{what} [{key}]: ' +
                            (_no_samples(ds.ann_file) if _blank(ds.ann_file)
                             else f'cannot be loaded: {type(e).__name__}'
                             f': {" ".join(str(e).split())}'))
            continue
        if len(ds) == 0:
            problems.append(f'{what} [{key}]: {_no_samples(ds.ann_file)}')
            continue
        infos = [ds.get_data_info(i) for i in range(len(ds))]
        wrong = _label_problem(cfg, infos)
        if wrong:
            problems.append(f'{what} [{key}]: {wrong}')
        files = [
            v for info in infos for k, v in info.items()
            if k.endswith('_path') and isinstance(v, str)
        ]
        if len(files) > SAMPLE_STAT:
            step = len(files) / SAMPLE_STAT
            files = [files[int(i * step)] for i in range(SAMPLE_STAT)]
        deep = set(decode_sample(files))
        for f in files:
            why = image_damage(f, decode=f in deep)
            if why:
                problems.append(f'{f} (for {purpose}, {key}): {why}')
            if len(problems) >= 5:
                break
        if len(problems) >= 5:
            break
    if not problems:
        return None
    return ('mmsoft: damaged data (fix or remove these files, or set '
            'MMSOFT_SKIP_DATA_CHECK=1):\n  ' + '\n  '.join(problems))


def launcher_rank(launcher: str) -> int:
    """This process's rank from the launcher's environment variable."""
    env = dict(
        pytorch='RANK', slurm='SLURM_PROCID',
        mpi='OMPI_COMM_WORLD_RANK').get(launcher, '')
    try:
        return int(os.environ.get(env, 0))
    except ValueError:
        return 0


def exit_if_missing(cfg, mode, launcher='none'):
    """Exit 1 (rank 0 prints why) when data is missing or damaged."""
    if os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', '0'):
        return
    msg = missing_data_message(cfg, mode) or damaged_data_message(cfg, mode)
    if msg is None:
        return
    if launcher_rank(launcher) == 0:
        print(msg, file=sys.stderr, flush=True)
    raise SystemExit(1)


def pretrained_message(cfg, resume=None):
    """Why the ``Pretrained`` init_cfg files cannot be read, or None."""
    if resume is not None or cfg.get('load_from', None):
        return None
    cli = _cli()
    msg = cli.missing_pretrained(cfg)
    if msg:
        return msg
    try:  # a folder, damaged, offline
        cli.check_init_checkpoints(cfg)
    except cli.ToolError as e:
        return str(e)
    return None


def _cli():
    """The tools' ``cli`` (also when run as a script)."""
    try:
        from mmsoft_tools import cli
    except ImportError:
        import cli
    return cli


def main(argv=None):
    """``data_check.py {train,val,test} CONFIG [--cfg-options ...]``."""
    import argparse
    cli = _cli()  # a syntax error, a mistyped key: one line
    parser = argparse.ArgumentParser(
        description='check that the data a config needs exists',
        add_help=False)  # the tools' own --help goes through
    parser.add_argument('mode', choices=sorted(_MODES))
    parser.add_argument('config')
    parser.add_argument(
        '--cfg-options', nargs='+', action=cli.cfg_options_action())
    parser.add_argument('--resume', nargs='?', const='auto')
    try:
        args, _ = parser.parse_known_args(argv)
        if not osp.isfile(args.config):
            print(
                f'mmsoft: config file not found: {args.config}',
                file=sys.stderr)
            return 1
        cfg = cli.load_config(args.config)
        cli.merge_cfg_options(cfg, args.cfg_options)
    except cli.ToolError as e:
        print(f'error: {e}', file=sys.stderr, flush=True)
        return 1
    msg = missing_data_message(cfg, args.mode) or \
        damaged_data_message(cfg, args.mode)
    if msg is None and args.mode == 'train':  # the ImageNet weights, once
        msg = pretrained_message(cfg, args.resume)
        msg = msg and f'error: {msg}'
    if msg is None:
        return 0
    print(msg, file=sys.stderr, flush=True)
    return 1


if __name__ == '__main__':
    sys.exit(main())
