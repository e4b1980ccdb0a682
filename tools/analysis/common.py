"""What the scripts in ``tools/analysis`` share: model names, images,
measuring (one per fresh process: :func:`run_isolated`), options, outputs."""
import argparse
import csv
import io
import json
import os
import os.path as osp
import re
import subprocess
import sys
import time
from collections import namedtuple
from typing import Callable, Dict, List, Optional

ROOT = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
if osp.isdir(osp.join(ROOT, 'projects')):  # a checkout: the attention zoo
    sys.path.append(ROOT)
    import projects.attention_zoo  # noqa: E402,F401

NR_METHODS = ('iterative', 'spectral', 'lanczos')
#: registry names, and ``soft_norm`` = SOFT with the IJCV normalisation
ATTENTION_NAMES = ('soft', 'soft_norm', 'softmax', 'linformer', 'performer',
                   'nystromformer', 'sima')

ModelName = namedtuple('ModelName', 'attn arch norm nr_method max_landmarks')


def parse_model_name(name: str) -> ModelName:
    """``<attn>_<arch>[_norm][_iterative|_spectral][_ml<N>]`` parsed."""
    from mmsoft.models.backbones import SOFT
    archs = tuple(SOFT.arch_zoo)
    usage = (f'use <attn>_<arch>[_norm][_iterative|_spectral][_ml<N>] with '
             f'attn in {ATTENTION_NAMES} and arch in {archs}')
    for attn in sorted(ATTENTION_NAMES, key=len, reverse=True):
        if not name.startswith(attn + '_'):
            continue
        parts = name[len(attn) + 1:].split('_')
        max_landmarks = nr_method = None
        if len(parts) > 1 and re.fullmatch(r'ml\d+', parts[-1]):
            max_landmarks = int(parts.pop()[2:])
        if len(parts) > 1 and parts[-1] in NR_METHODS:
            nr_method = parts.pop()
        norm = len(parts) > 1 and parts[-1] == 'norm'
        if norm:
            parts.pop()
        arch = '-'.join(parts)
        if arch not in archs:
            break
        if attn == 'soft_norm':
            attn, norm = 'soft', True
        if attn != 'soft' and (norm or nr_method or max_landmarks):
            raise ValueError(f'model {name!r}: _norm, _{"/_".join(NR_METHODS)}'
                             ' and _ml<N> only apply to soft')
        return ModelName(attn, arch, norm, nr_method, max_landmarks)
    raise ValueError(f'unknown model {name!r}; {usage}')


def attn_cfg_of(attn: str, norm: bool = False) -> dict:
    """The backbone's ``attn_cfg`` of a name of :data:`ATTENTION_NAMES`."""
    if attn not in ATTENTION_NAMES:
        raise ValueError(f'unknown attention {attn!r}; choose one of '
                         f'{ATTENTION_NAMES}')
    if attn in ('soft', 'soft_norm'):
        return dict(type='soft', attn_norm=norm or attn == 'soft_norm')
    return dict(type=attn)


def soft_model_kwargs(name: str) -> dict:
    """``SOFT(**kwargs)``'s ``arch`` and ``attn_cfg`` of a model name."""
    m = parse_model_name(name)
    attn_cfg = attn_cfg_of(m.attn, m.norm)
    if m.nr_method:
        attn_cfg['nr_method'] = m.nr_method
    if m.max_landmarks:
        attn_cfg['max_landmarks'] = m.max_landmarks
    return dict(arch=m.arch, attn_cfg=attn_cfg)


IMG_EXTS = ('.jpg', '.jpeg', '.png', '.bmp', '.webp')
#: ImageNet mean / std (RGB), as the configs' data preprocessors
MEAN = (123.675, 116.28, 103.53)
STD = (58.395, 57.12, 57.375)
DEMO_SETS = (('imagenet', 'imagenet/val'), ('coco', 'coco/val'),
             ('ade', 'ade/images/validation'))


def demo_data_root() -> str:
    """``data/demo`` of the checkout, else of the working directory."""
    from mmsoft_tools import checkout_root
    return osp.join(checkout_root() or os.getcwd(), 'data', 'demo')


