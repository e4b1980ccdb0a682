"""ONNX export of SOFT models built from mmpretrain / mmdet / mmseg configs
(docs/en/user_guides/deployment.md): one fixed input shape per file."""
import importlib
import os.path as osp
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn as nn

from mmsoft.models.layers.amp import ExportError
from mmsoft.utils.atomic import atomic_path

DEFAULT_OPSET = 17
#: the oldest opsets that export SOFT: TorchScript (SDPA needs 14), dynamo
MIN_OPSET = 14
MIN_OPSET_DYNAMO = 18


def onnx_export_takes_dynamo():
    """Whether ``torch.onnx.export`` takes ``dynamo`` (torch >= 2.5)."""
    import inspect
    return 'dynamo' in inspect.signature(torch.onnx.export).parameters


def build_model(config,
                checkpoint: Optional[str],
                cfg_options: Optional[dict] = None,
                partial_load: bool = False):
    """(model in eval mode on the CPU, scope, cfg) of a config."""
    from mmengine.config import Config
    from mmengine.model import revert_sync_batchnorm
    from mmengine.registry import init_default_scope

    from analysis.common import quiet_init_weights
    from mmsoft_tools import launch
    if not isinstance(config, Config):
        if not osp.isfile(config):
            raise ExportError(f'config {config!r} does not exist; pass a '
                              f'config file, e.g. configs/soft_tiny_in1k.py')
        from mmsoft_tools.cli import load_config
        config = load_config(config)  # a syntax error: one line
    cfg = config
    from mmsoft_tools.cli import ToolError, merge_cfg_options
    try:
        merge_cfg_options(cfg, cfg_options)  # a mistyped key: one line
    except ToolError as e:
        raise ExportError(str(e)) from None
    scope = launch.import_codebase(cfg)
    init_default_scope(scope)
    registry = importlib.import_module(f'{launch.CODEBASES[scope]}.registry')
    random = checkpoint is None or str(checkpoint).lower() == 'none'
    if random and cfg.model.get('backbone'):  # no ImageNet file needed
        cfg.model.backbone.init_cfg = None
    # SyncBN has no CPU kernel: BN (same statistics) for the export
    model = revert_sync_batchnorm(registry.MODELS.build(cfg.model))
    if random:
        quiet_init_weights(model)
    else:
        load_weights(model, checkpoint, partial_load)
    return model.eval(), scope, cfg


def load_weights(model: nn.Module,
                 checkpoint: str,
                 partial_load: bool = False) -> None:
    """Load ``checkpoint`` after ``tools/test.py``'s checks."""
    from mmengine.runner.checkpoint import _load_checkpoint_to_model

    from mmsoft.models.loading import (check_checkpoint_for_model,
                                       read_checkpoint)
    from mmsoft.utils.checkpoint_io import CheckpointError, CheckpointRefused
    from mmsoft.utils.strict_load import CheckpointMismatchError
    try:
        ckpt = read_checkpoint(checkpoint)
        check_checkpoint_for_model(model, ckpt, str(checkpoint), partial_load,
                                   'pass --partial-load')
    except (CheckpointMismatchError, CheckpointError, CheckpointRefused,
            FileNotFoundError) as e:
        raise ExportError(' '.join(str(e).split())) from None
    _load_checkpoint_to_model(model, ckpt, strict=False, logger='current')


def check_exportable(model: nn.Module, dynamo: bool = False) -> None:
    """Raise :class:`ExportError` for model parts with no export path."""
    from mmsoft.models.layers.soft_attention import SOFTAttention
    for name, mod in model.named_modules():
        if isinstance(mod, SOFTAttention):
            if mod.nr_method == 'spectral':
                raise ExportError(
                    f"{name}: nr_method='spectral' cannot be exported "
                    f"(torch.linalg.eigh has no ONNX operator); export with "
                    f"--cfg-options model.backbone.attn_cfg.nr_method=auto "
                    f"(the same function, evaluated iteratively)")
            pooled = [(k, getattr(mod.sampler, k))
                      for k in ('max_landmarks', 'landmark_hw')
                      if getattr(mod.sampler, k) is not None]
            if pooled and not dynamo:
                raise ExportError(
                    f'{name}: {pooled[0][0]}={pooled[0][1]} '
                    f'(adaptive pooling of the landmark grid) has no '
                    f'TorchScript ONNX export; pass --dynamo (torch.export '
                    f'exporter, needs onnxscript)')


