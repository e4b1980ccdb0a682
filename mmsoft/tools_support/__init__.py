"""What mmsoft's tools need and the library does not: not the library.

The library is the rest of ``mmsoft`` (models, engine hooks, utils,
configs); nothing in it imports this subpackage. The code here serves the
scripts in ``tools/`` - run from a checkout (``python tools/train.py``) or
installed (``mim train mmsoft ...`` runs the copies in
``mmsoft/.mim/tools``) - and the checkout's demo. The scripts import it as
any other module; nothing here loads files from ``tools/``.

* :mod:`.launch` - one ``tools/train.py`` / ``tools/test.py`` for
  mmpretrain, mmdet and mmseg configs: the codebase from
  ``default_scope``, ``--launcher pytorch`` without CUDA, ``--amp`` on CPU.
* :mod:`.data_check` - the data a config needs is on disk, checked before
  any worker starts (``python -m mmsoft.tools_support.data_check``).
* :mod:`.deploy` - ONNX export and verification
  (``tools/deployment/pytorch2onnx.py``, ``benchmark_onnx.py``).
* :mod:`.cli` - argparse types and options shared by the tools.
* :mod:`.analysis` - what the scripts of ``tools/analysis`` share
  (models, inputs, timing, figures).
* :mod:`.demo_synthetic`, :mod:`.demo_tasks` - the synthetic COCO / ADE20K
  / ImageNet data and the demo tasks of ``make demo``
  (``tools/demo.py``, ``tools/misc/make_demo_data.py``).

The submodules are imported on demand (``from mmsoft.tools_support import
demo_tasks``): importing this package imports none of them.
"""
