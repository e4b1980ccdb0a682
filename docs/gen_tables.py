"""Generate the documentation's tables from their one source each.

A page marks a generated table with two HTML comments (invisible on
GitHub and in the built site)::

    <!-- generated: NAME -->
    ...the table, written by this script...
    <!-- end generated -->

and :data:`SOURCES` renders ``NAME`` from its source:

* ``zoo_<task>`` / ``zoo_summary``: the model index (``model-index.yml``
  and the ``configs/metafiles/*.yml`` it imports: what ``mim search``
  shows);
* ``bench_*`` / ``onnx_latency``: the CSV files in ``docs/en/benchmarks/``,
  with the columns the benchmark tools write (``tools/analysis/*.py
  --out``, ``tools/deployment/benchmark_onnx.py``);
* ``tested_versions``: the ranges of ``requirements/*.txt`` and the pins
  of ``requirements/constraints.txt``;
* ``official_files``: ``OFFICIAL_FILES`` of
  ``mmsoft/models/arch_zoo.py`` (the authors' ImageNet
  files, the arch each loads into, the paper configs that expect it).

``python docs/gen_tables.py`` rewrites the pages (``make docs`` does),
``--check`` only reports the pages that differ (exit 1; the test
``tests/test_docs/test_generated_tables.py`` does the same), and
``--docs-env`` prints which of ``requirements/docs.txt`` and
``requirements/docs_api.txt`` are not installed (exit 1; the Makefile
installs those) or nothing (exit 0).
"""
import argparse
import ast
import csv
import os.path as osp
import re
import sys

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
DOCS = osp.join(ROOT, 'docs', 'en')
BENCH = osp.join(DOCS, 'benchmarks')
#: the pages that hold generated tables (relative to ROOT)
PAGES = ('README.md', 'docs/en/model_zoo.md', 'docs/en/benchmarks.md',
         'docs/en/user_guides/deployment.md',
         'docs/en/user_guides/official_weights.md',
         'docs/en/advanced_guides/compatibility.md')
BLOCK = re.compile(
    r'(<!-- generated: (?P<name>[^>]+?) -->\n)(?P<body>.*?)'
    r'(<!-- end generated -->)', re.S)


def md_table(head, rows):
    lines = ['| ' + ' | '.join(head) + ' |', '|' + '---|' * len(head)]
    lines += ['| ' + ' | '.join(str(c) for c in r) + ' |' for r in rows]
    return '\n'.join(lines) + '\n'


def read_csv(name):
    with open(osp.join(BENCH, name), newline='') as f:
        return list(csv.DictReader(f))


# ------------------------------------------------------------ model index
def load_models():
    """The models of the model index, in its order; each is in a collection
    of its metafile (else ``ValueError``)."""
    import yaml  # here: ``--docs-env`` runs before any dependency is there
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    models = []
    for rel in index['Import']:
        with open(osp.join(ROOT, rel)) as f:
            meta = yaml.safe_load(f)
        collections = {c['Name'] for c in meta['Collections']}
        for m in meta['Models']:
            if m['In Collection'] not in collections:
                raise ValueError(
                    f'{rel}: model {m["Name"]} is in collection '
                    f'{m["In Collection"]!r}, which {rel} does not define')
            models.append(m)
    return models


def _metrics(model):
    out = {}
    for res in model.get('Results', []):
        for k, v in res['Metrics'].items():
            out[k] = v
    return out


def _tasks(model):
    return [r['Task'] for r in model.get('Results', [])]


def _m(value):
    return f'{value / 1e6:.2f}M' if value else ''


def _paper_m(value):
    """The paper's rounded count as the paper gives it (13M, not 13.00M)."""
    return f'{value / 1e6:g}M' if value else ''


def _g(value):
    return f'{value / 1e9:.1f}G' if value else ''


def _source(meta):
    """The paper table a model's numbers come from (its ``Numbers``
    note, e.g. ``(IJCV 2024 Table 4; FLOPs not reported)``)."""
    m = re.search(r'\(((NeurIPS|IJCV) \d+ Table \d+)', meta.get('Numbers', ''))
    return m.group(1) if m else ''


