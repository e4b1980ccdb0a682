""":mod:`mmsoft.compat`: inside ``mmengine_checkpoints_allowed`` (what
SafeCheckpointHook enters around the Runner's loads) mmengine's training
checkpoints load weights-only on torch >= 2.6; outside it, and in a fresh
process before and after ``import mmsoft``, they fail as without mmsoft."""
import json
import os
import pickle
import sys
import textwrap
import uuid
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import ROOT, needs_torch, run, run_python
from mmengine.logging import HistoryBuffer, MessageHub

from mmsoft import compat
from mmsoft.utils import safe_load

needs_weights_only = needs_torch(
    '2.6', 'torch.load weights-only by default, allow-list with names')


def _mmengine_checkpoint(path):
    """A checkpoint laid out like ``Runner.save_checkpoint`` writes it."""
    model = nn.Linear(4, 3)
    hub = MessageHub.get_instance(f'mmsoft_test_compat_{uuid.uuid4().hex}')
    for i in range(3):
        hub.update_scalar('train/loss', 1.0 / (i + 1))
        hub.update_scalar('train/lr', 0.1)
    hub.update_scalar('val/acc', 0.5)
    hub.update_info('iter', 3)
    hub.update_info('best_score', np.float64(0.75))  # a numpy scalar
    ckpt = dict(
        meta=dict(epoch=0, iter=3, cfg='', seed=0, mmengine_version='0.10.7'),
        state_dict=model.state_dict(),
        message_hub=hub.state_dict(),
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1).state_dict(),
        param_schedulers=[],
        extra=dict(arrays=[
            np.array([0, 1, 2]).astype(dt)
            for dt in ('int32', 'int64', 'float32', 'float64', 'bool')
        ]),
    )
    torch.save(ckpt, path)
    return ckpt, model


@pytest.fixture
def allowed():
    """Inside mmsoft's allow-list context (as the Runner's loads are)."""
    with compat.mmengine_checkpoints_allowed():
        yield


@needs_weights_only
def test_allow_list_is_scoped():
    """The context adds and removes exactly mmengine's entries."""

    def get():  # torch keeps a set: its order is no property
        return set(torch.serialization.get_safe_globals())

    before = get()
    entries = safe_load.mmengine_safe_globals()
    with compat.mmengine_checkpoints_allowed():
        inside = get()
        assert inside == before | set(entries)
        with compat.mmengine_checkpoints_allowed():
            assert get() == inside
        assert get() == inside
    assert get() == before
    torch.serialization.add_safe_globals([entries[0]])  # the user's own
    try:
        with compat.mmengine_checkpoints_allowed():
            pass
        assert get() == before | {entries[0]}
    finally:
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(list(before))
    assert get() == before


@needs_weights_only
def test_torch_load_fails_outside_the_context(tmp_path):
    path = tmp_path / 'iter_3.pth'
    _mmengine_checkpoint(path)
    with pytest.raises(pickle.UnpicklingError, match='HistoryBuffer'):
        torch.load(path)
    unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    assert {  # getattr: HistoryBuffer.statistics_methods
        'mmengine.logging.history_buffer.HistoryBuffer', 'builtins.getattr',
        'numpy.ndarray', 'numpy.dtype'
    } <= unsafe
    assert any(g.endswith('multiarray._reconstruct') for g in unsafe)
    assert any(g.endswith('multiarray.scalar') for g in unsafe)


@needs_weights_only
def test_mmengine_checkpoint_loads_weights_only(tmp_path, allowed):
    path = tmp_path / 'iter_3.pth'
    ckpt, _ = _mmengine_checkpoint(path)
    loaded = torch.load(path)  # weights_only=True is torch's default
    loaded_wo = torch.load(path, weights_only=True)
    for got in (loaded, loaded_wo):
        assert got['meta'] == ckpt['meta']
        for k, v in ckpt['state_dict'].items():
            torch.testing.assert_close(got['state_dict'][k], v)
        for a, b in zip(got['extra']['arrays'], ckpt['extra']['arrays']):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        best = got['message_hub']['runtime_info']['best_score']
        assert type(best) is np.float64 and best == 0.75
        buf = got['message_hub']['log_scalars']['train/loss']
        assert isinstance(buf, HistoryBuffer)
        np.testing.assert_allclose(buf.data[0], [1.0, 0.5, 1.0 / 3])
        # statistics methods came back through the restricted getattr
        assert buf.statistics('mean') == pytest.approx((1 + .5 + 1 / 3) / 3)
        assert buf.current() == pytest.approx(1 / 3)
        hub = MessageHub.get_instance(f'mmsoft_loaded_{uuid.uuid4().hex}')
        hub.load_state_dict(got['message_hub'])
        assert hub.get_scalar('val/acc').current() == 0.5


