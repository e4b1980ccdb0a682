"""The data check (``mmsoft_tools/data_check.py``): missing data with the
layout and both remedies, wrappers, remote storage, damaged annotations and
images named with the file, one message from the tools; existing data
passes."""
import copy
import fnmatch
import glob
import os
import os.path as osp
import re
import shlex
import shutil
import subprocess

import pytest
from conftest import CONFIGS, ROOT, TOOLS, demo_support, tiny_demo_data
from mmengine.config import Config, ConfigDict

from mmsoft_tools import data_check as dc


def raised(exc, fn, *args):
    with pytest.raises(exc) as e:
        fn(*args)
    return e.value


_COCO = 'annotations/instances_val2017.json, val2017/'
_ADE = 'images/validation/, annotations/validation/'
#: one config per data set (a row of the docs' table): its codebase, data
#: root and the items of the 'expected ... layout' line per mode
SHIPPED = [
    ('soft_tiny_in1k.py', 'mmpretrain', 'ImageNet', 'data/imagenet',
     dict(train='train/, val/', test='val/')),
    ('mask_rcnn_soft_small_3x_ms.py', 'mmdet', 'CocoDataset', 'data/coco/',
     dict(train='annotations/instances_train2017.json, train2017/, ' + _COCO,
          test=_COCO)),
    ('upernet_soft_small_512x512_160k_ade20k.py', 'mmseg', 'ADE20KDataset',
     'data/ade/ADEChallengeData2016',
     dict(train='images/training/, annotations/training/, ' + _ADE,
          test=_ADE)),
]  # yapf: disable


def _make_layout(line, base):
    """The files / folders of a 'layout: R/{a, b/}' line under ``base``."""
    for item in re.search(r'layout: \S+?/\{([^}]*)\}', line)[1].split(', '):
        os.makedirs(osp.join(base, osp.dirname(item)), exist_ok=True)
        if not item.endswith('/'):
            open(osp.join(base, item), 'w').close()


CONFIG_NAMES = sorted(f for f in os.listdir(CONFIGS) if f.endswith('.py'))


def _docs_rows():
    """[(config patterns, training, testing overrides)] of the docs page."""
    with open(osp.join(ROOT, 'docs/en/user_guides/data_preparation.md')) as f:
        text = f.read()  # the page the message names
    assert text.startswith('# Data preparation')
    return [[re.findall(r'`([^`]+)`', c) for c in ln.split('|')[1:4]]
            for ln in text.splitlines() if ln.startswith('| `')]


def _in_row(name, row):
    return any(
        fnmatch.fnmatch(name, p if p.endswith('.py') else p + '.py')
        for p in row[0])


def test_docs_rows_cover_every_config():
    rows = _docs_rows()
    assert len(rows) == 3
    assert all(any(_in_row(c, r) for c in CONFIG_NAMES) for r in rows)
    assert all(any(_in_row(c, r) for r in rows) for c in CONFIG_NAMES)


@pytest.mark.parametrize(
    'name, codebase, dataset, root, items',
    SHIPPED,
    ids=[r[0] for r in SHIPPED])
