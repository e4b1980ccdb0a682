"""Official <-> mmsoft checkpoint conversion (tools/model_converters/*),
against ``tests/reference``'s official naming (written independently)."""
import argparse
import os
import os.path as osp
import re
import shutil
from collections import OrderedDict

import pytest
import torch
from conftest import ROOT, dead_pid, flip_tensor_bytes, load_module, tiny_arch
from reference import official_soft_ref as ref

from mmsoft.models import converters as ok
from mmsoft.models.backbones.soft import SOFT
from mmsoft.models.converters import ConversionError
from mmsoft.utils import checkpoint_io as cio
from model_converters import checkpoint_files as cf

TINY = dict(
    embed_dims=[64, 128, 320, 512],
    num_heads=[2, 4, 10, 16],
    depths=[1, 2, 3, 2])
TOOLS = {
    n: load_module(osp.join(ROOT, 'tools', 'model_converters', n + '.py'), n)
    for n in ('soft2mmsoft', 'mmsoft2soft')
}
to_official = TOOLS['mmsoft2soft'].convert_mmpretrain_to_official


def official_state_dict(embed_dims, num_heads, depths, num_classes=1000, **kw):
    """Random official tensors in the official order (pos embeddings, cls
    token first)."""
    sd = ref.random_official_state_dict(
        embed_dims, num_heads, depths, num_classes, 224, dtype=torch.float32,
        **kw)  # yapf: disable
    for k in ('cls_token', 'pos_embed4', 'pos_embed3', 'pos_embed2',
              'pos_embed1'):
        sd.move_to_end(k, last=False)
    return sd


def tool(name, *argv):
    return TOOLS[name].main([str(a) for a in argv])


def one_line_error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    return err


def raised(fn, *args, exc=ConversionError, **kwargs):
    with pytest.raises(exc) as e:
        fn(*args, **kwargs)
    return str(e.value)


@pytest.fixture(scope='module')
def tiny_sd():
    return official_state_dict(**TINY)


@pytest.fixture(scope='module')
def files(tmp_path_factory):
    """An authors' file of tiny_arch() and its soft2mmsoft.py conversion."""
    tmp = tmp_path_factory.mktemp('converters')
    torch.save({'state_dict': official_state_dict(**tiny_arch())},
               tmp / 'official.pth')
    assert tool('soft2mmsoft', tmp / 'official.pth', tmp / 'mmsoft.pth') == 0
    return tmp / 'official.pth', tmp / 'mmsoft.pth'


def backbone_part(sd):
    return {k[9:]: v for k, v in sd.items() if k.startswith('backbone.')}


def _with(sd, pattern, tensor):
    return OrderedDict(
        (k, tensor if re.fullmatch(pattern, k) else v) for k, v in sd.items())


class Opaque:
    pass


