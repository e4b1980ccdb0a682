"""What mmsoft's tools need and the library does not; ``mmsoft`` never
imports it. Scripts in sub-folders put ``tools/`` first on ``sys.path``."""
import os.path as osp

#: the tools folder: ``<checkout>/tools`` or ``<site>/mmsoft/.mim/tools``
TOOLS_DIR = osp.dirname(osp.dirname(osp.abspath(__file__)))


def checkout_root():
    """The repository root when run from a checkout, else None."""
    root = osp.dirname(osp.realpath(TOOLS_DIR))
    if (osp.isfile(osp.join(root, 'setup.py'))
            and osp.isdir(osp.join(root, 'configs'))):
        return root
    return None


def import_root():
    """The folder holding the ``mmsoft`` the tools import."""
    import mmsoft
    return osp.dirname(osp.dirname(osp.abspath(mmsoft.__file__)))
