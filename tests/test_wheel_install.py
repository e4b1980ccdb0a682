"""mmsoft as a user gets it: a wheel from a copy of the sources in a venv
reusing this interpreter's packages (a ``.pth`` path line: not the editable
mmsoft); outside the checkout, mmseg / mmpretrain unimportable: ``mim train``
and the installed ``demo/image_demo.py``. Nothing skips."""
import glob
import importlib.util
import json
import os
import os.path as osp
import shutil
import sys
import sysconfig
import zipfile

import pytest
from conftest import ROOT, run

SOURCES = ('setup.py', 'MANIFEST.in', 'README.md', 'model-index.yml',
           'requirements', 'mmsoft', 'configs', 'tools', 'demo')

#: only mmdet: mmseg and mmpretrain absent
BLOCKER = '''import sys
class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('mmseg', 'mmpretrain'):
            raise ModuleNotFoundError(
                f'No module named {name!r} (blocked by the test)', name=name)
sys.meta_path.insert(0, _Absent())
'''

#: where mmsoft is, read without importing it (no torch: a cheap process)
WHERE = '''import importlib.util as u, json, os
pkg = os.path.dirname(u.find_spec('mmsoft').origin)
spec = u.spec_from_file_location('c', os.path.join(pkg, 'configs.py'))
c = u.module_from_spec(spec)
spec.loader.exec_module(c)
print(json.dumps([pkg, c.configs_root(), os.path.islink(c.configs_root()),
                  c.get_config_path('retinanet_soft_small_1x')]))
'''


def _run(cmd, cwd, env):
    proc = run(cmd, cwd=cwd, env=env)
    if proc.returncode != 0:
        pytest.fail(
            f'command failed ({proc.returncode}): {cmd}\n--- stdout\n'
            f'{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}',
            pytrace=False)
    return proc.stdout + proc.stderr


@pytest.fixture(scope='module')
def env(tmp_path_factory):
    missing = [m for m in ('setuptools', 'wheel', 'mmdet', 'mim')
               if importlib.util.find_spec(m) is None]  # yapf: disable
    assert not missing, f'{missing} not installed; run tools/setup_env.sh'
    tmp = tmp_path_factory.mktemp('wheel_install')
    ignore = shutil.ignore_patterns('__pycache__', '.mim', '*.pyc', '*.png',
                                    '*.jpg')
    (tmp / 'src').mkdir()
    for name in SOURCES:
        src, dst = osp.join(ROOT, name), tmp / 'src' / name
        (shutil.copytree(src, dst, ignore=ignore) if osp.isdir(src) else
         shutil.copyfile(src, dst))  # yapf: disable
    clean = dict(os.environ, OMP_NUM_THREADS='1')  # tiny ops: one thread
    clean.pop('PYTHONPATH', None)
    _run([sys.executable, '-m', 'pip', 'wheel', '.', '--no-deps',
          '--no-build-isolation', '-q', '-w', tmp / 'dist'], tmp / 'src',
         clean)  # yapf: disable
    wheels = glob.glob(str(tmp / 'dist' / 'mmsoft-*.whl'))
    assert len(wheels) == 1, wheels
    venv = tmp / 'venv'
    _run([sys.executable, '-m', 'venv', '--system-site-packages',
          '--without-pip', venv], tmp, clean)  # yapf: disable
    site = sysconfig.get_paths('venv', dict(base=venv,
                                            platbase=venv))['purelib']
    # this interpreter's packages; a path line: their .pth files do not run
    paths = dict.fromkeys(sysconfig.get_paths()[k]
                          for k in ('purelib', 'platlib'))
    with open(osp.join(site, '_reuse_project_venv.pth'), 'w') as f:
        f.write('\n'.join(paths) + '\n')
    vpy = venv / 'bin' / 'python'
    _run([vpy, '-m', 'pip', 'install', '-q', '--no-deps', '--no-index',
          wheels[0]], tmp, clean)  # yapf: disable
    work = tmp / 'project'
    work.mkdir()
    e = dict(vpy=vpy, site=site, wheel=wheels[0], work=work, env=clean)
    tool = osp.join(site, 'mmsoft', '.mim', 'tools', 'misc',
                    'make_demo_data.py')  # writes under the working dir
    _vrun(e, tool,
          *'--tasks det --num-train 2 --num-val 2 --workers 1'.split())
    assert os.listdir(work / 'data' / 'demo') == ['coco']
    return e