def test_key_mapping_and_arch_inference(tiny_sd):
    """A bijection on the official soft_tiny (its numbers), the arch and its
    names inferred; another arch converts and loads."""
    assert len(tiny_sd) == 187
    assert sum(v.numel() for k, v in tiny_sd.items()
               if not k.endswith(('running_mean', 'running_var',
                                  'num_batches_tracked'))) == 13_069_056
    # the keys one to one (back: test_cli_round_trip): mmsoft's SOFT's
    arch = ok.infer_official_arch(tiny_sd)
    mm_sd = ok.convert_official_to_mmpretrain(tiny_sd)[0]
    cf.check_converted(backbone_part(mm_sd), dict(arch, num_classes=0), 'x')
    want = set(SOFT(arch='tiny').state_dict())
    assert set(mm_sd) == {'backbone.' + k for k in want} | {
        'head.fc.weight', 'head.fc.bias'}  # yapf: disable
    for bad in ('head.fc.weight.x', 'block1.0.att.mha.W_k.weight',
                'patch_embed2.proj.3.weight', 'patch_embed1.proj.2.weight',
                'block4.0.attn.sr.weight', 'pos_embed5', 'foo'):
        assert ok.official_to_mmsoft_key(bad) is None, bad
    for bad in ('stages.0.blocks.0.attn.k.weight',
                'stages.1.patch_embed.proj.1.conv.weight', 'neck.fc.weight',
                'stages.2.cls_token'):
        assert ok.mmsoft_to_official_key(bad) is None, bad
    assert arch == dict(
        TINY, sampling_ratios=[8, 4, 2, 1], dw_kernel_sizes=[9, 5, 3, None],
        mlp_ratios=[4, 4, 4, 4], in_channels=3, num_classes=1000,
        pretrain_img_size=224, stage4_heads_given=False)  # yapf: disable
    assert all(type(r) is int for r in arch['mlp_ratios'])
    assert ok.describe_arch(arch) == "arch='tiny'"
    assert ok.official_model_name(arch) == 'soft[_norm]_tiny'
    assert ok.match_arch_preset(dict(arch, depths=[1, 3, 20, 4])) == \
        'small-official'
    other = dict(arch, depths=[1, 1, 2, 1])
    assert ok.match_arch_preset(other) is None
    assert ok.describe_arch(other) == (
        'arch=dict(embed_dims=[64, 128, 320, 512], num_heads=[2, 4, 10, 16], '
        'depths=[1, 1, 2, 1])')
    assert ok.infer_official_arch(tiny_sd, 16)['stage4_heads_given'] is True
    odd = _with(tiny_sd, r'block1\.\d+\.att\.ff1\.weight', torch.zeros(96, 64))
    assert ok.infer_official_arch(odd)['mlp_ratios'][0] == 1.5  # 96 / 64
    gray = _with(tiny_sd, r'patch_embed1\.proj\.0\.weight',
                 torch.zeros(64, 1, 3, 3))
    assert ok.infer_official_arch(gray)['in_channels'] == 1
    narrow = official_state_dict([64, 128, 320, 16], [2, 4, 10, 1],
                                 [1, 1, 1, 1])
    assert ok.infer_official_arch(narrow)['num_heads'][3] == 1
    sd = official_state_dict([64, 128, 288, 512], [2, 4, 9, 16], [1, 1, 1, 1],
                             ratios=(4, 4, 2), convs=(7, 5, 3),
                             num_classes=10)  # yapf: disable
    arch = ok.infer_official_arch(sd)
    assert ok.arch_for_mmsoft(arch) == dict(
        embed_dims=[64, 128, 288, 512], num_heads=[2, 4, 9, 16],
        depths=[1, 1, 1, 1], sampling_ratios=[4, 4, 2, 1],
        dw_kernel_sizes=[7, 5, 3, None])  # yapf: disable
    out, _ = ok.convert_official_to_mmpretrain(sd)
    SOFT(arch=ok.arch_for_mmsoft(arch)).load_state_dict(
        backbone_part(out), strict=True)
    assert out['head.fc.weight'].shape == (10, 512)
    assert ok.infer_official_arch(sd, stage4_heads=8)['num_heads'][3] == 8


def test_infer_arch_refusals(tiny_sd):
    no_pos3 = OrderedDict(tiny_sd)
    del no_pos3['pos_embed3']
    for sd, heads, msg in (
        (no_pos3, None, "cannot infer the architecture: key 'pos_embed3' is "
         'missing'),
        (_with(tiny_sd, r'block2\.0\.att\.mha\.attn\.conv\.weight',
               torch.zeros(3, 1, 5, 5)), None,
         'inconsistent stage 2: 3 heads (block2.*.att.mha.attn.conv.weight '
         '(3, 1, 5, 5)) x head width 32 (Qlandmark_op (32, 32, 4, 4)) != '
         'embed dim 128'),  # block 0 of 2: the first shape
        (_with(tiny_sd, r'block1\.\d+\.att\.mha\.attn\.Qlandmark_op\.weight',
               torch.zeros(32, 32)), None,
         'cannot infer the architecture: block1.*.att.mha.attn.'
         'Qlandmark_op.weight should be (d, d, r, r) and .conv.weight (heads, '
         '1, k, k); found (32, 32) and (2, 1, 9, 9) (linear landmark ops, '
         'sr_ratio 1, are not supported)'),
            *[(tiny_sd, bad, 'stage-4 heads must be a positive integer, got '
               f'{bad!r}') for bad in (True, 2.5, 0)],
        (tiny_sd, 7, 'stage-4 heads 7 do not divide its embed dim 512'),
        (official_state_dict([64, 128, 320, 496], [2, 4, 10, 16],
                             [1, 2, 3, 2]), None,
         "stage-4 heads 15 do not divide its embed dim 496 (stage 3's head "
         'width 32); give them explicitly'),
    ):
        assert raised(cf.infer_arch, sd, stage4_heads=heads) == msg
    assert cf.infer_arch(tiny_sd, stage4_heads=1)['num_heads'] == \
        [2, 4, 10, 1]