def _with_tasks(models):
    """``(model, tasks)``; a model without results (a config whose paper
    gives no number) takes its collection's tasks."""
    coll = {}
    for m in models:
        coll.setdefault(m['In Collection'], []).extend(_tasks(m))
    return [(m, _tasks(m) or coll[m['In Collection']]) for m in models]


def zoo_table(task):
    models = [m for m, tasks in _with_tasks(load_models()) if task in tasks]
    keys = []
    for m in models:
        for k in _metrics(m):
            if k not in keys:
                keys.append(k)
    # the metrics first: the table is read for them; the config of a
    # model is configs/<model>.py
    head = ['model'] + keys + [
        'params (paper)', 'params (mmsoft)', 'FLOPs (paper)', 'source'
    ]
    rows = []
    for m in models:
        meta, met = m['Metadata'], _metrics(m)
        if m['Config'] != f'configs/{m["Name"]}.py':
            raise ValueError(f'model index: {m["Name"]} has the config '
                             f'{m["Config"]}; the model zoo page assumes '
                             f'configs/{m["Name"]}.py (rename one)')
        rows.append([f'`{m["Name"]}`'] + [met.get(k, '-') for k in keys] + [
            _paper_m(meta.get('Parameters (paper)')),
            _m(meta.get('Parameters (mmsoft)')),
            _g(meta.get('FLOPs (paper)')),
            _source(meta)
        ])
    return md_table(head, rows)


def zoo_summary():
    """One row per collection: its configs' sizes and paper results."""
    groups = {}
    for m in load_models():
        groups.setdefault(m['In Collection'], []).append(m)
    rows = []
    for coll, models in groups.items():
        task = ', '.join(dict.fromkeys(t for m in models for t in _tasks(m)))
        results = []
        for m in models:
            name = m['Name']
            size = re.search(r'_(tiny|small|medium|large|huge)', name)
            label = size.group(1) if size else name
            if name.endswith('_3x_ms'):
                label += ' 3x'
            vals = ' / '.join(str(v) for v in _metrics(m).values()) or '-'
            results.append(f'{label} {vals}')
        metric = ' / '.join(_metrics(models[0]))
        rows.append([coll, task, metric, ', '.join(results)])
    order = ('Image Classification', 'Object Detection',
             'Semantic Segmentation')
    rows.sort(key=lambda r: order.index(r[1].split(', ')[0]))
    return md_table(['collection', 'task', 'metric', 'paper results'], rows)


# ------------------------------------------------------------ benchmarks
def _f1(v):
    return f'{float(v):.1f}' if v not in ('', None) else 'n/a'


def bench_attention():
    """``tools/analysis/benchmark_attention.py``'s table from its CSV."""
    rows = read_csv('benchmark_attention.csv')
    get = {(r['device'], r['n'], r['method'], r['mode']): r for r in rows}
    keys = list(
        dict.fromkeys((r['device'], r['n'], r['method']) for r in rows))
    out = []
    for dev, n, method in keys:
        f = get.get((dev, n, method, 'forward'))
        b = get.get((dev, n, method, 'forward_backward'))
        out.append([
            dev, n, method,
            _f1(f and f['time_ms']),
            _f1(f and f['peak_mb']),
            _f1(b and b['time_ms']),
            _f1(b and b['peak_mb'])
        ])
    return md_table([
        'device', 'n', 'method', 'fwd ms', 'fwd MiB', 'fwd+bwd ms',
        'fwd+bwd MiB'
    ], out)


def _baseline(model):
    """PVTv2 of the same size (``benchmark.py``'s default baselines)."""
    if model.startswith('soft_tiny'):
        return 'pvtv2_b1'
    if model.startswith('soft_small'):
        return 'pvtv2_b2'
    return None


def bench_backbones():
    """``tools/analysis/benchmark.py``'s table from its CSV."""
    rows = read_csv('benchmark_backbones.csv')
    get = {(r['model'], r['size'], r['mode']): r for r in rows}
    out = []
    for r in rows:
        base = _baseline(r['model'])
        rb = get.get((base, r['size'], r['mode']))
        ratio = (f'{float(r["time_ms"]) / float(rb["time_ms"]):.2f}x {base}'
                 if rb else '')
        out.append([
            r['model'], f'{float(r["params_m"]):.1f}M', r['size'], r['mode'],
            f'{float(r["time_ms"]):.1f}', f'{float(r["img_per_s"]):.2f}',
            f'{float(r["peak_mb"]):.0f}', ratio
        ])
    return md_table([
        'model', 'params', 'input', 'mode', 'ms', 'img/s', 'peak MiB',
        'x baseline'
    ], out)


