"""The data check of the tools (``mmsoft_tools/data_check.py``): missing
data roots with the layout and both remedies, wrappers, remote storage,
damaged annotations and images named with the file, one message from
tools/train.py, tools/test.py and dist_train.sh; existing data passes."""
import copy
import glob
import os
import os.path as osp
import re
import shlex
import subprocess
import sys

import pytest
from conftest import (CONFIGS, ROOT, TOOLS, child_env, demo_support, free_port,
                      run, tiny_demo_data, tool_namespace)
from mmengine.config import Config, ConfigDict

from mmsoft_tools import data_check as dc

# one config per family: (config, dataset type in the message)
FAMILIES = [
    ('soft_tiny_in1k.py', 'ImageNet'),
    ('retinanet_soft_tiny_1x.py', 'CocoDataset'),
    ('mask_rcnn_soft_tiny_1x.py', 'CocoDataset'),
    ('cascade_mask_rcnn_soft_small_3x_ms.py', 'CocoDataset'),
    ('atss_soft_small_3x_ms.py', 'CocoDataset'),
    ('gfl_soft_small_3x_ms.py', 'CocoDataset'),
    ('sparse_rcnn_soft_small_3x_ms.py', 'CocoDataset'),
    ('upernet_soft_small_512x512_160k_ade20k.py', 'ADE20KDataset'),
]


def _run_checked(cmd, tmp_path, **env):
    """Run ``cmd`` in tmp_path with the data check on."""
    return run(
        cmd, cwd=tmp_path, timeout=300, MMSOFT_SKIP_DATA_CHECK=None, **env)


def _make_layout(line, base):
    """The files / folders of a 'layout: R/{a, b/}' line under ``base``."""
    m = re.search(r'layout: (\S+?)/\{([^}]*)\}', line)
    assert m, line
    for item in m.group(2).split(', '):
        path = osp.join(base, item)
        if item.endswith('/'):
            os.makedirs(path, exist_ok=True)
        else:
            os.makedirs(osp.dirname(path), exist_ok=True)
            open(path, 'w').close()
    return m.group(1)


@pytest.mark.parametrize('name,dataset', FAMILIES)
@pytest.mark.parametrize('mode', ['train', 'test'])
def test_shipped_configs_message_and_remedies(name, dataset, mode, tmp_path,
                                              monkeypatch):
    pytest.importorskip(
        dict(ImageNet='mmpretrain', CocoDataset='mmdet').get(dataset, 'mmseg'))
    monkeypatch.chdir(tmp_path)  # no data/ here
    cfg = Config.fromfile(osp.join(CONFIGS, name))
    msg = dc.missing_data_message(cfg, mode)
    assert msg is not None
    lines = msg.splitlines()
    assert len(lines) <= 6, msg
    root = dict(
        ImageNet='data/imagenet',
        CocoDataset='data/coco/').get(dataset, 'data/ade/ADEChallengeData2016')
    purpose = 'training' if mode == 'train' else 'testing'
    assert lines[0].startswith(f'mmsoft: data for {purpose} not found: '
                               f'{root} ')
    assert f'[{mode}_dataloader.dataset.data_root]' in lines[0]
    layout = next(ln for ln in lines if 'layout:' in ln)
    assert f'expected {dataset} layout: {root.rstrip("/")}/{{' in layout
    if dataset == 'CocoDataset':
        val = 'annotations/instances_val2017.json, val2017/'
        assert layout.endswith(
            '{annotations/instances_train2017.json, train2017/, ' + val +
            '}' if mode == 'train' else '{' + val + '}'), layout
    elif dataset == 'ImageNet':
        assert ('{train/, val/}' if mode == 'train' else '{val/}') in layout
    else:
        split = ('images/training/, annotations/training/, '
                 if mode == 'train' else '')
        assert layout.endswith('{' + split + 'images/validation/, '
                               'annotations/validation/}'), layout

    # remedy 1: the --cfg-options of the message, on a generated layout
    over = next(ln for ln in lines if '--cfg-options' in ln)
    options = dict(
        kv.split('=', 1) for kv in over.split('--cfg-options ', 1)[1].split())
    loaders = (['train_dataloader', 'val_dataloader']
               if mode == 'train' else ['test_dataloader'])
    assert {k for k in options if k.endswith('.data_root')} == \
        {f'{k}.dataset.data_root' for k in loaders}
    if dataset == 'CocoDataset':  # CocoMetric reads the annotations itself
        ev = 'val_evaluator' if mode == 'train' else 'test_evaluator'
        assert options[f'{ev}.ann_file'].endswith(
            '/annotations/instances_val2017.json')
    new_base = str(tmp_path / 'elsewhere')
    options = {k: v.replace('/path/to', new_base) for k, v in options.items()}
    name_dir = osp.basename(root.rstrip('/'))
    cfg2 = Config.fromfile(osp.join(CONFIGS, name))
    cfg2.merge_from_dict(options)
    assert dc.missing_data_message(cfg2, mode) is not None  # not made yet
    _make_layout(layout, osp.join(new_base, name_dir))
    assert dc.missing_data_message(cfg2, mode) is None

    # remedy 2: the symlink command of the message, unchanged config
    link = next(ln for ln in lines if 'ln -s' in ln)
    cmd = link.split('link your copy there: ',
                     1)[1].replace('/path/to', new_base)
    subprocess.run(cmd, shell=True, check=True, cwd=str(tmp_path))
    assert osp.islink(root.rstrip('/'))
    assert dc.missing_data_message(cfg, mode) is None


