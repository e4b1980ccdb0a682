"""Check that the data a config needs is on disk, before a run starts.

``tools/train.py`` (train + val data) and ``tools/test.py`` (test data) call
:func:`exit_if_missing` before the Runner is built, and
``tools/dist_train.sh`` / ``tools/dist_test.sh`` run the same check once
(``python tools/mmsoft_tools/data_check.py {train,test} CONFIG [args]``)
before starting the worker processes. A missing data set then gives one
short message on stderr - the missing path, the layout the config expects
and how to point the config elsewhere - and exit code 1, instead of a
``FileNotFoundError`` buried in the logs of every rank.

For every dataset of the relevant dataloaders (wrappers such as
``RepeatDataset`` / ``ClassBalancedDataset`` (``dataset``) and
``ConcatDataset`` (``datasets``) are looked through) the check needs, as
the datasets themselves resolve them (``BaseDataset``: relative
``ann_file`` / ``data_prefix`` entries are joined to ``data_root``):

* ``data_root`` (a directory), when set;
* ``ann_file`` (mmdet COCO json, mmpretrain file list, ...), when set;
* every ``data_prefix`` entry (image / label directories); mmpretrain's
  ``ImageNet`` with ``split='train'`` reads ``<data_root>/train``;
* the ``ann_file`` of the matching evaluator (mmdet's ``CocoMetric`` reads
  the val annotations itself).

Then the files themselves (:func:`damaged_data_message`): every
annotation json must parse (a truncated or invalid one is named with the
line, column and character position of the error), every line of an
ImageNet-style list must be ``<image file> <class index>`` (an empty or
malformed line is named with the file and line number), the images the
annotations list (COCO ``file_name`` entries, mmpretrain lists; for
datasets without a list, the image folders) must exist and not be empty
(0 bytes), and they must decode: every one of a data set of up to
:data:`DECODE_ALL` (2,000) images, else a seeded random sample of
:data:`SAMPLE_FILES` (500) of them (:func:`decode_sample`); each problem is
named with the file and the config key.

Remote storage (a ``backend_args`` backend other than ``local``, or a path
with a ``scheme://``) is not checked. Only the standard library is imported
here (the command line entry also imports mmengine's ``Config``).
"""
import os
import os.path as osp
import sys

__all__ = [
    'required_paths', 'missing_data_message', 'damaged_data_message',
    'image_damage', 'json_problem', 'list_problem', 'decode_sample',
    'exit_if_missing', 'launcher_rank', 'main'
]

#: dataset type -> (name, placeholder directory, layout note)
KNOWN_LAYOUTS = {
    'CocoDataset': ('COCO 2017', 'coco', ''),
    'ADE20KDataset':
    ('ADE20K (ADEChallengeData2016)', 'ADEChallengeData2016', ''),
    'ImageNet': ('ImageNet', 'imagenet',
                 'train/ and val/ hold one folder per class, or list the '
                 'images in meta/{train,val}.txt'),
}

_MODES = {
    # mode -> [(dataloader key, evaluator key, what it is for)]
    'train': [('train_dataloader', None, 'training'),
              ('val_dataloader', 'val_evaluator', 'validation')],
    'val': [('val_dataloader', 'val_evaluator', 'validation')],
    'test': [('test_dataloader', 'test_evaluator', 'testing')],
}


def _get(node, key, default=None):
    try:
        return node.get(key, default)
    except AttributeError:
        return default


def _is_remote(path, backend_args):
    if '://' in str(path):
        return True
    backend = _get(backend_args, 'backend')
    return backend not in (None, 'local')


def _type_name(ds):
    return str(_get(ds, 'type', '')).split('.')[-1]


