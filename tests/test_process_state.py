"""``import mmsoft`` and building, initialising, running a SOFT change nothing
else in the process (issues 34, 50): one fresh interpreter's snapshots."""
import json
import os.path as osp
import textwrap

from conftest import ROOT, run_python

SCRIPT = textwrap.dedent('''
    import json, logging, os, pickle, sys, tempfile, warnings
    import numpy as np
    import torch
    # mmsoft's stack imported before the first snapshot: its state is its own
    import mmengine.hooks, mmengine.model, mmengine.optim, mmengine.runner
    from mmengine.logging import MMLogger
    from mmengine.registry import MODELS
    from mmengine.runner.checkpoint import CheckpointLoader
    MMLogger.get_current_instance()
    warnings.simplefilter('always')
    caught = []
    warnings.showwarning = lambda msg, *a, **k: caught.append(str(msg))
    tmp = tempfile.mkdtemp()
    array = os.path.join(tmp, 'array.pth')
    torch.save({'x': np.arange(3)}, array)

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

    def load_array():
        try:
            got = torch.load(array, weights_only=True)
            return 'loaded ' + repr(got['x'].tolist())
        except pickle.UnpicklingError as e:
            return 'refused: ' + str(e).splitlines()[0]

    snaps, loads = dict(before=snapshot()), [load_array()]
    import mmsoft  # noqa
    at_import = list(caught)
    heavy = [m for m in ('mmdet', 'mmseg', 'mmpretrain', 'mmcv')
             if m in sys.modules]
    snaps['import'] = snapshot()
    loads.append(load_array())
    arch = dict(embed_dims=[8, 8, 8, 8], num_heads=[1, 1, 1, 1],
                depths=[1, 1, 1, 1])
    model = MODELS.build(dict(type='mmsoft.SOFT', arch=arch))
    snaps['build'] = snapshot()
    path = os.path.join(tmp, 'soft.pth')
    torch.save(dict(state_dict=model.state_dict()), path)
    model = MODELS.build(dict(
        type='mmsoft.SOFT', arch=arch,
        init_cfg=dict(type='Pretrained', checkpoint=path)))
    model.init_weights()
    snaps['init_weights'] = snapshot()
    with torch.no_grad():
        model.eval()(torch.rand(1, 3, 64, 64))
    snaps['forward'] = snapshot()
    print(json.dumps(dict(snaps=snaps, loads=loads, file=mmsoft.__file__,
                          heavy=heavy, at_import=at_import)))
''')


def test_import_changes_nothing_process_wide(tmp_path):
    """This checkout's mmsoft, no codebase import, no warning of its own."""
    res = run_python(SCRIPT, cwd=tmp_path, PYTHONPATH=ROOT)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    snaps = dict(out['snaps'])
    before = snaps.pop('before')
    for stage, snap in snaps.items():
        for key, value in snap.items():
            assert value == before[key], (stage, key, before[key], value)
    assert out['file'] == osp.join(ROOT, 'mmsoft', '__init__.py')
    assert out['heavy'] == []
    assert not [w for w in out['at_import'] if 'mmsoft' in w], out
    before, after = out['loads']
    assert after == before
    assert before.startswith('refused: '), out  # torch 2.1 to 2.14