def _coco_ds(root, ann='annotations/a.json', img='imgs/'):
    return dict(
        type='CocoDataset',
        data_root=root,
        ann_file=ann,
        data_prefix=dict(img=img))


def test_wrappers_evaluators_and_order(tmp_path):
    pytest.importorskip('mmdet')
    root = str(tmp_path / 'coco') + '/'
    cfg = ConfigDict(
        default_scope='mmdet',
        train_dataloader=dict(
            dataset=dict(
                type='RepeatDataset',
                times=2,
                dataset=dict(
                    type='ConcatDataset',
                    datasets=[
                        _coco_ds(root),
                        _coco_ds(root, 'annotations/b.json', 'more/')
                    ]))),
        val_dataloader=dict(dataset=_coco_ds(root)),
        val_cfg=dict(type='ValLoop'),
        val_evaluator=[
            dict(type='CocoMetric', ann_file=root + 'annotations/a.json')
        ])
    inner = 'train_dataloader.dataset.dataset.datasets'
    assert [k for k, _, _ in dc.built_datasets(cfg, 'train')
            ] == [f'{inner}.0', f'{inner}.1', 'val_dataloader.dataset']
    msg = dc.missing_data_message(cfg, 'train')
    assert f'[{inner}.0.data_root]' in msg.splitlines()[0]
    assert f'{inner}.1.data_root=/path/to/coco/ ' in msg
    assert 'val_evaluator.0.ann_file=/path/to/coco/annotations/a.json' in msg
    # the first missing path is named: data_root, then its contents
    os.makedirs(root + 'annotations')
    open(root + 'annotations/a.json', 'w').close()
    msg = dc.missing_data_message(cfg, 'train')
    assert msg.splitlines()[0].startswith(
        f'mmsoft: data for training not found: {root}imgs/ ')
    for sub in ('imgs', 'more'):
        os.makedirs(root + sub)
    msg = dc.missing_data_message(cfg, 'train')
    assert 'annotations/b.json' in msg.splitlines()[0]
    open(root + 'annotations/b.json', 'w').close()
    assert dc.missing_data_message(cfg, 'train') is None
    # without a validation loop, the val data is not needed
    cfg.val_dataloader.dataset.data_root = str(tmp_path / 'nothing')
    assert dc.missing_data_message(cfg, 'train') is not None
    cfg.val_cfg = None
    assert dc.missing_data_message(cfg, 'train') is None
    # nor without an evaluator (mmengine's Runner refuses a val_cfg
    # without one: that error, not a data message, is the user's)
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
    remote = _coco_test(
        data_root='s3://bucket/coco/',
        ann_file='annotations/x.json',
        data_prefix=dict(img='val2017/'))
    remote.test_evaluator = dict(
        type='CocoMetric', ann_file='s3://bucket/coco/annotations/x.json')
    assert dc.built_datasets(remote, 'test') == []
    assert dc.missing_data_message(remote, 'test') is None
    petrel = _coco_test(
        data_root='data/coco/',
        ann_file='a.json',
        backend_args=dict(backend='petrel'))
    assert dc.missing_data_message(petrel, 'test') is None
    pytest.importorskip('mmpretrain')
    imagenet = ConfigDict(
        default_scope='mmpretrain',
        test_dataloader=dict(
            dataset=dict(
                type='ImageNet', data_root=str(tmp_path), split='val')))
    msg = dc.missing_data_message(imagenet, 'test').splitlines()
    assert msg[0] == (f'mmsoft: data for testing not found: {tmp_path}/val '
                      '[test_dataloader.dataset.data_prefix.img_path]')
    assert msg[1] == f'  expected ImageNet layout: {tmp_path}/{{val/}}'
    with pytest.raises(ValueError, match='mode'):
        dc.missing_data_message(imagenet, 'eval')


