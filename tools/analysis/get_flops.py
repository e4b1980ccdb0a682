"""Parameters and FLOPs of SOFT models, zoo variants and configs.

FLOPs are counted with ``torch.utils.flop_counter.FlopCounterMode`` (aten
mm / addmm / bmm / baddbmm / convolution, also inside custom autograd
Functions such as the Gaussian kernel and the Newton-Raphson inverse), so
every matrix product of the attentions is included - the "corrected FLOPs"
of the NeurIPS paper's Table 3 footnote. Reported as multiply-adds (one
multiply-add = one "FLOP", the papers' convention: ResNet-50 = 4.1G),
split into

* ``layers``: nn.Linear and nn.Conv2d modules (what per-layer counters
  that skip functional matmuls report);
* ``attention``: every other product (attention matrices, P (A^+ (P^T V)),
  the stage-4 softmax attention, ...), computed with the math SDPA backend
  so that fused kernels are counted too;
* ``nr``: the Newton-Raphson iterations of A^+ (T iterations x 2 products
  of m x m matrices per head), counted with the iterative method (the
  eigendecomposition of ``nr_method='spectral'`` has no FLOP formula).

Element-wise operations (exp, softmax, norms, activations) are not counted,
as in the papers.

    python tools/analysis/get_flops.py                      # Table 3 presets
    python tools/analysis/get_flops.py --tables zoo         # Table 1
    python tools/analysis/get_flops.py --tables bottleneck sampling
    python tools/analysis/get_flops.py --models soft_tiny_norm sima_small \\
        --shape 800 1216 --backbone-only
    python tools/analysis/get_flops.py --config configs/soft_tiny_in1k.py
    python tools/analysis/get_flops.py --config \\
        configs/retinanet_soft_tiny_1x.py --shape 800 1216

``--plot CSV`` only redraws the figure from a ``flops.csv`` (the docs'
figure: ``--plot docs/en/benchmarks/flops.csv``, written by the first
command above).

Configs: the whole model runs in ``mode='tensor'`` (two-stage detectors with
metainfo-only data samples, so their RoI-head FLOPs depend on the number of
proposals, as with mmdet's own counter).

Model names: ``<attn>_<arch>[_norm]`` (see
:func:`analysis.common.parse_model_name`): attn one of
soft, soft_norm, softmax, linformer, performer, nystromformer, sima;
arch one of the SOFT presets. ``soft_<arch>`` is the NeurIPS model (no
normalisation), ``soft_<arch>_norm`` = ``soft_norm_<arch>`` the IJCV one.
Named models are image classifiers (backbone + 1000-way linear head, as the
papers count them) unless ``--backbone-only``. Writes ``flops.csv``,
``flops.md`` and ``flops.png`` to ``--out``.
"""
import io
import json
import os.path as osp
import sys
import time
from typing import Optional

import torch
import torch.nn as nn

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from analysis.common import (ATTENTION_NAMES, add_hw_argument, attn_cfg_of,
                             make_parser, pyplot, soft_model_kwargs,
                             write_results)
from mmsoft_tools.cli import load_config, run_main

# NeurIPS Table 3 (SOFT, no normalisation): params (M), FLOPs (G)
PAPER_PRESETS = dict(
    zip(('tiny', 'small', 'medium', 'large', 'huge'),
        ((13, 1.9), (24, 3.3), (45, 7.2), (64, 11.0), (87, 16.3))))
# NeurIPS Table 1 (Tiny architecture)
PAPER_ZOO = dict(
    zip(('softmax', 'linformer', 'performer', 'nystromformer', 'soft'),
        ((13, 3.9), (13, 1.9), (13, 2.2), (13, 2.0), (13, 1.9))))