def _old_keys(mm):
    """The keys of an mmsoft 0.1 checkpoint."""
    old = OrderedDict()
    for k, v in mm.items():
        for a, b in ((r'\.ffn\.layers\.0\.0\.',
                      '.ffn.fc1.'), (r'\.ffn\.layers\.1\.', '.ffn.fc2.'),
                     (r'^backbone\.stages\.(\d)\.patch_embed\.',
                      r'backbone.patch_embeds.\1.'),
                     (r'^backbone\.stages\.(\d)\.pos_embed$',
                      r'backbone.pos_embeds.\1'),
                     (r'^backbone\.stages\.(\d)\.blocks\.(\d+)\.',
                      r'backbone.stages.\1.\2.'),
                     (r'^backbone\.stages\.3\.(cls_token|norm\.)',
                      r'backbone.\1')):
            k = re.sub(a, b, k)
        old[k] = v
    return old


def test_unknown_missing_and_mismatched_keys_are_named(tmp_path, capsys,
                                                       tiny_sd):
    """Either tool: one line naming them (the odd block 0 of stage 3's three
    is reported, not taken as the arch), nothing written."""
    sd = OrderedDict(tiny_sd)
    sd['block4.0.attn.sr.weight'] = torch.zeros(512, 512, 1, 1)
    del sd['block2.1.att.ff2.bias']
    sd['block3.2.att.mha.W_v.weight'] = torch.zeros(320, 321)
    assert raised(ok.convert_official_to_mmpretrain, sd) == (
        "1 keys have no counterpart in mmsoft's SOFT: block4.0.attn.sr.weight "
        '(512, 512, 1, 1)')
    mm, _ = ok.convert_official_to_mmpretrain(tiny_sd)
    assert raised(to_official, dict(mm, **{
        'neck.proj.weight': torch.zeros(2, 2)})).startswith(
            'the mmsoft checkpoint has keys with no official counterpart (1: '
            'neck.proj.weight (2, 2)); only an ')  # yapf: disable
    bad = OrderedDict(mm)
    bad['backbone.stages.2.blocks.0.ffn.layers.0.0.weight'] = torch.zeros(
        1279, 320)
    del bad['backbone.stages.2.blocks.1.attn.sampler.norm.bias']
    src = tmp_path / 'src.pth'
    for script, sd, parts in (
        ('soft2mmsoft', sd,
         ('185 of its 187 tensors would load.',
          'missing from the checkpoint: block2.1.att.ff2.bias;',
          '(unexpected): block4.0.attn.sr.weight;',
          '1 tensors have another shape: block3.2.att.mha.W_v.weight '
          '(checkpoint [320, 321] vs model [320, 320])')),
        ('mmsoft2soft', bad,
         ('185 of its 186 tensors would load.',
          '1 tensors have another shape: backbone.stages.2.blocks.0.ffn.'
          'layers.0.0.weight (checkpoint [1279, 320] vs model [1280, 320])',
          'missing from the checkpoint: '
          'backbone.stages.2.blocks.1.attn.sampler.norm.bias;')),
    ):
        torch.save({'state_dict': sd}, src)
        assert tool(script, src, tmp_path / 'o.pth') == 1
        err = one_line_error(capsys)
        assert err.startswith(f"error: checkpoint '{src}' does not match "
                              "the SOFT of its shapes (arch='tiny'): ")
        assert all(part in err for part in parts), err
        assert sorted(os.listdir(tmp_path)) == ['src.pth']


