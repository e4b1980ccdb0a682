"""Weights into SOFT (:mod:`mmsoft.models.loading`; the authors' files:
issue 29), the one-line report and errors."""
import functools
import http.server
import inspect
import logging
import os
import os.path as osp
import re
import threading
import zipfile
from collections import OrderedDict

import pytest
import torch
import torch.hub
import torch.nn as nn
from conftest import Reduce
from conftest import authors_file as preset_file
from conftest import current_log, tiny_arch
from mmengine.runner import CheckpointLoader
from reference import official_soft_ref as ref

from mmsoft.models import SOFT, loading
from mmsoft.models.converters import (OFFICIAL_PAGE,
                                      convert_official_to_mmpretrain,
                                      official_soft_hint)
from mmsoft.utils.checkpoint_io import CheckpointRefused
from mmsoft.utils.strict_load import CheckpointMismatchError as Mismatch

#: the SOFT of the demo configs (configs/demo/*.py)
DEMO = dict(embed_dims=[32, 64, 128, 192], num_heads=[1, 2, 4, 6])


def _linear_file(path, **entries):
    """``nn.Linear(2, 3)``'s keys (or ``entries``) saved to ``path``."""
    sd = {'weight': torch.arange(6.).reshape(3, 2), 'bias': torch.ones(3)}
    torch.save(entries or sd, str(path))
    return sd


def _same(sd, want):
    return all(torch.equal(sd[k], v) for k, v in want.items())


def _mapped_from(t, path):
    """Whether the data of tensor ``t`` is memory-mapped from ``path``."""
    ptr, path = t.untyped_storage().data_ptr(), osp.realpath(path)
    with open('/proc/self/maps') as f:
        for parts in (line.split(maxsplit=5) for line in f):
            lo, hi = (int(x, 16) for x in parts[0].split('-'))
            if len(parts) == 6 and lo <= ptr < hi and \
                    osp.realpath(parts[5].strip()) == path:
                return True
    return False


def authors_sd(img_size=64, depths=(1, 1, 2, 1), **drop):
    """An authors' state dict (5 classes), without the keys in ``drop``."""
    sd = ref.random_official_state_dict(
        *DEMO.values(), list(depths), num_classes=5, ratios=(4, 2, 2),
        pretrain_img_size=img_size, dtype=torch.float32)  # yapf: disable
    return {k: v for k, v in sd.items() if not k.startswith(tuple(drop))}


def authors_file(path, img_size, depths=(1, 1, 2, 1)):
    """Saves an authors' file of the demo SOFT; returns its conversion."""
    sd = authors_sd(img_size, depths)
    torch.save({'model': sd}, str(path))
    converted, n = convert_official_to_mmpretrain(sd)[0], len('backbone.')
    return {k[n:]: v for k, v in converted.items() if k[:n] == 'backbone.'}


def _tiny(depths=(1, 1, 2, 1), **kw):
    return SOFT(dict(DEMO, depths=list(depths)), pretrain_img_size=64, **kw)


@pytest.fixture
def reports(monkeypatch):
    """The report lines :mod:`mmsoft.models.loading` logs."""
    lines, log = [], loading.print_log

    def record(msg, *a, **k):
        if str(msg).startswith('mmsoft: loaded '):
            lines.append(str(msg))
        return log(msg, *a, **k)

    monkeypatch.setattr(loading, 'print_log', record)
    return lines


def test_read_checkpoint_and_load_pretrained_defaults(tmp_path, monkeypatch):
    """CPU, schemes, missing paths; strict, state_dict over EMA."""
    path = tmp_path / 'w.pth'
    want = _linear_file(path)
    assert loading.read_checkpoint(path)['bias'].device.type == 'cpu'
    m = nn.Linear(2, 3)
    seen = []  # a map_location recording the locations it is called with
    r = loading.load_pretrained(
        m, str(path), map_location=lambda s, loc: seen.append(loc) or s)
    assert r.ok and r.matched == 2 and _same(m.state_dict(), want)
    assert seen and set(seen) == {'cpu'}
    raw = {'weight': torch.zeros(3, 2), 'bias': torch.zeros(3)}
    ema = {'weight': torch.ones(3, 2), 'bias': torch.ones(3)}
    _linear_file(path, state_dict_ema=ema, state_dict=raw)
    loading.load_pretrained(m, str(path))
    assert _same(m.state_dict(), raw)
    for path, what in ((tmp_path, 'is a directory, not a file'),
                       (tmp_path / 'nope.pth', 'does not exist')):
        with pytest.raises(FileNotFoundError) as info:
            loading.read_checkpoint(path)
        assert str(info.value) == (
            f'checkpoint {path} {what}; pass a .pth checkpoint file')
    calls = []

    def loader(filename, map_location):
        calls.append((filename, map_location))
        return {'w': torch.ones(1)}

    loader.__name__ = 'load_from_mmsofttest'
    schemes = {'mmsofttest://': loader, **CheckpointLoader._schemes}
    monkeypatch.setattr(CheckpointLoader, '_schemes', schemes)
    assert list(loading.read_checkpoint('mmsofttest://a/b.pth')) == ['w']
    loading.read_checkpoint('mmsofttest://c.pth', map_location='meta')
    assert calls == [('mmsofttest://a/b.pth', 'cpu'),
                     ('mmsofttest://c.pth', 'meta')]