def test_rank_and_skip(tmp_path, monkeypatch, capsys):
    cfg = _coco_test(data_root=str(tmp_path / 'no'))
    monkeypatch.setenv('RANK', '1')
    with pytest.raises(SystemExit) as exc:
        dc.exit_if_missing(cfg, 'test', 'pytorch')
    assert exc.value.code == 1
    assert capsys.readouterr().err == ''  # only rank 0 prints
    monkeypatch.setenv('RANK', '0')
    with pytest.raises(SystemExit):
        dc.exit_if_missing(cfg, 'test', 'pytorch')
    assert 'not found' in capsys.readouterr().err
    # the skip switch: no exit, nothing printed; '0' still checks
    monkeypatch.setenv('MMSOFT_SKIP_DATA_CHECK', '1')
    assert dc.exit_if_missing(cfg, 'test', 'pytorch') is None
    assert capsys.readouterr() == ('', '')
    monkeypatch.setenv('MMSOFT_SKIP_DATA_CHECK', '0')
    with pytest.raises(SystemExit):
        dc.exit_if_missing(cfg, 'test', 'pytorch')
    assert 'not found' in capsys.readouterr().err


# ------------------------------------------------------------ the tools
def _missing_cfg(tmp_path):
    """A tiny RetinaNet whose data_root does not exist."""
    pytest.importorskip('mmdet')
    path = tmp_path / 'retinanet_nodata.py'
    path.write_text(
        f"_base_ = {osp.join(CONFIGS, 'retinanet_soft_tiny_1x.py')!r}\n"
        "data_root = 'data/no_coco/'\n"
        "train_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "val_dataloader = dict(dataset=dict(data_root=data_root))\n"
        "test_dataloader = val_dataloader\n"
        "val_evaluator = dict(ann_file=data_root + "
        "'annotations/instances_val2017.json')\n"
        "test_evaluator = val_evaluator\n")
    return str(path)


def _assert_one_message(proc, purpose):
    err = proc.stderr.strip().splitlines()
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert 'Traceback' not in proc.stderr, proc.stderr
    first = [ln for ln in err if ln.startswith('mmsoft: data for')]
    assert len(first) == 1, proc.stderr  # once, not per rank
    assert first[0].startswith(f'mmsoft: data for {purpose} not found: '
                               'data/no_coco/ ')
    assert len(err) < 10, proc.stderr
    assert '--cfg-options' in proc.stderr
    assert 'CocoDataset layout' in proc.stderr


@pytest.mark.parametrize('cmd', [
    [sys.executable, osp.join(TOOLS, 'train.py'), '{cfg}'],
    ['bash', osp.join(TOOLS, 'dist_train.sh'), '{cfg}', '2'],
])
def test_train_tools_exit_with_one_message(tmp_path, cmd):
    """train.py, and dist_train.sh's 2 ranks: one message, no worker."""
    cfg = _missing_cfg(tmp_path)
    proc = _run_checked(
        [c.format(cfg=cfg)
         for c in cmd] + ['--work-dir', str(tmp_path / 'w')],
        tmp_path,
        PORT=str(free_port()))
    _assert_one_message(proc, 'training')
    assert not osp.exists(tmp_path / 'w')  # stopped before the Runner
    assert 'ChildFailedError' not in proc.stderr  # no worker started


def test_test_tool_exits_with_one_message(tmp_path, monkeypatch, capsys):
    cfg = _missing_cfg(tmp_path)
    monkeypatch.chdir(tmp_path)
    (tmp_path / 'ckpt.pth').write_bytes(b'')  # checked first
    main = tool_namespace('test')['main']
    with pytest.raises(SystemExit) as exc:
        main([cfg, str(tmp_path / 'ckpt.pth'), '--work-dir', 'w'])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith('mmsoft: data for testing not found: '
                          'data/no_coco/ ')
    assert 'test_dataloader.dataset.data_root=/path/to/no_coco/ ' in err
    assert 'test_evaluator.ann_file=/path/to/no_coco/annotations/' \
        'instances_val2017.json' in err
    assert not osp.exists(tmp_path / 'w')


