"""``import mmsoft`` registers; building, initialising and running a SOFT
model changes nothing else in the process (issue 34).

A fresh interpreter snapshots what a plugin could change behind its user's
back: mmengine's checkpoint loaders (``CheckpointLoader._schemes``, by
identity), ``torch.load``, the warning filters and ``showwarning``, the
handlers of the root and ``mmengine`` loggers, torch's default dtype and
thread count, and torch's weights-only allow-list. The snapshots before
``import mmsoft``, after it, after ``MODELS.build(dict(type='mmsoft.SOFT',
...))``, after ``init_weights`` with an ``init_cfg`` ``Pretrained`` and after
a forward must be equal, the allow-list included (issue 50: mmsoft widens it
only inside :func:`mmsoft.compat.mmengine_checkpoints_allowed`, around the
Runner's checkpoint loads).
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
    print(json.dumps(dict(snaps=snaps)))
''')


def test_only_import_changes_the_process():
    res = run_python(SCRIPT, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    snaps = out['snaps']
    before = snaps.pop('before')
    for stage, snap in snaps.items():
        for key, value in snap.items():
            assert value == before[key], (stage, key, before[key], value)


NUMPY_LOAD = textwrap.dedent('''
    import json, os, pickle, sys, tempfile
    import numpy as np
    import torch
    path = os.path.join(tempfile.mkdtemp(), 'array.pth')
    torch.save({'x': np.arange(3)}, path)

    def attempt():
        try:
            got = torch.load(path, weights_only=True)
            return 'loaded ' + repr(got['x'].tolist())
        except pickle.UnpicklingError as e:
            return 'refused: ' + str(e).splitlines()[0]

    out = dict(before=attempt())
    import mmsoft  # noqa
    out['after'] = attempt()
    print(json.dumps(out))
''')


def test_unrelated_weights_only_load_is_the_same_after_import():
    """A ``.pth`` holding a numpy array, which torch's weights-only unpickler
    refuses (torch >= 2.6), is refused alike after ``import mmsoft``: the
    import leaves torch's allow-list alone (issue 50)."""
    res = run_python(NUMPY_LOAD, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out['after'] == out['before']
    refused = out['before'].startswith('refused: ')
    assert refused == compat.native_allow_list(), out