def test_mmengine_loaders(tmp_path, allowed):
    """mmengine's own entry points: CheckpointLoader and load_checkpoint."""
    from mmengine.runner import load_checkpoint
    from mmengine.runner.checkpoint import CheckpointLoader

    path = tmp_path / 'iter_3.pth'
    ckpt, model = _mmengine_checkpoint(path)
    got = CheckpointLoader.load_checkpoint(str(path), map_location='cpu')
    assert got['meta']['iter'] == 3
    fresh = nn.Linear(4, 3)
    load_checkpoint(fresh, str(path), map_location='cpu')
    torch.testing.assert_close(fresh.state_dict(), model.state_dict())
    # a plain state dict (e.g. official SOFT weights) loads with or without
    plain = tmp_path / 'plain.pth'
    torch.save(model.state_dict(), plain)
    fresh = nn.Linear(4, 3)
    load_checkpoint(fresh, str(plain), map_location='cpu')
    torch.testing.assert_close(fresh.state_dict(), model.state_dict())


class _Alloc:
    """Pickles to ``bytes(10)`` (the allow-list takes only ``bytes()``)."""

    def __reduce__(self):
        return bytes, (10, )


@needs_weights_only
@pytest.mark.parametrize(
    'make,match',
    [
        (lambda: os.getcwd, 'getcwd'),  # any other global
        (lambda: np.array([1, 2], dtype=object), ''),  # an object array
        (_Alloc, 'only bytes'),
    ])
def test_weights_only_still_refuses_other_globals(tmp_path, allowed, make,
                                                  match):
    """The fix is an allow-list, not ``weights_only=False``."""
    path = tmp_path / 'evil.pth'
    torch.save({'x': make()}, path)
    with pytest.raises(pickle.UnpicklingError, match=match):
        torch.load(path)


