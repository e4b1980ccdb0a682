"""mmsoft: SOFT (softmax-free transformers) for OpenMMLab.

``pip install .`` / a wheel ship the configs, the tools and the model index
inside the package, as mmdet / mmseg / mmpretrain do: ``mmsoft/.mim/`` holds
copies of ``configs/`` (found by :mod:`mmsoft.configs`), ``tools/``
(with the tools' own package, ``tools/mmsoft_tools``), ``demo/``
(``image_demo.py``, the inference quick-start) and ``model-index.yml`` (for
``mim``); an editable install (``pip install -e .``) links
them instead (``mmsoft/.mim/* -> ../../configs`` ...), so that edits show at
once. The core installs torch, mmengine and mmcv; the codebases are extras:
``mmsoft[det]``, ``mmsoft[seg]``, ``mmsoft[cls]``, ``mmsoft[all]``.
"""
import os
import os.path as osp
import shutil
import sys
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = osp.dirname(osp.abspath(__file__))

#: what ships in mmsoft/.mim (source, files to skip)
MIM_FILES = ('configs', 'tools', 'demo', 'model-index.yml')
#: checkout-only tools (they set up or lint the checkout itself)
MIM_SKIP_TOOLS = ('setup_env.sh', 'demo.py', 'lint.sh')


def read_version():
    ns = {}
    with open(osp.join(HERE, 'mmsoft', 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__']


def read_requirements(name):
    path = osp.join(HERE, 'requirements', name)
    if not osp.exists(path):
        return []
    with open(path) as f:
        return [
            ln.split('#')[0].strip() for ln in f if ln.split('#')[0].strip()
        ]


def _ignore(src, names):
    """shutil.copytree filter: no caches, no figures, no checkout tools."""
    skip = {'__pycache__'}
    skip.update(n for n in names if n.endswith(('.pyc', '.png', '.jpg')))
    if osp.basename(src) == 'tools':
        skip.update(MIM_SKIP_TOOLS)
    return skip


def copy_mim_files(dst):
    """Copy configs/, tools/, demo/ and model-index.yml into ``dst`` (.mim)."""
    os.makedirs(dst, exist_ok=True)
    for name in MIM_FILES:
        src, tar = osp.join(HERE, name), osp.join(dst, name)
        if osp.islink(tar) or osp.isfile(tar):
            os.remove(tar)
        elif osp.isdir(tar):
            shutil.rmtree(tar)
        if osp.isdir(src):
            shutil.copytree(src, tar, ignore=_ignore)
        elif osp.isfile(src):
            shutil.copyfile(src, tar)


def link_mim_files():
    """Editable installs: mmsoft/.mim/<name> -> ../../<name> (relative
    symlinks into the checkout; copies where symlinks are unavailable)."""
    dst = osp.join(HERE, 'mmsoft', '.mim')
    os.makedirs(dst, exist_ok=True)
    for name in MIM_FILES:
        src, tar = osp.join(HERE, name), osp.join(dst, name)
        if not osp.exists(src):
            continue
        if osp.islink(tar) or osp.isfile(tar):
            os.remove(tar)
        elif osp.isdir(tar):
            shutil.rmtree(tar)
        try:
            os.symlink(osp.relpath(src, dst), tar)
        except OSError:  # e.g. Windows without developer mode
            if osp.isdir(src):
                shutil.copytree(src, tar, ignore=_ignore)
            else:
                shutil.copyfile(src, tar)


class BuildPyWithMim(build_py):
    """build_py that also puts the .mim files into the built package
    (wheels, ``pip install .``), without touching the source tree."""

    def run(self):
        super().run()
        if not getattr(self, 'editable_mode', False):
            copy_mim_files(osp.join(self.build_lib, 'mmsoft', '.mim'))


if any(cmd in sys.argv for cmd in ('develop', 'editable_wheel')):
    link_mim_files()

extras = {
    'det': read_requirements('det.txt'),
    'seg': read_requirements('seg.txt'),
    'cls': read_requirements('cls.txt'),
}
extras['all'] = sorted({r for v in extras.values() for r in v})
extras['tests'] = read_requirements('tests.txt')
extras['lint'] = read_requirements('lint.txt')
extras['docs'] = read_requirements('docs.txt')
if read_requirements('deploy.txt'):
    extras['deploy'] = read_requirements('deploy.txt')

setup(
    name='mmsoft',
    version=read_version(),
    description='SOFT: softmax-free linear transformers as an OpenMMLab '
    'plugin (mmpretrain, mmdet, mmseg)',
    long_description=open(osp.join(HERE, 'README.md')).read() if osp.exists(
        osp.join(HERE, 'README.md')) else '',
    long_description_content_type='text/markdown',
    keywords='computer vision, vision transformer, linear attention, '
    'OpenMMLab',
    # tools/ (and its mmsoft_tools) ships as data in mmsoft/.mim, not as a
    # top-level package; projects/ (as mmdet's) stays in the checkout
    packages=find_packages(
        exclude=('configs', 'tools', 'tools.*', 'tests', 'tests.*', 'projects',
                 'projects.*')),
    python_requires='>=3.8',
    install_requires=read_requirements('runtime.txt'),
    extras_require=extras,
    cmdclass={'build_py': BuildPyWithMim},
    license='Apache License 2.0',
    zip_safe=False,
)