def bench_amp():
    """``tools/analysis/benchmark_amp.py``'s table from its CSV."""
    out = [[
        r['size'], f'{float(r["fp32_ms"]):.1f}', f'{float(r["bf16_ms"]):.1f}',
        f'{float(r["fp32_img_s"]):.2f}', f'{float(r["bf16_img_s"]):.2f}',
        f'{float(r["speedup"]):.2f}x'
    ] for r in read_csv('benchmark_amp.csv')]
    return md_table([
        'input HxWxB', 'fp32 ms', 'bf16 ms', 'fp32 img/s', 'bf16 img/s',
        'bf16 speed-up'
    ], out)


def bench_compile():
    """``tools/analysis/benchmark_compile.py``'s table from its CSV (the
    tool writes the formatted values)."""
    fields = ('size', 'batch', 'mode', 'eager_ms', 'compiled_ms', 'speedup',
              'compile_s')
    return md_table([
        'size', 'batch', 'mode', 'eager ms', 'compiled ms', 'speed-up',
        'compile s'
    ], [[r[f] for f in fields] for r in read_csv('benchmark_compile.csv')])


def onnx_latency():
    """``tools/deployment/benchmark_onnx.py``'s table from its CSV."""
    out = []
    for r in read_csv('benchmark_onnx.csv'):
        t, ort = float(r['torch_ms']), float(r['ort_ms'])
        out.append([
            r['model'], r['input'], f'{t:.1f}',
            f'{float(r["torch_iter_ms"]):.1f}', f'{ort:.1f}',
            f'{t / ort:.2f}x', f'{float(r["err"]):.1e}'
        ])
    return md_table([
        'model', 'input', 'torch ms', 'torch iterative ms', 'onnxruntime ms',
        'torch / ort', 'max rel. err'
    ], out)


def official_comparison():
    """mmsoft vs the official code (a one-off measurement, kept as text)."""
    return md_table(
        ['SOFT-*-Norm, 800 × 1216', 'official', 'mmsoft', 'speed-up'],
        [[r['case'], r['official'], r['mmsoft'], r['speedup']]
         for r in read_csv('official_comparison.csv')])


def _gpu_rows(name):
    """``{(section, model, input, mode): row}`` of a GPU CSV
    (``gpu_h200.csv``: what ``make gpu-check`` measured)."""
    return {
        (r['section'], r['model'], r['input'], r['mode']): r
        for r in read_csv(name)
    }


#: the machines of the README's figures (the conditions: benchmarks.md)
CPU1 = '2-core CPU, 1 thread'
CPU2 = '2-core CPU, 2 threads'
H200 = 'NVIDIA H200'
H100 = 'NVIDIA H100'
#: the GPU figures of the README: (machine, CSV)
GPU_CSVS = ((H200, 'gpu_h200.csv'), (H100, 'gpu_h100.csv'))
#: the SOFT vs softmax section of each GPU CSV
SOFTMAX_SECTIONS = ('softmax', 'SOFT vs softmax')


def detection_cpu_rows():
    """``{(model, size, mode): row}`` of ``detection_resolution_cpu.csv``
    (the models timed in turn in one process: the CPU figures at
    detection resolution since block Lanczos)."""
    return {
        (r['model'], r['size'], r['mode']): r
        for r in read_csv('detection_resolution_cpu.csv')
    }


