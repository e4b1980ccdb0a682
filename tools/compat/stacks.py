"""The stacks of the support matrix (``make compat``, noxfile.py).

Standard library only: the noxfile, tools/compat/matrix.py and
tests/test_compat_matrix.py import it. The claimed ranges of
``requirements/*.txt`` go from the lowest
to the highest version listed here (the upper bound is the next minor release
after the highest); the test keeps them equal.
"""

#: stack name (a nox session) -> pinned versions. ``setup_env``: the
#: verified stack, set up by tools/setup_env.sh itself.
STACKS = {
    # the oldest: what most OpenMMLab users run (mmcv 2.1.0 is the last
    # mmcv with prebuilt wheels; mmdet 3.2.0 / mmseg 1.2 / mmpretrain
    # 1.1.0 are the first releases that accept mmcv 2.1.0; the mmseg 1.2.0
    # wheel lacks mmseg/utils/bpe_simple_vocab_16e6.txt.gz, which
    # mmseg.models needs: 1.2.1 is the first that works; mmengine 0.10.0
    # does not resume bit-exactly on torch 2.1, 0.10.4 does)
    'torch2.1':
    dict(
        python='3.11',
        torch='2.1.2',
        torchvision='0.16.2',
        numpy='1.26.4',
        mmengine='0.10.4',
        mmcv='2.1.0',
        mmdet='3.2.0',
        mmseg='1.2.1',
        mmpretrain='1.1.0'),
    # the middle (torch 2.4: mmengine's import of torch.distributed.optim
    # prints an unfilterable deprecation before every tool's message;
    # the tests accept it there)
    'torch2.4':
    dict(
        python='3.11',
        torch='2.4.1',
        torchvision='0.19.1',
        numpy='1.26.4',
        mmengine='0.10.4',
        mmcv='2.1.0',
        mmdet='3.3.0',
        mmseg='1.2.2',
        mmpretrain='1.2.0'),
    # the verified stack (tools/setup_env.sh, CI)
    'torch2.14':
    dict(
        python='3.11',
        torch='2.14.1',
        torchvision='0.29.1',
        numpy='1.26.4',
        mmengine='0.10.7',
        mmcv='2.1.0',
        mmdet='3.3.0',
        mmseg='1.2.2',
        mmpretrain='1.2.0',
        setup_env=True),
}

#: pins every stack shares (as requirements/constraints.txt): numpy 1.x
#: wheels of opencv, and setuptools with pkg_resources for mmcv's build
COMMON_PINS = [
    'setuptools>=77.0.3,<81', 'opencv-python<4.12',
    'opencv-python-headless<4.12'
]

#: defined, not run into the table (none now)
NOT_RUN = {}

#: key of a stack -> distribution name
DISTS = {
    'torch': 'torch',
    'mmengine': 'mmengine',
    'mmcv': 'mmcv',
    'mmdet': 'mmdet',
    'mmseg': 'mmsegmentation',
    'mmpretrain': 'mmpretrain',
}


def _key(version):
    return tuple(int(x) for x in version.split('.')[:3])


def claimed_ranges():
    """distribution -> (lowest tested, first untested): from the lowest
    version of the matrix to the minor release after the highest."""
    out = {}
    for key, dist in DISTS.items():
        versions = sorted((s[key] for s in STACKS.values()), key=_key)
        lo, hi = versions[0], _key(versions[-1])
        out[dist] = (lo, f'{hi[0]}.{hi[1] + 1}.0')
    return out