@pytest.mark.skipif(
    not osp.exists('/proc/self/maps'), reason='reads /proc/self/maps')
def test_read_checkpoint_mmap(tmp_path, monkeypatch):
    """Mapped (absent device too); legacy read whole; crafted refused."""
    path = str(tmp_path / 'w.pth')
    want = _linear_file(path)
    assert not _mapped_from(loading.read_checkpoint(path)['weight'], path)
    with zipfile.ZipFile(path) as z:  # saved on a device this machine lacks
        items = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:
        for info, data in items:
            data = data.replace(b'X\x03\x00\x00\x00cpu',
                                b'X\x06\x00\x00\x00absent')
            z.writestr(info, data)
    got = loading.read_checkpoint(path, mmap=True)
    assert all(_mapped_from(v, path) for v in got.values())
    assert _same(got, want) and {v.device.type
                                 for v in got.values()} == {'cpu'}
    legacy = dict(_use_new_zipfile_serialization=False)
    torch.save({'w': torch.arange(3.)}, path, **legacy)
    got = loading.read_checkpoint(path, mmap=True)
    assert torch.equal(got['w'], torch.arange(3.))
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    marker = tmp_path / 'MARKER'
    torch.save({'w': torch.ones(1), 'x': Reduce(open, str(marker), 'w')}, path)
    with pytest.raises(CheckpointRefused, match=re.escape(path)):
        loading.read_checkpoint(path, mmap=True)
    assert not marker.exists()


def test_read_checkpoint_http_cached_quiet_and_safe(tmp_path, monkeypatch,
                                                    capfd):
    """To <hub>/checkpoints once, no progress bar; failure: one line."""
    hub = tmp_path / 'hub'
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(hub))
    served, marker = tmp_path / 'served', tmp_path / 'MARKER'
    served.mkdir()
    want = _linear_file(served / 'w.pth')
    torch.save({'x': Reduce(open, str(marker), 'w')}, served / 'crafted.pth')
    handler = functools.partial(
        type('Quiet', (http.server.SimpleHTTPRequestHandler, ),
             dict(log_message=lambda *a: None)),
        directory=str(served))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f'http://127.0.0.1:{server.server_address[1]}/'
    try:
        got = loading.read_checkpoint(url + 'w.pth')
        os.remove(served / 'w.pth')  # then read from the cache
        assert _same(loading.read_checkpoint(url + 'w.pth'), want)
        with pytest.raises(CheckpointRefused):
            loading.read_checkpoint(url + 'crafted.pth')
        with pytest.raises(FileNotFoundError) as info:  # init_cfg's too
            loading.SOFTPretrainedInit(url + 'gone.pth')(nn.Linear(2, 3))
    finally:
        server.shutdown()
        server.server_close()
    assert capfd.readouterr().err == '' and _same(got, want)
    assert sorted(os.listdir(hub / 'checkpoints')) == ['crafted.pth', 'w.pth']
    assert not marker.exists()
    assert re.fullmatch(
        f'checkpoint {re.escape(url)}gone.pth could not be downloaded '
        r'\(.*404.*\); check the URL, or download it and pass the file',
        str(info.value))


def _sd(prefix='', **meta):
    sd = {prefix + k: v for k, v in _tiny([1, 1, 3, 1]).state_dict().items()}
    return dict(state_dict=sd, meta=meta) if meta else sd


