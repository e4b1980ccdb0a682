"""ONNX export (tools/deployment/pytorch2onnx.py, mmsoft_tools.deploy): the
plain-op export path equals the normal forward without eigh; one error line
for what cannot be exported (onnxruntime parity per task: test_chain.py and
test_tool_contracts.py)."""
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
from mmsoft.models.backbones.soft import SOFT  # noqa: E402
from mmsoft.models.layers import gaussian_kernel  # noqa: E402
from mmsoft.models.layers import NRConfig, amp  # noqa: E402
from mmsoft.models.layers.soft_attention import kernel_forward  # noqa: E402
from mmsoft_tools import deploy  # noqa: E402

DEMO = osp.join(ROOT, 'configs', 'demo')
TINY = tiny_arch([16, 32, 64, 64], [1, 2, 2, 2], sampling_ratios=[4, 2, 2, 1])


def newton_inverse_apply(A, W, iters, init, method):
    return NRConfig(iters, init, method).apply(A, W)


def _tool():
    return load_module(
        osp.join(ROOT, 'tools', 'deployment', 'pytorch2onnx.py'),
        'pytorch2onnx')


def exporting(mp):
    """The export dispatch without exporting; eigh must not be hit."""
    mp.setattr(amp, 'is_exporting', lambda: True)
    mp.setattr(torch.linalg, 'eigh',
               lambda *a, **k: pytest.fail('eigh on the export path'))


def _spd_gram(b, h, m, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, h, m, d, generator=g) * 0.5
    return gaussian_kernel(x, x), torch.randn(b, h, m, 5, generator=g)


@pytest.mark.parametrize(
    'init', ['soft_norm_per_matrix', 'soft', 'soft_norm_per_sample'])
def test_export_path_equal_functions(init, monkeypatch):
    A, W = _spd_gram(2, 3, 96)  # m >= 80: 'auto' is spectral on the CPU
    ref = newton_inverse_apply(A, W, 20, init, 'auto')
    it = newton_inverse_apply(A, W, 20, init, 'iterative')
    with monkeypatch.context() as mp:  # the export path, plain ops, no eigh
        exporting(mp)
        out = newton_inverse_apply(A, W, 20, init, 'auto')
    assert (out - ref).abs().max() / ref.abs().max() < 1e-4
    torch.testing.assert_close(out, it, rtol=1e-5, atol=1e-6)
    g = torch.Generator().manual_seed(1)
    x, y = (torch.randn(2, n, 8, generator=g) for n in (40, 9))
    torch.testing.assert_close(kernel_forward(x, y), gaussian_kernel(x, y))
    # large-norm tokens (a shared offset): stable like the autograd kernel,
    # unit diagonal for the self-kernel
    off = 1e4 * torch.randn(8, generator=g)
    x, y = x + off, y + off
    torch.testing.assert_close(kernel_forward(x, y), gaussian_kernel(x, y))
    A = kernel_forward(y, y, self_kernel=True)
    torch.testing.assert_close(A, gaussian_kernel(y, y))
    assert torch.equal(A.diagonal(dim1=-2, dim2=-1), torch.ones(2, 9))


def test_export_path_equals_normal_forward(monkeypatch):
    """The backbone on the export path == its normal (spectral) forward."""
    torch.manual_seed(0)
    model = SOFT(TINY, pretrain_img_size=64).eval()
    model.init_weights()
    x = torch.randn(2, 3, 96, 128)  # stage 1: 24 x 32 tokens, m = 6 x 8
    with torch.no_grad():
        ref = model(x)
        exporting(monkeypatch)
        out = model(x)
    for o, r in zip(out, ref):
        assert (o - r).abs().max() / r.abs().max() < 1e-4


def test_export_path_refuses_spectral(monkeypatch):
    exporting(monkeypatch)
    A, W = _spd_gram(1, 1, 16)
    with pytest.raises(amp.ExportError, match="nr_method='auto'"):
        newton_inverse_apply(A, W, 5, 'soft_norm_per_matrix', 'spectral')


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
    """Issues 36, 52: mmsoft's loading code, as tools/test.py: an mmsoft
    checkpoint loads; an authors' file is refused with tools/test.py's line
    (the converter)."""
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


def test_onnx_model_wrong_shape(tmp_path, cls_wrapper):
    out = str(tmp_path / 'cls.onnx')
    deploy.export_onnx(cls_wrapper, out)
    with pytest.raises(deploy.ExportError, match='--shape 96 64'):
        deploy.OnnxModel(out)(torch.zeros(1, 3, 96, 64))


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


def test_min_opset_exports(tmp_path, cls_wrapper):
    """MIN_OPSET exports, one below does not (measured, not guessed)."""
    deploy.export_onnx(cls_wrapper, str(tmp_path / 'a.onnx'), deploy.MIN_OPSET)
    with pytest.raises(Exception):
        deploy.export_onnx(cls_wrapper, str(tmp_path / 'b.onnx'),
                           deploy.MIN_OPSET - 1)


def test_dynamo_export_refused_without_the_exporter(tmp_path, monkeypatch,
                                                    cls_wrapper):
    """torch < 2.5 (simulated): --dynamo stops in one line, nothing written."""
    out = tmp_path / 'cls.onnx'
    monkeypatch.setattr(deploy, 'onnx_export_takes_dynamo', lambda: False)
    with pytest.raises(deploy.ExportError) as info:
        deploy.export_onnx(cls_wrapper, str(out), dynamo=True)
    msg = str(info.value)
    assert '\n' not in msg and '--dynamo needs torch >= 2.5' in msg
    assert list(tmp_path.iterdir()) == []
