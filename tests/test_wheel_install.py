"""CI: mmsoft as a user gets it - a built wheel, installed non-editable.

The wheel (built from a copy of the sources) is installed without
dependencies into a throwaway virtualenv reusing this interpreter's packages
through a ``.pth`` path line (the checkout's editable mmsoft cannot shadow
it). Then, outside the checkout: (a) a user's config inheriting a shipped one
(``mim run mmsoft configs copy``) trains with ``mim train mmpretrain``,
mmsoft brought in by ``custom_imports`` only; (b) ``mim train / test mmsoft``
with mmseg / mmpretrain unimportable; (c) ``mim search mmsoft``; (d) the
shipped ``demo/image_demo.py``. A missing prerequisite fails; nothing skips.
"""
import glob
import importlib.util
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest
import torch
from conftest import ROOT, random_model

#: what the wheel is built from (the rest of a checkout is not needed)
SOURCES = ('setup.py', 'MANIFEST.in', 'README.md', 'model-index.yml',
           'requirements', 'mmsoft', 'configs', 'tools', 'demo')

IGNORE = shutil.ignore_patterns('__pycache__', '.mim', '*.pyc', '*.png',
                                '*.jpg')

BLOCKER = '''\
# simulate an environment with only mmdet: mmseg and mmpretrain are absent
import sys


class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('mmseg', 'mmpretrain'):
            raise ModuleNotFoundError(
                f'No module named {name!r} (blocked by the test)', name=name)
        return None


sys.meta_path.insert(0, _Absent())
'''

USER_CONFIG = '''\
# A user's config outside the checkout: a copied shipped base, custom_imports
_base_ = ['./mmsoft_configs/demo/soft_cls_demo.py']

custom_imports = dict(imports=['mmsoft'], allow_failed_imports=False)

my_arch = dict(embed_dims=[16, 32, 48, 64], num_heads=[1, 1, 2, 2],
               depths=[1, 1, 1, 1], sampling_ratios=[4, 2, 2, 1])
model = dict(
    backbone=dict(type='SOFT', arch=my_arch),
    head=dict(in_channels=64))
train_dataloader = dict(batch_size=5)
val_dataloader = dict(batch_size=5)
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=1, val_interval=1)
default_hooks = dict(logger=dict(interval=1), checkpoint=dict(interval=1))
'''


def _fail_unless(ok, msg):
    if not ok:
        pytest.fail(msg, pytrace=False)


