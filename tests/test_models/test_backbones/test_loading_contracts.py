"""Contracts of :mod:`mmsoft.models.loading` (read_checkpoint,
load_pretrained, missing_weights_message, pretrained_init_cfg) on tiny files.
"""
import functools
import http.server
import logging
import os
import os.path as osp
import re
import threading
import zipfile

import pytest
import torch
import torch.hub
import torch.nn as nn
from conftest import current_log
from mmengine.runner import CheckpointLoader
from reference import official_soft_ref as ref

from mmsoft.models import SOFT, loading
from mmsoft.models.converters import OFFICIAL_PAGE, official_soft_hint
from mmsoft.utils.checkpoint_io import CheckpointRefused
from mmsoft.utils.strict_load import CheckpointMismatchError, few_keys

_CPU_TAG = b'X\x03\x00\x00\x00cpu'


class Payload:
    """Creates ``marker`` when unpickled by an unsafe loader."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, 'w')


def _linear_file(path, **entries):
    """``nn.Linear(2, 3)``'s keys (or ``entries``) saved to ``path``."""
    sd = {'weight': torch.arange(6.).reshape(3, 2), 'bias': torch.ones(3)}
    torch.save(entries or sd, str(path))
    return sd


def _mapped_from(t, path):
    """Whether the data of tensor ``t`` is memory-mapped from ``path``."""
    ptr, path = t.untyped_storage().data_ptr(), osp.realpath(path)
    with open('/proc/self/maps') as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and osp.realpath(parts[5].strip()) == path:
                lo, hi = (int(x, 16) for x in parts[0].split('-'))
                if lo <= ptr < hi:
                    return True
    return False