def list_images(folder: str) -> List[str]:
    return sorted(
        osp.join(root, f) for root, _, files in os.walk(folder) for f in files
        if f.lower().endswith(IMG_EXTS))


def image_sets(specs, num_images: int, demo_root=None):
    """[(name, images)] of ``specs`` (``[name=]DIR``), demo or synthetic."""
    sets = []
    for spec in specs or []:
        name, _, path = spec.rpartition('=')
        name = name or osp.basename(osp.normpath(path))
        files = list_images(path)
        if not files:
            raise FileNotFoundError(f'no images under {path}')
        sets.append((name, files[:num_images]))
    if sets:
        return sets
    demo_root = demo_root or demo_data_root()
    for name, sub in DEMO_SETS:
        files = list_images(osp.join(demo_root, sub))
        if files:
            sets.append((f'demo-{name}', files[:num_images]))
    if sets:
        return sets
    import numpy as np

    import demo_synthetic
    render_scene = demo_synthetic.render_scene
    imgs = [
        render_scene(np.random.default_rng([7, i]), 224)[0][..., ::-1]
        for i in range(num_images)
    ]
    return [('synthetic', imgs)]


def load_rgb(item):
    """An RGB uint8 array from an image path (or the array itself)."""
    import numpy as np
    if isinstance(item, np.ndarray):
        return np.ascontiguousarray(item)
    import cv2
    img = cv2.imread(item, cv2.IMREAD_COLOR)
    if img is None:
        raise IOError(f'cannot read image {item}')
    return img[..., ::-1].copy()


def normalize(rgb):
    """ImageNet-normalised (3, H, W) float tensor of an RGB array."""
    import numpy as np
    import torch
    img = (rgb.astype(np.float32) - np.float32(MEAN)) / np.float32(STD)
    return torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))


def to_tensor(rgb, size):
    """Resize to size (H, W), ImageNet-normalise -> (3, H, W) float."""
    import cv2
    H, W = size
    return normalize(cv2.resize(rgb, (W, H), interpolation=cv2.INTER_LINEAR))


def build_model(name=None, config=None, checkpoint=None, **overrides):
    """A SOFT backbone (eval mode) of a model name or a config."""
    from mmsoft.models.backbones import SOFT
    if config:
        from mmsoft_tools.cli import load_config
        bb = dict(load_config(config).model.backbone)
        bb.pop('type', None)
        bb.pop('init_cfg', None)
    else:
        bb = soft_model_kwargs(name)
    model = SOFT(**dict(bb, **overrides))
    if checkpoint:  # strict: a file of another model is an error
        from mmsoft.models.loading import load_pretrained
        load_pretrained(model, checkpoint)
    else:
        print(
            'warning: no --checkpoint, the model is randomly initialised',
            flush=True)
        quiet_init_weights(model)
    return model.eval()


def soft_attention_modules(model):
    """[(stage, layer, SOFTAttention)] in order."""
    from mmsoft.models.layers import SOFTAttention
    out = []
    for name, mod in model.named_modules():
        if isinstance(mod, SOFTAttention):
            parts = name.split('.')  # ...stages.<i>.blocks.<j>.attn
            i = parts.index('stages')
            out.append((int(parts[i + 1]), int(parts[i + 3]), mod))
    return out