def test_state_dict_entries(tiny_sd):
    """The entry read (EMA preferred, --ema / --no-ema), 'module.' prefixes,
    the authors' keys found (half of them at least); the refusals."""
    ema = OrderedDict((k, v + 1) for k, v in tiny_sd.items())
    sd, src = ok.extract_state_dict(
        dict(state_dict=tiny_sd, state_dict_ema=ema, epoch=3))
    assert src == 'state_dict_ema' and sd['cls_token'].equal(ema['cls_token'])
    sd, src = ok.extract_state_dict(
        dict(state_dict=tiny_sd, state_dict_ema=ema), prefer_ema=False)
    assert src == 'state_dict' and sd['cls_token'].equal(tiny_sd['cls_token'])
    assert ok.extract_state_dict(tiny_sd)[1] == '<bare>'
    # DataParallel inside DDP: every prefix goes; an empty EMA entry: skipped
    for ckpt in (dict(model={'module.module.' + k: v
                             for k, v in tiny_sd.items()}),
                 {'state_dict_ema': {}, 'model': tiny_sd}):  # yapf: disable
        sd, src = ok.extract_state_dict(ckpt)
        assert src == 'model' and list(sd) == list(tiny_sd)
    assert raised(ok.extract_state_dict,
                  [1]) == 'checkpoint is a list, not a dict'
    assert raised(ok.extract_state_dict, {
        f'k{i:02d}': 1 for i in range(25)
    }) == ("no state dict found in the checkpoint: expected one of "
           "['state_dict_ema', 'model_ema', 'state_dict', 'model'] "
           'holding tensors, or a bare state dict; top-level keys '
           f'are {[f"k{i:02d}" for i in range(20)]}')  # yapf: disable
    assert raised(ok.strip_module_prefix, {'module.a': 1, 'a': 2}) == \
        'keys occur twice after stripping "module." prefixes'
    authors = ['pos_embed1', 'patch_embed1.proj.0.weight']
    for keys, found in [(authors + ['a', 'b', 'c'], True),
                        (authors + ['a', 'b', 'c', 'd'], False),
                        (['x'], False),
                        (['cls_token', 'norm.weight', 'head.weight'], False)]:
        sd = dict.fromkeys(keys, torch.zeros(1))
        assert (ok.find_official_state_dict(sd) is not None) == found, keys
    sd = OrderedDict(w=torch.zeros(1))
    assert raised(
        cf.official_weights, {'model': sd}, 'b.pth', ema=True) == (
            "--ema given but 'b.pth' has no state_dict_ema / model_ema entry "
            "(found 'model')")
    for entry in ('state_dict_ema', 'model_ema'):
        only_ema = {entry: sd}
        both = {'model': dict(w=torch.ones(1)), entry: sd}
        assert cf.official_weights(only_ema, 'a.pth') == (sd, entry)
        assert cf.official_weights(only_ema, 'a.pth', ema=True) == (sd, entry)
        assert raised(
            cf.official_weights, only_ema, 'a.pth', ema=False
        ) == (f"--no-ema given but 'a.pth' only holds EMA weights ({entry!r})")
        assert cf.official_weights(both, 'a.pth', ema=False)[1] == 'model'
        assert cf.official_weights(both, 'a.pth')[1] == entry


def test_cli_round_trip(tmp_path, tiny_sd, capsys):
    ema = OrderedDict((k, v * 2) for k, v in tiny_sd.items())
    src = tmp_path / 'official.pth.tar'
    torch.save(
        dict(
            state_dict={
                'module.' + k: v
                for k, v in tiny_sd.items()
            },
            state_dict_ema=ema,
            epoch=299,
            args=argparse.Namespace(model='soft_norm_tiny')), src)
    dst = tmp_path / 'mmsoft.pth'
    assert tool('soft2mmsoft', src, dst, '--norm') == 0
    log = capsys.readouterr().out
    for part in ("reading 'state_dict_ema'", "arch='tiny'",
                 '(official soft_norm_tiny)', 'not visible in the weights'):
        assert part in log, part
    ckpt = torch.load(dst, weights_only=True)
    assert set(ckpt) == {'state_dict', 'meta'}
    assert (ckpt['meta']['attn_norm'], ckpt['meta']['arch'],
            ckpt['meta']['source_entry']) == (True, 'tiny', 'state_dict_ema')
    model = SOFT(arch='tiny')
    model.load_state_dict(backbone_part(ckpt['state_dict']), strict=True)
    assert torch.equal(model.stages[3].cls_token, ema['cls_token'])
    assert tool('soft2mmsoft', src, tmp_path / 'raw.pth', '--no-ema') == 0
    assert '(official soft_tiny)' in capsys.readouterr().out
    raw = torch.load(tmp_path / 'raw.pth', weights_only=True)
    assert raw['meta']['attn_norm'] is False
    assert torch.equal(raw['state_dict']['backbone.stages.3.cls_token'],
                       tiny_sd['cls_token'])
    assert tool('mmsoft2soft', dst, tmp_path / 'back.pth') == 0
    assert 'soft_norm_tiny' in capsys.readouterr().out
    official = torch.load(tmp_path / 'back.pth', weights_only=True)
    assert list(official['state_dict']) == list(tiny_sd)
    assert all(torch.equal(official['state_dict_ema'][k], ema[k]) for k in ema)
    # a bare backbone state dict (no prefix, no head) converts too
    back, arch = to_official(backbone_part(ckpt['state_dict']))
    assert arch['num_classes'] == 0 and 'head.weight' not in back
    assert len(back) == len(tiny_sd) - 2


