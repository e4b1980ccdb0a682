"""What mmsoft's tools need and the library does not.

It lives in ``tools/`` and ships with them (``mmsoft/.mim/tools``, where
``mim train mmsoft ...`` runs them); the ``mmsoft`` package does not know
it. A script in ``tools/`` finds it next to itself (Python puts the
script's folder on the module search path); a script in a sub-folder puts
``tools/`` first there with the same two lines as the others (the only path
edit of the tools: tests/test_tools/test_tool_cli.py).

* :mod:`.launch` - one ``tools/train.py`` / ``tools/test.py`` for
  mmpretrain, mmdet and mmseg configs: the codebase from
  ``default_scope``, ``--launcher pytorch`` without CUDA, ``--amp`` on CPU,
  one run per work dir (:mod:`.work_dir_lock`).
* :mod:`.data_check` - the data a config needs is on disk, checked before
  any worker starts (``python tools/mmsoft_tools/data_check.py``).
* :mod:`.deploy` - ONNX export and verification
  (``tools/deployment/pytorch2onnx.py``, ``benchmark_onnx.py``).
* :mod:`.cli` - argparse types and options shared by the tools.
* :mod:`.analysis` - what the scripts of ``tools/analysis`` share
  (models, inputs, timing, figures).
* :mod:`.demo_synthetic`, :mod:`.demo_tasks` - the synthetic COCO / ADE20K
  / ImageNet data and the demo tasks of ``make demo``
  (``tools/demo.py``, ``tools/misc/make_demo_data.py``).

The submodules are imported on demand.
"""
import os.path as osp

#: the tools folder: ``<checkout>/tools`` or ``<site>/mmsoft/.mim/tools``
TOOLS_DIR = osp.dirname(osp.dirname(osp.abspath(__file__)))


def checkout_root():
    """The repository root when the tools run from a checkout (also through
    an editable install's ``.mim`` links), else None."""
    root = osp.dirname(osp.realpath(TOOLS_DIR))
    if (osp.isfile(osp.join(root, 'setup.py'))
            and osp.isdir(osp.join(root, 'configs'))):
        return root
    return None


def import_root():
    """The folder that holds the ``mmsoft`` the tools import (a child
    process with it first on ``PYTHONPATH`` imports the same one)."""
    import mmsoft
    return osp.dirname(osp.dirname(osp.abspath(mmsoft.__file__)))