# Table 4a / IJCV Table 7: bottleneck length -> FLOPs (G)
PAPER_BOTTLENECK = {36: 1.9, 49: 1.9, 64: 2.0, 81: 2.1}
# Table 4b / IJCV Table 8: sampling -> (params M, FLOPs G)
PAPER_SAMPLING = {
    'conv': (13.07, 2.0),
    'random': (12.96, 1.9),
    'biased': (12.96, 1.9),
    'avgpool': (12.96, 1.9)
}
TABLES = ('presets', 'zoo', 'bottleneck', 'sampling')
STAGE_SIDES_224 = (56, 28, 14)


# ------------------------------------------------------------------ models
class Classifier(nn.Module):
    """SOFT backbone (cls token) + linear head, as the papers count it."""

    def __init__(self, backbone, num_classes=1000):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.embed_dims[-1], num_classes)

    def forward(self, x):
        return self.head(self.backbone(x)[-1])


def build_named(name: str,
                head: bool = True,
                attn: Optional[dict] = None,
                **overrides) -> nn.Module:
    """A SOFT model from a name (see module docstring); ``attn``: options
    added to its ``attn_cfg`` (e.g. Linformer's ``sr_mode``)."""
    from mmsoft.models.backbones import SOFT
    kw = soft_model_kwargs(name)
    kw['attn_cfg'].update(attn or {})
    if head:
        kw.update(out_type='cls_token', out_indices=(3, ))
    kw.update(overrides)
    backbone = SOFT(**kw)
    return Classifier(backbone) if head else backbone


def build_config(path: str, attn_type=None):
    """(model, call) for a config file; ``call(model, x)`` runs it.

    ``attn_type`` (a name of ``ATTENTION_NAMES``) replaces the backbone's
    ``attn_cfg`` (the config's SOFT-attention options do not apply to
    another attention)."""
    import importlib

    from mmengine.registry import init_default_scope

    import mmsoft  # noqa: F401  (registers SOFT)
    cfg = load_config(path)  # a syntax error: one line
    if attn_type is not None:
        cfg.model.backbone.attn_cfg = attn_cfg_of(attn_type)
    scope = cfg.get('default_scope', 'mmpretrain')
    init_default_scope(scope)
    registry = importlib.import_module(f'{scope}.registry').MODELS
    bb = cfg.model.get('backbone', {})
    if isinstance(bb.get('init_cfg'), dict):
        bb.init_cfg = None  # no checkpoint needed to count
    model = registry.build(cfg.model)
    return model, scope


def config_call(model, scope, x):
    """How to run a built OpenMMLab model on images x without annotations:
    ``mode='tensor'``; with metainfo-only data samples if the model needs
    them (two-stage detectors); else backbone (+ neck). Tried once outside
    the counter; returns ``call(model, x) -> description``."""
    H, W = x.shape[-2:]
    meta = dict(
        img_shape=(H, W),
        ori_shape=(H, W),
        pad_shape=(H, W),
        batch_input_shape=(H, W),
        scale_factor=(1.0, 1.0))

    def samples(n):
        if scope == 'mmdet':
            from mmdet.structures import DetDataSample
            return [DetDataSample(metainfo=meta) for _ in range(n)]
        if scope == 'mmseg':
            from mmseg.structures import SegDataSample
            return [SegDataSample(metainfo=meta) for _ in range(n)]
        raise TypeError('no data samples for scope ' + scope)

    def tensor(m, inp):
        m(inp, mode='tensor')
        return 'model (tensor mode)'

    def tensor_meta(m, inp):
        m(inp, samples(len(inp)), mode='tensor')
        return 'model (tensor mode, metainfo samples)'

    def feat(m, inp):
        m.extract_feat(inp)
        return 'extract_feat (backbone + neck)'

    model.eval()
    for call in (tensor, tensor_meta):
        try:
            with torch.no_grad():
                call(model, x)
            return call
        except Exception:  # noqa: BLE001 - try the next way
            continue
    return feat


