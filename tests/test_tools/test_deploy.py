"""ONNX export (tools/deployment/pytorch2onnx.py, deploy.py): the
plain-op export path equals the normal forward without eigh; one error line
for what cannot be exported (onnxruntime parity per task:
test_tool_contracts.py; the export path's functions: test_pinv.py,
test_soft_attention.py)."""
import contextlib
import io
import os
import os.path as osp

import pytest
import torch
from conftest import ROOT, load_module, tiny_arch

pytest.importorskip('onnx')
pytest.importorskip('onnxruntime')
pytest.importorskip('mmdet')
pytest.importorskip('mmseg')
pytest.importorskip('mmpretrain')

import mmsoft  # noqa: E402,F401
from deployment import deploy  # noqa: E402
from mmsoft.models.backbones.soft import SOFT  # noqa: E402
from mmsoft.models.layers import amp  # noqa: E402

DEMO = osp.join(ROOT, 'configs', 'demo')
TINY = tiny_arch([16, 32, 64, 64], [1, 2, 2, 2], sampling_ratios=[4, 2, 2, 1])


def _tool():
    return load_module(
        osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'),
        'pytorch2onnx')


def test_export_path_equals_normal_forward(monkeypatch):
    """The backbone on the export path (no eigh) == its spectral forward."""
    torch.manual_seed(0)
    model = SOFT(TINY, pretrain_img_size=64).eval()
    model.init_weights()
    x = torch.randn(2, 3, 96, 128)  # stage 1: 24 x 32 tokens, m = 6 x 8
    with torch.no_grad():
        ref = model(x)
        monkeypatch.setattr(amp, 'is_exporting', lambda: True)
        monkeypatch.setattr(
            torch.linalg, 'eigh',
            lambda *a, **k: pytest.fail('eigh on the export path'))
        out = model(x)
    for o, r in zip(out, ref):
        assert (o - r).abs().max() / r.abs().max() < 1e-4


def _error_line(capsys, argv):
    rc = _tool().main(argv)
    err = without_logging_errors(capsys.readouterr().err)
    assert rc == 2
    # the tool's whole stderr: one error line
    assert len(err) == 1 and err[0].startswith('error: '), err
    return err[0]


def without_logging_errors(text):
    """``text``'s lines less :mod:`logging`'s reports of a failed emit (an
    earlier test's logger may hold a closed captured stream)."""
    lines, inside = [], False
    for ln in text.strip().splitlines():
        if ln == '--- Logging error ---':
            inside = True
        elif inside and ln.startswith('Arguments: '):
            inside = False
        elif not inside:
            lines.append(ln)
    assert not inside, text  # a report is complete
    return lines


CLS = '{demo}/soft_cls_demo.py none --shape 64 64 --out {tmp}/x.onnx '
ATTN = CLS + '--cfg-options model.backbone.attn_cfg.'


@pytest.mark.parametrize('args, parts', [
    (ATTN + 'nr_method=spectral',
     ["nr_method='spectral'", 'model.backbone.attn_cfg.nr_method=auto']),
    (ATTN + 'max_landmarks=7', ['max_landmarks', '--dynamo']),
    (ATTN + 'landmark_hw=[2,2]', ['landmark_hw=(2, 2)', '--dynamo']),
    ('{demo}/retinanet_soft_demo.py {tmp}/cls.pth --shape 160 160 --out '
     '{tmp}/x.onnx', [
         'does not match the model (RetinaNet)', 'missing from the checkpoint',
         '--partial-load'
     ]),
    ('{demo}/soft_cls_demo.py {tmp}/nope.pth --shape 64 64',
     ['does not exist']),
    ('{demo}/retinanet_soft_demo.py none --shape 150 160 --out {tmp}/x.onnx',
     ['--shape 160 160']),
    ('{demo}/soft_cls_demo.py none --shape 64 64 --dynamic',
     ['dynamic input shapes are not supported']),
])
def test_error_line(tmp_path, capsys, args, parts):
    """What cannot be exported: one line naming it, nothing written."""
    if 'cls.pth' in args:  # the classifier's weights
        model, _, _ = deploy.build_model(f'{DEMO}/soft_cls_demo.py', None)
        torch.save({'state_dict': model.state_dict()}, tmp_path / 'cls.pth')
    line = _error_line(
        capsys, [a.format(demo=DEMO, tmp=tmp_path) for a in args.split()])
    assert all(p in line for p in parts), (line, parts)
    assert not (tmp_path / 'x.onnx').exists()