def _leaf_datasets(ds, key):
    """(key, dataset cfg) of the datasets that read files, looking through
    dataset wrappers."""
    if not hasattr(ds, 'get'):
        return []
    if _get(ds, 'dataset') is not None:  # RepeatDataset, ClassBalanced, ...
        return _leaf_datasets(ds['dataset'], key + '.dataset')
    if isinstance(_get(ds, 'datasets'), (list, tuple)):  # ConcatDataset
        out = []
        for i, sub in enumerate(ds['datasets']):
            out += _leaf_datasets(sub, f'{key}.datasets.{i}')
        return out
    return [(key, ds)]


def _join(root, path):
    if not root or osp.isabs(path):
        return path
    return osp.join(root, path)


def _ann_file(ds):
    """The annotation file a dataset reads: its ``ann_file``, or for
    mmpretrain's ``ImageNet`` with a ``split`` and none given,
    ``meta/<split>.txt`` when that file exists (as the dataset does)."""
    ann = _get(ds, 'ann_file') or ''
    if not ann and _get(ds, 'split') and \
            _type_name(ds).startswith('ImageNet'):
        meta = osp.join('meta', f'{ds["split"]}.txt')
        if osp.isfile(_join(_get(ds, 'data_root') or '', meta)):
            return meta
    return ann


def _dataset_needs(key, ds):
    """[(path, config key)] a dataset needs; the data_root comes first."""
    if _is_remote(_get(ds, 'data_root', ''), _get(ds, 'backend_args')):
        return []
    root = _get(ds, 'data_root') or ''
    needs = []
    if root:
        needs.append((root, key + '.data_root'))
    ann = _ann_file(ds)
    if isinstance(ann, str) and ann:
        needs.append((_join(root, ann), key + '.ann_file'))
    prefix = _get(ds, 'data_prefix')
    if not prefix and _get(ds, 'split') and \
            _type_name(ds).startswith('ImageNet'):
        prefix = ds['split']  # mmpretrain ImageNet: data_prefix = split
    if isinstance(prefix, str):
        prefix = {'img_path': prefix} if prefix else {}
    if hasattr(prefix, 'items'):
        for name, sub in prefix.items():
            if isinstance(sub, str) and sub and '://' not in sub:
                needs.append((_join(root, sub), f'{key}.data_prefix.{name}'))
    return needs


def _evaluator_needs(cfg, key):
    ev = _get(cfg, key)
    items = [(key, ev)] if hasattr(ev, 'get') else \
        [(f'{key}.{i}', e) for i, e in enumerate(ev or [])
         if hasattr(e, 'get')]
    needs = []
    for k, e in items:
        ann = _get(e, 'ann_file')
        if isinstance(ann, str) and ann and \
                not _is_remote(ann, _get(e, 'backend_args')):
            needs.append((ann, k + '.ann_file'))
    return needs


def _loaders(cfg, mode):
    if mode not in _MODES:
        raise ValueError(f'mode must be one of {sorted(_MODES)}, got '
                         f'{mode!r}')
    out = []
    for loader, evaluator, purpose in _MODES[mode]:
        if not _get(cfg, loader):
            continue
        if loader == 'val_dataloader' and mode == 'train' and (_get(
                cfg, 'val_cfg') is None or _get(cfg, 'val_evaluator') is None):
            continue  # the Runner builds no validation loop
        out.append((loader, evaluator, purpose))
    return out


def required_paths(cfg, mode):
    """The paths ``mode`` ('train' = train + val, 'val' or 'test') of a
    config reads, as ``[(path, config key, purpose, dataset cfg)]``;
    ``dataset cfg`` is None for an evaluator's ``ann_file``."""
    out = []
    for loader, evaluator, purpose in _loaders(cfg, mode):
        ds_cfg = _get(cfg[loader], 'dataset')
        for key, ds in _leaf_datasets(ds_cfg, loader + '.dataset'):
            out += [(p, k, purpose, ds) for p, k in _dataset_needs(key, ds)]
        if evaluator:
            out += [(p, k, purpose, None)
                    for p, k in _evaluator_needs(cfg, evaluator)]
    return out