def random_batch(scope: str,
                 name: str,
                 size: int,
                 batch_size: int = 2,
                 seg_classes: int = 150):
    """A seeded random batch of ``scope``'s data samples."""
    import torch
    g = torch.Generator().manual_seed(0)
    inputs = [
        torch.randint(0, 256, (3, size, size), generator=g, dtype=torch.uint8)
        for _ in range(batch_size)
    ]
    if scope == 'mmpretrain':
        from mmpretrain.structures import DataSample
        samples = [DataSample().set_gt_label(i) for i in range(batch_size)]
        return dict(inputs=inputs, data_samples=samples)
    if scope == 'mmdet':
        from mmdet.testing import demo_mm_inputs
        return demo_mm_inputs(
            batch_size=batch_size,
            image_shapes=[(3, size, size)] * batch_size,
            num_items=[3] * batch_size,
            num_classes=80,
            with_mask='mask' in name)
    from mmengine.structures import PixelData
    from mmseg.structures import SegDataSample
    samples = []
    for _ in range(batch_size):
        s = SegDataSample()
        s.gt_sem_seg = PixelData(
            data=torch.randint(
                0, seg_classes, (1, size,
                                 size), generator=g, dtype=torch.long))
        s.set_metainfo(
            dict(
                img_shape=(size, size),
                ori_shape=(size, size),
                pad_shape=(size, size),
                scale_factor=(1.0, 1.0),
                flip=False,
                flip_direction=None))
        samples.append(s)
    return dict(inputs=inputs, data_samples=samples)


RESULT_PREFIX = 'RESULT '


def sync_device(device: str):
    """Wait for ``device``'s queued kernels (CUDA; a no-op on the CPU)."""
    if device.startswith('cuda'):
        import torch
        torch.cuda.synchronize()


