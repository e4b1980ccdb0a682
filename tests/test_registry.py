"""SOFT is reachable from mmpretrain, mmdet and mmseg configs."""
import pytest
from conftest import tiny_arch
from mmengine.registry import DefaultScope

import mmsoft
from mmsoft.models.backbones import SOFT

TINY = tiny_arch(num_heads=[1, 1, 2, 2])


# a plain type: mmengine's root registry; 'mmsoft.SOFT': mmsoft's scope
@pytest.mark.parametrize('codebase, type_name', [('mmpretrain', 'SOFT'),
                                                 ('mmseg', 'mmsoft.SOFT')])
def test_build_from_codebase_registry(codebase, type_name, monkeypatch):
    """Attentions too (mmsoft's ATTENTIONS), without mmengine's "Failed to
    search registry with scope ..." warning."""
    import mmengine.logging as mm_logging
    assert mmsoft.MODELS.get('SOFT') is SOFT
    assert mmsoft.MODELS.scope == 'mmsoft'
    logged = []
    real_print_log = mm_logging.print_log

    def print_log(msg, *args, **kwargs):
        logged.append(str(msg))
        return real_print_log(msg, *args, **kwargs)

    monkeypatch.setattr(mm_logging, 'print_log', print_log)
    registry = pytest.importorskip(f'{codebase}.registry')
    with DefaultScope.overwrite_default_scope(codebase):
        model = registry.MODELS.build(dict(type=type_name, arch=TINY))
    assert isinstance(model, SOFT)
    assert type(model.stages[0].blocks[0].attn).__name__ == 'SOFTAttention'
    assert not [m for m in logged if 'Failed to search registry' in m]