#: the modules loaded into
MODULES = dict(
    Linear=lambda: nn.Linear(2, 3),
    SOFT=_tiny,
    Module=lambda: nn.Sequential(OrderedDict(backbone=nn.Linear(2, 2))),
    norm_false=lambda: _tiny([1, 1, 3, 1],
                             attn_cfg=dict(type='soft', attn_norm=False)))

#: (id, content, module, keywords, the error's start or ('$') line; P: file)
LOAD_FAULTS = [  # check_state_dict's other lines: test_strict_load.py
    ('opt-in-named', dict(weight=torch.ones(3, 2)), 'Linear',
     dict(opt_in='set X'),
     'checkpoint P does not match Linear: 1 of its 1 tensors would load. 1 '
     "of the model's 2 tensors are missing from the checkpoint: bias. If a "
     'partial load is intended (e.g. another head), set X.$'),
    ('authors-unconvertible', dict(model=authors_sd(pos_embed2=1)), 'Linear',
     {}, "checkpoint P has the authors' SOFT key layout (fudan-zvg/SOFT) but "
     "cannot be converted: cannot infer the architecture: key 'pos_embed2' "
     'is missing$'),
    ('no-state-dict', dict(meta={}), 'Linear', {},
     'checkpoint P: no state dict found in the checkpoint'),
    # converted, then the usual mismatch (not a crash on the missing SOFT)
    ('authors-into-no-soft', authors_sd(), 'Linear', {},
     "checkpoint P does not match Linear (checkpoint keys under 'backbone.')"
     ': 0 of its'),
    ('no-tensor-under-prefix', {
        'backbone.w': torch.ones(1)
    }, 'Linear', dict(prefix='head'),
     "checkpoint P has no tensor under the prefix "
     "'head.' (init_cfg.prefix); its keys look like backbone.w$"),
    ('other-arch', _sd(), 'SOFT', {}, 'checkpoint P does not match SOFT: '),
    ('whole-model-file', _sd('backbone.'), 'SOFT', {},
     "checkpoint P does not match SOFT (checkpoint keys under 'backbone.'): "),
    ('whole-model-into-whole', _sd('backbone.'), 'Module', {},
     'checkpoint P does not match Sequential: '),
    ('other-attn-norm', _sd(attn_norm=True), 'norm_false', {},
     'checkpoint P holds soft_norm_* weights (converted with attn_norm=True, '
     '--norm), but the model has attn_norm=False'),
]


@pytest.mark.parametrize(
    'content, module, kw, line', [f[1:] for f in LOAD_FAULTS],
    ids=[f[0] for f in LOAD_FAULTS])
def test_load_pretrained_fault_is_one_line(tmp_path, content, module, kw,
                                           line):
    path = str(tmp_path / 'w.pth')
    torch.save(content, path)
    with pytest.raises(Mismatch) as info:
        loading.load_pretrained(MODULES[module](), path, **kw)
    line = line.replace('P', path, 1)
    if line.endswith('$'):
        assert str(info.value) == line[:-1]
    else:
        assert str(info.value).startswith(line), str(info.value)


def test_prefix_found_or_given(tmp_path, reports):
    """The backbone. prefix found; a given one wins; the report logged."""
    src = _tiny()
    src.init_weights()
    sd = {f'backbone.{k}': v for k, v in src.state_dict().items()}
    sd.update({f'ema.{k}': torch.full_like(v, 1.) if v.is_floating_point()
               else v for k, v in src.state_dict().items()})  # yapf: disable
    sd['head.fc.weight'] = torch.zeros(5, 192)
    path = tmp_path / 'cls.pth'
    torch.save({'state_dict': sd, 'meta': {}}, str(path))
    n = len(src.state_dict())
    for prefix, under in ((None, 'backbone.'), ('backbone.', 'backbone.'),
                          ('ema', 'ema.'), ('ema.', 'ema.')):
        reports.clear()
        dst = _tiny()
        with current_log() as records:
            loading.load_pretrained(dst, str(path), prefix=prefix)
        want = {k: sd[under + k] for k in src.state_dict()}
        assert _same(dst.state_dict(), want)
        assert [r.getMessage() for r in records] == reports == [
            f"mmsoft: loaded {path}: mmsoft layout ('state_dict'), keys "
            f"under '{under}', {n} tensors, strict"
        ]


