"""``import mmsoft`` registers; building, initialising and running a SOFT
model changes nothing else in the process (issue 34).

A fresh interpreter snapshots what a plugin could change behind its user's
back: mmengine's checkpoint loaders (``CheckpointLoader._schemes``, by
identity), ``torch.load``, the warning filters and ``showwarning``, the
handlers of the root and ``mmengine`` loggers, torch's default dtype and
thread count, and torch's weights-only allow-list. The snapshots before
``import mmsoft``, after it, after ``MODELS.build(dict(type='mmsoft.SOFT',
...))``, after ``init_weights`` with an ``init_cfg`` ``Pretrained`` and after
a forward must be equal, except the allow-list, which only ``import mmsoft``
may extend (torch >= 2.6: :func:`mmsoft.compat.register_safe_globals`).
"""
import json
import textwrap

from conftest import run_python

from mmsoft import compat

SCRIPT = textwrap.dedent('''
    import json, logging, os, sys, tempfile, warnings
    import torch
    # what mmsoft imports from its stack, imported (and mmengine's current
    # logger made) before the first snapshot: their import-time state is
    # theirs, not mmsoft's
    import mmengine.hooks, mmengine.model, mmengine.optim, mmengine.runner
    from mmengine.logging import MMLogger
    from mmengine.registry import MODELS
    from mmengine.runner.checkpoint import CheckpointLoader
    MMLogger.get_current_instance()

    def snapshot():
        get = getattr(torch.serialization, 'get_safe_globals', list)
        return dict(
            schemes={k: id(v) for k, v in CheckpointLoader._schemes.items()},
            torch_load=id(torch.load),
            filters=[repr(f) for f in warnings.filters],
            showwarning=id(warnings.showwarning),
            root_handlers=[id(h) for h in logging.getLogger().handlers],
            mmengine_handlers=[
                id(h) for h in logging.getLogger('mmengine').handlers],
            dtype=str(torch.get_default_dtype()),
            threads=torch.get_num_threads(),
            allow_list=sorted(map(str, get())))

    snaps = dict(before=snapshot())
    import mmsoft  # noqa
    snaps['import'] = snapshot()
    entries = sorted(map(str, mmsoft.compat.MMENGINE_SAFE_GLOBALS))
    arch = dict(embed_dims=[8, 8, 8, 8], num_heads=[1, 1, 1, 1],
                depths=[1, 1, 1, 1])
    model = MODELS.build(dict(type='mmsoft.SOFT', arch=arch))
    snaps['build'] = snapshot()
    path = os.path.join(tempfile.mkdtemp(), 'soft.pth')
    torch.save(dict(state_dict=model.state_dict()), path)
    model = MODELS.build(dict(
        type='mmsoft.SOFT', arch=arch,
        init_cfg=dict(type='Pretrained', checkpoint=path)))
    model.init_weights()
    snaps['init_weights'] = snapshot()
    with torch.no_grad():
        model.eval()(torch.rand(1, 3, 64, 64))
    snaps['forward'] = snapshot()
    print(json.dumps(dict(snaps=snaps, entries=entries)))
''')


def test_only_import_changes_the_process():
    res = run_python(SCRIPT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    snaps = out['snaps']
    before = snaps.pop('before')
    after_import = snaps['import']
    for stage, snap in snaps.items():
        for key, value in snap.items():
            if key == 'allow_list':
                # only import mmsoft adds to the allow-list ...
                assert value == after_import['allow_list'], stage
            else:
                assert value == before[key], (stage, key, before[key], value)
    # ... and exactly mmsoft's entries (torch >= 2.6), nothing before
    added = set(after_import['allow_list']) - set(before['allow_list'])
    assert set(before['allow_list']) <= set(after_import['allow_list'])
    assert added == (
        set(out['entries']) if compat.native_allow_list() else set())
    assert bool(added) == compat.native_allow_list()