def why_table():
    """README's "Why SOFT": a few rows picked from the benchmark CSVs, each
    with the machine it was measured on (CPU rows, then the GPU rows of
    the same comparison), and one paragraph on detection resolution."""
    att = {
        (r['n'], r['method'], r['mode']): r
        for r in read_csv('benchmark_attention.csv') if r['device'] == 'cpu'
    }
    bb = {
        (r['model'], r['size'], r['mode']): r
        for r in read_csv('benchmark_backbones.csv')
    }
    det = detection_cpu_rows()
    gpus = [(machine, _gpu_rows(name)) for machine, name in GPU_CSVS]
    off = {r['case']: r for r in read_csv('official_comparison.csv')}

    def layer(method):
        r = att[('3136', method, 'forward_backward')]
        return f'{float(r["time_ms"]):.0f} ms, {float(r["peak_mb"]):.0f} MiB'

    def cpu_ms(model, size, mode):
        """The CPU time: at 800 x 1216 from the alternated run (block
        Lanczos), else from benchmark_backbones.csv."""
        src = det if size.startswith('800x1216') else bb
        return float(src[(model, size, mode)]['time_ms'])

    def g(gpu, sections, model, size, mode):
        return next((gpu[(s, model, size, mode)]
                     for s in sections if (s, model, size, mode) in gpu), None)

    def g_ms(r):
        v = float(r['ms'])
        return f'{v:.1f} ms' if v < 100 else f'{v:.0f} ms'

    def g_mib(r):
        return f'{int(r["peak_mib"]):,} MiB'

    rows = [[
        'one attention layer, n = 3136 tokens, forward + backward', CPU1,
        layer('soft'), f'softmax: {layer("softmax")} (fused SDPA); '
        f'{layer("softmax_naive")} (n × n)'
    ]]
    # SOFT vs softmax in one architecture on each GPU (one call each)
    for machine, gpu in gpus:
        s = g(gpu, SOFTMAX_SECTIONS, 'soft_tiny', '224x224x64',
              'forward_backward')
        p = g(gpu, SOFTMAX_SECTIONS, 'softmax_tiny', '224x224x64',
              'forward_backward')
        if s is None or p is None:
            continue
        rows.append([
            "SOFT vs softmax in SOFT-Tiny's architecture, 224 × 224 × 64, "
            'training step', machine,
            f'{g_ms(s)} ({_x(float(s["ms"]) / float(p["ms"]))}), {g_mib(s)}',
            f'{g_ms(p)}, {g_mib(p)}'
        ])
    other = old = False  # footnotes: a peer of another call; pre-Lanczos
    # (soft, peer, CPU size, GPU size, mode, what): CPU row, then GPU rows
    for soft, peer, size, gsize, mode, what in (
        ('soft_small', 'pvtv2_b2', '224x224x8', '224x224x64', 'forward',
         'SOFT-Small vs PVTv2-b2 backbone, {}, forward'),
        ('soft_small', 'pvtv2_b2', None, '224x224x64', 'forward_backward',
         'SOFT-Small vs PVTv2-b2 backbone, {}, training step'),
        ('soft_tiny', 'pvtv2_b1', '224x224x8', '224x224x64',
         'forward_backward',
         'SOFT-Tiny vs PVTv2-b1 backbone, {}, training step'),
        ('soft_small_norm', 'pvtv2_b2', '800x1216x1', '800x1216x2', 'forward',
         'SOFT-Small-Norm vs PVTv2-b2 backbone, {}, forward'),
        ('soft_small_norm', 'pvtv2_b2', '800x1216x1', '800x1216x2',
         'forward_backward',
         'SOFT-Small-Norm vs PVTv2-b2 backbone, {}, training step')):
        if size:
            a, b = cpu_ms(soft, size, mode), cpu_ms(peer, size, mode)
            rows.append([
                what.format(_dims(size)), CPU2, f'{a:.0f} ms ({_x(a / b)})',
                f'{b:.0f} ms'
            ])
        for machine, gpu in gpus:
            s = g(gpu, ('backbones', ), soft, gsize, mode)
            if s is None:
                continue
            p = g(gpu, ('backbones', ), peer, gsize, mode)
            if p is None and machine != gpus[0][0]:
                continue  # another GPU's row without its peer: no news
            mem = mode == 'forward_backward'
            if p is None:
                mine, peer_cell = g_ms(s), f'{_name(peer)}: not measured'
            else:
                mine = f'{g_ms(s)} ({_x(float(s["ms"]) / float(p["ms"]))})'
                peer_cell = g_ms(p) + (f', {g_mib(p)}' if mem else '')
                if s['note'] != p['note']:  # two calls: two machines
                    peer_cell += ' ¹'
                    other = True
            if gsize.startswith('800x1216'):
                mine += ' ²'
                old = True
            rows.append([
                what.format(_dims(gsize)), machine,
                mine + (f', {g_mib(s)}' if mem else ''), peer_cell
            ])
    for case, label in (('Small, forward',
                         'SOFT-Small-Norm, 800 × 1216, forward, vs the '
                         'official code'),
                        ('Tiny, forward + backward',
                         'SOFT-Tiny-Norm, 800 × 1216, training '
                         'step, vs the official code')):
        r = off[case]
        rows.append([
            label, CPU2, r['mmsoft'], f'{r["official"]} '
            f'({r["speedup"]} slower)'
        ])
    size, cpu, gpu_ = '800x1216', '800x1216x1', '800x1216x2'
    on_cpu = float(det[('soft_small_norm', cpu, 'forward')]['ratio'])
    step_cpu = float(det[('soft_small_norm', cpu,
                          'forward_backward')]['ratio'])
    h200 = dict(gpus)[H200]
    on_gpu = float(
        g(h200,
          ('backbones', ), 'soft_small_norm', gpu_, 'forward')['ms']) / float(
              g(h200, ('backbones', ), 'pvtv2_b2', gpu_, 'forward')['ms'])
    note = ''
    if other:
        note += (
            f'\n¹ measured in another call, on another {H200}: '
            f'compare its time with care (the peak memory was the same to '
            f'the MiB on each GPU tried).\n')
    if old:
        note += (
            '\n² measured in November 2026 with the Newton–Raphson '
            'iterations, before `nr_method=\'auto\'` took block Lanczos on '
            'CUDA; the GPU rerun with it is pending a lent GPU (`make '
            'gpu-check` has the rows).\n')
    # the newest run with memory reused: the first such row of the runs
    runs = read_csv('detection_resolution_cpu_runs.csv')
    label = next(r['note'] for r in runs if r['memory'] == 'reused')
    reused = {(r['model'], r['mode']): float(r['time_ms'])
              for r in runs if (r['memory'], r['note']) == ('reused', label)}

    def reused_x(mode):
        return _x(reused[('soft_small_norm', mode)] /
                  reused[('pvtv2_b2', mode)])

    note += (f'\nAt detection resolution ({_dims(size)}) SOFT-Small-Norm\'s '
             f'backbone forward takes **{_x(on_cpu)}** PVTv2-b2\'s time on '
             f'the 2-core CPU (batch 1, block Lanczos, the default '
             f'`nr_method=\'auto\'`, glibc\'s default allocator; '
             f'{reused_x("forward")} with freed memory reused); a CPU '
             f'training step takes {_x(step_cpu)} '
             f'({reused_x("forward_backward")}). On the {H200} (batch 2) '
             f'it took '
             f'**{_x(on_gpu)}**, measured before that fast path: the 20 '
             f'Newton–Raphson iterations on the m × m matrices (m = 950 '
             f'landmarks in each of the first three stages) dominate there, '
             f'and block Lanczos does 1/115 of their multiply-adds. '
             f'[The pseudo-inverse at detection resolution]'
             f'(docs/en/benchmarks.md#the-pseudo-inverse-at-detection-'
             f'resolution) has the figures.\n')
    return md_table(['measurement', 'machine', 'SOFT (mmsoft)', 'peer'],
                    rows) + note