def measure_step(step: Callable[[], None],
                 device: str = 'cpu',
                 repeats: int = 3,
                 warmup: Optional[Callable] = None) -> Dict[str, float]:
    """Peak memory of the first ``step()``, median / min time of the rest."""
    import resource

    import torch
    if warmup is not None:
        warmup()
    sync_device(device)
    if device.startswith('cuda'):
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    step()
    sync_device(device)
    first = (time.perf_counter() - t0) * 1e3
    if device.startswith('cuda'):
        peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss -
                   base) / 1024
    times: List[float] = []
    for _ in range(repeats):
        sync_device(device)
        t0 = time.perf_counter()
        step()
        sync_device(device)
        times.append((time.perf_counter() - t0) * 1e3)
    if not times:
        times = [first]
    times.sort()
    return dict(
        time_ms=times[len(times) // 2],
        min_ms=times[0],
        peak_mb=max(peak_mb, 0.0))


def print_result(res: dict):
    """The child's side of :func:`run_isolated`: its one result line."""
    print(RESULT_PREFIX + json.dumps(res), flush=True)


def run_isolated(argv: List[str], threads: Optional[int] = None) -> Dict:
    """The :func:`print_result` dict of ``python argv...`` in a new process."""
    from mmsoft_tools import import_root
    if threads:
        argv = list(argv) + ['--threads', str(threads)]
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([import_root()] + (
        [env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    proc = subprocess.run(
        [sys.executable] + [str(a) for a in argv],
        capture_output=True,
        text=True,
        env=env)
    lines = [
        ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_PREFIX)
    ]
    if proc.returncode != 0 or not lines:
        err = (proc.stderr.strip().splitlines() or ['no output'])[-1]
        raise RuntimeError(err)
    return json.loads(lines[-1][len(RESULT_PREFIX):])


def make_parser(doc: str) -> argparse.ArgumentParser:
    """A parser with the docstring as description and epilog."""
    return argparse.ArgumentParser(
        description=doc.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=doc)


class _HW(argparse.Action):
    """``H`` or ``H W`` -> ``[H, W]``."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) not in (1, 2):
            parser.error(f'{option_string} takes H or H W, got {values}')
        setattr(namespace, self.dest, [values[0], values[-1]])


def add_hw_argument(parser: argparse.ArgumentParser,
                    option: str = '--size',
                    default: int = 224,
                    what: str = 'input'):
    """``option H [W]`` (a square for one value), parsed into ``[H, W]``."""
    parser.add_argument(
        option,
        nargs='+',
        type=int,
        default=[default, default],
        action=_HW,
        help=f'{what} H [W] (default {default})')


def add_timing_arguments(parser: argparse.ArgumentParser,
                         repeats: int = 3,
                         warmup: Optional[int] = None,
                         device: Optional[str] = None,
                         threads: Optional[int] = None,
                         with_device: bool = True,
                         helps: Optional[Dict[str, str]] = None):
    """``--repeats``, ``--warmup``, ``--device``, ``--threads``."""
    helps = {
        'repeats': 'timed repeats',
        'warmup': 'untimed steps first',
        'device': 'default: cuda if any' if device is None else None,
        'threads': 'intra-op threads (default: torch\'s)',
        **(helps or {})
    }
    parser.add_argument(
        '--repeats', type=int, default=repeats, help=helps['repeats'])
    if warmup is not None:
        parser.add_argument(
            '--warmup', type=int, default=warmup, help=helps['warmup'])
    if with_device:
        parser.add_argument('--device', default=device, help=helps['device'])
    parser.add_argument(
        '--threads', type=int, default=threads, help=helps['threads'])


def add_stage_argument(parser: argparse.ArgumentParser, default: int,
                       help: str):
    """``--stage``: a SOFT-attention stage, 0-based (0, 1 or 2)."""
    parser.add_argument(
        '--stage', type=int, default=default, choices=[0, 1, 2], help=help)


def add_model_arguments(parser: argparse.ArgumentParser,
                        model: str = 'soft_tiny_norm',
                        helps: Optional[Dict[str, str]] = None):
    """``--model``, ``--config``, ``--checkpoint``, ``--images``."""
    helps = {
        'model': f'a model name (default {model})',
        'config': 'take model.backbone of this config instead',
        'checkpoint': 'weights to load',
        'images': 'image folders, optionally name=DIR',
        **(helps or {})
    }
    parser.add_argument('--model', default=model, help=helps['model'])
    parser.add_argument('--config', default=None, help=helps['config'])
    parser.add_argument('--checkpoint', default=None, help=helps['checkpoint'])
    parser.add_argument(
        '--images', nargs='+', default=None, help=helps['images'])


def pyplot():
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str, dpi: int = 110):
    """Lay out, write atomically and close a figure."""
    from mmsoft.utils.atomic import atomic_path
    fig.tight_layout()
    with atomic_path(path, suffix=osp.splitext(path)[1], makedirs=True) as t:
        fig.savefig(t, dpi=dpi)
    pyplot().close(fig)


def write_text(path: str, text: str):
    from mmsoft.utils.atomic import atomic_write
    atomic_write(path, text, makedirs=True)


def write_csv(path: str, rows: List[dict], fields: Optional[List] = None):
    """Rows as CSV with the columns ``fields`` (default: the first row's)."""
    buf = io.StringIO()
    if fields is None and rows:
        fields = list(rows[0])
    if fields:
        w = csv.DictWriter(buf, fieldnames=fields, extrasaction='ignore')
        w.writeheader()
        w.writerows(rows)
    write_text(path, buf.getvalue())


def write_results(out: str,
                  stem: str,
                  rows: List[dict],
                  fields: Optional[List],
                  md: str,
                  fig=None,
                  figure_name: Optional[str] = None) -> List[str]:
    """``<out>/<stem>.csv``, ``.md`` and the figure; returns the paths."""
    paths = [osp.join(out, f'{stem}.csv'), osp.join(out, f'{stem}.md')]
    write_csv(paths[0], rows, fields)
    write_text(paths[1], md)
    if fig is not None:
        paths.append(osp.join(out, figure_name or f'{stem}.png'))
        save_figure(fig, paths[2])
    print(md)
    print('wrote ' + ', '.join(paths), flush=True)
    return paths


def quiet_init_weights(model) -> None:
    """``model.init_weights()`` without its INFO line per parameter."""
    import logging

    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)


def sdpa_math():
    """A context where SDPA runs its math kernel (any torch)."""
    import torch
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return torch.backends.cuda.sdp_kernel(
            enable_flash=False, enable_math=True, enable_mem_efficient=False)
    return sdpa_kernel(SDPBackend.MATH)


def grad_scaler(device_type, **kwargs):
    """``torch.amp.GradScaler`` (torch >= 2.3), else CUDA's."""
    import torch
    if hasattr(torch.amp, 'GradScaler'):
        return torch.amp.GradScaler(device_type, **kwargs)
    return torch.cuda.amp.GradScaler(**kwargs)