def _rel(path, root):
    rel = osp.relpath(path, root) if root else path
    return rel + ('/' if osp.isdir(path) or not osp.splitext(path)[1] else '')


def _layout(needs):
    """'<data_root>/{a, b/}' for each data_root the config reads."""
    groups = {}
    for path, key, _, ds in needs:
        if ds is None or key.endswith('.data_root'):
            continue
        root = _get(ds, 'data_root') or ''
        rel = _rel(path, root.rstrip('/'))
        items = groups.setdefault(root.rstrip('/'), [])
        if rel not in items:
            items.append(rel)
    parts = []
    for root, items in groups.items():
        if root:
            parts.append(f'{root}/{{{", ".join(items)}}}')
        else:
            parts += items
    return '; '.join(parts)


def missing_data_message(cfg, mode):
    """None when every path ``mode`` needs exists, else a short message:
    the first missing path, the expected layout and the overrides."""
    needs = required_paths(cfg, mode)
    missing = [n for n in needs if not osp.exists(n[0])]
    if not missing:
        return None
    path, key, purpose, _ = missing[0]
    where = '' if osp.isabs(path) else \
        f' (relative to the current directory {os.getcwd()})'
    lines = [
        f'mmsoft: data for {purpose} not found: {path}{where} '
        f'[{key}]'
    ]

    # the datasets whose data_root the user should set
    leaves = []
    for loader, _, _ in _loaders(cfg, mode):
        leaves += _leaf_datasets(
            _get(cfg[loader], 'dataset'), loader + '.dataset')
    known = [
        KNOWN_LAYOUTS[_type_name(ds)] for _, ds in leaves
        if _type_name(ds) in KNOWN_LAYOUTS
    ]
    name, placeholder, note = known[0] if known else \
        ('this config\'s', 'your_data', '')
    layout = _layout(needs)
    if layout:
        lines.append(f'  expected {name} layout: {layout}' +
                     (f' ({note})' if note else ''))

    overrides, links = [], []
    roots = []
    for key, ds in leaves:
        root = _get(ds, 'data_root') or ''
        if not root or _is_remote(root, _get(ds, 'backend_args')):
            continue
        new = f'/path/to/{osp.basename(root.rstrip("/")) or placeholder}' \
            + ('/' if root.endswith('/') else '')
        overrides.append(f'{key}.data_root={new}')
        if root not in roots:
            roots.append(root)
            target = root.rstrip('/')
            parent = osp.dirname(target)
            links.append((f'mkdir -p {parent} && ' if parent else '') +
                         f'ln -s /path/to/{osp.basename(target)} {target}')
    for loader, evaluator, _ in _loaders(cfg, mode):
        for ann, key in (_evaluator_needs(cfg, evaluator)
                         if evaluator else []):
            for root in roots:
                if ann.startswith(root):
                    base = osp.basename(root.rstrip('/'))
                    rest = ann[len(root):].lstrip('/')
                    overrides.append(f'{key}=/path/to/{base}/{rest}')
                    break
    if links:
        lines.append('  link your copy there: ' + ' ; '.join(links))
    if overrides:
        lines.append('  or point the config at it: --cfg-options ' +
                     ' '.join(dict.fromkeys(overrides)))
    lines.append('  (see docs/en/user_guides/data_preparation.md)')
    return '\n'.join(lines)


# ------------------------------------------------- the files themselves
#: every image of a data set of up to DECODE_ALL images is decoded; of a
#: larger one, a random sample of SAMPLE_FILES (seeded with SAMPLE_SEED:
#: the same files at every start). 500 full-size decodes take ~3 s (an
#: ImageNet JPEG ~5 ms), 2,000 small ones (the demo's 64 x 64) ~1 s
DECODE_ALL = 2000
SAMPLE_FILES = 500
SAMPLE_SEED = 0
#: how many listed files are only checked to exist and not be empty (one
#: ``stat`` each: COCO train2017's 118k files take well under a second on
#: a local disk). An annotation file too big to parse here (COCO
#: train2017's 448 MB json, parsed by the dataset anyway) is replaced by the
#: image files of its image folder (every one checked to be not empty)
SAMPLE_STAT = 200000
#: annotation json files up to this size are parsed (syntax errors named
#: with their position); larger ones are checked for truncation only
MAX_PARSE_BYTES = 64 << 20