@pytest.mark.parametrize('mode', ['train', 'test'])
def test_shipped_configs_message_and_remedies(name, codebase, dataset, root,
                                              items, mode, tmp_path,
                                              monkeypatch):
    """The message's layout, its two remedies and the docs' overrides."""
    pytest.importorskip(codebase)
    monkeypatch.chdir(tmp_path)  # no data/ here
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    cfg2, docs = copy.deepcopy(cfg), copy.deepcopy(cfg)
    lines = dc.missing_data_message(cfg, mode).splitlines()
    purpose = dict(train='training', test='testing')[mode]
    assert len(lines) == 5, lines
    assert lines[0] == (
        f'mmsoft: data for {purpose} not found: {root} (relative to the '
        f'current directory {tmp_path}) [{mode}_dataloader.dataset.data_root]')
    layout = lines[1]
    assert layout == (f'  expected {dataset} layout: {root.rstrip("/")}/'
                      f'{{{items[mode]}}}')
    assert lines[-1] == '  (see docs/en/user_guides/data_preparation.md)'
    # remedy 1: the --cfg-options of the message, on a generated layout
    over = next(ln for ln in lines if '--cfg-options' in ln)
    over = over.split('--cfg-options ', 1)[1]
    assert shlex.split(over) == over.split()  # shell words, no quoting
    options = dict(kv.split('=', 1) for kv in over.split())
    loaders = (['train_dataloader', 'val_dataloader']
               if mode == 'train' else ['test_dataloader'])
    assert {k for k in options if k.endswith('.data_root')} == \
        {f'{k}.dataset.data_root' for k in loaders}
    if codebase == 'mmdet':  # CocoMetric reads the annotations itself
        ev = 'val_evaluator' if mode == 'train' else 'test_evaluator'
        assert options[f'{ev}.ann_file'].endswith(
            '/annotations/instances_val2017.json')
    new_base = str(tmp_path / 'elsewhere')
    cfg2.merge_from_dict({
        k: v.replace('/path/to', new_base)
        for k, v in options.items()
    })
    assert dc.missing_data_message(cfg2, mode) is not None  # not made yet
    _make_layout(layout, osp.join(new_base, osp.basename(root.rstrip('/'))))
    assert dc.missing_data_message(cfg2, mode) is None
    # the docs' overrides (their keys exist in the resolved config)
    (row, ) = [r for r in _docs_rows() if _in_row(name, r)]
    opts = dict(
        o.replace('/data/', f'{new_base}/').split('=', 1)
        for o in row[1 if mode == 'train' else 2][0].split())
    for key in opts:
        node = docs
        for part in key.split('.'):
            node = node[part]
    docs.merge_from_dict(opts)
    assert dc.missing_data_message(docs, mode) is None, opts
    # remedy 2: the symlink command of the message, unchanged config
    link = next(ln for ln in lines if 'ln -s' in ln)
    command = link.split('link your copy there: ', 1)[1]
    subprocess.run(command.replace('/path/to', new_base), shell=True,
                   check=True, cwd=str(tmp_path))  # yapf: disable
    assert osp.islink(root.rstrip('/'))
    assert dc.missing_data_message(cfg, mode) is None


def _coco_ds(root, ann='annotations/a.json', img='imgs/'):
    return dict(type='CocoDataset', data_root=root, ann_file=ann,
                data_prefix=dict(img=img))  # yapf: disable


def test_wrappers_evaluators_and_order(tmp_path):
    pytest.importorskip('mmdet')
    root = str(tmp_path / 'coco') + '/'
    inner = [_coco_ds(root), _coco_ds(root, 'annotations/b.json', 'more/')]
    cfg = ConfigDict(
        default_scope='mmdet', val_cfg=dict(type='ValLoop'),
        train_dataloader=dict(dataset=dict(
            type='RepeatDataset', times=2,
            dataset=dict(type='ConcatDataset', datasets=inner))),
        val_dataloader=dict(dataset=_coco_ds(root)), val_evaluator=[
            dict(type='CocoMetric', ann_file=root + 'annotations/a.json')
        ])  # yapf: disable
    inner = 'train_dataloader.dataset.dataset.datasets'
    assert [k for k, _, _ in dc.built_datasets(cfg, 'train')
            ] == [f'{inner}.0', f'{inner}.1', 'val_dataloader.dataset']

    def first():
        return dc.missing_data_message(cfg, 'train').splitlines()[0]

    msg = dc.missing_data_message(cfg, 'train')
    assert f'[{inner}.0.data_root]' in first()
    assert f'{inner}.1.data_root=/path/to/coco/ ' in msg
    assert 'val_evaluator.0.ann_file=/path/to/coco/annotations/a.json' in msg
    # the first missing path is named: data_root, then its contents
    os.makedirs(root + 'annotations')
    open(root + 'annotations/a.json', 'w').close()
    assert first().startswith(
        f'mmsoft: data for training not found: {root}imgs/ ')
    for sub in ('imgs', 'more'):
        os.makedirs(root + sub)
    assert 'annotations/b.json' in first()
    open(root + 'annotations/b.json', 'w').close()
    assert dc.missing_data_message(cfg, 'train') is None
    # without a validation loop, the val data is not needed
    cfg.val_dataloader.dataset.data_root = str(tmp_path / 'nothing')
    assert dc.missing_data_message(cfg, 'train') is not None
    cfg.val_cfg = None
    assert dc.missing_data_message(cfg, 'train') is None
    # nor without an evaluator (the Runner refuses a val_cfg without one)
    cfg.val_cfg, cfg.val_evaluator = dict(type='ValLoop'), None
    assert dc.missing_data_message(cfg, 'train') is None
    # test mode reads only the test dataloader (absent here)
    assert dc.missing_data_message(cfg, 'test') is None


def _coco_test(**dataset):
    """A config whose test dataloader reads a CocoDataset."""
    pytest.importorskip('mmdet')
    return ConfigDict(
        default_scope='mmdet',
        test_dataloader=dict(dataset=dict({'type': 'CocoDataset'}, **dataset)))


