"""No loading path runs code from a crafted checkpoint (creating a marker):
each entry point refuses it in one line naming the file and the safe fix."""
import os.path as osp
import pickle
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn as nn
from conftest import ROOT, cls_demo_config, load_module
from mmengine.logging import HistoryBuffer, MessageHub

import mmsoft.compat
from mmsoft.engine import SafeCheckpointHook
from mmsoft.engine.hooks.checkpoint_hook import find_newest_complete
from mmsoft.models import SOFT
from mmsoft.models.loading import load_pretrained
from mmsoft.utils import checkpoint_io as cio


class Payload:
    """Unpickling it opens (creates) ``marker``: code run from a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, 'w')


class Opaque:
    """An object of a class: no code of the file's choosing runs."""


def _state():
    return {'backbone.w': torch.ones(2), 'head.b': torch.zeros(1)}


def _crafted(tmp_path, kind, obj=None):
    """(path, marker) of a crafted file: zip, legacy or a plain pickle."""
    marker = tmp_path / f'MARKER_{kind}'
    path = tmp_path / f'crafted_{kind}.pth'
    obj = obj or dict(state_dict=_state(), meta=dict(x=Payload(marker)))
    if kind == 'raw':
        path.write_bytes(pickle.dumps(obj))
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=kind == 'zip')
    return str(path), marker


KINDS = ('zip', 'legacy', 'raw')


@pytest.mark.parametrize('kind', KINDS)
def test_payload_runs_when_unpickled_unsafely(tmp_path, kind):
    """The crafted files are real: an unrestricted load runs them."""
    path, marker = _crafted(tmp_path, kind)
    if kind == 'raw':
        with open(path, 'rb') as f:
            pickle.load(f)
    else:
        torch.load(path, weights_only=False)
    assert marker.exists()


def _hook_before_run(resume):
    """SafeCheckpointHook's ``before_run`` (before ``load_or_resume``)."""
    return lambda path: SafeCheckpointHook().before_run(
        SimpleNamespace(_load_from=path, _resume=resume, _has_loaded=False))


def _resume_search(path):
    # Runner(resume=True): the newest complete checkpoint of the work dir
    found, skipped = find_newest_complete(osp.dirname(path))
    assert found is None and skipped, (found, skipped)
    raise pickle.UnpicklingError(skipped[0][1])


def _onnx_export_loader(path):
    from deployment.deploy import load_weights
    load_weights(nn.Linear(2, 1), path)


def _converter(name, *options):

    def convert(path):
        tool = load_module(
            osp.join(ROOT, 'tools', 'model_converters', name + '.py'), name)
        assert tool.main([path, path + '.out.pth', *options]) == 1
        assert not osp.exists(path + '.out.pth')
        raise pickle.UnpicklingError('refused by ' + name)

    return convert


ENTRY_POINTS = {
    'Runner_load_from':  # resume=True: the same branch
    _hook_before_run(resume=False),
    'resume_search':
    _resume_search,
    'init_cfg_Pretrained':
    lambda p: load_pretrained(nn.Linear(2, 1), p, prefix='backbone.'),
    # init_cfg Pretrained on the backbone: mmsoft.models.loading end to end
    'SOFT.init_weights':
    lambda p: SOFT(
        dict(embed_dims=[8] * 4, num_heads=[1] * 4, depths=[1] * 4),
        init_cfg=dict(type='Pretrained', checkpoint=p)).init_weights(),
    'onnx_export_loader':
    _onnx_export_loader,
    'soft2mmsoft':
    _converter('soft2mmsoft'),
    'mmsoft2soft':
    _converter('mmsoft2soft'),
    'soft2mmsoft_trusted':
    _converter('soft2mmsoft', '--trust-checkpoint'),
    'mmsoft2soft_trusted':
    _converter('mmsoft2soft', '--trust-checkpoint'),
    'safe_torch_load':
    lambda p: mmsoft.compat.safe_torch_load(p),
}


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('entry', list(ENTRY_POINTS))
def test_crafted_checkpoint_is_refused(tmp_path, kind, entry, capsys):
    path, marker = _crafted(tmp_path, kind)
    with pytest.raises(Exception) as info:
        ENTRY_POINTS[entry](path)
    assert not marker.exists(), f'{entry} ran code from {path}'
    msg = str(info.value) + capsys.readouterr().err
    assert 'weights_only=False' not in msg, msg
    if entry not in ('safe_torch_load', 'resume_search'):
        # one line naming the file and the code; no --trust-checkpoint
        line = [ln for ln in msg.splitlines() if path in ln]
        assert line and 'refused' in line[0] and 'pickled code (' in \
            line[0] and 'trust' not in line[0], msg