def image_damage(path, decode=False):
    """Why the image file ``path`` cannot be used, or None: missing, empty
    (0 bytes), truncated (a JPEG without its end marker, a PNG without its
    IEND chunk) or, with ``decode``, not decodable by OpenCV."""
    try:
        size = osp.getsize(path)
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if size == 0:
        return 'the file is empty (0 bytes)'
    try:
        with open(path, 'rb') as f:
            head = f.read(8)
            f.seek(max(0, size - 4096))
            tail = f.read().rstrip(b'\0\r\n ')
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    if head[:2] == b'\xff\xd8' and b'\xff\xd9' not in tail[-2048:]:
        return f'truncated JPEG ({size} bytes, no end-of-image marker)'
    if head == b'\x89PNG\r\n\x1a\n' and b'IEND' not in tail[-64:]:
        return f'truncated PNG ({size} bytes, no IEND chunk)'
    if decode:
        import cv2
        import numpy as np
        with open(path, 'rb') as f:
            buf = np.frombuffer(f.read(), np.uint8)
        if cv2.imdecode(buf, cv2.IMREAD_UNCHANGED) is None:
            return f'not a decodable image ({size} bytes)'
    return None


def json_problem(path):
    """Why the json file ``path`` cannot be parsed (with the line, column
    and character position), or None. Files above
    :data:`MAX_PARSE_BYTES` are only checked for truncation (the last
    character must close the document)."""
    import json
    try:
        size = osp.getsize(path)
        if size > MAX_PARSE_BYTES:
            with open(path, 'rb') as f:
                f.seek(max(0, size - 64))
                end = f.read().rstrip()
            if not end.endswith((b'}', b']')):
                return f'truncated: it does not end with "}}" ({size} bytes)'
            return None
        with open(path, 'rb') as f:
            json.loads(f.read().decode('utf-8'))
    except OSError as e:
        return f'cannot be read ({e.strerror})'
    except UnicodeDecodeError as e:
        return f'not UTF-8 text (byte {e.start})'
    except json.JSONDecodeError as e:
        what = 'truncated' if e.pos >= size - 1 else 'invalid JSON'
        return (f'{what}: {e.msg} at line {e.lineno} column {e.colno} '
                f'(character {e.pos} of {size})')
    return None


def decode_sample(files):
    """The files to decode (:data:`DECODE_ALL`, :data:`SAMPLE_FILES`):
    all of them, or a seeded random sample in their listed order."""
    import random
    if len(files) <= DECODE_ALL:
        return list(files)
    pick = set(
        random.Random(SAMPLE_SEED).sample(range(len(files)), SAMPLE_FILES))
    return [f for i, f in enumerate(files) if i in pick]


def list_problem(path, with_label=True):
    """``'line N: ...'`` for the first line of the ImageNet-style list
    ``path`` that mmpretrain's ``CustomDataset`` cannot read (empty, or not
    ``<image file> <class index>``), or None."""
    try:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                text = line.strip()
                if not text:
                    return (f'line {n}: empty line (the dataset reads every '
                            f'line; remove it)')
                parts = text.rsplit(' ', 1)
                if with_label and (len(parts) != 2
                                   or not parts[1].lstrip('-').isdigit()):
                    return (f"line {n}: expected '<image file> <class "
                            f"index>', got {text[:80]!r}")
    except (OSError, UnicodeDecodeError) as e:
        return f'cannot be read as text ({e})'
    return None


