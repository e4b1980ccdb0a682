"""No loading path runs code from a crafted checkpoint (creating a marker):
each entry point refuses it in one line naming the file and the safe fix."""
import os.path as osp
import pickle
import runpy
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn
from conftest import (CONFIGS, ROOT, cls_demo_config, load_module,
                      tool_namespace)

import mmsoft.compat
from mmsoft.engine import SafeCheckpointHook
from mmsoft.engine.hooks.checkpoint_hook import find_newest_complete
from mmsoft.models import SOFT
from mmsoft.models.loading import load_pretrained
from mmsoft.utils import checkpoint_io as cio

KINDS = ('zip', 'legacy', 'raw')
CODE = ('pickled code (io.open) that would run when unpickled; mmsoft never '
        'unpickles such a file, whatever the options: get the weights again '
        'from their original source')
#: a plain pickle's tensors: torch.storage._load_from_bytes
RAW = CODE.replace('(', '(torch.storage._load_from_bytes, ', 1)
PLAIN = "a plain / legacy pickle (not torch's zip format) with "


class Payload:
    """Unpickling it opens (creates) ``marker``: code run from a file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, 'w')


class Opaque:
    """An object of a class: no code of the file's choosing runs."""


def _crafted(tmp_path, kind, make=None):
    """(path, marker) of a crafted file: zip, legacy or a plain pickle
    (``make(marker)``: what it holds)."""
    marker = tmp_path / f'MARKER_{kind}'
    path = tmp_path / f'crafted_{kind}.pth'
    state = {'backbone.w': torch.ones(2), 'head.b': torch.zeros(1)}
    obj = (make
           or (lambda m: dict(state_dict=state, meta=dict(x=Payload(m)))))(
               marker)
    if kind == 'raw':
        path.write_bytes(pickle.dumps(obj))
    else:
        torch.save(obj, path, _use_new_zipfile_serialization=kind == 'zip')
    return str(path), marker


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


@pytest.fixture(scope='module')
def demo_cfg(tmp_path_factory):
    """The cls demo config on generated data (tools/test.py checks it)."""
    cfg = cls_demo_config(tmp_path_factory.mktemp('safety'), val=2)
    with open(cfg, 'a') as f:
        f.write('test_dataloader = val_dataloader\n')
    return cfg


def _test_tool(path, request):
    work = osp.join(osp.dirname(path), 'work')
    tool_namespace('test')['main'](
        [request.getfixturevalue('demo_cfg'), path, '--work-dir', work])


def _image_demo(path, request):
    import cv2
    import numpy as np
    img = osp.join(osp.dirname(path), 'img.png')
    cv2.imwrite(img, np.zeros((8, 8, 3), np.uint8))
    cfg = osp.join(CONFIGS, 'demo', 'soft_cls_demo.py')
    main = runpy.run_path(
        osp.join(ROOT, 'demo', 'image_demo.py'), run_name='image_demo')['main']
    assert main([img, cfg, path, '--out-dir', img + '.out']) == 2
    raise pickle.UnpicklingError('refused by image_demo')


ENTRY_POINTS = {
    # Runner(load_from=...); resume=True: the same branch
    'Runner_load_from': lambda p: SafeCheckpointHook().before_run(
        SimpleNamespace(_load_from=p, _resume=False, _has_loaded=False)),
    'resume_search': _resume_search,
    'init_cfg_Pretrained': lambda p: load_pretrained(
        nn.Linear(2, 1), p, prefix='backbone.'),
    # init_cfg Pretrained on the backbone: mmsoft.models.loading end to end
    'SOFT.init_weights': lambda p: SOFT(
        dict(embed_dims=[8] * 4, num_heads=[1] * 4, depths=[1] * 4),
        init_cfg=dict(type='Pretrained', checkpoint=p)).init_weights(),
    'onnx_export_loader': _onnx_export_loader,
    'tools/test.py': _test_tool,
    'demo/image_demo.py': _image_demo,
    'soft2mmsoft': _converter('soft2mmsoft'),
    'mmsoft2soft': _converter('mmsoft2soft'),
    'soft2mmsoft_trusted': _converter('soft2mmsoft', '--trust-checkpoint'),
    'mmsoft2soft_trusted': _converter('mmsoft2soft', '--trust-checkpoint'),
    'safe_torch_load': lambda p: mmsoft.compat.safe_torch_load(p),
}  # yapf: disable

#: one kind for the doors whose loader another row reads every kind with
#: (tools/test.py, image_demo, init_weights: load_verified; the converters:
#: load_checkpoint_file)
ONE_KIND = ('tools/test.py', 'demo/image_demo.py', 'SOFT.init_weights',
            'mmsoft2soft', 'mmsoft2soft_trusted')
CASES = [(e, k) for e in ENTRY_POINTS for k in KINDS
         if k == 'zip' or e not in ONE_KIND]


@pytest.mark.parametrize(
    'entry, kind', CASES, ids=[f'{e}-{k}' for e, k in CASES])
def test_crafted_checkpoint_is_refused(tmp_path, kind, entry, capsys, request):
    path, marker = _crafted(tmp_path, kind)
    with pytest.raises((Exception, SystemExit)) as info:
        call = ENTRY_POINTS[entry]
        call(path, request) if call in (_test_tool, _image_demo) else \
            call(path)
    assert not marker.exists(), f'{entry} ran code from {path}'
    msg = str(info.value) + capsys.readouterr().err
    assert 'weights_only=False' not in msg, msg
    if entry not in ('safe_torch_load', 'resume_search'):
        # one line naming the file and the code; no --trust-checkpoint
        line = [ln for ln in msg.splitlines() if path in ln]
        assert line and 'refused' in line[0] and 'pickled code (' in \
            line[0] and 'trust' not in line[0], msg


#: (file kind, what it holds, the one line of load_verified after "it holds")
FAULTS = [
    ('zip', 'code', CODE),
    ('legacy', 'code', PLAIN + CODE),
    ('raw', 'code', PLAIN + RAW),
    # code after a refused class is still code
    ('zip', 'object-then-code', CODE),
    ('legacy', 'object-then-code', PLAIN + CODE),
    # only objects of classes: the converter is the way, trusted
    ('zip', 'object',
     f'pickled objects other than tensors and plain containers ({__name__}'
     '.Opaque), which could run code when unpickled; convert it with '
     'tools/model_converters/soft2mmsoft.py SRC DST (add --trust-checkpoint '
     'there only if you trust the file)'),
]


@pytest.mark.parametrize(
    'kind, holds, line', FAULTS, ids=[f'{k}-{h}' for k, h, _ in FAULTS])
def test_refusal_is_one_line_with_the_safe_fix(tmp_path, kind, holds, line):
    """The crafted files are real (an unrestricted load runs them)."""
    make = {
        'code': None,
        'object': lambda m: dict(w=torch.ones(1), meta=Opaque()),
        'object-then-code':
        lambda m: dict(a=Opaque(), b=[Opaque(), Payload(m)])
    }[holds]
    path, marker = _crafted(tmp_path, kind, make)
    with pytest.raises(cio.CheckpointRefused) as info:
        cio.load_verified(path)
    assert str(info.value) == f'checkpoint {path} was refused: it holds {line}'
    if holds == 'object-then-code':  # the converters, trusted or not
        for options in ([], ['--trust-checkpoint']):
            with pytest.raises(pickle.UnpicklingError, match='refused by'):
                _converter('soft2mmsoft', *options)(path)
    assert not marker.exists()
    if holds == 'code':
        with open(path, 'rb') as f:
            pickle.load(f) if kind == 'raw' else torch.load(
                f, weights_only=False)
        assert marker.exists()