def _retag_zip(path, tag='mmsoft_absent_device'):
    """Make zip checkpoint ``path`` look saved on a device this lacks."""
    new = tag.encode()
    new = b'X' + len(new).to_bytes(4, 'little') + new
    with zipfile.ZipFile(path) as z:
        items = [(i, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, 'w', zipfile.ZIP_STORED) as z:
        for info, data in items:
            if info.filename.endswith('/data.pkl'):
                assert _CPU_TAG in data
                data = data.replace(_CPU_TAG, new)
            z.writestr(info, data)


def _locations():
    """A ``map_location`` recording the locations it is called with."""
    seen = []
    return seen, lambda storage, location: seen.append(location) or storage


# ------------------------------------------------------ read_checkpoint
def test_read_checkpoint_cpu_by_default_and_map_location(tmp_path):
    path = tmp_path / 'w.pth'
    _linear_file(path)
    assert loading.read_checkpoint(path)['bias'].device.type == 'cpu'
    seen, keep = _locations()
    loading.read_checkpoint(path, map_location=keep)
    assert seen and set(seen) == {'cpu'}


@pytest.mark.skipif(
    not osp.exists('/proc/self/maps'), reason='reads /proc/self/maps')
def test_read_checkpoint_mmap_keeps_tensors_on_disk(tmp_path):
    """Mapped from the file (also one of an absent device), else read."""
    path = str(tmp_path / 'w.pth')
    want = _linear_file(path)
    got = loading.read_checkpoint(path, mmap=True)
    assert all(_mapped_from(v, path) for v in got.values())
    assert not _mapped_from(loading.read_checkpoint(path)['weight'], path)
    _retag_zip(path)
    got = loading.read_checkpoint(path, mmap=True)
    assert all(_mapped_from(v, path) for v in got.values())
    for k, v in want.items():
        assert got[k].device.type == 'cpu' and torch.equal(got[k], v)


@pytest.mark.parametrize('force_unsafe', [False, True])
def test_read_checkpoint_mmap_never_runs_code(tmp_path, monkeypatch,
                                              force_unsafe):
    """Also under ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD``."""
    if force_unsafe:
        monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    marker, path = tmp_path / 'MARKER', str(tmp_path / 'crafted.pth')
    torch.save({'w': torch.ones(1), 'x': Payload(marker)}, path)
    with pytest.raises(CheckpointRefused, match=re.escape(path)):
        loading.read_checkpoint(path, mmap=True)
    assert not marker.exists()


def test_read_checkpoint_mmap_reads_a_legacy_file_whole(tmp_path):
    path = tmp_path / 'legacy.pth'
    torch.save({'w': torch.arange(3.)},
               str(path),
               _use_new_zipfile_serialization=False)
    got = loading.read_checkpoint(path, mmap=True)
    assert torch.equal(got['w'], torch.arange(3.))


def test_read_checkpoint_missing_path_is_one_line(tmp_path):
    missing = tmp_path / 'nope.pth'
    for path, what in ((tmp_path, 'is a directory, not a file'),
                       (missing, 'does not exist')):
        with pytest.raises(FileNotFoundError) as info:
            loading.read_checkpoint(path)
        assert str(info.value) == (
            f'checkpoint {path} {what}; pass a .pth checkpoint file')


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """torch.hub's dir (holding another file), away from the cwd."""
    d = tmp_path / 'hub'
    (d / 'checkpoints').mkdir(parents=True)
    (d / 'checkpoints' / 'other.pth').write_bytes(b'')
    monkeypatch.setattr(torch.hub, 'get_dir', lambda: str(d))
    (tmp_path / 'cwd').mkdir()
    monkeypatch.chdir(tmp_path / 'cwd')
    return d / 'checkpoints'


def test_read_checkpoint_https_cached_and_read_safely(tmp_path, monkeypatch,
                                                      hub):
    """Downloaded once to ``<hub>/checkpoints/<name>``, read safely."""
    marker, calls = tmp_path / 'MARKER', []

    def download(url, dst, *args, **kwargs):
        calls.append((url, dst))
        torch.save({'x': Payload(marker)}
                   if 'crafted' in url else {'w': torch.ones(2)}, dst)

    monkeypatch.setattr(torch.hub, 'download_url_to_file', download)
    url = 'https://example.com/weights/soft_demo.pth'
    for _ in range(2):
        assert torch.equal(loading.read_checkpoint(url)['w'], torch.ones(2))
    assert calls == [(url, str(hub / 'soft_demo.pth'))]
    with pytest.raises(CheckpointRefused):
        loading.read_checkpoint('https://example.com/crafted.pth')
    assert not marker.exists()


def test_read_checkpoint_http_download_is_quiet(tmp_path, hub, capfd):
    """A local server: no progress bar; then read from the cache."""
    served = tmp_path / 'served'
    served.mkdir()
    want = _linear_file(served / 'w.pth')
    handler = functools.partial(
        type('Quiet', (http.server.SimpleHTTPRequestHandler, ),
             dict(log_message=lambda *a: None)),
        directory=str(served))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f'http://127.0.0.1:{server.server_address[1]}/w.pth'
    try:
        got = loading.read_checkpoint(url)
    finally:
        server.shutdown()
        server.server_close()
    assert capfd.readouterr().err == ''
    assert sorted(os.listdir(hub)) == ['other.pth', 'w.pth']
    for sd in (got, loading.read_checkpoint(url)):
        assert all(torch.equal(sd[k], v) for k, v in want.items())


def test_read_checkpoint_other_schemes_are_mmengines(monkeypatch):
    """mmengine's CheckpointLoader, with ``map_location`` (CPU default)."""
    calls = []

    def loader(filename, map_location):
        calls.append((filename, map_location))
        return {'w': torch.ones(1)}

    loader.__name__ = 'load_from_mmsofttest'
    monkeypatch.setattr(CheckpointLoader, '_schemes', {
        'mmsofttest://': loader,
        **CheckpointLoader._schemes
    })
    assert list(loading.read_checkpoint('mmsofttest://a/b.pth')) == ['w']
    loading.read_checkpoint('mmsofttest://c.pth', map_location='meta')
    assert calls == [('mmsofttest://a/b.pth', 'cpu'),
                     ('mmsofttest://c.pth', 'meta')]


# ------------------------------------------------------ load_pretrained
def test_load_pretrained_defaults(tmp_path):
    """Strict, CPU; a partial file's error names no opt-in unless given."""
    path = tmp_path / 'w.pth'
    want = _linear_file(path)
    m = nn.Linear(2, 3)
    r = loading.load_pretrained(m, str(path))
    assert r.ok and r.matched == 2
    assert all(torch.equal(m.state_dict()[k], v) for k, v in want.items())
    _linear_file(path, weight=want['weight'], other=torch.ones(1))
    with pytest.raises(CheckpointMismatchError) as info:
        loading.load_pretrained(nn.Linear(2, 3), str(path))
    assert 'partial load is intended' not in str(info.value)
    with pytest.raises(
            CheckpointMismatchError,
            match=r'intended \(e\.g\. another head\), set X\.$'):
        loading.load_pretrained(nn.Linear(2, 3), str(path), opt_in='set X')


def test_load_pretrained_reads_with_map_location(tmp_path):
    """``map_location`` (``init_cfg``'s) is what reads the file."""
    path = tmp_path / 'w.pth'
    _linear_file(path)
    seen, to_cpu = _locations()
    loading.load_pretrained(nn.Linear(2, 3), str(path), map_location=to_cpu)
    assert seen and set(seen) == {'cpu'}


def test_load_pretrained_mmsoft_layout_takes_state_dict(tmp_path):
    """Not the EMA copy (as mmengine's loaders; authors' files: EMA)."""
    path = tmp_path / 'w.pth'
    raw = {'weight': torch.zeros(3, 2), 'bias': torch.zeros(3)}
    ema = {'weight': torch.ones(3, 2), 'bias': torch.ones(3)}
    _linear_file(path, state_dict_ema=ema, state_dict=raw)
    m = nn.Linear(2, 3)
    loading.load_pretrained(m, str(path))
    assert all(torch.equal(m.state_dict()[k], v) for k, v in raw.items())


def _authors_state_dict(**drop):
    sd = ref.random_official_state_dict([32, 64, 128, 192], [1, 2, 4, 6],
                                        [1, 1, 2, 1],
                                        num_classes=5,
                                        pretrain_img_size=64,
                                        ratios=(4, 2, 2),
                                        dtype=torch.float32)
    return {k: v for k, v in sd.items() if not k.startswith(tuple(drop))}


def test_load_pretrained_files_it_cannot_use_are_one_error(tmp_path):
    path = str(tmp_path / 'w.pth')
    torch.save({'model': _authors_state_dict(pos_embed2=1)}, path)
    with pytest.raises(CheckpointMismatchError) as info:
        loading.load_pretrained(nn.Linear(2, 3), path)
    assert str(info.value) == (
        f"checkpoint {path} has the authors' SOFT key layout (fudan-zvg/SOFT)"
        " but cannot be converted: cannot infer the architecture: key "
        "'pos_embed2' is missing")
    torch.save({'meta': {}}, path)
    with pytest.raises(
            CheckpointMismatchError,
            match=f'^checkpoint {re.escape(path)}: no state dict '
            'found in the checkpoint'):
        loading.load_pretrained(nn.Linear(2, 3), path)
    # an authors' file for a module without a SOFT backbone: converted, then
    # the usual mismatch error (not a crash on the missing SOFT)
    torch.save(_authors_state_dict(), path)
    with pytest.raises(CheckpointMismatchError, match=re.escape(path)):
        loading.load_pretrained(nn.Linear(2, 3), path)


# ---------------------------------------------- missing_weights_message
def test_missing_weights_message_documented_line():
    """The line of docs/en/user_guides/official_weights.md."""
    doc = osp.join(
        osp.dirname(__file__), *[os.pardir] * 3, 'docs', 'en', 'user_guides',
        'official_weights.md')
    with open(doc) as f:
        line = next(ln for ln in f if ln.startswith('error: checkpoints/'))
    msg = loading.missing_weights_message('checkpoints/soft_norm_small.pth')
    assert line.rstrip('\n') == f'error: {msg}'


def test_missing_weights_message_other_forms():
    """An unpublished size, an unknown file, another config key."""
    tail = ('or use another file with --cfg-options {key}=PATH; to train '
            'from scratch on purpose: --cfg-options {b}.init_cfg=None '
            '{b}.norm_eval=False')
    key = 'model.backbone.init_cfg.checkpoint'
    assert loading.missing_weights_message('w/soft_small.pth') == (
        f'w/soft_small.pth ({key}) does not exist: the authors publish no '
        f'soft_small file ({OFFICIAL_PAGE}): train configs/soft_small_in1k'
        f'.py and give its checkpoint, ' +
        tail.format(key=key, b='model.backbone'))
    assert loading.missing_weights_message('mine.pth') == (
        f"mine.pth ({key}) does not exist: download the authors' ImageNet "
        f'file from {OFFICIAL_PAGE}, ' +
        tail.format(key=key, b='model.backbone'))
    key = 'model.img_backbone.init_cfg.ckpt'
    assert loading.missing_weights_message(
        'soft_tiny.pth', 'model.img_backbone', 'init_cfg.ckpt') == (
            f"soft_tiny.pth ({key}) does not exist: download the authors' "
            f"soft_tiny ImageNet file ('SOFT_Tiny' on {OFFICIAL_PAGE}) to "
            'that path, ' + tail.format(key=key, b='model.img_backbone'))


# ------------------------------------------------ pretrained_init_cfg
_NORMAL = dict(type='TruncNormal', layer='Linear', std=.02)


def _pre(checkpoint='a.pth', type='Pretrained', **kw):
    return dict(type=type, checkpoint=checkpoint, **kw)


def _soft(checkpoint='a.pth', **kw):
    return _pre(checkpoint, 'SOFTPretrained', **kw)


# a list stays a list; the load runs last (mmengine's order)
@pytest.mark.parametrize('init_cfg, want, loads_all', [
    (None, None, False),
    (_NORMAL, _NORMAL, False),
    (_pre(), _soft(), True),
    (_pre(strict=False), _soft(strict=False), False),
    ([_pre()], [_soft()], True),
    ([_pre(strict=True), _NORMAL], [_NORMAL, _soft(strict=True)], True),
    ([_pre(strict=False), _pre('b.pth')
      ], [_soft(strict=False), _soft('b.pth')], True),
])
def test_pretrained_init_cfg(init_cfg, want, loads_all):
    """Pretrained -> the strict loader, shape kept, whether it loads all."""
    with current_log() as records:
        got = loading.pretrained_init_cfg(init_cfg)
    assert got == (want, loads_all)
    assert records == []  # nothing dropped, nothing logged


@pytest.mark.parametrize('init_cfg, want',
                         [(_pre(None), None),
                          ([_NORMAL, _pre(None)], [_NORMAL])])
def test_pretrained_init_cfg_without_checkpoint(init_cfg, want):
    """``checkpoint=None`` drops the entry, logging one line (the owner)."""
    with current_log() as records:
        assert loading.pretrained_init_cfg(init_cfg) == (want, False)
        loading.pretrained_init_cfg(init_cfg, owner='MyNet')
    assert [r.getMessage() for r in records] == [
        'SOFT: init_cfg has no checkpoint; using random initialisation',
        'MyNet: init_cfg has no checkpoint; using random initialisation'
    ]


def test_pretrained_load_is_named_in_the_init_info(tmp_path):
    """mmengine's init-info dump names the strict loader and the file."""
    arch = dict(
        embed_dims=[8, 8, 8, 8], num_heads=[1, 1, 1, 1], depths=[1, 1, 1, 1])
    path = tmp_path / 'own.pth'
    torch.save(SOFT(arch, pretrain_img_size=32).state_dict(), str(path))
    model = SOFT(
        arch,
        pretrain_img_size=32,
        init_cfg=dict(type='Pretrained', checkpoint=str(path)))
    with current_log(logging.DEBUG) as records:
        model.init_weights()
    dump = '\n'.join(r.getMessage() for r in records)
    assert f'ffn.layers.1.weight - torch.Size([8, 32]): \n' \
        f'SOFTPretrainedInit: load from {path}' in dump, dump[-2000:]


def test_init_cfg_loader_defaults_and_map_location(tmp_path, monkeypatch):
    """Checkpoint, prefix, map_location and strict defaults passed on."""
    calls = []
    monkeypatch.setattr(loading, 'load_pretrained',
                        lambda *a, **k: calls.append((a, k)))
    path = tmp_path / 'x.pth'
    path.write_bytes(b'')
    init = loading.SOFTPretrainedInit(str(path), 'backbone.', 'meta')
    assert init.map_location == 'meta'
    init(nn.Linear(2, 2))
    assert calls == [
        ((calls[0][0][0], str(path), 'backbone.', 'meta'),
         dict(strict=True, opt_in='set model.backbone.init_cfg.strict=False'))
    ]


def test_official_soft_hint():
    """The converter command for an authors' file; None for another."""
    sd = ref.random_official_state_dict([8, 8, 8, 8], [1, 1, 1, 1],
                                        [1, 1, 1, 1],
                                        pretrain_img_size=32,
                                        dtype=torch.float32)
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
        'SRC is an official SOFT checkpoint')
    assert 'soft2mmsoft.py SRC weights/SRC [' in official_soft_hint(sd)
    assert 'soft2mmsoft.py /data/ weights/soft.pth [' in \
        official_soft_hint(sd, '/data/')
    assert official_soft_hint({'state_dict': {'w': torch.zeros(1)}}) \
        is None


def test_few_keys():
    keys = [f'k{i}' for i in range(8)]
    assert few_keys(keys[:5]) == 'k0, k1, k2, k3, k4'
    assert few_keys(keys[:6]) == 'k0, k1, k2, k3, k4, ... (+1 more)'
    assert few_keys(keys) == 'k0, k1, k2, k3, k4, ... (+3 more)'
    assert few_keys(keys, 2) == 'k0, k1, ... (+6 more)'
    assert few_keys([]) == ''
