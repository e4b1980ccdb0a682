"""Official <-> mmsoft checkpoint conversion (tools/model_converters/*),
checked against the re-derivation of the official model (fudan-zvg/SOFT
naming) in ``tests/reference``, written independently of the converters;
the official ``soft_tiny``: 187 entries, 13,069,056 parameters."""
import argparse
import builtins
import os
import os.path as osp
import pickle
import re
import signal
import socket
import stat as st
import textwrap
from collections import OrderedDict

import pytest
import torch
from conftest import (CONFIGS, ROOT, dead_pid, flip_tensor_bytes, load_module,
                      random_model, run_python)
from reference import official_soft_ref as ref

from mmsoft.models import converters as ok
from mmsoft.models.backbones.soft import SOFT
from mmsoft.models.converters import ConversionError
from mmsoft.utils import checkpoint_io as cio
from mmsoft.utils.strict_load import check_state_dict

TINY = dict(
    embed_dims=[64, 128, 320, 512],
    num_heads=[2, 4, 10, 16],
    depths=[1, 2, 3, 2])


def official_state_dict(embed_dims, num_heads, depths, num_classes=1000, **kw):
    """Random official tensors in the official order (cls token after the
    position embeddings)."""
    arch = (embed_dims, num_heads, depths, num_classes, 224)
    sd = ref.random_official_state_dict(*arch, dtype=torch.float32, **kw)
    sd.move_to_end('cls_token', last=False)
    for i in (4, 3, 2, 1):
        sd.move_to_end(f'pos_embed{i}', last=False)
    return sd


def n_params(sd):
    return sum(v.numel() for k, v in sd.items()
               if not k.endswith(('running_mean', 'running_var',
                                  'num_batches_tracked')))


def load_script(name):
    return load_module(
        osp.join(ROOT, 'tools', 'model_converters', name + '.py'), name)


#: the converters' file helpers (tools/mmsoft_tools/checkpoint_files.py)
from mmsoft_tools import checkpoint_files as cf  # noqa: E402

#: the reverse conversion (tools only)
to_official = load_script('mmsoft2soft').convert_mmpretrain_to_official


@pytest.fixture(scope='module')
def tiny_sd():
    return official_state_dict(**TINY)


def prefixed(sd, prefix='module.'):
    return {prefix + k: v for k, v in sd.items()}


def backbone_part(sd):
    return {
        k[len('backbone.'):]: v
        for k, v in sd.items() if k.startswith('backbone.')
    }


# ------------------------------------------------------------ the mapping
def test_key_mapping_is_a_bijection(tiny_sd):
    assert len(tiny_sd) == 187  # the official soft_tiny's numbers
    assert n_params(tiny_sd) == 13_069_056
    # the tools' check (mmsoft's SOFT of the inferred arch, its keys
    # renamed) agrees with the official naming and shapes
    cf.check_converted(tiny_sd, ok.infer_official_arch(tiny_sd), 'x', True)
    mm = [ok.official_to_mmsoft_key(k) for k in tiny_sd]
    assert None not in mm and len(set(mm)) == len(mm)
    assert [ok.mmsoft_to_official_key(k) for k in mm] == list(tiny_sd)
    # the backbone keys are exactly mmsoft's SOFT state dict keys
    want = set(SOFT(arch='tiny').state_dict())
    assert {k for k in mm if not k.startswith('head.')} == want
    for bad in ('head.fc.weight.x', 'block1.0.att.mha.W_k.weight',
                'patch_embed2.proj.3.weight', 'patch_embed1.proj.2.weight',
                'block4.0.attn.sr.weight', 'pos_embed5', 'foo'):
        assert ok.official_to_mmsoft_key(bad) is None, bad
    for bad in ('stages.0.blocks.0.attn.k.weight',
                'stages.1.patch_embed.proj.1.conv.weight', 'neck.fc.weight',
                'stages.2.cls_token'):
        assert ok.mmsoft_to_official_key(bad) is None, bad


@pytest.mark.parametrize('depths,preset', [([1, 2, 3, 2], 'tiny'),
                                           ([1, 3, 20, 4], 'small-official'),
                                           ([1, 1, 2, 1], None)])
def test_infer_arch_and_preset(depths, preset):
    sd = official_state_dict(TINY['embed_dims'], TINY['num_heads'], depths)
    arch = ok.infer_official_arch(sd)
    assert arch['depths'] == depths
    assert arch['embed_dims'] == TINY['embed_dims']
    assert arch['num_heads'] == TINY['num_heads']
    assert arch['sampling_ratios'] == [8, 4, 2, 1]
    assert arch['dw_kernel_sizes'] == [9, 5, 3, None]
    assert arch['mlp_ratios'] == [4, 4, 4, 4]
    assert (arch['in_channels'], arch['num_classes'],
            arch['pretrain_img_size']) == (3, 1000, 224)
    assert not arch['stage4_heads_given']
    assert ok.match_arch_preset(arch) == preset
    if preset is None:
        assert ok.describe_arch(arch) == (
            'arch=dict(embed_dims=[64, 128, 320, 512], '
            'num_heads=[2, 4, 10, 16], depths=[1, 1, 2, 1])')
    else:
        assert ok.describe_arch(arch) == f"arch='{preset}'"


def test_infer_medium_and_non_default_entries():
    sd = official_state_dict([64, 128, 288, 512], [2, 4, 9, 16], [1, 1, 1, 1],
                             ratios=(4, 4, 2),
                             convs=(7, 5, 3),
                             num_classes=10)
    arch = ok.infer_official_arch(sd)
    assert arch['num_heads'] == [2, 4, 9, 16]
    assert ok.arch_for_mmsoft(arch) == dict(
        embed_dims=[64, 128, 288, 512],
        num_heads=[2, 4, 9, 16],
        depths=[1, 1, 1, 1],
        sampling_ratios=[4, 4, 2, 1],
        dw_kernel_sizes=[7, 5, 3, None])
    out, _ = ok.convert_official_to_mmpretrain(sd)
    model = SOFT(arch=ok.arch_for_mmsoft(arch))
    model.load_state_dict(backbone_part(out), strict=True)
    assert out['head.fc.weight'].shape == (10, 512)
    assert ok.infer_official_arch(sd, stage4_heads=8)['num_heads'][3] == 8