# ------------------------------------------------------------------ counting
def _soft_attentions(model):
    from mmsoft.models.layers import SOFTAttention
    return [m for m in model.modules() if isinstance(m, SOFTAttention)]


@torch.no_grad()
def count(model: nn.Module, x: torch.Tensor, call=None) -> dict:
    """Params and FLOPs (multiply-adds) of ``call(model, x)``.

    Returns a dict with ``params`` and ``total``, ``layers``,
    ``attention``, ``nr`` (all in multiply-adds) and ``ran``.
    """
    from torch.utils.flop_counter import FlopCounterMode

    from analysis.common import sdpa_math
    from mmsoft.models.layers import with_nr

    # counted on a copy whose SOFT attentions iterate (the same function;
    # the eigendecomposition of 'spectral' has no FLOP formula)
    model = with_nr(model.eval(), method='iterative')
    softs = _soft_attentions(model)
    nr_macs = [0]

    def hook(iters):

        def count_nr(mod, args, out):  # sampler output: (B, h, m, d)
            B, h, m, _ = out.shape
            nr_macs[0] += B * h * iters * 2 * m**3

        return count_nr

    handles = []
    for m in softs:
        handles.append(m.sampler.register_forward_hook(hook(m.nr_iters)))
    call = call or (lambda mod, inp: mod(inp))
    try:
        with sdpa_math(), \
                FlopCounterMode(display=False) as fc:
            ran = call(model, x)
    finally:
        for h in handles:
            h.remove()
    counts = fc.get_flop_counts()
    root = type(model).__name__
    total = fc.get_total_flops() // 2
    layers = 0
    for name, mod in model.named_modules():
        if isinstance(mod, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d,
                            nn.ConvTranspose2d)):
            key = f'{root}.{name}' if name else root
            layers += sum(counts.get(key, {}).values()) // 2
    nr = nr_macs[0]
    return dict(
        params=sum(p.numel() for p in model.parameters()),
        total=total,
        layers=layers,
        nr=nr,
        attention=total - layers - nr,
        ran=ran if isinstance(ran, str) else 'model')