def _sample(items, n):
    """``n`` evenly spaced items (all of them when there are at most n)."""
    items = list(items)
    if len(items) <= n:
        return items
    step = len(items) / n
    return [items[int(i * step)] for i in range(n)]


def _listed_files(ds, ann_path):
    """The image files a dataset's annotation file lists (a sample), as
    full paths: COCO json ``images[].file_name`` under the image prefix,
    mmpretrain text lists ``<file> <label>`` under the split folder.
    Returns [] when the format is not known; for a list too big to read
    (:data:`MAX_PARSE_BYTES`), the image files in the image folder."""
    import json
    root = _get(ds, 'data_root') or ''
    prefix = _get(ds, 'data_prefix')
    if isinstance(prefix, str):
        img_dir = prefix
    elif hasattr(prefix, 'get'):
        img_dir = prefix.get('img') or prefix.get('img_path') or ''
    else:
        img_dir = ''
    if not img_dir and _get(ds, 'split') and \
            _type_name(ds).startswith('ImageNet'):
        img_dir = ds['split']
    img_dir = _join(root, img_dir) if img_dir else root
    try:
        if osp.getsize(ann_path) > MAX_PARSE_BYTES:
            return _image_files(img_dir, SAMPLE_STAT)
        if ann_path.endswith('.json'):
            with open(ann_path, 'rb') as f:
                data = json.loads(f.read().decode('utf-8'))
            names = [
                im.get('file_name') for im in data.get('images', [])
                if isinstance(im, dict) and im.get('file_name')
            ] if isinstance(data, dict) else []
        elif ann_path.endswith('.txt'):
            with open(ann_path) as f:
                names = [
                    ln.strip().rsplit(' ', 1)[0] for ln in f if ln.strip()
                ]
        else:
            return []
    except (OSError, ValueError):
        return []  # reported by the json check
    return [_join(img_dir, n) for n in _sample(names, SAMPLE_STAT)]


IMAGE_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')


def _image_files(directory, limit):
    """Up to ``limit`` image files directly in ``directory`` (sorted)."""
    try:
        names = sorted(
            e.name for e in os.scandir(directory)
            if e.name.lower().endswith(IMAGE_EXTS))
    except OSError:
        return []
    return [osp.join(directory, n) for n in _sample(names, limit)]


def _folder_files(directory):
    """The files in an image folder (first level and one level of
    sub-folders, as the class folders of ImageNet), at most
    20 x :data:`SAMPLE_FILES`."""
    exts = IMAGE_EXTS
    out = []
    try:
        entries = sorted(os.scandir(directory), key=lambda e: e.name)
    except OSError:
        return out
    for e in entries:
        if e.is_file() and e.name.lower().endswith(exts):
            out.append(e.path)
        elif e.is_dir():
            try:
                out += [
                    s.path
                    for s in sorted(os.scandir(e.path), key=lambda s: s.name)
                    if s.is_file() and s.name.lower().endswith(exts)
                ]
            except OSError:
                pass
        if len(out) >= 20 * SAMPLE_FILES:
            break
    return out