def test_message_is_one_line_with_the_safe_fix(tmp_path):
    path, _ = _crafted(tmp_path, 'raw')
    with pytest.raises(cio.CheckpointRefused) as info:
        cio.load_verified(path)
    msg = str(info.value)
    assert '\n' not in msg and path in msg
    assert 'plain / legacy pickle' in msg
    assert 'soft2mmsoft' not in msg and 'trust' not in msg
    path, _ = _crafted(tmp_path, 'zip')
    with pytest.raises(cio.CheckpointRefused, match=r'\(io\.open\)'):
        cio.load_verified(path)
    # only objects of classes: the converter is the way, trusted
    objs = str(tmp_path / 'objects.pth')
    torch.save(dict(state_dict=_state(), meta=Opaque()), objs)
    with pytest.raises(cio.CheckpointRefused) as info:
        cio.load_verified(objs)
    assert f'({__name__}.Opaque)' in str(info.value)
    assert 'soft2mmsoft.py SRC DST (add --trust-checkpoint' in str(info.value)


@pytest.mark.parametrize('kind', ['zip', 'legacy'])
def test_code_hidden_behind_an_object_is_still_code(tmp_path, kind):
    """Code after a refused class is still refused as code."""
    marker = tmp_path / 'MARKER'
    path, _ = _crafted(tmp_path, kind,
                       dict(a=Opaque(), b=[Opaque(), Payload(marker)]))
    for options in ([], ['--trust-checkpoint']):
        with pytest.raises(pickle.UnpicklingError, match='refused by'):
            _converter('soft2mmsoft', *options)(path)
    assert not marker.exists()
    with pytest.raises(cio.CheckpointRefused) as info:
        cio.load_verified(path)
    assert '(io.open)' in str(info.value) and 'trust' not in str(info.value)


def test_training_checkpoints_still_load(tmp_path):
    """HistoryBuffers, numpy arrays and scalars still load; mmsoft's
    loaders leave torch's process-wide allow-list as it was."""
    get = getattr(torch.serialization, 'get_safe_globals', lambda: [])
    before = sorted(map(str, get()))  # a set: its order may change
    hub = MessageHub.get_instance('mmsoft_test_checkpoint_safety')
    for v in (1.0, 0.5):
        hub.update_scalar('train/loss', v)
    hub.update_info('best_score', np.float64(0.75))
    path = str(tmp_path / 'iter_2.pth')
    torch.save(
        dict(
            meta=dict(iter=2),
            state_dict=_state(),
            message_hub=hub.state_dict(),
            arrays=[np.arange(3), np.zeros(0)]), path)
    got = cio.load_verified(path)
    buf = got['message_hub']['log_scalars']['train/loss']
    assert type(buf) is HistoryBuffer and buf.mean() == pytest.approx(0.75)
    assert got['message_hub']['runtime_info']['best_score'] == 0.75
    np.testing.assert_array_equal(got['arrays'][0], [0, 1, 2])
    assert find_newest_complete(str(tmp_path))[0] == path
    mmsoft.compat.safe_torch_load(path, extra=[pickle.PickleError])
    assert sorted(map(str, get())) == before


@pytest.mark.parametrize('script', ['tools/test.py', 'demo/image_demo.py'])
def test_tools_refuse_crafted_checkpoint(tmp_path, script, script_server):
    cfg = cls_demo_config(tmp_path, val=2)
    with open(cfg, 'a') as f:
        f.write('test_dataloader = val_dataloader\n')
    path, marker = _crafted(tmp_path, 'zip')
    if script == 'tools/test.py':
        args = [cfg, path, '--work-dir', str(tmp_path / 'work')]
    else:
        img = sorted(
            p for p in (tmp_path / 'data').rglob('*')
            if p.suffix.lower() in ('.jpg', '.jpeg', '.png'))[0]
        args = [str(img), cfg, path, '--out-dir', str(tmp_path / 'out')]
    proc = script_server(osp.join(ROOT, script), args, cwd=tmp_path)
    assert proc.returncode != 0
    assert not marker.exists(), f'{script} ran code from {path}'
    out = proc.stdout + proc.stderr
    assert 'weights_only=False' not in out, out[-3000:]
    assert any(path in ln and 'refused' in ln
               for ln in out.splitlines()), out[-3000:]