def opset_range(dynamo: bool = False) -> Tuple[int, int]:
    """The ONNX opsets the export supports (lowest, highest)."""
    from torch.onnx import _constants  # torch >= 1.13
    hi = max(
        getattr(_constants, 'ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET', 0),
        DEFAULT_OPSET)
    if dynamo:
        hi = max(getattr(_constants, 'ONNX_MAX_OPSET', hi), hi)
    return (MIN_OPSET_DYNAMO if dynamo else MIN_OPSET), hi


def check_opset(opset: int, dynamo: bool = False) -> None:
    """``--opset`` outside :func:`opset_range`: one line before building."""
    lo, hi = opset_range(dynamo)
    if not lo <= opset <= hi:
        raise ExportError(
            f'--opset {opset} is not supported: SOFT exports with opsets '
            f'{lo} to {hi}' + (' (--dynamo)' if dynamo else '') +
            f'; the default is {DEFAULT_OPSET}')


def check_out(out: str, config: str, shape: Sequence[int]) -> None:
    """``--out`` naming a directory: refused before the export."""
    if osp.isdir(out):
        name = osp.splitext(osp.basename(config))[0] + \
            f'_{shape[0]}x{shape[1]}.onnx'
        raise ExportError(
            f'--out {out} is a directory; give a file name, e.g. --out '
            f'{osp.join(out, name)}')


class ExportWrapper(nn.Module):
    """Image tensor -> the exported tensors (``output_names``)."""

    def __init__(self, model: nn.Module, scope: str, shape: Tuple[int, int]):
        super().__init__()
        self.model = model
        self.scope = scope
        self.shape = tuple(int(s) for s in shape)
        self.kind = self._kind(model, scope)
        # eval mode, also for this wrapper: torch.onnx.export restores the
        # top module's mode recursively after the export
        self.eval()
        self.output_names = self._names()

    @staticmethod
    def _kind(model, scope) -> str:
        name = type(model).__name__
        if scope == 'mmpretrain':
            if not hasattr(model, 'extract_feat') or \
                    getattr(model, 'head', None) is None:
                raise ExportError(f'{name}: only mmpretrain classifiers '
                                  f'with a head can be exported')
            return 'cls'
        if scope == 'mmseg':
            if not hasattr(model, 'encode_decode'):
                raise ExportError(f'{name}: only mmseg EncoderDecoder '
                                  f'segmentors can be exported')
            return 'seg'
        rpn = getattr(model, 'rpn_head', None)
        if rpn is not None and type(rpn).__name__ != 'EmbeddingRPNHead' \
                and hasattr(model, 'extract_feat'):
            return 'two_stage'
        if getattr(model, 'bbox_head', None) is not None and \
                hasattr(model, 'extract_feat') and \
                not hasattr(model, 'roi_head'):
            return 'single_stage'
        raise ExportError(f'{name}: no ONNX export path for this mmdet '
                          f'model; single-stage detectors (RetinaNet, ATSS, '
                          f'GFL) and RPN-based two-stage detectors are '
                          f'supported')

    def _raw(self, x):
        m = self.model
        if self.kind == 'cls':
            return [m.head(m.extract_feat(x))]
        if self.kind == 'seg':
            H, W = self.shape
            metas = [
                dict(img_shape=(H, W), ori_shape=(H, W), pad_shape=(H, W))
            ] * x.shape[0]
            return [m.encode_decode(x, metas)]
        feats = m.extract_feat(x)
        if self.kind == 'two_stage':
            return [list(feats)] + list(m.rpn_head(feats))
        return list(m.bbox_head(feats))

    def _names(self) -> List[str]:
        if self.kind == 'cls':
            return ['cls_score']
        if self.kind == 'seg':
            return ['seg_logits']
        with torch.no_grad():
            raw = self._raw(torch.zeros(1, 3, *self.shape))
        if self.kind == 'two_stage':
            prefixes = ['feat', 'rpn_cls_score', 'rpn_bbox_pred']
        else:
            prefixes = ['cls_score', 'bbox_pred', 'centerness', 'out3']
        return [
            f'{prefixes[i]}_{j}' for i, group in enumerate(raw)
            for j in range(len(group))
        ]

    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        raw = self._raw(x)
        if self.kind in ('cls', 'seg'):
            return tuple(raw)
        return tuple(t for group in raw for t in group)


