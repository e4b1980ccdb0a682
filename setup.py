"""mmsoft: SOFT (softmax-free transformers) for OpenMMLab."""
import os.path as osp

from setuptools import find_packages, setup

HERE = osp.dirname(osp.abspath(__file__))


def read_version():
    ns = {}
    with open(osp.join(HERE, 'mmsoft', 'version.py')) as f:
        exec(f.read(), ns)
    return ns['__version__']


def read_requirements(name):
    with open(osp.join(HERE, 'requirements', name)) as f:
        return [ln.split('#')[0].strip() for ln in f
                if ln.split('#')[0].strip()]


setup(
    name='mmsoft',
    version=read_version(),
    description='SOFT: softmax-free linear transformers as an OpenMMLab plugin '
    '(mmpretrain, mmdet, mmseg)',
    long_description=open(osp.join(HERE, 'README.md')).read()
    if osp.exists(osp.join(HERE, 'README.md')) else '',
    long_description_content_type='text/markdown',
    packages=find_packages(exclude=('configs', 'tools', 'tests')),
    python_requires='>=3.8',
    install_requires=read_requirements('runtime.txt'),
    extras_require={'tests': read_requirements('tests.txt')},
    license='Apache License 2.0',
    zip_safe=False,
)