@pytest.fixture(scope='module')
def inputs(files, tmp_path_factory):
    """The faulty inputs of :data:`CLI_FAULTS` in one folder."""
    d = tmp_path_factory.mktemp('inputs')
    official, mm = torch.load(files[0]), torch.load(files[1])['state_dict']
    torch.save(dict(official, obj=Opaque()), d / 'objects.pth')
    flip_tensor_bytes(shutil.copy(files[1], d / 'flipped.pth'), 4)
    torch.load(d / 'flipped.pth')  # the fault: loads silently
    torch.save({'model': {'foo': torch.zeros(1)}}, d / 'no_arch.pth')
    torch.save(backbone_part(mm), d / 'bare.pth')
    torch.save(dict(state_dict=_old_keys(mm)), d / 'v1.pth')
    (d / 'link.pth').symlink_to(files[0])
    (d / 'weights').write_text('not a folder')
    return dict(files=files, d=d)


#: (id, tool, SRC, DST, options, parts of the one-line error: 'error: c...'
#: the whole line, '!x': not x); files of the inputs' folder
CLI_FAULTS = [
    ('no-ema', 'soft2mmsoft', 'official', 'o.pth', ['--ema'],
     ['no state_dict_ema']),
    # untrusted pickled objects are refused, naming them, with a hint
    ('objects', 'soft2mmsoft', 'objects.pth', 'o.pth', [],
     [f'{__name__}.Opaque', '--trust-checkpoint']),
    ('flipped', 'mmsoft2soft', 'flipped.pth', 'o.pth', [],
     ['damaged', 'SRC', '!trust']),
    # truncated: test_faults.py's soft2mmsoft-truncated
    ('output-links-input', 'soft2mmsoft', 'official', 'link.pth', [],
     ['is the input file']),
    ('output-is-input', 'mmsoft2soft', 'mmsoft', 'mmsoft', [],
     ['is the input file']),
    ('no-arch', 'soft2mmsoft', 'no_arch.pth', 'new/x.pth', [],
     ["error: cannot infer the architecture: key 'pos_embed1' is missing"]),
    # issue 51: a file where the output's folder should be
    *[(f'file-in-the-way-{dst[8:9]}', 'soft2mmsoft', 'official', dst, [], [
        "error: cannot create the output directory of 'DST': 'D/weights' is "
        'a file, not a directory; choose another output path'
    ]) for dst in ('weights/x.pth', 'weights/sub/x.pth')],
    # issue 52: already mmsoft's: one line saying so, not "cannot infer"
    *[(f'already-mmsoft-{src[:-4]}', 'soft2mmsoft', src, 'again.pth', [], [
        "error: 'SRC' is already an mmsoft checkpoint (",
        "needs no conversion: use it directly, e.g. load_from='SRC'",
        '!cannot infer'
    ]) for src in ('mmsoft', 'bare.pth', 'v1.pth')],
]


@pytest.mark.parametrize(
    'script, src, dst, options, parts', [c[1:] for c in CLI_FAULTS],
    ids=[c[0] for c in CLI_FAULTS])