class MatmulAdaptiveAvgPool2d(nn.Module):
    """``nn.AdaptiveAvgPool2d`` as two averaging matrices (exportable)."""

    def __init__(self, output_size):
        super().__init__()
        size = output_size if isinstance(output_size, (tuple, list)) \
            else (output_size, output_size)
        self.output_size = tuple(size)

    @staticmethod
    def _bins(n: int, o: int, like: torch.Tensor) -> torch.Tensor:
        P = torch.zeros(o, n, dtype=like.dtype)
        for i in range(o):
            a, b = (i * n) // o, -(-((i + 1) * n) // o)
            P[i, a:b] = 1.0 / (b - a)
        return P

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        H, W = int(x.shape[-2]), int(x.shape[-1])
        oh = self.output_size[0] or H
        ow = self.output_size[1] or W
        Ph = self._bins(H, oh, x)
        Pw = self._bins(W, ow, x)
        return torch.matmul(torch.matmul(Ph, x), Pw.t())


def _swap_adaptive_pools(model: nn.Module) -> List[Tuple]:
    swapped = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.AdaptiveAvgPool2d):
                setattr(parent, name,
                        MatmulAdaptiveAvgPool2d(child.output_size))
                swapped.append((parent, name, child))
    return swapped


def export_onnx(wrapper: ExportWrapper,
                out: str,
                opset: int = DEFAULT_OPSET,
                dynamo: bool = False,
                batch: int = 1) -> float:
    """Write the ONNX file atomically; returns the export time (s)."""
    x = torch.zeros(batch, 3, *wrapper.shape)
    t0 = time.perf_counter()
    swapped = _swap_adaptive_pools(wrapper)
    try:
        kwargs = dict(
            input_names=['input'],
            output_names=wrapper.output_names,
            opset_version=opset)
        if onnx_export_takes_dynamo():  # torch >= 2.5
            kwargs['dynamo'] = dynamo
        elif dynamo:
            raise ExportError(
                f'--dynamo needs torch >= 2.5 (torch.onnx.export has no '
                f'dynamo argument in torch {torch.__version__}); export '
                f'without --dynamo or upgrade torch')
        if dynamo:
            kwargs['external_data'] = False
        with atomic_path(out, makedirs=True) as tmp, torch.no_grad():
            torch.onnx.export(wrapper, (x, ), tmp, **kwargs)
        wrapper.eval()
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
    return time.perf_counter() - t0


class OnnxModel:
    """onnxruntime (CPU) session of an exported file, shape-checked."""

    def __init__(self, path: str, threads: Optional[int] = None):
        import onnxruntime as ort
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
            opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            path, opts, providers=['CPUExecutionProvider'])
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.input_shape = tuple(inp.shape)
        self.output_names = [o.name for o in self.session.get_outputs()]

    def __call__(self, x) -> List:
        x = x.numpy() if isinstance(x, torch.Tensor) else x
        if tuple(x.shape) != self.input_shape:
            want = 'x'.join(map(str, self.input_shape))
            raise ExportError(
                f'the ONNX model was exported for {want} inputs (fixed '
                f'shape), got {"x".join(map(str, x.shape))}; export again '
                f'with --shape {x.shape[2]} {x.shape[3]}')
        return self.session.run(None, {self.input_name: x})


def relative_error(out, ref) -> float:
    """max |out - ref| / max |ref| (the README's parity measure)."""
    out = torch.as_tensor(out).double()
    ref = torch.as_tensor(ref).double()
    return float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def verify(wrapper: ExportWrapper,
           onnx_path: str,
           seed: int = 0,
           batch: int = 1) -> Dict[str, float]:
    """Relative error of every onnxruntime output against PyTorch's."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, *wrapper.shape, generator=g)
    with torch.no_grad():
        ref = wrapper(x)
    out = OnnxModel(onnx_path)(x)
    return {
        name: relative_error(o, r)
        for name, o, r in zip(wrapper.output_names, out, ref)
    }


def check_shape(scope: str, cfg, shape: Sequence[int]) -> Tuple[int, int]:
    """Validate ``--shape H W`` for the codebase."""
    if len(shape) != 2 or min(shape) < 1:
        raise ExportError(f'--shape takes two positive sizes H W, got '
                          f'{list(shape)}')
    H, W = (int(s) for s in shape)
    div = cfg.model.get('data_preprocessor', {}).get('pad_size_divisor', 1) \
        if scope == 'mmdet' else 1
    if div and (H % div or W % div):
        ph, pw = -(-H // div) * div, -(-W // div) * div
        raise ExportError(
            f'--shape {H} {W}: mmdet pads inputs to a multiple of {div} '
            f'(data_preprocessor.pad_size_divisor); export the padded size '
            f'--shape {ph} {pw}')
    return H, W