# ------------------------------------------------------------------ tables
def bottleneck_overrides(m: int):
    """SOFT-Tiny settings with an m-token bottleneck in every stage at 224:
    ratios r_i = side_i // sqrt(m) (grid >= sqrt(m)), capped to m."""
    g = int(round(m**0.5))
    if g * g != m:
        raise ValueError(f'bottleneck length {m} is not a square')
    from mmsoft.models.backbones import SOFT
    ratios = [max(1, s // g) for s in STAGE_SIDES_224] + [1]
    arch = dict(SOFT.arch_zoo['tiny'], sampling_ratios=ratios)
    return dict(arch=arch, attn=dict(max_landmarks=m))


def jobs_for(args):
    """(table, label, builder, paper_params, paper_flops) tuples."""
    jobs = []
    head = not args.backbone_only
    for t in args.tables:
        if t == 'presets':
            for a, (pp, pf) in PAPER_PRESETS.items():
                jobs.append(
                    (t, f'soft_{a}',
                     lambda a=a: build_named(f'soft_{a}', head), pp, pf))
        elif t == 'zoo':
            for z in ATTENTION_NAMES:
                pp, pf = PAPER_ZOO.get(z, (None, None))
                jobs.append(
                    (t, f'{z}_tiny',
                     lambda z=z: build_named(f'{z}_tiny', head), pp, pf))
                if z == 'linformer':  # parameter-free spatial reduction
                    jobs.append(
                        (t, 'linformer_tiny (avgpool SR)', lambda: build_named(
                            'linformer_tiny',
                            head,
                            attn=dict(sr_mode='avgpool')), None, None))
        elif t == 'bottleneck':
            for m in args.bottlenecks:
                jobs.append((t, f'soft_tiny m={m}', lambda m=m: build_named(
                    'soft_tiny', head, **bottleneck_overrides(m)), None,
                             PAPER_BOTTLENECK.get(m)))
        elif t == 'sampling':
            for s in ('conv', 'avgpool', 'random', 'biased'):
                pp, pf = PAPER_SAMPLING[s]
                jobs.append((t, f'soft_tiny {s}', lambda s=s: build_named(
                    'soft_tiny', head, attn=dict(sampling=s)), pp, pf))
    extra = dict(arch=json.loads(args.arch)) if args.arch else {}
    for name in args.models:
        jobs.append(('models', name,
                     lambda n=name: build_named(n, head, **extra), None, None))
    for path in args.config:
        jobs.append(
            ('config', osp.relpath(path),
             lambda p=path: build_config(p, args.attn_type), None, None))
    return jobs


FIELDS = [
    'table', 'model', 'input', 'params_m', 'flops_g', 'layers_g',
    'attention_g', 'nr_g', 'flops_wo_nr_g', 'paper_params_m', 'paper_flops_g',
    'counted'
]


def _fmt(v, nd=2):
    return '' if v is None or v == '' else (
        f'{v:.{nd}f}' if isinstance(v, float) else str(v))


def to_markdown(rows) -> str:
    out = io.StringIO()
    heads = [
        'table', 'model', 'input', 'Params (M)', 'FLOPs (G)', 'layers',
        'attention', 'NR iters', 'FLOPs w/o NR', 'paper Params', 'paper FLOPs'
    ]
    out.write('| ' + ' | '.join(heads) + ' |\n')
    out.write('|' + '---|' * len(heads) + '\n')
    for r in rows:
        vals = [
            r['table'], r['model'], r['input'],
            _fmt(r['params_m']),
            _fmt(r['flops_g']),
            _fmt(r['layers_g']),
            _fmt(r['attention_g']),
            _fmt(r['nr_g']),
            _fmt(r['flops_wo_nr_g']),
            _fmt(r['paper_params_m']),
            _fmt(r['paper_flops_g'], 1)
        ]
        out.write('| ' + ' | '.join(vals) + ' |\n')
    out.write('\nFLOPs in G multiply-adds; layers = Linear + Conv modules, '
              'attention = all other matrix products, NR = Newton-Raphson '
              'iterations of A^+.\n')
    return out.getvalue()


def plot(rows):
    """GFLOPs of each model by component as horizontal stacked bars (one
    row per model, its name at 10 pt) and the papers' numbers as black
    ticks: legible at the docs' page width (8 in wide) for any number of
    models."""
    fig, ax = pyplot().subplots(figsize=(8, 0.34 * len(rows) + 1.6))
    ys = range(len(rows))
    left = [0.0] * len(rows)
    for key, label in (('layers_g', 'Linear + Conv'), ('attention_g',
                                                       'attention products'),
                       ('nr_g', 'Newton-Raphson')):
        vals = [float(r[key]) for r in rows]
        ax.barh(ys, vals, 0.7, left=left, label=label)
        left = [b + v for b, v in zip(left, vals)]
    py = [
        i for i, r in enumerate(rows) if r['paper_flops_g'] not in (None, '')
    ]
    if py:
        ax.scatter([float(rows[i]['paper_flops_g']) for i in py],
                   py,
                   marker='|',
                   s=220,
                   c='k',
                   linewidths=2.5,
                   zorder=3,
                   label='paper')
    same_input = len({r['input'] for r in rows}) == 1
    ax.set_yticks(
        list(ys), [
            r['model'] if same_input else f"{r['model']} ({r['input']})"
            for r in rows
        ],
        fontsize=10)
    ax.invert_yaxis()  # the first row on top
    ax.tick_params(axis='x', labelsize=9.5)
    ax.set_xlabel(
        'GFLOPs (multiply-adds)' +
        (f", input {rows[0]['input']}" if same_input else ''),
        fontsize=10)
    ax.set_title(
        'FLOPs by component (bars) vs the papers (black ticks)', fontsize=11)
    ax.grid(axis='x', alpha=.3)
    ax.legend(fontsize=9.5, loc='lower right')
    return fig


def read_rows(path):
    """The rows of a ``flops.csv`` this tool wrote (``--plot``)."""
    import csv
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def parse_args(argv=None):
    p = make_parser(__doc__)
    p.add_argument(
        '--tables',
        nargs='*',
        default=None,
        choices=TABLES,
        help='paper tables to reproduce (default: presets, unless '
        '--models / --config are given)')
    p.add_argument(
        '--models',
        nargs='+',
        default=[],
        help='model names <attn>_<arch>[_norm]')
    p.add_argument(
        '--config',
        nargs='+',
        default=[],
        help='config files (the whole model is counted)')
    p.add_argument(
        '--attn-type',
        default=None,
        help='replace model.backbone.attn_cfg of --config by this '
        'attention (soft, soft_norm, softmax, linformer, ...)')
    add_hw_argument(p, '--shape')
    p.add_argument(
        '--bottlenecks', nargs='+', type=int, default=[36, 49, 64, 81])
    p.add_argument(
        '--arch',
        default=None,
        help='JSON arch dict replacing the preset of --models, '
        'e.g. \'{"embed_dims": [32, 64, 160, 256], "num_heads": '
        '[1, 2, 5, 8], "depths": [1, 1, 1, 1]}\'')
    p.add_argument(
        '--backbone-only',
        action='store_true',
        help='named models without the classification head')
    p.add_argument('--out', default='work_dirs/get_flops')
    p.add_argument(
        '--plot',
        metavar='CSV',
        help='only redraw the figure from a flops.csv this tool wrote (e.g. '
        'docs/en/benchmarks/flops.csv) to --figure; nothing is counted')
    p.add_argument(
        '--figure',
        default='tools/analysis/figures/flops.png',
        help='the PNG that --plot writes')
    args = p.parse_args(argv)
    if args.tables is None:
        args.tables = [] if (args.models or args.config) else ['presets']
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.plot:
        from analysis.common import save_figure
        save_figure(plot(read_rows(args.plot)), args.figure)
        print(f'wrote {args.figure}')
        return []
    torch.manual_seed(0)
    H, W = args.shape
    jobs = jobs_for(args)
    print(
        f'counting {len(jobs)} models at {H}x{W} (FLOPs = multiply-adds)',
        flush=True)
    rows, t0 = [], time.time()
    for i, (table, label, builder, pp, pf) in enumerate(jobs, 1):
        built = builder()
        x = torch.randn(1, 3, H, W)
        if isinstance(built, tuple):  # config: (model, scope)
            model, scope = built
            res = count(model, x, config_call(model, scope, x))
        else:
            model = built
            res = count(model, x)
        g = 1e9
        row = dict(
            table=table,
            model=label,
            input=f'{H}x{W}',
            params_m=res['params'] / 1e6,
            flops_g=res['total'] / g,
            layers_g=res['layers'] / g,
            attention_g=res['attention'] / g,
            nr_g=res['nr'] / g,
            flops_wo_nr_g=(res['total'] - res['nr']) / g,
            paper_params_m=pp,
            paper_flops_g=pf,
            counted=res['ran'])
        rows.append(row)
        paper = f'  (paper {pp}M / {pf}G)' if pf is not None else ''
        print(
            f'[{i}/{len(jobs)}] {label:24s} {row["params_m"]:7.2f}M '
            f'{row["flops_g"]:7.2f}G (w/o NR {row["flops_wo_nr_g"]:.2f}G)'
            f'{paper}  {time.time() - t0:.0f}s',
            flush=True)
        del model, built
    write_results(args.out, 'flops', rows, FIELDS, to_markdown(rows),
                  plot(rows))
    return rows


if __name__ == '__main__':
    run_main(main)  # expected failures (a config's syntax error): one line