# ------------------------------------------------------------ conversion
@pytest.mark.parametrize('attn_norm', [False, True])
def test_convert_loads_strictly_and_runs(tiny_sd, attn_norm):
    out, arch = ok.convert_official_to_mmpretrain(tiny_sd)
    assert ok.describe_arch(arch) == "arch='tiny'"
    assert set(out) == {
        'backbone.' + k
        for k in SOFT(arch='tiny').state_dict()
    } | {'head.fc.weight', 'head.fc.bias'}
    model = SOFT(
        arch='tiny',
        attn_cfg=dict(type='SOFTAttention', attn_norm=attn_norm),
        out_type='cls_token',
        out_indices=(3, ))
    model.load_state_dict(backbone_part(out), strict=True)
    # values moved, not copied wrongly
    assert torch.equal(model.stages[1].blocks[1].attn.q.weight,
                       tiny_sd['block2.1.att.mha.W_q.weight'])
    assert torch.equal(model.stages[0].patch_embed.proj[2].bn.running_var,
                       tiny_sd['patch_embed1.proj.7.running_var'])
    assert torch.equal(
        model.stages[3].blocks[1].ffn.layers[1].bias,  # fc2
        tiny_sd['block4.1.mlp.fc2.bias'])
    assert torch.equal(out['head.fc.weight'], tiny_sd['head.weight'])
    model.eval()
    with torch.no_grad():
        (cls, ) = model(torch.randn(1, 3, 64, 64))
    assert cls.shape == (1, 512) and torch.isfinite(cls).all()


def test_round_trip(tiny_sd):
    mm, _ = ok.convert_official_to_mmpretrain(tiny_sd)
    back, arch = to_official(mm)
    assert list(back) == list(tiny_sd)
    assert all(torch.equal(back[k], tiny_sd[k]) for k in tiny_sd)
    assert ok.official_model_name(arch, True) == 'soft_norm_tiny'
    assert ok.official_model_name(arch, False) == 'soft_tiny'
    # a bare backbone state dict (no prefix, no head) converts too
    bare = backbone_part(mm)
    back2, arch2 = to_official(bare)
    assert arch2['num_classes'] == 0 and 'head.weight' not in back2
    assert len(back2) == len(tiny_sd) - 2


def _old_keys(mm, version):
    """The keys of an mmsoft 0.2 (``fc1`` / ``fc2``) or 0.1 checkpoint."""
    old = OrderedDict()
    for k, v in mm.items():
        k = re.sub(r'\.ffn\.layers\.0\.0\.', '.ffn.fc1.', k)
        k = re.sub(r'\.ffn\.layers\.1\.', '.ffn.fc2.', k)
        if version == 1:
            k = re.sub(r'^backbone\.stages\.(\d)\.patch_embed\.',
                       r'backbone.patch_embeds.\1.', k)
            k = re.sub(r'^backbone\.stages\.(\d)\.pos_embed$',
                       r'backbone.pos_embeds.\1', k)
            k = re.sub(r'^backbone\.stages\.(\d)\.blocks\.(\d+)\.',
                       r'backbone.stages.\1.\2.', k)
            k = re.sub(r'^backbone\.stages\.3\.(cls_token|norm\.)',
                       r'backbone.\1', k)
        old[k] = v
    return old


@pytest.mark.parametrize('version', [1, 2])
def test_old_mmsoft_checkpoints_are_refused(tiny_sd, version):
    """mmsoft 0.1 / 0.2 keys: refused in one line naming them (issue 50)."""
    mm, _ = ok.convert_official_to_mmpretrain(tiny_sd)
    with pytest.raises(ConversionError) as exc:
        to_official(_old_keys(mm, version))
    msg = str(exc.value)
    assert '\n' not in msg and 'no official counterpart' in msg
    assert ('backbone.pos_embeds.0 ' if version == 1 else
            'backbone.stages.0.blocks.0.ffn.fc1.weight') in msg


def test_missing_bn_counters_are_not_a_mismatch(tiny_sd):
    """Files without BN counters convert, pass the check, load strictly."""
    sd = {
        k: v
        for k, v in tiny_sd.items() if not k.endswith('num_batches_tracked')
    }
    assert len(sd) == len(tiny_sd) - 6
    cf.check_converted(sd, ok.infer_official_arch(sd), 'x', official=True)
    out, _ = ok.convert_official_to_mmpretrain(sd)
    SOFT(arch='tiny').load_state_dict(backbone_part(out), strict=True)


# ------------------------------------------------------------ error paths
def _tool_error(tmp_path, capsys, script, sd):
    """The one line of ``script`` converting ``sd`` (nothing written)."""
    src = tmp_path / 'src.pth'
    torch.save({'state_dict': sd}, src)
    assert load_script(script).main([str(src), str(tmp_path / 'o.pth')]) == 1
    err = _one_line_error(capsys)
    assert err.startswith(f"error: checkpoint '{src}' does not match the "
                          f'SOFT of its shapes (arch=')
    assert sorted(os.listdir(tmp_path)) == ['src.pth']
    return err