def test_remote_and_imagenet_split(tmp_path):
    """Remote storage is not checked (nor built); ImageNet's ``split``."""
    remote = _coco_test(data_root='s3://bucket/coco/',
                        ann_file='annotations/x.json',
                        data_prefix=dict(img='val2017/'))  # yapf: disable
    remote.test_evaluator = dict(
        type='CocoMetric', ann_file='s3://bucket/coco/annotations/x.json')
    assert dc.built_datasets(remote, 'test') == []
    assert dc.missing_data_message(remote, 'test') is None
    petrel = _coco_test(data_root='data/coco/', ann_file='a.json',
                        backend_args=dict(backend='petrel'))  # yapf: disable
    assert dc.missing_data_message(petrel, 'test') is None
    pytest.importorskip('mmpretrain')
    imagenet = ConfigDict(default_scope='mmpretrain', test_dataloader=dict(
        dataset=dict(type='ImageNet', data_root=str(tmp_path),
                     split='val')))  # yapf: disable
    msg = dc.missing_data_message(imagenet, 'test').splitlines()
    assert msg[:2] == [
        f'mmsoft: data for testing not found: {tmp_path}/val '
        '[test_dataloader.dataset.data_prefix.img_path]',
        f'  expected ImageNet layout: {tmp_path}/{{val/}}'
    ]
    with pytest.raises(ValueError, match='mode'):
        dc.missing_data_message(imagenet, 'eval')


def test_rank_and_skip(tmp_path, monkeypatch, capsys):
    """Only rank 0 prints; MMSOFT_SKIP_DATA_CHECK=1 skips, '0' / '' check."""
    cfg = _coco_test(data_root=str(tmp_path / 'no'))
    for rank, skip in (('1', '0'), ('0', ''), ('0', '1')):
        monkeypatch.setenv('RANK', rank)
        monkeypatch.setenv('MMSOFT_SKIP_DATA_CHECK', skip)
        if skip == '1':
            assert dc.exit_if_missing(cfg, 'test', 'pytorch') is None
        else:
            assert raised(SystemExit, dc.exit_if_missing, cfg, 'test',
                          'pytorch').code == 1
        err = capsys.readouterr().err
        assert ('not found' in err) == ((rank, skip) == ('0', '')), err


# ------------------------------------------------------------ the tools
# (the tools' message: test_faults.py's *-missing-data rows)
@pytest.fixture(scope='module')
def demo_data(tmp_path_factory):
    """Tiny demo data of the three tasks: ``{task: (config, root)}``."""
    S, T = demo_support()
    report = S.make_demo_data(str(tmp_path_factory.mktemp('demo')), log=None,
                              overrides=tiny_demo_data(num_train=3),
                              workers=1)  # yapf: disable
    return {t: (T.set_data_root(T.load_demo_config(t), r['path']), r['path'])
            for t, r in report.items()}  # yapf: disable


def test_existing_data_passes(demo_data, tmp_path, monkeypatch, capsys,
                              script_server):
    import demo_tasks as T
    monkeypatch.chdir(tmp_path)
    assert dc.missing_data_message(T.load_demo_config('seg'), 'train') \
        is not None  # data/demo
    for task, (cfg, _) in demo_data.items():
        for mode in ('train', 'test'):
            assert dc.missing_data_message(cfg, mode) is None, (task, mode)
            assert dc.damaged_data_message(cfg, mode) is None, (task, mode)
    # the command line, with the overrides a user would type
    det, root = T.config_path('det'), demo_data['det'][1].rstrip('/') + '/'
    over = [
        f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={root}annotations/instances_val.json'
    ]
    assert dc.main(['train', det, '--work-dir', 'x', '--cfg-options'] +
                   over) == 0  # the data and the init_cfg checked
    assert dc.main(['train', det, '--cfg-options'] + over[:1]) == 1
    assert capsys.readouterr().err.startswith(
        'mmsoft: data for validation not found')
    assert dc.main(['test', 'no_such_config.py', '--help']) == 1
    assert capsys.readouterr().err == \
        'mmsoft: config file not found: no_such_config.py\n'
    # run as a script (tools/ not on sys.path), the tools' --cfg-options check
    proc = script_server(
        f'{TOOLS}/mmsoft_tools/data_check.py',
        ['train', det, '--cfg-options', 'train_cfg.max_epoch=1'],
        cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --cfg-options train_cfg.max_epoch: the config has no key "
        "'max_epoch' under train_cfg; did you mean train_cfg.max_epochs?")


