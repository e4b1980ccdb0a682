# Copyright (c) mmsoft contributors.
"""Export a SOFT classifier / detector / segmentor to ONNX (fixed shape).

    python tools/deployment/pytorch2onnx.py CONFIG CHECKPOINT --shape H W \\
        [--out model.onnx] [--opset 17] [--verify] [--dynamo]

The exported graph takes ONE fixed input shape, (1, 3, H, W) (``--batch``
changes the 1): the bottleneck grids, the position-embedding interpolation
and the Newton-Raphson iterations are specialised to it. Export one file
per input size. The input is the preprocessed image (after the config's
data_preprocessor: normalised, RGB, padded; mmdet: H, W multiples of the
pad_size_divisor, e.g. 800 x 1216 for an 800 x 1199 image).

Outputs: classifier logits (``cls_score``); single-stage detector head
outputs per FPN level (``cls_score_i``, ``bbox_pred_i``; decoding and NMS
stay in Python); two-stage detectors the FPN features and RPN outputs;
segmentor ``seg_logits`` at the input size. See
``tools/deployment/deploy.py``.

``--verify`` runs the file with onnxruntime (CPU) on a seeded random input
and prints max |onnx - torch| / max |torch| per output; it exits with
status 1 when one exceeds ``--tolerance`` (1e-4).

CHECKPOINT ``none`` exports randomly initialised weights (for trying the
export path only).
"""
import argparse
import os.path as osp
import sys
import warnings

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmsoft_tools.cli import cfg_options_action  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description='Export a SOFT model (mmpretrain / mmdet / mmseg config) '
        'to ONNX with a FIXED input shape (1, 3, H, W); dynamic shapes are '
        'not supported: export one file per input size.')
    parser.add_argument('config', help='config file')
    parser.add_argument(
        'checkpoint', help='checkpoint file, or "none" for random weights')
    parser.add_argument(
        '--shape',
        type=int,
        nargs=2,
        required=True,
        metavar=('H', 'W'),
        help='the fixed input height and width (after the '
        'data preprocessor; mmdet: padded size, e.g. 800 '
        '1216)')
    parser.add_argument(
        '--out',
        help='output .onnx file (default: '
        '<config name>_<H>x<W>.onnx in the current dir)')
    parser.add_argument(
        '--opset', type=int, default=17, help='ONNX opset (default 17)')
    parser.add_argument(
        '--partial-load',
        action='store_true',
        help='allow a checkpoint that matches the model only in part: '
        'export with the matching tensors and print what was skipped '
        '(without it a mismatch is an error)')
    parser.add_argument(
        '--batch',
        type=int,
        default=1,
        help='fixed batch size of the graph (default 1)')
    parser.add_argument(
        '--verify',
        action='store_true',
        help='compare onnxruntime (CPU) with PyTorch')
    parser.add_argument(
        '--tolerance',
        type=float,
        default=1e-4,
        help='--verify: max allowed relative error')
    parser.add_argument(
        '--dynamo',
        action='store_true',
        help='use the torch.export-based exporter (needs '
        'onnxscript; ~10x slower to export) instead of the '
        'TorchScript-based one')
    parser.add_argument(
        '--dynamic',
        action='store_true',
        help='(not supported) dynamic input shapes')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=cfg_options_action(),
        help='override config settings, e.g. '
        'model.backbone.attn_cfg.nr_method=iterative')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from deployment.deploy import ExportError
    try:
        return run(args)
    except ExportError as e:
        print(f'error: {e}', file=sys.stderr)
        return 2


def run(args) -> int:
    import mmsoft  # noqa: F401  (registers SOFT, applies compat fixes)
    from deployment import deploy
    if args.dynamic:
        raise deploy.ExportError(
            'dynamic input shapes are not supported (the landmark grids, '
            'position-embedding interpolation and Newton-Raphson iterations '
            'are specialised to one size); export one file per size with '
            '--shape H W')
    if args.batch < 1:
        raise deploy.ExportError(f'--batch must be >= 1, got {args.batch}')
    deploy.check_opset(args.opset, args.dynamo)
    if args.out is not None:
        deploy.check_out(args.out, args.config, args.shape)
    model, scope, cfg = deploy.build_model(args.config, args.checkpoint,
                                           args.cfg_options, args.partial_load)
    shape = deploy.check_shape(scope, cfg, args.shape)
    deploy.check_exportable(model, dynamo=args.dynamo)
    wrapper = deploy.ExportWrapper(model, scope, shape)
    out = args.out or (osp.splitext(osp.basename(args.config))[0] +
                       f'_{shape[0]}x{shape[1]}.onnx')
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')  # tracer / deprecation noise
        secs = deploy.export_onnx(wrapper, out, args.opset, args.dynamo,
                                  args.batch)
    print(f'exported {scope} {type(model).__name__} '
          f'({args.batch}x3x{shape[0]}x{shape[1]}, opset {args.opset}, '
          f'{"dynamo" if args.dynamo else "torchscript"} exporter) to {out} '
          f'in {secs:.1f} s; outputs: {", ".join(wrapper.output_names)}')
    if not args.verify:
        return 0
    errs = deploy.verify(wrapper, out, batch=args.batch)
    worst = max(errs.values())
    for name, err in errs.items():
        print(f'  {name}: max|onnx - torch| / max|torch| = {err:.2e}')
    ok = worst <= args.tolerance
    print(f'verify: max relative error {worst:.2e} '
          f'({"PASS" if ok else "FAIL"}, tolerance {args.tolerance:g})')
    return 0 if ok else 1


if __name__ == '__main__':
    from mmsoft_tools.cli import run_main
    run_main(main)  # other expected failures: one line