def test_unknown_missing_and_mismatched_keys_are_named(tmp_path, capsys,
                                                       tiny_sd):
    sd = OrderedDict(tiny_sd)
    sd['block4.0.attn.sr.weight'] = torch.zeros(512, 512, 1, 1)
    del sd['block2.1.att.ff2.bias']
    sd['block3.2.att.mha.W_v.weight'] = torch.zeros(320, 321)
    with pytest.raises(
            ConversionError,
            match=r"1 keys have no counterpart in mmsoft's SOFT: "
            r'block4.0.attn.sr.weight \(512, 512, 1, 1\)'):
        ok.convert_official_to_mmpretrain(sd)
    err = _tool_error(tmp_path, capsys, 'soft2mmsoft', sd)
    assert "arch='tiny'): 185 of its 187 tensors would load." in err
    assert 'missing from the checkpoint: block2.1.att.ff2.bias;' in err
    assert '(unexpected): block4.0.attn.sr.weight;' in err
    assert ('1 tensors have another shape: block3.2.att.mha.W_v.weight '
            '(checkpoint [320, 321] vs model [320, 320])') in err


def test_mmsoft_side_errors(tmp_path, capsys, tiny_sd):
    mm, _ = ok.convert_official_to_mmpretrain(tiny_sd)
    bad = OrderedDict(mm)
    bad['neck.proj.weight'] = torch.zeros(2, 2)
    with pytest.raises(
            ConversionError,
            match=r'the mmsoft checkpoint has keys with no official '
            r'counterpart \(1: neck.proj.weight \(2, 2\)\); only an '):
        to_official(bad)
    bad = OrderedDict(mm)
    # stage 3 has 3 blocks: the odd block 0 is reported, not taken as truth
    bad['backbone.stages.2.blocks.0.ffn.layers.0.0.weight'] = torch.zeros(
        1279, 320)
    del bad['backbone.stages.2.blocks.1.attn.sampler.norm.bias']
    err = _tool_error(tmp_path, capsys, 'mmsoft2soft', bad)
    assert "arch='tiny'): 185 of its 186 tensors would load." in err
    assert ('1 tensors have another shape: '
            'backbone.stages.2.blocks.0.ffn.layers.0.0.weight (checkpoint '
            '[1279, 320] vs model [1280, 320])') in err
    assert ('missing from the checkpoint: '
            'backbone.stages.2.blocks.1.attn.sampler.norm.bias;') in err


# ------------------------------------------------------------ checkpoint files
def test_extract_state_dict_layouts(tiny_sd):
    ema = OrderedDict((k, v + 1) for k, v in tiny_sd.items())
    sd, src = ok.extract_state_dict(
        dict(state_dict=tiny_sd, state_dict_ema=ema, epoch=3))
    assert src == 'state_dict_ema' and sd['cls_token'].equal(ema['cls_token'])
    sd, src = ok.extract_state_dict(
        dict(state_dict=tiny_sd, state_dict_ema=ema), prefer_ema=False)
    assert src == 'state_dict' and sd['cls_token'].equal(tiny_sd['cls_token'])
    sd, src = ok.extract_state_dict(dict(model=prefixed(tiny_sd)))
    assert src == 'model' and list(sd) == list(tiny_sd)
    sd, src = ok.extract_state_dict(tiny_sd)
    assert src == '<bare>'
    # an empty EMA entry (a placeholder) is passed over
    sd, src = ok.extract_state_dict({'state_dict_ema': {}, 'model': tiny_sd})
    assert src == 'model' and list(sd) == list(tiny_sd)
    # DataParallel inside DDP: every ``module.`` prefix goes
    sd, _ = ok.extract_state_dict(
        dict(model=prefixed(tiny_sd, 'module.module.')))
    assert list(sd) == list(tiny_sd)
    with pytest.raises(ConversionError, match='no state dict found'):
        ok.extract_state_dict({'epoch': 1, 'optimizer': {}})


def test_cli_round_trip(tmp_path, tiny_sd, capsys):
    ema = OrderedDict((k, v * 2) for k, v in tiny_sd.items())
    src = tmp_path / 'official.pth.tar'
    torch.save(
        dict(
            state_dict=prefixed(tiny_sd),
            state_dict_ema=ema,
            epoch=299,
            args=argparse.Namespace(model='soft_norm_tiny')), src)
    dst = tmp_path / 'mmsoft.pth'
    s2m = load_script('soft2mmsoft')
    assert s2m.main([str(src), str(dst), '--norm']) == 0
    log = capsys.readouterr().out
    assert "reading 'state_dict_ema'" in log
    assert "arch='tiny'" in log and 'soft_norm_tiny' in log
    assert 'not visible in the weights' in log
    ckpt = torch.load(dst, weights_only=True)
    assert set(ckpt) == {'state_dict', 'meta'}
    assert ckpt['meta']['attn_norm'] is True
    assert ckpt['meta']['arch'] == 'tiny'
    assert ckpt['meta']['source_entry'] == 'state_dict_ema'
    model = SOFT(arch='tiny')
    model.load_state_dict(backbone_part(ckpt['state_dict']), strict=True)
    assert torch.equal(model.stages[3].cls_token, ema['cls_token'])

    # --no-ema takes the raw weights
    dst_raw = tmp_path / 'raw.pth'
    assert s2m.main([str(src), str(dst_raw), '--no-ema']) == 0
    raw = torch.load(dst_raw, weights_only=True)
    assert raw['meta']['attn_norm'] is False
    assert torch.equal(raw['state_dict']['backbone.stages.3.cls_token'],
                       tiny_sd['cls_token'])

    back = tmp_path / 'back.pth'
    assert load_script('mmsoft2soft').main([str(dst), str(back)]) == 0
    assert 'soft_norm_tiny' in capsys.readouterr().out
    official = torch.load(back, weights_only=True)
    assert list(official['state_dict']) == list(tiny_sd)
    assert all(torch.equal(official['state_dict_ema'][k], ema[k]) for k in ema)