@needs_weights_only
def test_fresh_process_before_and_after_import(tmp_path):
    """A fresh interpreter: refused before / after import, loads inside."""
    path = tmp_path / 'iter_3.pth'
    _mmengine_checkpoint(path)
    code = textwrap.dedent(f"""
        import json, pickle, sys, warnings, torch
        from mmengine.logging import HistoryBuffer
        from mmengine.registry import MODELS
        from mmengine.runner.checkpoint import CheckpointLoader
        before = sorted(map(str, torch.serialization.get_safe_globals()))
        loader = CheckpointLoader._schemes['']
        out = {{'mmsoft_imported': 'mmsoft' in sys.modules}}

        def attempts(key):
            out[key] = {{}}
            for name, fn in [
                ('torch.load', lambda: torch.load({str(path)!r})),
                ('CheckpointLoader', lambda: CheckpointLoader.load_checkpoint(
                    {str(path)!r}, map_location='cpu')),
            ]:
                try:
                    fn()
                    out[key][name] = 'ok'
                except pickle.UnpicklingError as e:
                    out[key][name] = str(e)

        attempts('before')
        import mmsoft
        from mmsoft import compat
        attempts('imported')
        out['table_empty'] = not HistoryBuffer._statistics_methods
        with compat.mmengine_checkpoints_allowed():
            with warnings.catch_warnings():
                warnings.simplefilter('error')
                ckpt = torch.load({str(path)!r})
        buf = ckpt['message_hub']['log_scalars']['train/loss']
        out['mean'] = buf.statistics('mean')
        out['list_restored'] = sorted(
            map(str, torch.serialization.get_safe_globals())) == before
        attempts('after')
        MODELS.build(dict(type='SOFT', arch=dict(
            embed_dims=[8, 16, 16, 32], num_heads=[1, 2, 2, 2],
            depths=[1, 1, 1, 1])))
        out['same_loader'] = CheckpointLoader._schemes[''] is loader
        with compat.mmengine_checkpoints_allowed():
            out['iter'] = CheckpointLoader.load_checkpoint(
                {str(path)!r}, map_location='cpu')['meta']['iter']
        print(json.dumps(out))
    """)
    res = run_python(code, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out.pop('mmsoft_imported') is False
    before = out.pop('before')
    assert set(before) == {'torch.load', 'CheckpointLoader'}
    for name, msg in before.items():
        assert 'Unsupported global' in msg and \
            'mmengine.logging.history_buffer.HistoryBuffer' in msg, (name, msg)
    assert out.pop('imported') == before and out.pop('after') == before
    assert out.pop('table_empty') is True
    assert out.pop('mean') == pytest.approx((1 + .5 + 1 / 3) / 3)
    assert out == dict(list_restored=True, same_loader=True, iter=3)


# ---------------------------------------------- loading mutates nothing
def _crafted_history_buffer(methods):
    """A HistoryBuffer pickling the method table ``methods``."""
    hb = HistoryBuffer([5.0], [1])
    state = dict(hb.__dict__)
    hb.__getstate__ = lambda: dict(state, statistics_methods=methods)
    return hb


@needs_weights_only
def test_loading_does_not_mutate_history_buffer_class(tmp_path, allowed):
    """Before: every HistoryBuffer's 'mean' became the max afterwards."""
    path = tmp_path / 'crafted.pth'
    torch.save({'x': _crafted_history_buffer({'mean': HistoryBuffer.max})},
               path)
    table = dict(HistoryBuffer._statistics_methods)
    ignored = r"ignoring the statistics methods \['mean'\]"
    try:
        with pytest.warns(UserWarning, match=ignored):
            got = torch.load(path)['x']
        assert HistoryBuffer._statistics_methods == table
        assert HistoryBuffer([1, 2, 3], [1, 1, 1]).statistics('mean') == 2
        assert type(got) is HistoryBuffer
        assert got.statistics('mean') == 5.0 and got.current() == 5.0
    finally:  # never leave a broken table behind for other tests
        HistoryBuffer._statistics_methods.clear()
        HistoryBuffer._statistics_methods.update(table)


@needs_weights_only
def test_regular_history_buffer_loads_without_warning(tmp_path, allowed):
    path = tmp_path / 'hb.pth'
    torch.save({'x': HistoryBuffer([1.0, 3.0], [1, 1])}, path)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        got = torch.load(path)['x']
    assert type(got) is HistoryBuffer and got.statistics('mean') == 2.0
    # and it pickles again under mmengine's own name (no mmsoft class)
    path2 = tmp_path / 'again.pth'
    torch.save({'x': got}, path2)
    import zipfile
    with zipfile.ZipFile(path2) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith('data.pkl')))
    assert b'mmengine.logging.history_buffer\nHistoryBuffer' in pkl
    assert b'mmsoft' not in pkl


@needs_weights_only
@pytest.mark.parametrize(
    'make',
    [
        lambda: np.array([]),
        lambda: np.zeros((0, 3), dtype=np.float32),
        lambda: HistoryBuffer(),  # never updated: empty arrays inside
    ])
def test_empty_arrays_load(tmp_path, make, allowed):
    """Before: ``Unsupported global: GLOBAL builtins.bytes``."""
    path = tmp_path / 'empty.pth'
    obj = make()
    torch.save({'x': obj}, path)
    got = torch.load(path)['x']
    assert type(got) is type(obj)
    if isinstance(obj, np.ndarray):
        assert got.shape == obj.shape and got.dtype == obj.dtype
    else:
        assert len(got.data[0]) == 0


def test_import_mmsoft_prints_nothing():
    """Nothing on stderr; ``warnings.showwarning`` left alone."""
    proc = run_python('import warnings; show = warnings.showwarning; '
                      'import mmsoft; assert warnings.showwarning is show')
    assert proc.returncode == 0, proc.stderr
    if compat.torch_version() != (2, 4):
        assert proc.stderr == '', proc.stderr


@pytest.mark.parametrize('tool', ['train', 'test'])
def test_tools_print_only_their_own_output(tool):
    tool = os.path.join(ROOT, 'tools', f'{tool}.py')
    proc = run([sys.executable, tool, '--help'], timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('usage:'), proc.stdout
    if compat.torch_version() != (2, 4):
        assert proc.stderr == '', proc.stderr


def test_allow_list_context_is_a_no_op_before_torch_2_6(monkeypatch):
    """Before torch 2.6 the context adds nothing."""
    get = getattr(torch.serialization, 'get_safe_globals', None)
    before = list(map(str, get())) if get else None
    monkeypatch.setattr(safe_load, 'native_allow_list', lambda: False)
    with compat.mmengine_checkpoints_allowed():
        if get is not None:
            assert list(map(str, get())) == before