def _run(cmd, cwd, env=None, timeout=600):
    proc = subprocess.run([str(c) for c in cmd],
                          cwd=str(cwd),
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        pytest.fail(
            f'command failed ({proc.returncode}): {cmd}\n'
            f'--- stdout\n{proc.stdout[-4000:]}\n'
            f'--- stderr\n{proc.stderr[-6000:]}',
            pytrace=False)
    return proc


@pytest.fixture(scope='module')
def env(tmp_path_factory):
    for mod, why in (('setuptools',
                      'to build the wheel'), ('wheel', 'to build the wheel'),
                     ('mmdet', 'for the mmdet-only run'),
                     ('mmpretrain', "for the user's classifier"),
                     ('mim', 'openmim, for mim train / test / search')):
        _fail_unless(
            importlib.util.find_spec(mod) is not None,
            f'{mod} is not installed ({why}); run bash tools/setup_env.sh')
    tmp = tmp_path_factory.mktemp('wheel_install')
    src = tmp / 'src'
    os.makedirs(src)
    for name in SOURCES:
        s = osp.join(ROOT, name)
        if osp.isdir(s):
            shutil.copytree(s, src / name, ignore=IGNORE)
        else:
            shutil.copyfile(s, src / name)
    clean = dict(os.environ)
    clean.pop('PYTHONPATH', None)
    _run([
        sys.executable, '-m', 'pip', 'wheel', '.', '--no-deps',
        '--no-build-isolation', '-q', '-w', tmp / 'dist'
    ], src, clean)
    wheels = glob.glob(str(tmp / 'dist' / 'mmsoft-*.whl'))
    _fail_unless(len(wheels) == 1, f'expected one wheel, got {wheels}')
    venv = tmp / 'venv'
    _run([
        sys.executable, '-m', 'venv', '--system-site-packages',
        '--without-pip', venv
    ], tmp, clean)
    vpy = venv / 'bin' / 'python'
    site = _run([
        vpy, '-c', 'import sysconfig; '
        'print(sysconfig.get_paths()["purelib"])'
    ], tmp, clean).stdout.strip()
    # reuse this interpreter's packages (torch, mm*, pip); a plain path
    # line: the .pth files there (the editable mmsoft) are not run
    paths = dict.fromkeys(sysconfig.get_paths()[k]
                          for k in ('purelib', 'platlib'))
    with open(osp.join(site, '_reuse_project_venv.pth'), 'w') as f:
        f.write('\n'.join(paths) + '\n')
    _run([
        vpy, '-m', 'pip', 'install', '-q', '--no-deps', '--no-index', wheels[0]
    ], tmp, clean)
    work = tmp / 'project'
    work.mkdir()
    return dict(
        tmp=tmp, vpy=vpy, site=site, wheel=wheels[0], work=work, env=clean)


def _vrun(env, *args, environ=None):
    """The venv's python with ``args``, in the project folder; its output
    (joined) and the process."""
    proc = _run([env['vpy'], *args], env['work'], environ or env['env'])
    return proc.stdout + proc.stderr, proc


def test_wheel_contents(env):
    with zipfile.ZipFile(env['wheel']) as z:
        names = set(z.namelist())
        meta = next(n for n in names if n.endswith('.dist-info/METADATA'))
        requires = [
            ln.split(':', 1)[1].strip()
            for ln in z.read(meta).decode().splitlines()
            if ln.startswith('Requires-Dist:')
        ]
    for f in ('configs/retinanet_soft_small_1x.py',
              'configs/_base_/soft_dense.py',
              'configs/demo/retinanet_soft_demo.py',
              'configs/metafiles/retinanet.yml', 'model-index.yml',
              'tools/train.py', 'tools/test.py', 'tools/dist_train.sh',
              'tools/misc/make_demo_data.py', 'demo/image_demo.py'):
        assert f'mmsoft/.mim/{f}' in names, f
    # the tools' own package (the demo data and tasks, launch, the
    # analysis scripts' shared code) ships with the tools, not in mmsoft
    for mod in ('__init__', 'demo_synthetic', 'demo_tasks', 'analysis',
                'launch', 'work_dir_lock'):
        assert f'mmsoft/.mim/tools/mmsoft_tools/{mod}.py' in names, mod
    assert not [
        n
        for n in names if 'tools_support' in n or n.startswith('mmsoft_tools')
    ]
    # checkout-only tools stay out
    assert 'mmsoft/.mim/tools/setup_env.sh' not in names
    assert not [n for n in names if n.endswith('.png')]
    core = sorted(
        r.split('<')[0].split('>')[0] for r in requires if 'extra ==' not in r)
    assert core == ['filelock', 'mmcv', 'mmengine', 'torch']
    extras = {
        r.split('extra == ')[1].strip('"\'')
        for r in requires if 'extra ==' in r
    }
    assert {'det', 'seg', 'cls', 'all', 'tests', 'lint'} <= extras


def test_installed_mmsoft_is_the_wheel(env):
    code = ('import json, os, mmsoft\n'
            'from mmsoft import configs as paths\n'
            'print(json.dumps(dict(file=mmsoft.__file__,\n'
            '    configs=paths.configs_root(),\n'
            '    link=os.path.islink(paths.configs_root()),\n'
            '    cfg=mmsoft.get_config_path("retinanet_soft_small_1x"))))\n')
    out = json.loads(_vrun(env, '-c', code)[1].stdout.splitlines()[-1])
    pkg = osp.join(env['site'], 'mmsoft')
    assert out['file'] == osp.join(pkg, '__init__.py')
    assert out['configs'] == osp.join(pkg, '.mim', 'configs')
    assert out['link'] is False  # a copy, not a link into a checkout
    assert out['cfg'] == osp.join(pkg, '.mim', 'configs',
                                  'retinanet_soft_small_1x.py')


def _make_data(env, task, num_train, num_val):
    tool = osp.join(env['site'], 'mmsoft', '.mim', 'tools', 'misc',
                    'make_demo_data.py')
    _vrun(env, tool, '--tasks', task, '--num-train', num_train, '--num-val',
          num_val, '--workers', 1)
    # the installed tool writes under the working directory
    assert osp.isdir(osp.join(env['work'], 'data', 'demo'))


@pytest.fixture(scope='module')
def cls_data(env):
    """The classification data, generated once for (a) and (d)."""
    _make_data(env, 'cls', 5, 5)


def test_user_config_with_custom_imports_trains(env, cls_data):
    """(a) the user's own config, mmpretrain's train tool."""
    work = env['work']
    _vrun(env, '-m', 'mim', 'run', 'mmsoft', 'configs', 'copy',
          'demo/soft_cls_demo.py', '--dest', 'mmsoft_configs')
    (work / 'my_soft_cls.py').write_text(USER_CONFIG)
    log, _ = _vrun(env, '-m', 'mim', 'train', 'mmpretrain', 'my_soft_cls.py',
                   '--work-dir', 'work_dirs/my_soft_cls')
    assert 'Epoch(train) [1][1/1]' in log, log[-3000:]
    assert 'accuracy/top1' in log
    assert osp.isfile(work / 'work_dirs' / 'my_soft_cls' / 'epoch_1.pth')
    # the dumped config is the user's: tiny arch, plain type, custom_imports
    text = (work / 'work_dirs' / 'my_soft_cls' / 'my_soft_cls.py').read_text()
    assert "embed_dims=[\n" in text or 'embed_dims=[16, 32, 48, 64]' in text
    assert "imports=[\n" in text or "imports=['mmsoft']" in text


def test_shipped_config_through_mim_with_mmdet_only(env):
    """(b) mim train / mim test mmsoft <shipped config>, no mmseg and no
    mmpretrain importable."""
    _make_data(env, 'det', 2, 2)
    block = env['tmp'] / 'only_mmdet'
    block.mkdir(exist_ok=True)
    (block / 'sitecustomize.py').write_text(BLOCKER)
    only_det = dict(env['env'], PYTHONPATH=str(block))
    proc = subprocess.run([str(env['vpy']), '-c', 'import mmseg'],
                          cwd=str(env['work']),
                          env=only_det,
                          capture_output=True,
                          text=True)
    assert proc.returncode != 0 and 'blocked by the test' in proc.stderr
    # an untrained detector scores low: score_thr=0
    opts = (
        'test_dataloader.batch_size=2 model.test_cfg.score_thr=0.0').split()
    wd = 'work_dirs/retinanet_soft_demo'
    log, _ = _vrun(
        env,
        '-m',
        'mim',
        'train',
        'mmsoft',
        'retinanet_soft_demo.py',
        '--work-dir',
        wd,
        '--cfg-options',
        *opts,
        *('train_cfg.max_epochs=1 train_cfg.val_interval=1 '
          'train_dataloader.batch_size=2 val_dataloader.batch_size=2 '
          'default_hooks.checkpoint.interval=1').split(),
        environ=only_det)
    assert 'Epoch(train) [1][1/1]' in log, log[-3000:]
    assert 'coco/bbox_mAP' in log
    ckpt = env['work'] / wd / 'epoch_1.pth'
    assert ckpt.is_file()
    log, _ = _vrun(
        env,
        '-m',
        'mim',
        'test',
        'mmsoft',
        'retinanet_soft_demo.py',
        '--checkpoint',
        ckpt,
        '--work-dir',
        wd + '_test',
        '--cfg-options',
        *opts,
        environ=only_det)
    assert 'Epoch(test) [1/1]' in log, log[-3000:]
    assert 'coco/bbox_mAP' in log


def test_mim_search_lists_the_models(env):
    out = _vrun(env, '-m', 'mim', 'search', 'mmsoft', '--field',
                'config')[1].stdout
    for name in ('soft_tiny_in1k', 'retinanet_soft_small_1x',
                 'mask_rcnn_soft_large_1x', 'sparse_rcnn_soft_small_3x_ms',
                 'upernet_soft_medium_512x512_160k_ade20k'):
        assert name in out, out[-3000:]


def test_installed_image_demo_runs(env, cls_data):
    """(d) the inference quick-start from the install (mmsoft/.mim/demo, as
    mmdet ships demo/): image_demo.py on a shipped config + checkpoint."""
    work = env['work']
    mim = osp.join(env['site'], 'mmsoft', '.mim')
    cfg = osp.join(mim, 'configs', 'demo', 'soft_cls_demo.py')
    # the random checkpoint is built here (the model is the checkout's,
    # the same code as the wheel's): what runs from the install is the demo
    torch.save(
        dict(state_dict=random_model(cfg).state_dict(), meta=dict()),
        str(work / 'cls_random.pth'))
    demo = osp.join(mim, 'demo', 'image_demo.py')
    _fail_unless(osp.isfile(demo), f'{demo} is not installed')
    out = _vrun(env, demo, 'data/demo/imagenet/val', cfg, 'cls_random.pth',
                '--out-dir', 'outputs/cls')[1].stdout
    assert 'classification: ' in out, out
    preds, vis = (glob.glob(
        str(work / 'outputs' / 'cls' / d / '**' / f'*.{e}'), recursive=True)
                  for d, e in (('preds', 'json'), ('vis', 'png')))
    assert preds and len(preds) == len(vis)
    with open(preds[0]) as f:
        pred = json.load(f)
    assert pred['task'] == 'classification' and 'pred_score' in pred