def test_authors_file_gets_the_line_of_tools_test(tmp_path, capsys):
    from conftest import cls_demo_config
    from conftest import tool_namespace as tool

    from mmsoft_tools.cli import run_main  # tools/test.py's door
    cfg = cls_demo_config(tmp_path, test=4)
    src, _, _ = deploy.build_model(cfg, None)
    sd = src.state_dict()
    mine, path = str(tmp_path / 'mine.pth'), str(tmp_path / 'soft_demo.pth')
    torch.save({'state_dict': sd}, mine)
    model, _, _ = deploy.build_model(cfg, mine)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in sd.items())
    to_official = load_module(
        osp.join(ROOT, 'tools', 'model_converters', 'mmsoft2soft.py'),
        'mmsoft2soft').convert_mmpretrain_to_official
    keep = ('backbone.', 'head.fc.')
    official = to_official({k: v for k, v in sd.items() if k.startswith(keep)})
    torch.save({'model': official[0]}, path)
    with pytest.raises(deploy.ExportError) as info:
        deploy.build_model(cfg, path)
    assert '\n' not in str(info.value)
    line = _error_line(
        capsys,
        [cfg, path, '--shape', '64', '64', '--out',
         str(tmp_path / 'x.onnx')])
    assert line == f'error: {info.value}'
    err = io.StringIO()
    with pytest.raises(SystemExit) as exit_, contextlib.redirect_stderr(err):
        run_main(
            tool('test')['main'],
            [cfg, path, '--work-dir', str(tmp_path)])
    assert exit_.value.code == 1
    assert line == [ln for ln in err.getvalue().splitlines() if ln.strip()][-1]
    assert 'official SOFT checkpoint' in line
    assert f'convert it first: python tools/model_converters/soft2mmsoft.py ' \
        f'{path} weights/soft_demo.pth' in line


@pytest.fixture(scope='module')
def cls_wrapper():
    """The demo classifier's export wrapper at 64 x 64."""
    model, scope, _ = deploy.build_model(
        osp.join(DEMO, 'soft_cls_demo.py'), None)
    return deploy.ExportWrapper(model, scope, (64, 64))


def test_matmul_adaptive_pool_equals_torch():
    x = torch.randn(2, 3, 16, 11)
    for size in [(1, 1), (3, 3), (6, 6), (5, 2)]:
        ref = torch.nn.AdaptiveAvgPool2d(size)(x)
        out = deploy.MatmulAdaptiveAvgPool2d(size)(x)
        torch.testing.assert_close(out, ref)


def test_error_is_all_the_output_with_random_weights(tmp_path, script_server):
    """``CHECKPOINT none``: no parameter-initialisation log (~700 lines)."""
    proc = script_server(
        osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'), [
            osp.join(DEMO, 'soft_cls_demo.py'), 'none', '--shape', '64', '64',
            '--out', tmp_path / 'x.onnx', '--cfg-options',
            'model.backbone.attn_cfg.nr_method=spectral'
        ], tmp_path)
    out = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, out
    assert out[-1].startswith('error: ') and 'nr_method' in out[-1]
    assert len(out) <= 3, '\n'.join(out[:20])


def test_out_directory_and_opset_refused_up_front(tmp_path, capsys,
                                                  monkeypatch):
    """Issue 27: --out a directory, --opset 5: refused before the model."""
    built = []
    monkeypatch.setattr(deploy, 'build_model',
                        lambda *a, **k: built.append(a) or 1 / 0)
    cfg = osp.join(DEMO, 'soft_cls_demo.py')
    line = _error_line(
        capsys, [cfg, 'none', '--shape', '64', '64', '--out',
                 str(tmp_path)])
    assert line == (f'error: --out {tmp_path} is a directory; give a file '
                    f'name, e.g. --out '
                    f'{osp.join(str(tmp_path), "soft_cls_demo_64x64.onnx")}')
    lo, hi = deploy.opset_range()
    assert lo == deploy.MIN_OPSET and hi >= deploy.DEFAULT_OPSET
    for opset in (5, hi + 1):
        line = _error_line(
            capsys,
            [cfg, 'none', '--shape', '64', '64', '--opset',
             str(opset)])
        assert line == (f'error: --opset {opset} is not supported: SOFT '
                        f'exports with opsets {lo} to {hi}; the default is '
                        f'17')
    assert not built and os.listdir(tmp_path) == []


def test_min_opset_wrong_shape_and_dynamo(tmp_path, monkeypatch, cls_wrapper):
    """MIN_OPSET - 1 fails; another shape, --dynamo on torch < 2.5: refused."""
    out = str(tmp_path / 'a.onnx')
    deploy.export_onnx(cls_wrapper, out, deploy.MIN_OPSET)
    with pytest.raises(deploy.ExportError, match='--shape 96 64'):
        deploy.OnnxModel(out)(torch.zeros(1, 3, 96, 64))
    with pytest.raises(Exception):
        deploy.export_onnx(cls_wrapper, str(tmp_path / 'b.onnx'),
                           deploy.MIN_OPSET - 1)
    empty = tmp_path / 'dynamo'
    empty.mkdir()
    monkeypatch.setattr(deploy, 'onnx_export_takes_dynamo', lambda: False)
    with pytest.raises(deploy.ExportError) as info:
        deploy.export_onnx(cls_wrapper, str(empty / 'cls.onnx'), dynamo=True)
    msg = str(info.value)
    assert '\n' not in msg and '--dynamo needs torch >= 2.5' in msg
    assert list(empty.iterdir()) == []