def test_existing_data_passes(tmp_path, monkeypatch, capsys):
    S, T = demo_support()
    report = S.make_demo_data(
        str(tmp_path / 'demo'),
        overrides=tiny_demo_data(num_train=2),
        workers=1,
        log=None)
    roots = {task: r['path'] for task, r in report.items()}
    monkeypatch.chdir(tmp_path)
    for task in ('det', 'seg', 'cls'):
        cfg = T.load_demo_config(task)
        assert dc.missing_data_message(cfg, 'train') is not None  # data/demo
        T.set_data_root(cfg, roots[task])
        for mode in ('train', 'test'):
            assert dc.missing_data_message(cfg, mode) is None, (task, mode)
    # the command line, with the overrides a user would type
    det = T.config_path('det')
    root = roots['det'].rstrip('/') + '/'
    over = [
        f'train_dataloader.dataset.data_root={root}',
        f'val_dataloader.dataset.data_root={root}',
        f'val_evaluator.ann_file={root}annotations/instances_val.json'
    ]
    script = [sys.executable, f'{TOOLS}/mmsoft_tools/data_check.py', 'train']
    proc = _run_checked(
        script + [det, '--work-dir', 'x', '--resume', '--cfg-options'] + over,
        tmp_path)
    assert proc.returncode == 0, proc.stderr
    # run as a script too, the tools' --cfg-options check (before: merged)
    proc = _run_checked(
        script + [det, '--cfg-options', 'train_cfg.max_epoch=1'], tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: --cfg-options train_cfg.max_epoch: the config has no key "
        "'max_epoch' under train_cfg; did you mean train_cfg.max_epochs?")
    assert dc.main(['train', det, '--cfg-options'] + over[:1]) == 1
    err = capsys.readouterr().err
    assert err.startswith('mmsoft: data for validation not found')
    assert dc.main(['test', 'no_such_config.py', '--help']) == 1
    assert capsys.readouterr().err.strip() == \
        'mmsoft: config file not found: no_such_config.py'


def test_message_quoting_and_docs_page():
    """The overrides are shell words; the last line names the docs page."""
    msg = dc.missing_data_message(_coco_test(**_coco_ds('data/x/')), 'test')
    over = msg.split('--cfg-options ', 1)[1].splitlines()[0]
    assert shlex.split(over) == over.split()
    last = msg.splitlines()[-1]
    page = re.search(r'see (\S+\.md)', last).group(1)
    assert osp.isfile(osp.join(ROOT, page)), last
    with open(osp.join(ROOT, page)) as f:
        assert f.read().startswith('# Data preparation')


# ------------------------------------------------------------ docs page
DATA_PAGE = osp.join(ROOT, 'docs', 'en', 'user_guides', 'data_preparation.md')
LAYOUTS = {
    'coco': 'annotations/instances_train2017.json train2017/ '
    'annotations/instances_val2017.json val2017/',
    'ADEChallengeData2016': 'images/training/ images/validation/ '
    'annotations/training/ annotations/validation/',
    'imagenet': 'train/ val/',
}


def _readme_rows():
    # the documentation page of the data layouts (docs/en)
    with open(DATA_PAGE) as f:
        section = f.read()
    rows = []
    for line in section.splitlines():
        if not line.startswith('| `'):
            continue
        cells = [c.strip() for c in line.strip().strip('|').split('|')]
        patterns = re.findall(r'`([^`]+)`', cells[0])
        train, test = (
            re.findall(r'`([^`]+)`', c)[0].split() for c in cells[1:3])
        rows.append((patterns, train, test))
    return rows