def _vrun(env, *args, environ=None):
    """The venv's python with ``args`` in the project folder: its output."""
    return _run([env['vpy'], *args], env['work'], environ or env['env'])


def test_wheel_contents_and_the_installed_package(env):
    with zipfile.ZipFile(env['wheel']) as z:
        names = set(z.namelist())
        meta = next(n for n in names if n.endswith('.dist-info/METADATA'))
        requires = [ln.split(':', 1)[1].strip()
                    for ln in z.read(meta).decode().splitlines()
                    if ln.startswith('Requires-Dist:')]  # yapf: disable
    for f in ('configs/retinanet_soft_small_1x.py',
              'configs/_base_/soft_dense.py',
              'configs/demo/retinanet_soft_demo.py',
              'configs/metafiles/retinanet.yml', 'model-index.yml',
              'tools/train.py', 'tools/test.py', 'tools/dist_train.sh',
              'tools/misc/make_demo_data.py', 'demo/image_demo.py'):
        assert f'mmsoft/.mim/{f}' in names, f
    # the tools' package ships with the tools, not in mmsoft
    for mod in ('mmsoft_tools/__init__', 'demo_synthetic',
                'mmsoft_tools/work_dir_lock', 'model_converters/__init__'):
        assert f'mmsoft/.mim/tools/{mod}.py' in names, mod
    assert not [n for n in names if n.startswith('mmsoft_tools')]
    # checkout-only tools stay out
    assert 'mmsoft/.mim/tools/setup_env.sh' not in names
    assert not [n for n in names if n.endswith('.png')]
    core = sorted(
        r.split('<')[0].split('>')[0] for r in requires if 'extra ==' not in r)
    assert core == ['filelock', 'mmcv', 'mmengine', 'torch']
    extras = {r.split('extra == ')[1].strip('"\'')
              for r in requires if 'extra ==' in r}  # yapf: disable
    assert {'det', 'seg', 'cls', 'all', 'tests', 'lint'} <= extras
    # installed: the wheel's copy, not a link into a checkout
    out = json.loads(_vrun(env, '-c', WHERE).splitlines()[-1])
    pkg = osp.join(env['site'], 'mmsoft')
    cfgs = osp.join(pkg, '.mim', 'configs')
    assert out == [pkg, cfgs, False, f'{cfgs}/retinanet_soft_small_1x.py']


def test_mim_train_with_mmdet_only_and_the_installed_image_demo(env):
    """The demo installed as mmdet ships demo/ (mmsoft/.mim/demo)."""
    block = env['work'].parent / 'only_mmdet'
    block.mkdir(exist_ok=True)
    (block / 'sitecustomize.py').write_text(BLOCKER)
    only_det = dict(env['env'], PYTHONPATH=str(block))
    proc = run([env['vpy'], '-c', 'import mmseg'], env['work'], env=only_det)
    assert proc.returncode != 0 and 'blocked by the test' in proc.stderr
    wd = 'work_dirs/retinanet_soft_demo'
    log = _vrun(
        env,
        *('-m mim train mmsoft retinanet_soft_demo.py --work-dir '
          f'{wd} --cfg-options train_cfg.max_epochs=1 '
          'train_cfg.val_interval=2 train_dataloader.batch_size=2 '
          'default_hooks.checkpoint.interval=1').split(),
        environ=only_det)
    assert 'Epoch(train) [1][1/1]' in log, log[-3000:]
    ckpt = env['work'] / wd / 'epoch_1.pth'
    assert ckpt.is_file()
    demo = osp.join(env['site'], 'mmsoft', '.mim', 'demo', 'image_demo.py')
    args = ('data/demo/coco/val', f'{wd}/retinanet_soft_demo.py', ckpt,
            '--out-dir', 'outputs/det')  # the config the run dumped
    out = _vrun(env, demo, *args, environ=only_det)
    assert 'detection: ' in out, out
    preds, vis = (glob.glob(f"{env['work']}/outputs/det/{d}/**/*.{e}",
                            recursive=True)
                  for d, e in (('preds', 'json'), ('vis', '*'))
                  )  # yapf: disable
    assert preds and len(preds) == len(vis)
    with open(preds[0]) as f:
        pred = json.load(f)
    assert pred['task'] == 'detection' and 'bboxes' in pred