def test_cli_errors_write_nothing(tmp_path, tiny_sd, capsys):
    s2m = load_script('soft2mmsoft')
    bad = OrderedDict(tiny_sd)
    bad['block1.0.att.mha.W_q.weight'] = torch.zeros(64, 63)
    src = tmp_path / 'bad.pth'
    torch.save(bad, src)
    dst = tmp_path / 'out.pth'
    assert s2m.main([str(src), str(dst)]) == 1
    err = capsys.readouterr().err
    assert ('block1.0.att.mha.W_q.weight (checkpoint [64, 63] vs model '
            '[64, 64])') in err
    assert os.listdir(tmp_path) == ['bad.pth']
    # --ema without EMA weights
    good = tmp_path / 'good.pth'
    torch.save({'state_dict': tiny_sd}, good)
    assert s2m.main([str(good), str(dst), '--ema']) == 1
    assert 'no state_dict_ema' in capsys.readouterr().err
    # untrusted pickled objects are refused, naming them, with a hint
    weird = tmp_path / 'weird.pth'
    torch.save({'state_dict': tiny_sd, 'obj': Opaque()}, weird)
    assert s2m.main([str(weird), str(dst)]) == 1
    err = capsys.readouterr().err
    assert f'{__name__}.Opaque' in err and '--trust-checkpoint' in err
    assert not dst.exists()
    assert s2m.main([str(tmp_path / 'nope.pth'), str(dst)]) == 1
    assert 'does not exist' in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ['bad.pth', 'good.pth', 'weird.pth']


class Opaque:
    pass


def test_atomic_write(tmp_path, monkeypatch):
    dst = tmp_path / 'ckpt.pth'
    cf.save_checkpoint_atomic({'a': torch.ones(2)}, str(dst))
    assert torch.load(dst)['a'].equal(torch.ones(2))
    before = dst.read_bytes()

    def failing_save(obj, f, *args, **kwargs):
        f.write(b'partial')
        raise RuntimeError('disk full')

    monkeypatch.setattr(torch, 'save', failing_save)
    with pytest.raises(RuntimeError, match='disk full'):
        cf.save_checkpoint_atomic({'a': torch.zeros(2)}, str(dst))
    assert dst.read_bytes() == before  # old file untouched
    assert os.listdir(tmp_path) == ['ckpt.pth']  # no temporary left
    with pytest.raises(RuntimeError, match='disk full'):
        cf.save_checkpoint_atomic({'a': 1}, str(tmp_path / 'new.pth'))
    assert os.listdir(tmp_path) == ['ckpt.pth']
    with pytest.raises(ConversionError, match='does not exist'):
        cf.save_checkpoint_atomic({}, str(tmp_path / 'no' / 'x.pth'))


def test_mmpretrain_classifier_loads(tiny_sd):
    """The converted file loads into the ImageClassifier of the configs."""
    pytest.importorskip('mmpretrain')
    out, _ = ok.convert_official_to_mmpretrain(tiny_sd)
    clf = random_model(osp.join(CONFIGS, 'soft_tiny_in1k.py'))
    missing, unexpected = clf.load_state_dict(out, strict=False)
    assert unexpected == []
    # the data preprocessor's buffers are not part of checkpoints
    assert all(k.startswith('data_preprocessor.') for k in missing)


# --------------------------------------------- damaged input, bad output
@pytest.fixture
def src(tmp_path, tiny_sd):
    """The authors' file ``tmp_path / 'official.pth'``."""
    path = tmp_path / 'official.pth'
    torch.save({'state_dict': tiny_sd}, path)
    return path


def _convert(tmp_path, tiny_sd, name='mmsoft.pth'):
    src = tmp_path / 'official.pth'
    if not src.exists():
        torch.save({'state_dict': tiny_sd}, src)
    dst = tmp_path / name
    assert load_script('soft2mmsoft').main([str(src), str(dst)]) == 0
    return src, dst