@pytest.mark.parametrize(
    'args, get', [
        (('w/soft_small.pth', ), f'the authors publish no soft_small file '
         f'({OFFICIAL_PAGE}): train configs/soft_small_in1k.py and give its '
         'checkpoint'),
        (('mine.pth', ),
         f"download the authors' ImageNet file from {OFFICIAL_PAGE}"),
        (('soft_tiny.pth', 'model.img_backbone', 'init_cfg.ckpt'),
         f"download the authors' soft_tiny ImageNet file ('SOFT_Tiny' on "
         f'{OFFICIAL_PAGE}) to that path'),
    ],
    ids=['unpublished', 'unknown', 'other-key'])
def test_missing_weights_message(args, get):
    """(a published file, the docs' line: test_official_files.py)"""
    b, key = (args[1:] or ['model.backbone'])[0], '.'.join(
        (args[1:] or ['model.backbone', 'init_cfg.checkpoint']))
    assert loading.missing_weights_message(*args) == (
        f'{args[0]} ({key}) does not exist: {get}, or use another file with '
        f'--cfg-options {key}=PATH; to train from scratch on purpose: '
        f'--cfg-options {b}.init_cfg=None {b}.norm_eval=False')


_NORMAL = dict(type='TruncNormal', layer='Linear', std=.02)


def _pre(checkpoint='a.pth', type='Pretrained', **kw):
    return dict(type=type, checkpoint=checkpoint, **kw)


def _soft(checkpoint='a.pth', **kw):
    return _pre(checkpoint, 'SOFTPretrained', **kw)


# the load last (mmengine's order); no checkpoint: dropped, one line logged
@pytest.mark.parametrize('init_cfg, want, loads_all', [
    (None, None, False),
    (_NORMAL, _NORMAL, False),
    (_pre(), _soft(), True),
    (_pre(strict=False), _soft(strict=False), False),
    ([_pre(strict=True), _NORMAL], [_NORMAL, _soft(strict=True)], True),
    ([_pre(strict=False), _pre('b.pth')
      ], [_soft(strict=False), _soft('b.pth')], True),
    (_pre(None), None, False),
    ([_NORMAL, _pre(None)], [_NORMAL], False),
])
def test_pretrained_init_cfg(init_cfg, want, loads_all):
    """Pretrained -> the strict loader, shape kept, whether it loads all."""
    with current_log() as records:
        assert loading.pretrained_init_cfg(init_cfg) == (want, loads_all)
        loading.pretrained_init_cfg(init_cfg, owner='MyNet')
    assert [r.getMessage() for r in records] == [
        f'{o}: init_cfg has no checkpoint; using random initialisation'
        for o in ('SOFT', 'MyNet')
        if 'a.pth' not in str(init_cfg) and 'Pretrained' in str(init_cfg)
    ]


def test_init_cfg_loader_defaults_and_init_info(tmp_path, monkeypatch):
    """mmengine's init-info names the strict loader; defaults passed."""
    arch = tiny_arch([8] * 4, [1] * 4)
    path = tmp_path / 'own.pth'
    torch.save(SOFT(arch, pretrain_img_size=32).state_dict(), str(path))
    init_cfg = dict(type='Pretrained', checkpoint=str(path))
    model = SOFT(arch, pretrain_img_size=32, init_cfg=init_cfg)
    with current_log(logging.DEBUG) as records:
        model.init_weights()
    dump = '\n'.join(r.getMessage() for r in records)
    assert f'ffn.layers.1.weight - torch.Size([8, 32]): \n' \
        f'SOFTPretrainedInit: load from {path}' in dump, dump[-2000:]
    calls = []
    monkeypatch.setattr(loading, 'load_pretrained',
                        lambda *a, **k: calls.append((a, k)))
    init = loading.SOFTPretrainedInit(str(path), 'backbone.', 'meta')
    assert init.map_location == 'meta'
    init(nn.Linear(2, 2))
    assert calls == [
        ((calls[0][0][0], str(path), 'backbone.', 'meta'),
         dict(strict=True, opt_in='set model.backbone.init_cfg.strict=False'))
    ]


def test_bare_authors_state_dict_and_report_names_the_model(tmp_path, reports):
    """Named by attn_norm; into another size: the preset as the fix."""
    path = tmp_path / 'soft_tiny.pth'
    n = preset_file(path, 'tiny')
    for norm, name in ((True, 'soft_norm_tiny'), (False, 'soft_tiny')):
        reports.clear()
        SOFT('tiny', attn_cfg=dict(type='SOFTAttention', attn_norm=norm),
             init_cfg=dict(type='Pretrained', checkpoint=str(path))
             ).init_weights()  # yapf: disable
        assert reports == [
            f"mmsoft: loaded {path}: authors' {name} layout ('model'), "
            f"converted, keys under 'backbone.', {n - 2} tensors, strict"
        ]
    model = SOFT(
        tiny_arch((32, 64, 128, 256), (1, 2, 4, 16)), pretrain_img_size=32)
    with pytest.raises(Mismatch) as exc:
        loading.load_pretrained(model, str(path))
    assert str(exc.value).endswith(
        ': use --cfg-options model.backbone.arch=tiny and neck / head '
        'in_channels [64, 128, 320, 512]')


