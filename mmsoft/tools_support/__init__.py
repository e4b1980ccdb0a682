"""What mmsoft's tools need and the library does not: not the library.

The library is the rest of ``mmsoft`` (models, engine hooks, utils,
configs); nothing in it imports this subpackage. The code here serves the
scripts in ``tools/`` - run from a checkout (``python tools/train.py``) or
installed (``mim train mmsoft ...`` runs the copies in
``mmsoft/.mim/tools``) - and the checkout's demo:

* :mod:`.launch` - one ``tools/train.py`` / ``tools/test.py`` for
  mmpretrain, mmdet and mmseg configs: the codebase from
  ``default_scope``, ``--launcher pytorch`` without CUDA, ``--amp`` on CPU.
* :mod:`.data_check` - the data a config needs is on disk, checked before
  any worker starts (``python -m mmsoft.tools_support.data_check``).
* :mod:`.deploy` - ONNX export and verification
  (``tools/deployment/pytorch2onnx.py``, ``benchmark_onnx.py``).
* :mod:`.cli` - argparse types shared by the tools.
* :func:`demo_synthetic`, :func:`demo_tasks` - the synthetic COCO / ADE20K
  / ImageNet data and the demo tasks of ``make demo``. They are no part of
  the package: they live in ``tools/demo_support/`` (shipped with the tools
  in ``mmsoft/.mim/tools``) and are loaded from there by path
  (:func:`load_tool_module`).

Helpers used by the analysis scripts only live next to them, in
``tools/analysis/utils.py``.
"""
import importlib.util
import os.path as osp
import sys

__all__ = ['load_tool_module', 'demo_synthetic', 'demo_tasks']


def load_tool_module(relpath: str, name: str):
    """The file ``tools/<relpath>`` (the checkout's, or the installed
    ``mmsoft/.mim/tools``) as a module registered as ``sys.modules[name]``
    (so that forked workers and pickle find its functions), loaded once."""
    if name in sys.modules:
        return sys.modules[name]
    from mmsoft.utils.paths import tools_root
    path = osp.join(tools_root(), relpath)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'{path} is missing: the tools of this mmsoft are incomplete; '
            f'reinstall mmsoft (pip install mmsoft, or pip install -e . in '
            f'a checkout)')
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


def demo_synthetic():
    """``tools/demo_support/synthetic.py``: the synthetic demo data sets
    (the module ``tools/misc/make_demo_data.py`` loads, under the same
    name)."""
    return load_tool_module('demo_support/synthetic.py',
                            '_mmsoft_demo_synthetic')


def demo_tasks():
    """``tools/demo_support/tasks.py``: the three demo tasks of
    ``make demo`` (configs, training, metrics, drawings)."""
    return load_tool_module('demo_support/tasks.py', '_mmsoft_demo_tasks')