def test_readme_data_overrides(tmp_path, monkeypatch):
    """The docs' layouts and overrides pass every config family's check."""
    import fnmatch
    pytest.importorskip('mmdet')
    pytest.importorskip('mmseg')
    pytest.importorskip('mmpretrain')
    for name, items in LAYOUTS.items():
        for item in items.split():
            path = tmp_path / name / item
            if item.endswith('/'):
                path.mkdir(parents=True, exist_ok=True)
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text('')
    rows = _readme_rows()
    assert len(rows) == 3
    configs = sorted(f for f in os.listdir(CONFIGS) if f.endswith('.py'))
    monkeypatch.chdir(tmp_path)  # no data/ here
    covered = set()
    for patterns, train, test in rows:
        matched = [
            c for c in configs if any(
                fnmatch.fnmatch(c, p if p.endswith('.py') else p + '.py')
                for p in patterns)
        ]
        assert matched, patterns
        covered.update(matched)
        # one config per family (the sizes share their family's data)
        families = {}
        for name in matched:
            families.setdefault(
                re.sub(r'_(tiny|small|medium|large|huge)', '', name), name)
        for name in families.values():
            resolved = Config.fromfile(osp.join(CONFIGS, name))
            for mode, options in (('train', train), ('test', test)):
                cfg = copy.deepcopy(resolved)
                assert dc.missing_data_message(cfg, mode) is not None
                opts = dict(
                    o.replace('/data/', f'{tmp_path}/').split('=', 1)
                    for o in options)
                for key in opts:  # the keys exist in the resolved config
                    node = cfg
                    for part in key.split('.'):
                        node = node[part]
                cfg.merge_from_dict(opts)
                assert dc.missing_data_message(cfg, mode) is None, \
                    (name, mode, dc.missing_data_message(cfg, mode))
    assert covered == set(configs)


@pytest.mark.parametrize('tool,name', [
    ('train', 'retinanet_soft_tiny_1x.py'),
    ('train', 'soft_tiny_in1k.py'),
    ('test', 'upernet_soft_small_512x512_160k_ade20k.py'),
])
def test_tools_message_is_all_a_newcomer_sees(tool, name, tmp_path):
    """Default warning filters: stderr is the message alone (no
    'pkg_resources is deprecated' per codebase import)."""
    pytest.importorskip(
        dict(retinanet='mmdet', upernet='mmseg',
             soft='mmpretrain')[name.split('_')[0]])
    env = child_env()
    env.pop('PYTHONWARNINGS')
    if tool == 'test':  # a checkpoint that exists: the data is what is not
        (tmp_path / 'ckpt.pth').write_bytes(b'')
    args = [osp.join(CONFIGS, name)] + (['ckpt.pth'] if tool == 'test' else [])
    proc = run([sys.executable,
                osp.join(ROOT, 'tools', f'{tool}.py'), *args],
               cwd=tmp_path,
               env=env,
               timeout=300)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert err and err[0].startswith('mmsoft: data for '), proc.stderr
    assert len(err) <= 5, proc.stderr
    assert proc.stdout == ''


# ------------------------------------------- the files the data lists
@pytest.fixture
def demo_det(tmp_path):
    pytest.importorskip('mmdet')
    from mmsoft_tools import demo_synthetic as S
    from mmsoft_tools import demo_tasks as T
    report = S.make_demo_data(
        str(tmp_path / 'demo'),
        tasks=('det', ),
        overrides=dict(
            det=dict(num_train=3, num_val=2, size=64, radius=(6, 16))),
        workers=1,
        log=None)
    cfg = T.load_demo_config('det')
    T.set_data_root(cfg, report['det']['path'])
    path = str(tmp_path / 'det.py')
    cfg.dump(path)
    assert dc.main(['train', path]) == 0
    return path, report['det']['path']


def _check_message(cfg, capsys):
    capsys.readouterr()
    assert dc.main(['train', cfg]) == 1
    return capsys.readouterr().err.rstrip().splitlines()