def test_cli_fault_is_one_line_and_writes_nothing(inputs, capsys, script, src,
                                                  dst, options, parts):
    d, (official, mm) = inputs['d'], inputs['files']
    src, dst = (
        str(dict(official=official, mmsoft=mm).get(p, d / p))
        for p in (src, dst))
    before = sorted(os.listdir(d))
    assert tool(script, src, dst, *options) == 1
    out, err = capsys.readouterr()
    err = err.strip()
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    for part in parts:
        part = part.replace('SRC', src).replace('DST',
                                                dst).replace('D/', f'{d}/')
        if part.startswith('!'):
            assert part[1:] not in err, err
        else:
            assert err == part if part.startswith('error: c') else part in err
    assert sorted(os.listdir(d)) == before
    assert 'reading' not in out or 'no_arch' in src


def test_output_folders_made_or_removed(files, tmp_path, capsys, monkeypatch):
    """The command of README.md / get_started.md (``soft2mmsoft.py SRC
    weights/SRC``) from a folder without ``weights/``; nested folders; a
    failed write or a folder that cannot be made: none left, one line."""
    monkeypatch.chdir(tmp_path)
    for name, src, dst, made in (('soft2mmsoft', files[0], 'weights/x.pth',
                                  'weights'),
                                 ('mmsoft2soft', files[1],
                                  tmp_path / 'a' / 'b' / 'out.pth',
                                  tmp_path / 'a' / 'b')):
        assert tool(name, src, dst) == 0 and osp.isfile(tmp_path / dst)
        assert f'created the output directory {made}\n' in \
            capsys.readouterr().out
        assert tool(name, src, dst) == 0  # it exists: nothing said
        assert 'created the output' not in capsys.readouterr().out
    (tmp_path / 'kept').mkdir()

    def full_disk(obj, path):
        raise ConversionError(f'cannot write {path!r}: No space left on '
                              'device (errno 28); nothing was written')

    monkeypatch.setattr(cf, 'save_checkpoint_atomic', full_disk)
    dst = tmp_path / 'kept' / 'new' / 'deeper' / 'x.pth'
    assert tool('soft2mmsoft', files[0], dst) == 1
    assert 'No space left on device' in capsys.readouterr().err
    assert os.listdir(tmp_path / 'kept') == []  # made and removed

    def refuse(path, *args, **kwargs):
        raise PermissionError(13, 'Permission denied', path)

    monkeypatch.setattr(os, 'makedirs', refuse)  # the shared helper's
    dst = tmp_path / 'ro' / 'x.pth'
    assert tool('mmsoft2soft', files[1], dst) == 1
    assert one_line_error(capsys) == (
        f'error: cannot create the output directory {str(dst.parent)!r}: '
        'Permission denied; choose another output path')


def test_save_checkpoint_atomic(tmp_path, monkeypatch):
    """Durable; a killed conversion's temporary goes at the next run (its
    own only); an OS error: one line, the old file kept (another error:
    test_checkpoint_io's test_full_disk_behind_another_exception...)."""
    pid, synced, real = dead_pid(), [], os.fsync
    mine = tmp_path / f'.ckpt.pth.{pid}.0123abcd{cio.TMP_SUFFIX}'
    other = tmp_path / f'.other.pth.{pid}.0123abcd{cio.TMP_SUFFIX}'
    mine.write_bytes(b'half')
    other.write_bytes(b'half')
    monkeypatch.setattr(
        os, 'fsync', lambda fd: synced.append(
            os.readlink(f'/proc/self/fd/{fd}')) or real(fd))
    dst = tmp_path / 'ckpt.pth'
    cf.save_checkpoint_atomic({'a': torch.ones(2)}, str(dst))
    assert torch.load(dst)['a'].equal(torch.ones(2))
    assert len(synced) >= 2 and str(tmp_path) in synced, synced
    assert not mine.exists() and other.exists()
    other.unlink()
    before = dst.read_bytes()
    no, d = tmp_path / 'no', tmp_path / 'd.pth'
    d.mkdir()
    assert raised(cf.save_checkpoint_atomic, {}, str(
        no / 'x.pth')) == (f'output directory {str(no)!r} does not exist')
    assert raised(cf.save_checkpoint_atomic, {}, str(d)) == (
        f'output {str(d)!r} is a directory, not a regular file: refusing to '
        'replace it')
    for err, tail in ((OSError(28, 'No space left on device'),
                       'No space left on device (errno 28)'),
                      (OSError('quota'), 'quota')):
        monkeypatch.setattr(
            cf,
            'save_atomic',
            lambda *a, err=err, **k: (_ for _ in ()).throw(err))
        assert raised(cf.save_checkpoint_atomic, {}, str(dst)) == \
            f'cannot write {str(dst)!r}: {tail}; nothing was written'
        assert dst.read_bytes() == before