def test_partial_authors_load_and_second_init_weights(tmp_path, reports):
    """strict=False: all but pos_embed; 2nd init a no-op; other arch."""
    assert '_is_init' not in inspect.getsource(SOFT)
    path = tmp_path / 'authors_64.pth'
    want = authors_file(path, 64)
    model = SOFT(dict(DEMO, depths=[1, 1, 2, 1], sampling_ratios=[4, 2, 2, 1]),
                 pretrain_img_size=96, init_cfg=dict(
                     type='Pretrained', checkpoint=str(path), strict=False)
                 )  # yapf: disable
    model.init_weights()
    got = model.state_dict()
    for k, v in want.items():
        if k.endswith('pos_embed'):
            assert got[k].shape != v.shape and got[k].abs().sum() > 0, k
        else:
            assert torch.equal(got[k], v), k
    assert reports == [
        f"mmsoft: loaded {path}: authors' SOFT arch=dict(embed_dims=[32, 64, "
        f'128, 192], num_heads=[1, 2, 4, 6], depths=[1, 1, 2, 1], '
        f"sampling_ratios=[4, 2, 2, 1]) layout ('model'), converted, keys "
        f"under 'backbone.', {len(want) - 4} tensors, strict=False, partial"
    ]
    before = {k: v.clone() for k, v in got.items()}
    model.init_weights()
    assert len(reports) == 1 and _same(model.state_dict(), before)
    authors_file(path, 64, depths=(1, 1, 3, 1))  # another arch: refused
    with pytest.raises(Mismatch) as exc:
        loading.load_pretrained(model, str(path))
    assert str(exc.value) == (
        f"checkpoint {path} holds the authors' weights of arch=dict("
        'embed_dims=[32, 64, 128, 192], num_heads=[1, 2, 4, 6], depths=[1, '
        '1, 3, 1], sampling_ratios=[4, 2, 2, 1]) (depths [1, 1, 3, 1]), not '
        'of the configured arch=dict(embed_dims=[32, 64, 128, 192], '
        'num_heads=[1, 2, 4, 6], depths=[1, 1, 2, 1], sampling_ratios=[4, 2,'
        ' 2, 1]): use model.backbone.arch=dict(embed_dims=[32, 64, 128, 192]'
        ', num_heads=[1, 2, 4, 6], depths=[1, 1, 3, 1], sampling_ratios=[4, '
        '2, 2, 1]) in the config')


def test_official_soft_hint():
    """The converter command for an authors' file; None for another."""
    sd = ref.random_official_state_dict([8] * 4, [1] * 4, [1] * 4,
                                        pretrain_img_size=32,
                                        dtype=torch.float32)  # yapf: disable
    ckpt = {'model': dict(head_extra=torch.zeros(1), **sd)}
    assert official_soft_hint(ckpt, '/data/w/soft_tiny.pth') == (
        '/data/w/soft_tiny.pth is an official SOFT checkpoint '
        "(fudan-zvg/SOFT key layout, e.g. 'pos_embed1'); convert it first: "
        'python tools/model_converters/soft2mmsoft.py /data/w/soft_tiny.pth '
        'weights/soft_tiny.pth [--norm for soft_norm_* weights], and load '
        'the converted file (the SOFT backbone alone reads it directly: '
        "init_cfg=dict(type='Pretrained', "
        'checkpoint=/data/w/soft_tiny.pth)).')
    assert official_soft_hint(sd).startswith(
        'SRC is an official SOFT checkpoint (fudan-zvg/SOFT key layout, e.g. '
        "'pos_embed1'); convert it first: python tools/model_converters/"
        'soft2mmsoft.py SRC weights/SRC [')
    assert 'soft2mmsoft.py /data/ weights/soft.pth [' in \
        official_soft_hint(sd, '/data/')
    assert official_soft_hint({'state_dict': {'w': torch.zeros(1)}}) is None
