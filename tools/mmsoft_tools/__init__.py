"""What mmsoft's tools need and the library does not (docs/en/advanced_guides/
architecture.md): it ships with them (``mmsoft/.mim/tools``); ``mmsoft``
never imports it. A script in ``tools/`` finds it beside itself, one in a
sub-folder puts ``tools/`` first on ``sys.path`` (the only path edit of the
tools: tests/test_tools/test_tool_cli.py). Submodules import on demand."""
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