class _FailingState:
    """An object whose unpickling raises ValueError(text)."""

    def __init__(self, text):
        self.text = text

    def __setstate__(self, state):
        raise ValueError(state['text'])


def test_load_checkpoint_file_and_output_path_contracts(tmp_path):
    load = cf.load_checkpoint_file
    assert raised(load, str(tmp_path / 'gone.pth')) == \
        f"checkpoint {str(tmp_path / 'gone.pth')!r} does not exist"
    assert raised(load, str(tmp_path)) == \
        f'checkpoint {str(tmp_path)!r} is a directory, not a file'
    timm, ns = tmp_path / 'timm.pth', argparse.Namespace(lr=1)
    torch.save(dict(state_dict=dict(w=torch.ones(1)), args=ns), str(timm))
    got = load(str(timm))
    assert got['args'].lr == 1 and got['state_dict']['w'].tolist() == [1.]
    objs = tmp_path / 'objects.pth'
    torch.save(dict(args=ns, o=Opaque(), w=torch.ones(1)), str(objs))
    assert raised(load, str(objs)) == (
        f'checkpoint {objs} was refused: it holds pickled objects other than '
        f'tensors and plain containers ({__name__}.Opaque), which could run '
        'code when unpickled; if you trust the file, run again with '
        '--trust-checkpoint')
    trusted = load(str(objs), trust=True)
    assert type(trusted['o']) is Opaque and trusted['w'].device.type == 'cpu'
    # pickled code, trusted or not: test_checkpoint_safety.py's table;
    # trusted objects whose unpickling fails: one line, the first line
    for text, first in (('', ''), ('first\nsecond', 'first')):
        bad = tmp_path / 'bad_state.pth'
        torch.save({'x': _FailingState(text)}, str(bad))
        assert raised(load, str(bad), trust=True) == \
            f'cannot load {str(bad)!r} (ValueError: {first})'
    src, fifo, link = (tmp_path / n for n in ('in.pth', 'fifo', 'hard.pth'))
    src.write_bytes(b'x')
    os.mkfifo(fifo)
    os.link(src, link)
    for dst, msg in (
        (tmp_path, f'output {str(tmp_path)!r} is a directory; give a file '
         f"name, e.g. {str(tmp_path / 'in.pth')!r}"),
        (fifo, f'output {str(fifo)!r} is a FIFO, not a regular file: '
         'refusing to replace it; give a file name'),
        (link, f'output {str(link)!r} is the input file {str(src)!r}: '
         'refusing to replace it; choose another output path'),
    ):
        assert raised(cf.check_output_path, str(src), str(dst)) == msg
    cf.check_output_path(str(src), str(tmp_path / 'new.pth'))  # fine


def test_converter_parser_arguments(capsys):
    assert raised(
        tool, 'soft2mmsoft', 'a', 'b', '--stage4-heads', '0',
        exc=SystemExit) == '2'
    assert "expected a positive integer, got '0'" in capsys.readouterr().err
    p = cf.converter_parser('DESC', 'SRC-HELP', 'DST-HELP', 'HEADS-HELP', int)
    text = ' '.join(p.format_help().split())
    for part in ('DESC', 'SRC-HELP', 'DST-HELP', 'HEADS-HELP', 'unpickle '
                 'arbitrary objects in SRC (only for files you trust)'):
        assert part in text, text
    assert vars(p.parse_args(['a', 'b'])) == dict(
        src='a', dst='b', stage4_heads=None, trust_checkpoint=False)
    assert vars(
        p.parse_args(
            'a b --stage4-heads 8 --trust-checkpoint'.split())) == dict(
                src='a', dst='b', stage4_heads=8, trust_checkpoint=True)