def _x(ratio):
    """A time ratio: ``1.40x``, ``12.5x``."""
    return f'{ratio:.1f}x' if ratio >= 10 else f'{ratio:.2f}x'


def _dims(size):
    """``'224x224x8'`` -> ``'224 × 224 × 8'``."""
    return ' × '.join(size.split('x'))


def _name(model):
    """``'pvtv2_b2'`` -> ``'PVTv2-b2'``."""
    return {'pvtv2_b1': 'PVTv2-b1', 'pvtv2_b2': 'PVTv2-b2'}.get(model, model)


# ------------------------------------------------------ recipe time
#: training images per epoch: COCO train2017 with annotations (mmdet's
#: ``filter_empty_gt``), ImageNet-1k train
TRAIN_IMAGES = {'COCO': 117266, 'ImageNet-1k': 1281167}
#: the GPU CSV a backbone-alone figure comes from
BACKBONE_GPU = (H200, 'gpu_h200.csv')
NOT_MEASURED = 'not measured yet ¹'


def recipe_iterations(name, meta):
    """(iterations, how) of a model's training schedule (its metafile's
    ``Epochs`` or ``Iterations`` and ``Batch Size``, all GPUs together)."""
    if 'Iterations' in meta:
        n = meta['Iterations']
        return n, f'{n:,}'
    data = 'ImageNet-1k' if name.endswith('_in1k') else 'COCO'
    per_epoch = -(-TRAIN_IMAGES[data] // meta['Batch Size'])
    n = meta['Epochs'] * per_epoch
    return n, f'{n:,} ({meta["Epochs"]} × {per_epoch:,})'


def _backbone_of(name, meta):
    """(backbone, input of a backbone-alone GPU row, images per GPU) or
    None: classifiers at 224 (a row at batch 64, scaled to the batch),
    the 1x detectors at 800 x 1216 (their batch); no row fits the
    multi-scale 3x detectors or the 512 x 512 segmentors."""
    size = re.search(r'_(tiny|small|medium|large|huge)', name).group(1)
    per_gpu = meta['Batch Size'] // 8
    if name.endswith('_in1k'):
        norm = '_norm' if name.startswith('soft_norm_') else ''
        return f'soft_{size}{norm}', '224x224x64', per_gpu
    if name.endswith('_1x'):
        return f'soft_{size}_norm', f'800x1216x{per_gpu}', per_gpu
    return None


def _hours(seconds):
    return f'{seconds / 3600:.1f} h'


def recipe_times(measured_rows=None):
    """Per paper config: the estimated time on 8 GPUs and the memory per
    GPU from a measured s/iter of the recipe (``recipe_gpu.csv``: config,
    gpu, s_per_iter, peak_mib; ``measured_rows``: such rows instead, e.g.
    a ``gpu_check.py`` run's), and its schedule; where none was
    measured, says so, with the backbone alone where a GPU CSV has its
    row (a lower bound: the neck, heads, data and optimizer add to it)."""
    if measured_rows is None:
        measured_rows = read_csv('recipe_gpu.csv')
    measured = {r['config']: r for r in measured_rows}
    machine, name = BACKBONE_GPU
    gpu = _gpu_rows(name)
    order = ('Image Classification', 'Object Detection',
             'Semantic Segmentation')
    models = sorted(
        _with_tasks(load_models()), key=lambda mt: order.index(mt[1][0]))
    rows, bound, estimated = [], False, False
    for m, _ in models:
        meta = m['Metadata']
        iters, how = recipe_iterations(m['Name'], meta)
        r = measured.get(m['Name'])
        if r:
            estimated = True
            s = float(r['s_per_iter'])
            time = (f'estimated {_hours(iters * s)} ({iters:,} iters × '
                    f'{s:.3f} s/iter, {r["gpu"]}) ³')
            mem = f'{int(r["peak_mib"]):,} MiB ({r["gpu"]})'
        else:
            time = mem = NOT_MEASURED
            bb = _backbone_of(m['Name'], meta)
            row = bb and gpu.get(
                ('backbones', bb[0], bb[1], 'forward_backward'))
            if row:
                bound = True
                b = int(bb[1].split('x')[2])
                s = float(row['ms']) / 1e3 * bb[2] / b
                time += (f'; ≥ {_hours(iters * s)} ² (backbone alone: '
                         f'{iters:,} × {s:.3f} s)')
                mem += (f'; ≥ {int(row["peak_mib"]) / 1024:.1f} GiB ² '
                        f'(backbone alone, {b} images)')
        rows.append([
            f'`{m["Name"]}`', time, mem,
            f'{how}, 8 × {meta["Batch Size"] // 8}'
        ])
    table = md_table([
        'config', 'time on 8 GPUs', 'memory per GPU',
        'iterations (epochs × per epoch), GPUs × images'
    ], rows)
    table += (
        '\n¹ No training iteration of this recipe has been timed on a GPU '
        'yet (it needs a lent GPU): `python tools/analysis/gpu_check.py '
        '--sections recipe --recipe-csv docs/en/benchmarks/recipe_gpu.csv` '
        '(part of `make gpu-check`: RetinaNet, Mask R-CNN, UperNet and the '
        'classifiers; other recipes with `--configs`) writes its row there '
        '(config, GPU, s/iter, peak MiB), which becomes "estimated: '
        'iterations × s/iter" here.\n')
    if estimated:
        table += (
            '\n³ Estimated: the schedule\'s iterations × the seconds of one '
            'iteration of one GPU\'s batch (forward, backward, the config\'s '
            'optimizer step; random data, so no data loading, and one GPU, '
            'so no gradient all-reduce), measured by '
            '`tools/analysis/gpu_check.py` on the GPU named; its memory is '
            'that iteration\'s peak allocated memory.\n')
    if bound:
        table += (
            f'\n² The backbone\'s forward + backward alone, measured on '
            f'one {machine} (`docs/en/benchmarks/{name}`, fp32, November '
            f'2026), × the iterations: a lower bound, as the neck, heads, '
            f'optimizer step and data loading add to it. Classifiers: the '
            f'time of a batch of 64 at 224 × 224, scaled to 128 images per '
            f'GPU. Detectors: SOFT-Small-Norm at 800 × 1216 × 2 (the 1x '
            f'recipes resize to at most 1333 × 800), timed with the '
            f'Newton–Raphson iterations before `nr_method=\'auto\'` took '
            f'block Lanczos on CUDA (the rerun is pending a lent GPU).\n')
    return table


def requirement_ranges():
    """dist -> (lowest tested, first untested): the ``>=lo,<hi`` lines of
    ``requirements/{runtime,det,seg,cls}.txt`` (what pip checks)."""
    out = {}
    for name in ('runtime', 'det', 'seg', 'cls'):
        with open(osp.join(ROOT, 'requirements', f'{name}.txt')) as f:
            for ln in f:
                m = re.fullmatch(r'([\w.-]+)>=([\d.]+),<([\d.]+)',
                                 ln.split('#')[0].strip())
                if m:
                    out[m.group(1)] = (m.group(2), m.group(3))
    return out


def verified_versions():
    """dist -> the version ``requirements/constraints.txt`` pins (the stack
    tools/setup_env.sh installs and CI runs)."""
    with open(osp.join(ROOT, 'requirements', 'constraints.txt')) as f:
        pins = (ln.split('#')[0].strip().split('==') for ln in f)
        return {p[0]: p[1] for p in pins if len(p) == 2}


def tested_versions():
    """The tested range of ``requirements/*.txt`` and the verified version
    of ``requirements/constraints.txt``."""
    verified = verified_versions()
    rows = [[f'`{dist}`', f'>= {lo}, < {hi}',
             verified.get(dist, '')]
            for dist, (lo, hi) in requirement_ranges().items()]
    return md_table([
        'package', 'tested range (`pip check` names a version outside it)',
        'verified (CI)'
    ], rows)


def literal(rel, name):
    """The literal value a Python file assigns to ``name`` (read, not
    imported: the docs need no torch)."""
    with open(osp.join(ROOT, rel)) as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [getattr(node, 'target', None)]
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise KeyError(f'{rel} assigns no literal {name}')


OFFICIAL = 'mmsoft/models/arch_zoo.py'


def official_files():
    """The authors' ImageNet files: README model and parameters, download,
    the mmsoft arch they load into, the paper configs that expect them."""
    page = literal(OFFICIAL, 'OFFICIAL_PAGE')
    rows = []
    for name, e in literal(OFFICIAL, 'OFFICIAL_FILES').items():
        model = 'SOFT-' + '-'.join(w.capitalize()
                                   for w in reversed(name.split('_')[1:]))
        arch = f"`{e['arch']}` {e['depths']}, {e['params']}M"
        if e.get('code_arch'):
            other, depths, params = e['code_arch']
            arch += f"; their code builds `{other}` {depths}, {params}M"
        links = [e['link']] + e.get('more_links', []) if e['link'] else []
        rows.append([
            f'`{name}`', arch, ', '.join(f'[{link}]({page})' for link in links)
            or 'not published',
            _folded([f'`{c}`' for c in e['configs']],
                    'configs'), f"{model}, {e['readme']}"
        ])
    return md_table([
        "authors' file", 'mmsoft `arch` (depths, params)', 'download',
        'paper configs', 'their README'
    ], rows)


def _folded(items, what, keep=2):
    """A table cell's list: up to ``keep`` items as they are, more folded
    into a ``<details>`` whose summary counts them (a wide table stays
    readable at 1280 px)."""
    if len(items) <= keep:
        return ', '.join(items)
    return (f'<details><summary>{len(items)} {what}</summary>'
            f'{", ".join(items)}</details>')


SOURCES = {
    'zoo_Image Classification': lambda: zoo_table('Image Classification'),
    'zoo_Object Detection': lambda: zoo_table('Object Detection'),
    'zoo_Semantic Segmentation': lambda: zoo_table('Semantic Segmentation'),
    'zoo_summary': zoo_summary,
    'bench_attention': bench_attention,
    'bench_backbones': bench_backbones,
    'bench_amp': bench_amp,
    'bench_compile': bench_compile,
    'onnx_latency': onnx_latency,
    'tested_versions': tested_versions,
    'official_comparison': official_comparison,
    'why': why_table,
    'official_files': official_files,
    'recipe_times': recipe_times,
}

#: the file each table is generated from (named under the table)
ORIGIN = {
    'bench_attention':
    '`docs/en/benchmarks/benchmark_attention.csv`',
    'bench_backbones':
    '`docs/en/benchmarks/benchmark_backbones.csv`',
    'bench_amp':
    '`docs/en/benchmarks/benchmark_amp.csv`',
    'bench_compile':
    '`docs/en/benchmarks/benchmark_compile.csv`',
    'onnx_latency':
    '`docs/en/benchmarks/benchmark_onnx.csv`',
    'tested_versions':
    '`requirements/*.txt`, `requirements/constraints.txt`',
    'official_comparison':
    '`docs/en/benchmarks/official_comparison.csv`',
    'why':
    'the CSV files of `docs/en/benchmarks/`',
    'official_files':
    f'`OFFICIAL_FILES` in `{OFFICIAL}`',
    'recipe_times':
    '`model-index.yml` (the schedules), '
    '`docs/en/benchmarks/recipe_gpu.csv` and `gpu_h200.csv`',
}


def render(text):
    """``text`` with every generated block rendered from its source."""

    def sub(m):
        name = m.group('name')
        if name not in SOURCES:
            raise KeyError(f'unknown generated table {name!r} '
                           f'(known: {", ".join(SOURCES)})')
        origin = ORIGIN.get(name, '`model-index.yml`')
        note = f'\n*Generated from {origin}.*\n'
        return m.group(1) + SOURCES[name]() + note + m.group(4)

    return BLOCK.sub(sub, text)


def blocks(text):
    """``{name: body}`` of the generated blocks of ``text``."""
    return {m.group('name'): m.group('body') for m in BLOCK.finditer(text)}


def stale_pages():
    """The pages whose generated tables differ from their sources."""
    stale = []
    for rel in PAGES:
        with open(osp.join(ROOT, rel)) as f:
            text = f.read()
        if render(text) != text:
            stale.append(rel)
    return stale


def docs_env_missing():
    """The requirement files of the docs build whose pins are not all
    installed: ``requirements/docs.txt`` (Sphinx, the theme) and
    ``requirements/docs_api.txt`` (what autodoc imports: torch, mmengine;
    a local version such as ``+cpu`` or ``+cu130`` is ignored)."""
    from importlib.metadata import PackageNotFoundError, version
    missing = []
    for name in ('docs.txt', 'docs_api.txt'):
        with open(osp.join(ROOT, 'requirements', name)) as f:
            pins = [ln.split('#')[0].strip() for ln in f]
        try:
            ok = all(
                version(p.split('==')[0]).split('+')[0] == p.split('==')[1]
                for p in pins if '==' in p and not p.startswith('-'))
        except PackageNotFoundError:
            ok = False
        if not ok:
            missing.append(f'requirements/{name}')
    return missing


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    p.add_argument(
        '--check',
        action='store_true',
        help='only list the pages that differ from their sources (exit 1)')
    p.add_argument(
        '--docs-env',
        action='store_true',
        help='print the docs requirement files not installed (exit 1), '
        'or nothing (exit 0)')
    args = p.parse_args(argv)
    if args.docs_env:
        missing = docs_env_missing()
        print(' '.join(missing))
        return 1 if missing else 0
    stale = stale_pages()
    if args.check:
        for rel in stale:
            print(f'{rel}: generated tables differ from their sources; '
                  'run python docs/gen_tables.py')
        return 1 if stale else 0
    for rel in stale:
        path = osp.join(ROOT, rel)
        with open(path) as f:
            text = render(f.read())
        with open(path, 'w') as f:
            f.write(text)
        print(f'updated {rel}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