# ------------------------------------------- the files the data lists
@pytest.fixture
def demo_det(demo_data, tmp_path):
    """A copy of the detection demo data (to damage) and its config file."""
    from demo_tasks import set_data_root
    cfg, root = copy.deepcopy(demo_data['det'][0]), str(tmp_path / 'det')
    shutil.copytree(demo_data['det'][1], root)
    set_data_root(cfg, root)
    cfg.dump(str(tmp_path / 'det.py'))
    return str(tmp_path / 'det.py'), root


def test_damaged_images_and_annotations_are_named(demo_det, capsys):
    """Empty, truncated, missing images; a truncated JSON, its position."""
    cfg, root = demo_det
    jpg, empty, gone = sorted(glob.glob(osp.join(root, 'train', '*.jpg')))[:3]
    data = open(jpg, 'rb').read()
    open(jpg, 'wb').write(data[:len(data) // 2])
    open(empty, 'wb').close()
    os.remove(gone)
    ann = osp.join(root, 'annotations', 'instances_val.json')
    text = open(ann, 'rb').read()
    open(ann, 'wb').write(text[:len(text) // 2])
    capsys.readouterr()
    assert dc.main(['train', cfg]) == 1
    lines = capsys.readouterr().err.rstrip().splitlines()
    assert lines[:4] == [
        'mmsoft: damaged data (fix or remove these files, or set '
        'MMSOFT_SKIP_DATA_CHECK=1):',
        f'  {jpg} (for training, train_dataloader.dataset): truncated JPEG '
        f'({len(data) // 2} bytes, no end-of-image marker)',
        f'  {empty} (for training, train_dataloader.dataset): the file is '
        'empty (0 bytes)',
        f'  {gone} (for training, train_dataloader.dataset): cannot be read '
        '(No such file or directory)'
    ]
    assert re.fullmatch(
        re.escape(f'  {ann} [val_dataloader.dataset]: cannot be loaded: '
                  'JSONDecodeError: ') + r'.*line 1 column \d+ \(char \d+\)',
        lines[4]), lines[4:]


def test_missing_imagenet_file_and_a_checkpoint_to_load(demo_det, capsys):
    """Issue 52: a run that loads a checkpoint needs no ImageNet file."""
    path, _ = demo_det
    cfg = Config.fromfile(path)
    cfg.model.backbone.init_cfg = dict(
        type='Pretrained', checkpoint='checkpoints/soft_norm_tiny.pth')
    cfg.dump(path)
    for extra, refused in (([], True), (['--resume'], False),
                           (['--cfg-options', 'load_from=det.pth'], False)):
        capsys.readouterr()
        assert dc.main(['train', path] + extra) == int(refused), extra
        assert ('error: checkpoints/soft_norm_tiny.pth (model.backbone.'
                'init_cfg.checkpoint) does not exist'
                in capsys.readouterr().err) == refused


# ----------------------------------------- decoding: all, or a sample
def _list_dataset(tmp_path, n, bad=None):
    """A list of ``n`` 8 x 8 PNGs (``bad``: not decodable) and its config."""
    import cv2
    import numpy as np
    pytest.importorskip('mmpretrain')
    root = tmp_path / 'imgs'
    (root / 'train').mkdir(parents=True)
    png = str(tmp_path / 'one.png')
    cv2.imwrite(png, np.zeros((8, 8, 3), np.uint8))
    for i in range(n):
        if i == bad:  # a PNG header, then garbage: not decodable
            (root / 'train' / f'{i:05d}.png'
             ).write_bytes(open(png, 'rb').read()[:16] + b'x' * 64 + b'IEND')
        else:
            os.link(png, root / 'train' / f'{i:05d}.png')
    (root / 'train.txt').write_text(''.join(f'{i:05d}.png 0\n'
                                            for i in range(n)))
    ds = dict(type='CustomDataset', data_root=str(root), data_prefix='train',
              ann_file='train.txt')  # yapf: disable
    cfg = dict(default_scope='mmpretrain', train_dataloader=dict(dataset=ds))
    return cfg, root


def _count_decodes(monkeypatch):
    decoded, real = [], dc.image_damage

    def image_damage(path, decode=False):
        decoded.extend([path] if decode else [])
        return real(path, decode)

    monkeypatch.setattr(dc, 'image_damage', image_damage)
    return decoded


def test_decoding_all_or_a_seeded_sample(tmp_path, monkeypatch):
    """Up to DECODE_ALL images each is decoded (the last one named); above
    it a seeded sample, all checked to exist; SAMPLE_STAT files along the
    whole list are checked."""
    monkeypatch.setattr(dc, 'DECODE_ALL', 20)
    monkeypatch.setattr(dc, 'SAMPLE_FILES', 5)
    (tmp_path / 'small').mkdir()
    cfg, root = _list_dataset(tmp_path / 'small', 20, bad=19)
    decoded = _count_decodes(monkeypatch)
    assert dc.damaged_data_message(cfg, 'train').splitlines()[-1] == (
        f"  {root / 'train' / '00019.png'} (for training, train_dataloader."
        'dataset): not a decodable image (84 bytes)')
    assert len(decoded) == 20
    decoded.clear()
    cfg, root = _list_dataset(tmp_path, 25)
    assert dc.damaged_data_message(cfg, 'train') is None
    assert len(decoded) == 5 and len(set(decoded)) == 5
    first = list(decoded)
    decoded.clear()
    dc.damaged_data_message(cfg, 'train')
    assert decoded == first  # seeded: the same sample
    os.remove(root / 'train' / '00024.png')  # not decoded, still checked
    assert '00024.png (for training' in dc.damaged_data_message(cfg, 'train')
    monkeypatch.setattr(dc, 'SAMPLE_STAT', 5)  # every 5th: 0, 5, ... 20
    assert dc.damaged_data_message(cfg, 'train') is None
    os.remove(root / 'train' / '00020.png')
    assert dc.damaged_data_message(cfg, 'train').splitlines()[-1] == (
        f"  {root / 'train' / '00020.png'} (for training, train_dataloader."
        'dataset): cannot be read (No such file or directory)')


@pytest.mark.parametrize(
    'ext, end, trailer',
    [
        ('jpg', 2, b'\0' * 300),  # the end marker in the last bytes
        ('jpg', 2, b'\xffxy' * 3000),  # the file's segments walked
        ('png', 12, b''),
        ('png', 12, b'trailer' * 1000),
    ])
def test_image_with_data_after_its_end_is_whole(tmp_path, ext, end, trailer):
    """Bytes after a JPEG's / PNG's end: no truncation; cut before it: one."""
    import cv2
    import numpy as np
    path = str(tmp_path / f'a.{ext}')
    cv2.imwrite(path, np.full((16, 16, 3), 90, np.uint8))
    data = open(path, 'rb').read()
    open(path, 'wb').write(data + trailer)
    assert dc.image_damage(path, decode=True) is None
    for cut in (data[:-end] + trailer, data[:len(data) // 2]):
        open(path, 'wb').write(cut)
        assert dc.image_damage(path).startswith(
            'truncated ' + dict(jpg='JPEG', png='PNG')[ext])


UNPACK = 'ValueError: not enough values to unpack (expected 2, got 1)'


@pytest.mark.parametrize(
    'lines, num_classes, problem',
    [
        # a line the list reader cannot read
        (['00000.png 0', 'no_label.png'], None, 'cannot be loaded: ' + UNPACK),
        # a blank list (mmpretrain: "need at least one array to ...")
        (['', '  '], 5, 'has no samples (an empty list); write one line per '
         'sample ("<image file> <class index>") or point ann_file at the '
         'full list'),
        # a class index the model has no output for (the loss fails at the
        # first batch: AssertionError / a CUDA device-side assert)
        (['00000.png 0', '00001.png 5', '00002.png 9'], 5,
         'class index 5 of {root}/train/00001.png (and 1 more samples) is '
         'out of range: the model has 5 classes (0 .. 4, '
         'model.head.num_classes); fix the list or raise '
         'model.head.num_classes'),
        (['00000.png 4', '00001.png 0'], 5, None),  # in range
        (['00000.png 7'], None, None),  # no head: nothing to compare with
    ])
def test_list_problems_named_with_the_file(tmp_path, lines, num_classes,
                                           problem):
    cfg, root = _list_dataset(tmp_path, 3)
    if num_classes is not None:
        cfg['model'] = dict(
            type='ImageClassifier', head=dict(num_classes=num_classes))
    ann = root / 'train.txt'
    ann.write_text(''.join(ln + '\n' for ln in lines))
    msg = dc.damaged_data_message(cfg, 'train')
    if problem is None:
        assert msg is None, msg
    else:
        assert msg.splitlines()[-1] == (
            f'  {ann} [train_dataloader.dataset]: ' +
            problem.format(root=root)), msg