def test_truncated_annotation_json_is_named_with_position(demo_det, capsys):
    cfg, root = demo_det
    ann = osp.join(root, 'annotations', 'instances_train.json')
    data = open(ann, 'rb').read()
    open(ann, 'wb').write(data[:len(data) // 2])
    lines = _check_message(cfg, capsys)
    assert lines[0].startswith('mmsoft: damaged data (fix or remove')
    assert lines[1].startswith(f'  {ann} [train_dataloader.dataset]: cannot '
                               'be loaded: JSONDecodeError: ')
    assert re.search(r'line 1 column \d+ \(char \d+\)$', lines[1]), lines[1]


def test_empty_training_image_is_named(demo_det, monkeypatch, capsys,
                                       tmp_path):
    cfg, root = demo_det
    img = sorted(glob.glob(osp.join(root, 'train', '*.jpg')))[1]
    open(img, 'wb').close()
    assert _check_message(cfg, capsys)[1] == (
        f'  {img} (for training, train_dataloader.dataset): the file is '
        'empty (0 bytes)')
    # every listed file is checked for that, not only the deep sample
    monkeypatch.setattr(dc, 'SAMPLE_FILES', 1)
    assert f'{img} (for training' in _check_message(cfg, capsys)[1]
    monkeypatch.undo()
    monkeypatch.delenv('MMSOFT_SKIP_DATA_CHECK', raising=False)
    with pytest.raises(SystemExit) as e:
        tool_namespace('train')['main'](
            [cfg, '--work-dir', str(tmp_path / 'w')])
    assert e.value.code == 1
    assert f'{img} (for training' in capsys.readouterr().err
    assert not osp.exists(tmp_path / 'w')
    # a listed image that is missing, and a truncated one
    os.remove(img)
    jpg = sorted(glob.glob(osp.join(root, 'train', '*.jpg')))[0]
    data = open(jpg, 'rb').read()
    open(jpg, 'wb').write(data[:len(data) // 2])
    lines = _check_message(cfg, capsys)
    assert lines[1].startswith(f'  {jpg} (for training, ') and \
        lines[1].endswith('truncated JPEG ' f'({len(data) // 2} bytes, no '
                          'end-of-image marker)')
    assert lines[2] == (f'  {img} (for training, train_dataloader.dataset): '
                        'cannot be read (No such file or directory)')


# ----------------------------------------- decoding: all, or a sample
def _list_dataset(tmp_path, n, bad=None):
    """A list of ``n`` 8 x 8 PNGs (``bad``: not decodable) and its config."""
    import cv2
    import numpy as np
    root = tmp_path / 'imgs'
    (root / 'train').mkdir(parents=True)
    png = str(tmp_path / 'one.png')
    cv2.imwrite(png, np.zeros((8, 8, 3), np.uint8))
    lines = []
    for i in range(n):
        name = f'{i:05d}.png'
        if i == bad:  # a PNG header, then garbage: not decodable
            (root / 'train' / name
             ).write_bytes(open(png, 'rb').read()[:16] + b'x' * 64 + b'IEND')
        else:
            os.link(png, root / 'train' / name)
        lines.append(f'{name} 0')
    (root / 'train.txt').write_text('\n'.join(lines) + '\n')
    pytest.importorskip('mmpretrain')
    cfg = dict(
        default_scope='mmpretrain',
        train_dataloader=dict(
            dataset=dict(
                type='CustomDataset',
                data_root=str(root),
                ann_file='train.txt',
                data_prefix='train')))
    return cfg, root


def _count_decodes(monkeypatch):
    decoded = []
    real = dc.image_damage

    def image_damage(path, decode=False):
        if decode:
            decoded.append(path)
        return real(path, decode)

    monkeypatch.setattr(dc, 'image_damage', image_damage)
    return decoded


def test_small_set_every_image_decoded(tmp_path, monkeypatch):
    """Up to DECODE_ALL images each is decoded (the last of 40 named)."""
    cfg, root = _list_dataset(tmp_path, 40, bad=39)
    decoded = _count_decodes(monkeypatch)
    msg = dc.damaged_data_message(cfg, 'train')
    assert len(decoded) == 40
    bad = str(root / 'train' / '00039.png')
    assert msg.splitlines()[-1] == (
        f'  {bad} (for training, train_dataloader.dataset): not a decodable '
        'image (84 bytes)')


def test_large_set_seeded_sample_decoded(tmp_path, monkeypatch):
    """Above DECODE_ALL a seeded sample is decoded, all checked to exist."""
    monkeypatch.setattr(dc, 'DECODE_ALL', 20)
    monkeypatch.setattr(dc, 'SAMPLE_FILES', 5)
    cfg, root = _list_dataset(tmp_path, 25)
    decoded = _count_decodes(monkeypatch)
    assert dc.damaged_data_message(cfg, 'train') is None
    assert len(decoded) == 5 and len(set(decoded)) == 5
    first = list(decoded)
    decoded.clear()
    dc.damaged_data_message(cfg, 'train')
    assert decoded == first  # seeded: the same sample
    os.remove(root / 'train' / '00024.png')  # not decoded, still checked
    assert '00024.png (for training' in dc.damaged_data_message(cfg, 'train')


def test_a_long_list_is_checked_along_its_whole_length(tmp_path, monkeypatch):
    monkeypatch.setattr(dc, 'SAMPLE_STAT', 5)
    cfg, root = _list_dataset(tmp_path, 25)
    assert dc.damaged_data_message(cfg, 'train') is None
    os.remove(root / 'train' / '00020.png')
    assert dc.damaged_data_message(cfg, 'train').splitlines()[-1] == (
        f"  {root / 'train' / '00020.png'} (for training, train_dataloader."
        'dataset): cannot be read (No such file or directory)')


@pytest.mark.parametrize('ext, end, trailer', [
    *(('jpg', 2, t)
      for t in (b'', b'\0' * 300, b'Exif-trailer' * 50, b'\xffxy' * 3000)),
    *(('png', 12, t) for t in (b'', b'\0' * 300, b'trailer' * 1000)),
])
def test_image_with_data_after_its_end_is_whole(tmp_path, ext, end, trailer):
    """Bytes after a JPEG's end-of-image marker / a PNG's IEND (padding,
    camera data) are no truncation; a file cut before it is."""
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


@pytest.mark.parametrize('line,why', [
    ('', 'ValueError: not enough values to unpack (expected 2, got 1)'),
    ('no_label.png',
     'ValueError: not enough values to unpack (expected 2, got 1)'),
    ('x.png cat', "ValueError: invalid literal for int() with base 10: 'cat'"),
])
def test_bad_list_line_named_with_file(tmp_path, line, why):
    cfg, root = _list_dataset(tmp_path, 3)
    ann = root / 'train.txt'
    lines = ann.read_text().splitlines()
    ann.write_text('\n'.join(lines[:1] + [line] + lines[1:]) + '\n')
    msg = dc.damaged_data_message(cfg, 'train')
    assert msg.splitlines()[-1] == (
        f'  {ann} [train_dataloader.dataset]: cannot be loaded: {why}')


@pytest.mark.parametrize(
    'lines, num_classes, problem',
    [
        # an empty list (mmpretrain: "need at least one array to ...")
        ([], 5, 'has no samples (an empty list); write one line per sample '
         '("<image file> <class index>") or point ann_file at the full list'),
        (['', '  '], 5, 'has no samples (an empty list)'),
        # a class index the model has no output for (the loss fails at the
        # first batch: AssertionError / a CUDA device-side assert)
        (['00000.png 0', '00001.png 5', '00002.png 9'], 5,
         'class index 5 of {root}/train/00001.png (and 1 more samples) is '
         'out of range: the model has 5 classes (0 .. 4, '
         'model.head.num_classes); fix the list or raise '
         'model.head.num_classes'),
        (['00000.png 2'], 2, 'class index 2 of {root}/train/00000.png is out '
         'of range: the model has 2 classes (0 .. 1, model.head.num_classes)'),
        (['00000.png 4', '00001.png 0'], 5, None),  # in range
        (['00000.png 7'], None, None),  # no head: nothing to compare with
    ])
def test_empty_list_and_class_index_out_of_range(tmp_path, lines, num_classes,
                                                 problem):
    cfg, root = _list_dataset(tmp_path, 3)
    if num_classes is not None:
        cfg['model'] = dict(
            type='ImageClassifier', head=dict(num_classes=num_classes))
    ann = root / 'train.txt'
    ann.write_text('\n'.join(lines) + '\n' if lines else '')
    msg = dc.damaged_data_message(cfg, 'train')
    if problem is None:
        assert msg is None, msg
    else:
        assert msg.splitlines()[-1].startswith(
            f'  {ann} [train_dataloader.dataset]: ' +
            problem.format(root=root)), msg


@pytest.mark.parametrize('extra,refused', [
    ([], True),
    (['--resume', 'work_dirs/det/epoch_1.pth'], False),
    (['--resume'], False),
    (['--cfg-options', 'load_from=det.pth'], False),
])
def test_missing_imagenet_file_and_a_checkpoint_to_load(
        demo_det, capsys, extra, refused):
    """Issue 52: a run that loads a checkpoint needs no ImageNet file."""
    path, _ = demo_det
    cfg = Config.fromfile(path)
    cfg.model.backbone.init_cfg = dict(
        type='Pretrained', checkpoint='checkpoints/soft_norm_tiny.pth')
    cfg.dump(path)
    capsys.readouterr()
    assert dc.main(['train', path] + extra) == int(refused)
    err = capsys.readouterr().err
    assert ('error: checkpoints/soft_norm_tiny.pth '
            '(model.backbone.init_cfg.checkpoint) does not exist' in err) \
        == refused