@pytest.mark.parametrize('damage', ['empty', 'truncated', 'flipped'])
def test_damaged_input_is_reported_as_damaged(tmp_path, src, capsys, damage):
    if damage == 'empty':
        src.write_bytes(b'')
    elif damage == 'truncated':
        src.write_bytes(src.read_bytes()[:src.stat().st_size * 2 // 3])
    else:
        flip_tensor_bytes(src, 8)  # in the largest tensor
    dst = tmp_path / 'out.pth'
    for script in ('soft2mmsoft', 'mmsoft2soft'):
        assert load_script(script).main([str(src), str(dst)]) == 1
        err = capsys.readouterr().err
        assert 'damaged' in err and str(src) in err, err
        assert 'trust' not in err
        assert len(err.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ['official.pth']


def test_output_replacing_input_is_refused(tmp_path, tiny_sd, capsys,
                                           monkeypatch):
    src, dst = _convert(tmp_path, tiny_sd)
    before = src.read_bytes()
    (tmp_path / 'link.pth').symlink_to(src)
    monkeypatch.chdir(tmp_path)
    for out in (str(src), str(tmp_path / 'link.pth'), 'official.pth',
                './sub/../official.pth'):
        assert load_script('soft2mmsoft').main([str(src), out]) == 1
        assert 'is the input file' in capsys.readouterr().err
    # mmsoft2soft too (its input is the converted file)
    assert load_script('mmsoft2soft').main([str(dst), str(dst)]) == 1
    assert 'is the input file' in capsys.readouterr().err
    assert src.read_bytes() == before


def _one_line_error(capsys):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and 'Traceback' not in err, err
    return err


def test_output_errors_are_one_line(tmp_path, src, capsys, monkeypatch):
    s2m = load_script('soft2mmsoft')
    # a directory as DST
    assert s2m.main([str(src), str(tmp_path)]) == 1
    assert 'is a directory' in _one_line_error(capsys)
    # an unwritable directory (as root, chmod does not stop writes: the
    # refusal is injected where the temporary file is created)
    real_open = builtins.open

    def no_write(file, mode='r', *a, **k):
        if str(file).endswith(cio.TMP_SUFFIX):
            raise PermissionError(13, 'Permission denied', str(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, 'open', no_write)
    assert s2m.main([str(src), str(tmp_path / 'out.pth')]) == 1
    assert 'Permission denied' in _one_line_error(capsys)
    monkeypatch.undo()

    # a full disk: the write fails with ENOSPC half-way
    def full(obj, f, *a, **k):
        f.write(b'x' * 1000)
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(torch, 'save', full)
    assert s2m.main([str(src), str(tmp_path / 'out.pth')]) == 1
    err = _one_line_error(capsys)
    assert 'No space left on device' in err and 'nothing was written' in err
    assert sorted(os.listdir(tmp_path)) == ['official.pth']


def test_real_write_failure_is_one_line(tmp_path, src):
    """EFBIG from the kernel (torch.save's RuntimeError raised while
    handling the OSError): one line, not that traceback."""
    dst = tmp_path / 'out.pth'
    limit = src.stat().st_size // 2  # the output is about as large as SRC
    code = textwrap.dedent(f"""
        import resource, runpy, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        sys.argv = ['soft2mmsoft.py', {str(src)!r}, {str(dst)!r}]
        runpy.run_path({osp.join(ROOT, 'tools', 'model_converters',
                                 'soft2mmsoft.py')!r}, run_name='__main__')
    """)
    res = run_python(code, timeout=300)
    err = res.stderr.strip()
    assert res.returncode == 1, err[-3000:]
    assert 'Traceback' not in err, err[-3000:]
    assert err.splitlines()[-1] == (
        f"error: cannot write {str(dst)!r}: File too large (errno 27); "
        f"nothing was written")
    assert sorted(os.listdir(tmp_path)) == ['official.pth']


def test_output_that_is_not_a_regular_file_is_refused(tmp_path, src, capsys):
    fifo = tmp_path / 'fifo'
    os.mkfifo(fifo)
    for script in ('soft2mmsoft', 'mmsoft2soft'):
        assert load_script(script).main([str(src), str(fifo)]) == 1
        err = _one_line_error(capsys)
        assert 'is a FIFO, not a regular file: refusing to replace it' in err
        assert osp.exists(fifo) and not osp.isfile(fifo)
    with pytest.raises(ConversionError, match='a FIFO'):
        cf.save_checkpoint_atomic({'a': torch.ones(1)}, str(fifo))
    assert sorted(os.listdir(tmp_path)) == ['fifo', 'official.pth']


@pytest.mark.parametrize('value', ['0', '-16', '2.5', 'x'])
def test_stage4_heads_validated(tmp_path, src, capsys, value):
    for script in ('soft2mmsoft', 'mmsoft2soft'):
        with pytest.raises(SystemExit) as e:
            load_script(script).main(
                [str(src),
                 str(tmp_path / 'o.pth'), '--stage4-heads', value])
        assert e.value.code == 2
        assert 'expected a positive integer' in capsys.readouterr().err


def test_stale_temporaries_are_removed(tmp_path, tiny_sd):
    """A killed conversion's temporary goes at the next run."""
    dead = dead_pid()
    stale = tmp_path / f'.mmsoft.pth.{dead}.deadbeef{cio.TMP_SUFFIX}'
    stale.write_bytes(b'partial')
    _convert(tmp_path, tiny_sd)
    assert sorted(os.listdir(tmp_path)) == ['mmsoft.pth', 'official.pth']


def test_sigterm_during_conversion_leaves_nothing(tmp_path, src):
    code = textwrap.dedent(f"""
        import os, signal, sys, torch
        save = torch.save
        def slow_save(obj, f, *a, **k):  # SIGTERM arrives mid-write
            f.write(b'partial')
            os.kill(os.getpid(), signal.SIGTERM)
            save(obj, f, *a, **k)
        torch.save = slow_save
        sys.argv = ['soft2mmsoft.py', {str(src)!r},
                    {str(tmp_path / 'o.pth')!r}]
        import runpy
        runpy.run_path({osp.join(ROOT, 'tools', 'model_converters',
                                 'soft2mmsoft.py')!r}, run_name='__main__')
    """)
    res = run_python(code, timeout=300)
    assert res.returncode == 128 + signal.SIGTERM, res.stderr[-2000:]
    assert sorted(os.listdir(tmp_path)) == ['official.pth']


def test_damaged_converted_file_is_refused(tmp_path, tiny_sd):
    _, dst = _convert(tmp_path, tiny_sd)
    back = tmp_path / 'back.pth'
    assert load_script('mmsoft2soft').main([str(dst), str(back)]) == 0
    assert cio.describe_damage(str(dst)) is None
    assert cio.describe_damage(str(back)) is None
    bad = tmp_path / 'bad.pth'
    bad.write_bytes(dst.read_bytes())
    flip_tensor_bytes(bad, 4)
    torch.load(bad)  # the fault: loads silently
    backbone = SOFT(
        arch='tiny',
        init_cfg=dict(
            type='Pretrained', checkpoint=str(bad), prefix='backbone.'))
    with pytest.raises(cio.CheckpointError, match=str(bad)):
        backbone.init_weights()
    with pytest.raises(ConversionError, match='corrupt'):
        cf.load_checkpoint_file(str(bad))


def test_unreadable_source_is_one_line(tmp_path, src, capsys, monkeypatch):
    """Issue 27: no PermissionError traceback (injected: root reads)."""
    real_open = builtins.open

    def no_read(file, mode='r', *a, **k):
        if str(file) == str(src):
            raise PermissionError(13, 'Permission denied', str(file))
        return real_open(file, mode, *a, **k)

    monkeypatch.setattr(builtins, 'open', no_read)
    for script in ('soft2mmsoft', 'mmsoft2soft'):
        assert load_script(script).main([str(src),
                                         str(tmp_path / 'o.pth')]) == 1
        assert _one_line_error(capsys) == (
            f"error: cannot read {str(src)!r}: Permission denied (errno 13); "
            f"check its permissions (ls -l) or copy it somewhere readable")
    assert sorted(os.listdir(tmp_path)) == ['official.pth']


# ------------------------------------------ checkpoint_files contracts
@pytest.mark.parametrize('entry', ['state_dict_ema', 'model_ema'])
def test_official_weights_ema_choice(entry):
    sd = OrderedDict(w=torch.zeros(1))
    only_ema = {entry: sd}
    assert cf.official_weights(only_ema, 'a.pth') == (sd, entry)
    assert cf.official_weights(only_ema, 'a.pth', ema=True) == (sd, entry)
    with pytest.raises(ConversionError) as exc:
        cf.official_weights(only_ema, 'a.pth', ema=False)
    assert str(exc.value) == (f"--no-ema given but 'a.pth' only holds EMA "
                              f"weights ({entry!r})")
    both = {'model': OrderedDict(w=torch.ones(1)), entry: sd}
    assert cf.official_weights(both, 'a.pth', ema=False)[1] == 'model'
    assert cf.official_weights(both, 'a.pth')[1] == entry
    with pytest.raises(ConversionError) as exc:
        cf.official_weights({'model': sd}, 'b.pth', ema=True)
    assert str(exc.value) == ("--ema given but 'b.pth' has no state_dict_ema "
                              "/ model_ema entry (found 'model')")


def test_save_atomic_is_durable(tmp_path, monkeypatch):
    synced = []
    real = os.fsync

    def fsync(fd):
        synced.append(os.readlink(f'/proc/self/fd/{fd}'))
        return real(fd)

    monkeypatch.setattr(os, 'fsync', fsync)
    out = tmp_path / 'out.pth'
    cf.save_atomic({'w': torch.ones(2)}, str(out))
    assert torch.load(str(out))['w'].tolist() == [1., 1.]
    assert len(synced) >= 2 and str(tmp_path) in synced, synced


def test_save_checkpoint_atomic_refusals_and_errors(tmp_path, monkeypatch):
    (tmp_path / 'd.pth').mkdir()
    with pytest.raises(ConversionError) as exc:
        cf.save_checkpoint_atomic({}, str(tmp_path / 'd.pth'))
    assert str(exc.value) == (
        f"output {str(tmp_path / 'd.pth')!r} is a directory, not a regular "
        'file: refusing to replace it')
    out = tmp_path / 'o.pth'
    for err, tail in ((OSError(28, 'No space left on device'),
                       'No space left on device (errno 28)'),
                      (OSError('quota'), 'quota')):

        def fail(*a, err=err, **k):
            raise err

        monkeypatch.setattr(cf, 'save_atomic', fail)
        with pytest.raises(ConversionError) as exc:
            cf.save_checkpoint_atomic({}, str(out))
        assert str(exc.value) == \
            f'cannot write {str(out)!r}: {tail}; nothing was written'
        assert not out.exists()


def test_save_checkpoint_atomic_removes_only_its_own_stale_temps(tmp_path):
    pid = dead_pid()
    mine = tmp_path / f'.out.pth.{pid}.0123abcd.mmsoft-tmp'
    other = tmp_path / f'.other.pth.{pid}.0123abcd.mmsoft-tmp'
    mine.write_bytes(b'half')
    other.write_bytes(b'half')
    cf.save_checkpoint_atomic({'w': torch.zeros(1)}, str(tmp_path / 'out.pth'))
    assert not mine.exists() and other.exists()
    assert (tmp_path / 'out.pth').exists()


def test_missing_pretrained_walks_every_node(tmp_path):
    gone = dict(type='Pretrained', checkpoint='gone.pth')
    cfg = dict(
        model=dict(
            type='X',
            extra=[1, 'two'],
            backbone=dict(type=SOFT, init_cfg=gone)))
    msg = cf.missing_pretrained(cfg)
    assert msg.startswith(
        'gone.pth (model.backbone.init_cfg.checkpoint) does not exist')
    cfg['model']['backbone']['init_cfg'] = [dict(type='TruncNormal'), gone]
    assert cf.missing_pretrained(cfg).startswith(
        'gone.pth (model.backbone.init_cfg[1].checkpoint) does not exist')
    cfg = dict(
        model=dict(type='X', parts=[3, dict(type='SOFT', init_cfg=gone)]))
    assert cf.missing_pretrained(cfg).startswith(
        'gone.pth (model.parts[1].init_cfg.checkpoint) does not exist')


def test_check_converted_mmsoft_keys(tiny_sd):
    converted, arch = ok.convert_official_to_mmpretrain(tiny_sd)
    cf.check_converted(converted, arch, 'x')
    cf.check_converted(
        backbone_part(converted), dict(arch, num_classes=0), 'x')
    with pytest.raises(ConversionError, match='patch_embed'):
        cf.check_converted(converted, dict(arch, in_channels=1), 'x')


class _Reduce:
    """Pickles as ``fn(*args)`` (run at load time)."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def test_load_checkpoint_file_contract(tmp_path):
    with pytest.raises(ConversionError) as exc:
        cf.load_checkpoint_file(str(tmp_path / 'gone.pth'))
    assert str(exc.value) == f"checkpoint {str(tmp_path / 'gone.pth')!r} " \
        'does not exist'
    with pytest.raises(ConversionError) as exc:
        cf.load_checkpoint_file(str(tmp_path))
    assert str(exc.value) == f'checkpoint {str(tmp_path)!r} is a ' \
        'directory, not a file'
    timm, ns = tmp_path / 'timm.pth', argparse.Namespace(lr=1)
    torch.save(dict(state_dict=dict(w=torch.ones(1)), args=ns), str(timm))
    got = cf.load_checkpoint_file(str(timm))
    assert got['args'].lr == 1 and got['state_dict']['w'].tolist() == [1.]
    objs = tmp_path / 'objects.pth'
    torch.save(dict(args=ns, o=Opaque(), w=torch.ones(1)), str(objs))
    with pytest.raises(ConversionError) as exc:
        cf.load_checkpoint_file(str(objs))
    msg = str(exc.value)
    assert msg.startswith(f'checkpoint {objs} was refused: it holds pickled '
                          f'objects other than tensors and plain containers '
                          f'({__name__}.Opaque), ')
    assert msg.endswith('; if you trust the file, run again with '
                        '--trust-checkpoint')
    trusted = cf.load_checkpoint_file(str(objs), trust=True)
    assert type(trusted['o']) is Opaque and trusted['w'].device.type == 'cpu'
    # code (a function, not a class): refused, trusted or not, with no
    # advice to trust it; nothing of it runs
    marker = tmp_path / 'MARKER'
    opens = f'open({str(marker)!r}, "w")'
    for fn, args in [(os.getcwd, ()), (exec, (opens, )),
                     (pickle.loads, (b'garbage', ))]:
        code = tmp_path / 'code.pth'
        torch.save({'x': _Reduce(fn, *args), 'o': Opaque()}, str(code))
        for trust in (False, True):
            with pytest.raises(ConversionError) as exc:
                cf.load_checkpoint_file(str(code), trust=trust)
            msg = str(exc.value)
            assert msg.startswith(f'checkpoint {code} was refused: it holds '
                                  f'pickled code ('), msg
            assert f'.{fn.__name__}) that would run when unpickled; ' in msg
            assert 'trust' not in msg
    assert not marker.exists()
    # trusted objects whose unpickling fails: one line, the first line
    for text, first in (('', ''), ('first\nsecond', 'first')):
        bad = tmp_path / 'bad_state.pth'
        torch.save({'x': _FailingState(text)}, str(bad))
        with pytest.raises(ConversionError) as exc:
            cf.load_checkpoint_file(str(bad), trust=True)
        assert str(exc.value) == \
            f'cannot load {str(bad)!r} (ValueError: {first})'


class _FailingState:
    """An object whose unpickling raises ValueError(text)."""

    def __init__(self, text):
        self.text = text

    def __setstate__(self, state):
        raise ValueError(state['text'])


def test_find_official_state_dict_needs_half_the_keys():
    """At least half the keys are the authors' (not a head or norm alone)."""
    authors = ['pos_embed1', 'patch_embed1.proj.0.weight']

    def find(*keys):
        return ok.find_official_state_dict(dict.fromkeys(keys, torch.zeros(1)))

    assert find(*authors, 'a', 'b') is not None  # 2 of 4
    assert find(*authors, 'a', 'b', 'c') is not None  # 2 of 5
    assert find(*authors, 'a', 'b', 'c', 'd') is None
    assert find('x') is None
    assert find('cls_token', 'norm.weight', 'head.weight', 'x') is None


def test_converter_parser_arguments():
    p = cf.converter_parser('DESC-TEXT', 'SRC-HELP', 'DST-HELP', 'HEADS-HELP',
                            int)
    text = p.format_help()
    for part in ('DESC-TEXT', 'SRC-HELP', 'DST-HELP', 'HEADS-HELP',
                 'unpickle arbitrary objects in SRC (only for files you '
                 'trust)'):
        assert part in ' '.join(text.split()), part
    assert [a.help for a in p._actions if a.dest == 'trust_checkpoint'] == \
        ['unpickle arbitrary objects in SRC (only for files you trust)']
    args = p.parse_args(['a.pth', 'b.pth'])
    assert (args.src, args.dst, args.stage4_heads,
            args.trust_checkpoint) == ('a.pth', 'b.pth', None, False)
    args = p.parse_args(
        ['a', 'b', '--stage4-heads', '8', '--trust-checkpoint'])
    assert args.stage4_heads == 8 and args.trust_checkpoint is True


def test_check_output_path_refusals(tmp_path, monkeypatch):
    src = tmp_path / 'in.pth'
    src.write_bytes(b'x')

    def refused(dst):
        with pytest.raises(ConversionError) as exc:
            cf.check_output_path(str(src), str(dst))
        return str(exc.value)

    assert refused(tmp_path) == (
        f'output {str(tmp_path)!r} is a directory; give a file name, e.g. '
        f"{str(tmp_path / 'in.pth')!r}")
    fifo, sock = tmp_path / 'fifo', tmp_path / 'sock'
    os.mkfifo(fifo)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    try:
        for dst, kind in (('/dev/null', 'a character device'),
                          (fifo, 'a FIFO'), (sock, 'a socket')):
            assert refused(dst) == (
                f'output {str(dst)!r} is {kind}, not a regular file: '
                'refusing to replace it; give a file name')
    finally:
        s.close()
    real_stat, blk = os.stat, tmp_path / 'blk'

    def fake_stat(path, *a, **k):
        if str(path) == str(blk):
            return os.stat_result((st.S_IFBLK | 0o600, ) + (0, ) * 9)
        return real_stat(path, *a, **k)

    monkeypatch.setattr(cf.os, 'stat', fake_stat)
    assert ' is a block device, not a regular file' in refused(blk)
    monkeypatch.undo()
    link = tmp_path / 'hard_link.pth'
    os.link(src, link)
    assert refused(link) == (
        f'output {str(link)!r} is the input file {str(src)!r}: refusing to '
        'replace it; choose another output path')
    cf.check_output_path(str(src), str(tmp_path / 'new.pth'))  # fine


def _with(sd, pattern, tensor):
    return OrderedDict(
        (k, tensor if re.fullmatch(pattern, k) else v) for k, v in sd.items())


def test_infer_arch_refusals(tiny_sd):
    conv2 = r'block2\.%s\.att\.mha\.attn\.conv\.weight'
    lm1 = r'block1\.\d+\.att\.mha\.attn\.Qlandmark_op\.weight'
    no_pos3 = OrderedDict(tiny_sd)
    del no_pos3['pos_embed3']
    stage2 = ('inconsistent stage 2: 3 heads (block2.*.att.mha.attn.conv.'
              'weight (3, 1, 5, 5)) x head width 32 (Qlandmark_op (32, 32, '
              '4, 4)) != embed dim 128')
    for sd, msg in (
        (no_pos3, "cannot infer the architecture: key 'pos_embed3' is "
         'missing'),
            # every block of stage 2, or its block 0 alone
        (_with(tiny_sd, conv2 % r'\d+', torch.zeros(3, 1, 5, 5)), stage2),
        (_with(tiny_sd, conv2 % '0', torch.zeros(3, 1, 5, 5)), stage2),
        (_with(tiny_sd, lm1, torch.zeros(32, 32)),
         'cannot infer the architecture: block1.*.att.mha.attn.'
         'Qlandmark_op.weight should be (d, d, r, r) and .conv.weight (heads, '
         '1, k, k); found (32, 32) and (2, 1, 9, 9) (linear landmark ops, '
         'sr_ratio 1, are not supported)'),
        (_with(tiny_sd, r'block1\.\d+\.att\.mha\.attn\.conv\.weight',
               torch.zeros(3, 1, 9, 9)),
         'inconsistent stage 1: 3 heads (block1.*.att.mha.attn.conv.weight '
         '(3, 1, 9, 9)) x head width 32 (Qlandmark_op (32, 32, 8, 8)) != '
         'embed dim 64'),
    ):
        with pytest.raises(ConversionError) as exc:
            cf.infer_arch(sd)
        assert str(exc.value) == msg
    for bad in (True, 2.5, 0, -1):
        with pytest.raises(ConversionError) as exc:
            cf.infer_arch(tiny_sd, stage4_heads=bad)
        assert str(exc.value) == \
            f'stage-4 heads must be a positive integer, got {bad!r}'
    assert cf.infer_arch(tiny_sd, stage4_heads=1)['num_heads'] == \
        [2, 4, 10, 1]
    with pytest.raises(ConversionError) as exc:
        cf.infer_arch(tiny_sd, stage4_heads=7)
    assert str(exc.value) == 'stage-4 heads 7 do not divide its embed dim 512'
    odd = official_state_dict([64, 128, 320, 496], [2, 4, 10, 16],
                              [1, 2, 3, 2])
    with pytest.raises(ConversionError) as exc:
        cf.infer_arch(odd)
    assert str(exc.value) == (
        "stage-4 heads 15 do not divide its embed dim 496 (stage 3's head "
        'width 32); give them explicitly')


def test_infer_official_arch_values(tiny_sd):
    arch = ok.infer_official_arch(tiny_sd)
    assert all(type(r) is int for r in arch['mlp_ratios'])
    assert arch['stage4_heads_given'] is False
    assert ok.infer_official_arch(tiny_sd, 16)['stage4_heads_given'] is True
    fc1 = r'block1\.\d+\.att\.ff1\.weight'
    odd = _with(tiny_sd, fc1, torch.zeros(96, 64))  # 1.5 x 64
    assert ok.infer_official_arch(odd)['mlp_ratios'][0] == 1.5
    gray = _with(tiny_sd, r'patch_embed1\.proj\.0\.weight',
                 torch.zeros(64, 1, 3, 3))
    assert ok.infer_official_arch(gray)['in_channels'] == 1
    narrow = official_state_dict([64, 128, 320, 16], [2, 4, 10, 1],
                                 [1, 1, 1, 1])
    assert ok.infer_official_arch(narrow)['num_heads'][3] == 1
    assert ok.official_model_name(arch) == 'soft[_norm]_tiny'


def test_state_dict_plumbing_messages():
    with pytest.raises(ConversionError) as exc:
        ok.extract_state_dict([1])
    assert str(exc.value) == 'checkpoint is a list, not a dict'
    with pytest.raises(ConversionError) as exc:
        ok.extract_state_dict({f'k{i:02d}': 1 for i in range(25)})
    names = [f'k{i:02d}' for i in range(20)]
    assert str(exc.value) == (
        "no state dict found in the checkpoint: expected one of "
        "['state_dict_ema', 'model_ema', 'state_dict', 'model'] holding "
        f'tensors, or a bare state dict; top-level keys are {names}')
    with pytest.raises(ConversionError) as exc:
        ok.strip_module_prefix({'module.a': 1, 'a': 2})
    assert str(exc.value) == \
        'keys occur twice after stripping "module." prefixes'
    with pytest.raises(Exception) as exc:
        check_state_dict(
            dict(a=torch.zeros(1), b=torch.zeros(1)), dict(a=torch.zeros(1)),
            'src')
    assert str(exc.value) == (
        'checkpoint src does not match the model: 1 of its 1 tensors would '
        "load. 1 of the model's 2 tensors are missing from the checkpoint: b.")


@pytest.mark.parametrize(
    'layout', ['converted', 'training', 'bare-backbone', 'ddp', 'version-1'])
def test_mmsoft_checkpoint_needs_no_conversion(tmp_path, tiny_sd, capsys,
                                               layout):
    """Already mmsoft's: one line saying so, not "cannot infer" (issue 52)."""
    _, done = _convert(tmp_path, tiny_sd)
    mm = torch.load(done)['state_dict']
    optimizer = dict(state={}, param_groups=[])
    sd = dict(
        converted=None,
        training=dict(meta=dict(epoch=2), state_dict=mm, optimizer=optimizer),
        ddp=dict(state_dict=prefixed(mm)),
        version_1=dict(state_dict=_old_keys(mm, 1)),
        bare_backbone=backbone_part(mm))[layout.replace('-', '_')]
    src = done
    if sd is not None:
        src = tmp_path / 'in.pth'
        torch.save(sd, src)
    dst = tmp_path / 'again.pth'
    assert load_script('soft2mmsoft').main([str(src), str(dst)]) == 1
    err = _one_line_error(capsys)
    assert err.startswith(f"error: '{src}' is already an mmsoft checkpoint "
                          '('), err
    assert 'needs no conversion: use it directly, e.g. ' \
        f"load_from='{src}'" in err
    assert 'cannot infer' not in err and not dst.exists()
    # an authors' file is still converted
    assert cf.already_mmsoft({'state_dict': tiny_sd}, 'x') is None