def damaged_data_message(cfg, mode):
    """None when the data files are usable, else one line per problem
    (at most 5): each names the file, what is wrong and the config key it
    comes from. Checks every annotation json (parsed: a syntax error or
    truncation is named with its position), every line of an ImageNet-style
    ``.txt`` list (:func:`list_problem`: file and line named), and the
    images the annotations list (or, without a list, the image folders):
    each must exist and not be empty (up to :data:`SAMPLE_STAT` of them,
    one ``stat`` each) and :func:`decode_sample` of them must decode.
    """
    problems = []
    for path, key, purpose, ds in required_paths(cfg, mode):
        if not osp.isfile(path) and not osp.isdir(path):
            continue
        if osp.isfile(path) and path.endswith('.json'):
            why = json_problem(path)
            if why:
                problems.append(f'{path} [{key}]: {why}')
                continue
        if ds is None:
            continue
        if key.endswith('.ann_file') and path.endswith('.txt') and \
                osp.isfile(path):
            why = list_problem(path, bool(_get(ds, 'with_label', True)))
            if why:
                problems.append(f'{path} {why} [{key}]')
                continue
        if key.endswith('.ann_file'):
            files = _listed_files(ds, path)
        elif '.data_prefix.' in key and osp.isdir(path) and \
                not _ann_file(ds):
            files = _folder_files(path)
        else:
            files = []
        # every (listed) file: there and not empty; all of a small set, a
        # seeded sample of a large one: decodable (and not truncated)
        deep = set(decode_sample(files))
        for f in files:
            try:
                size = os.stat(f).st_size
            except OSError:
                size = None
            if size is None or not osp.isfile(f):
                why = 'listed in the annotations, but missing' \
                    if key.endswith('.ann_file') else 'cannot be read'
            elif size == 0:
                why = 'the file is empty (0 bytes)'
            elif f not in deep:
                continue
            else:
                why = image_damage(f, decode=True)
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
    """This process's rank as the launcher (``pytorch``, ``slurm``,
    ``mpi``) set it in the environment, before any process group exists
    (0 for ``none`` or an unreadable value)."""
    env = {
        'pytorch': 'RANK',
        'slurm': 'SLURM_PROCID',
        'mpi': 'OMPI_COMM_WORLD_RANK'
    }.get(launcher)
    try:
        return int(os.environ.get(env, 0)) if env else 0
    except ValueError:
        return 0


def exit_if_missing(cfg, mode, launcher='none'):
    """Exit with code 1 and :func:`missing_data_message` when data is
    missing. In a distributed run every rank exits, only rank 0 prints.
    ``MMSOFT_SKIP_DATA_CHECK=1`` skips the check."""
    if os.environ.get('MMSOFT_SKIP_DATA_CHECK', '0') not in ('', '0'):
        return
    msg = missing_data_message(cfg, mode) or damaged_data_message(cfg, mode)
    if msg is None:
        return
    if launcher_rank(launcher) == 0:
        print(msg, file=sys.stderr, flush=True)
    raise SystemExit(1)


def main(argv=None):
    """``python tools/mmsoft_tools/data_check.py {train,val,test} CONFIG
    [--cfg-options k=v ...] [other tool arguments, ignored]``: exit code 0
    when the data is there, else the message and 1."""
    import argparse

    from mmengine.config import Config, DictAction
    parser = argparse.ArgumentParser(
        description='check that the data a config needs exists',
        add_help=False)  # the tools' own --help goes through
    parser.add_argument('mode', choices=sorted(_MODES))
    parser.add_argument('config')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction)
    args, _ = parser.parse_known_args(argv)
    if not osp.isfile(args.config):
        print(f'mmsoft: config file not found: {args.config}', file=sys.stderr)
        return 1
    cfg = Config.fromfile(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    msg = missing_data_message(cfg, args.mode) or \
        damaged_data_message(cfg, args.mode)
    if msg is None and args.mode == 'train':  # the ImageNet weights, once
        try:
            from mmsoft_tools.checkpoint_files import missing_pretrained
        except ImportError:  # run as a script: its folder is on sys.path
            from checkpoint_files import missing_pretrained
        msg = missing_pretrained(cfg)
        msg = msg and f'error: {msg}'
        try:  # a folder, damaged, offline: also once
            from mmsoft_tools.cli import ToolError, check_init_checkpoints
        except ImportError:  # run as a script: the tools' package is not
            pass  # importable (tools/train.py checks them itself)
        else:
            try:
                if msg is None:
                    check_init_checkpoints(cfg)
            except ToolError as e:
                msg = f'error: {e}'
    if msg is None:
        return 0
    print(msg, file=sys.stderr, flush=True)
    return 1


if __name__ == '__main__':
    sys.exit(main())
