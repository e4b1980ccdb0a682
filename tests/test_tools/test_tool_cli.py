"""Every tool script answers ``--help`` (all in one child process, from a
copy of ``tools/`` outside the checkout, as ``mmsoft/.mim/tools`` ships
them) and has a real invocation: :data:`INVOCATIONS` names its test."""
import ast
import csv
import glob
import json
import os
import os.path as osp
import re
import shutil
import sys
from types import SimpleNamespace

import pytest
from conftest import ROOT, TOOLS, load_tool, run

#: tool script (relative to tools/) -> the test that runs it for real
_CLI, _TA = 'test_tools/test_tool_cli.py::', 'test_tools/test_analysis/test_'
_TT = 'test_tools/test_'
_CH, _CE = _TT + 'chain.py::', _TT + 'check_env.py::'
INVOCATIONS = {
    'train.py': _CH + 'test_train_writes_a_full_training_checkpoint',
    'test.py': _CH + 'test_test_tool_on_trained_checkpoint',
    'demo.py': 'test_configs/test_demo_configs.py::test_demo_smoke',
    'analysis/benchmark.py': _TA + 'benchmark.py::test_tiny_run_writes_ratios',
    'analysis/benchmark_amp.py': _CLI + 'test_benchmark_amp_smoke_table',
    'analysis/benchmark_attention.py':
    _CLI + 'test_benchmark_attention_tiny_run',
    'analysis/benchmark_compile.py': _CLI + 'test_benchmark_compile_smoke',
    'analysis/get_flops.py': _TA + 'analysis_tools.py::'
    'test_get_flops_counts_attention_products_and_nr',
    'analysis/draw_architecture.py':
    _TA + 'figures.py::test_architecture_figure',
    'analysis/gpu_check.py': _CLI + 'test_gpu_check_smoke',
    'analysis/memory_vs_length.py':
    _TA + 'analysis_tools.py::test_memory_vs_length_fixed_m_and_outputs',
    'analysis/nr_accuracy.py': _TA + 'benchmark.py::test_nr_accuracy_tool',
    'analysis/nr_backward_compare.py':
    _CLI + 'test_nr_backward_compare_train_demo',
    'analysis/nr_convergence.py':
    _TA + 'analysis_tools.py::test_nr_convergence_on_an_image_folder',
    'analysis/nr_method_crossover.py':
    _TA + 'benchmark.py::test_nr_method_crossover_tool',
    'analysis/spectral_norm.py': _TA + 'analysis_tools.py::'
    'test_spectral_norm_field_normalisation_lowers_the_norm',
    'analysis/visualize_attention.py':
    _TA + 'analysis_tools.py::test_visualize_attention_rows',
    'deployment/pytorch2onnx.py': _CH + 'test_onnx_export_verify',
    'deployment/benchmark_onnx.py': _CLI + 'test_benchmark_onnx_tiny_run',
    'misc/configs.py':
    'test_packaging.py::test_paths_in_checkout_and_the_configs_cli',
    'misc/make_demo_data.py': 'test_demo/test_synthetic.py::test_tool_cli',
    'model_converters/soft2mmsoft.py':
    _TT + 'model_converters.py::test_cli_round_trip',
    'model_converters/mmsoft2soft.py':
    _TT + 'model_converters.py::test_cli_round_trip',
    'compat/matrix.py': 'test_compat_matrix.py::test_table_writer',
    'compat/check_env.py': _CE + 'test_the_verified_stack_is_one_line',
}
#: helpers of the scripts, not tools (files, or folders ending in /);
#: mutation/: ``make mutations``' developer runner
HELPERS = ('compat/stacks.py', 'mmsoft_tools/', 'mutation/',
           'demo_synthetic.py', 'demo_tasks.py', 'analysis/__init__.py',
           'analysis/common.py', 'deployment/__init__.py',
           'deployment/deploy.py', 'model_converters/__init__.py',
           'model_converters/checkpoint_files.py')

# run each path given as if `python PATH --help`; print {path: [rc, text]}
HELP_CHILD = '''
import contextlib, io, json, os.path as osp, runpy, sys, warnings
warnings.simplefilter('ignore')
paths, base, res = sys.argv[1:], list(sys.path[1:]), {}
for path in paths:
    sys.argv = [path, '--help']
    sys.path[:] = [osp.dirname(path)] + base
    out, rc = io.StringIO(), 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            runpy.run_path(path, run_name='__main__')
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else int(e.code is not None)
    except BaseException as e:  # noqa
        rc = repr(e)
    res[path] = [rc, out.getvalue()]
print('HELP ' + json.dumps(res))
'''


def tool_scripts():
    found = glob.glob(osp.join(TOOLS, '**', '*.py'), recursive=True)
    return sorted(p for p in (osp.relpath(f, TOOLS) for f in found)
                  if not p.startswith(HELPERS))  # yapf: disable


def test_every_tool_has_an_invocation_test():
    assert tool_scripts() == sorted(INVOCATIONS), (
        'a tool without an entry in INVOCATIONS (or a stale entry)')
    for script, node in INVOCATIONS.items():
        path, name = node.split('::')
        with open(osp.join(ROOT, 'tests', path)) as f:
            text = f.read()
        defs = {n.name for n in ast.walk(ast.parse(text))
                if isinstance(n, ast.FunctionDef)}  # yapf: disable
        assert name in defs, node
        assert osp.basename(script)[:-3] in text, f'{node} runs no {script}'


#: the one ``sys.path`` edit a tool may make: a script in a sub-folder of
#: tools/ puts tools/ first, for the tools' own packages and modules
BOOTSTRAP = (
    'if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:'
    '  # tools/\n'
    '    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))'
    '\n')


def test_tools_edit_sys_path_only_for_their_package():
    """Only a sub-folder's script that uses tools/ modules adds tools/."""
    for path in glob.glob(osp.join(TOOLS, '**', '*.py'), recursive=True):
        script = osp.relpath(path, TOOLS)
        with open(path) as f:
            code = f.read()
        uses = re.search(
            r'^ *(from|import) (mmsoft_tools|analysis|deployment|'
            r'model_converters|demo_synthetic|demo_tasks)\b', code, re.M)
        if uses and osp.dirname(script) and not script.startswith(HELPERS):
            assert code.count(BOOTSTRAP) == 1, script
        rest = code.replace(BOOTSTRAP, '')
        assert 'sys.path.insert' not in rest and 'sys.path[' not in rest, \
            script


@pytest.fixture(scope='module')
def helps(tmp_path_factory, script_server):
    """{script: (exit code, output)} of ``--help``."""
    tmp = tmp_path_factory.mktemp('installed')
    copy = tmp / 'tools'
    shutil.copytree(
        TOOLS, copy, ignore=shutil.ignore_patterns('__pycache__', 'figures'))
    (tmp / 'help_child.py').write_text(HELP_CHILD)
    proc = script_server(tmp / 'help_child.py',
                         [copy / s for s in tool_scripts()], tmp)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('HELP ')]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    return {osp.relpath(k, str(copy)): v
            for k, v in json.loads(line[-1][5:]).items()}  # yapf: disable


@pytest.mark.parametrize('script', sorted(INVOCATIONS))
def test_help(helps, script):
    rc, text = helps[script]
    assert rc == 0, text[-2000:]
    assert text.startswith(f'usage: {osp.basename(script)} '), text[:300]
    assert 'show this help message and exit' in text


def test_python_sh_runs_a_tool_with_this_checkout(tmp_path):
    """``bash tools/python.sh``: the checkout's mmsoft, no PYTHONPATH."""
    code = "import importlib.util as u; print(u.find_spec('mmsoft').origin)"
    sh = ['bash', osp.join(TOOLS, 'python.sh')]
    proc = run(sh + ['-c', code], tmp_path, 120, PYTHONPATH=None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == osp.join(ROOT, 'mmsoft', '__init__.py')
    proc = run(sh, PYTHONPATH=None)
    assert proc.returncode == 2 and 'usage: bash' in proc.stderr


def _isolated_runs_in(script_server, monkeypatch):
    """``run_isolated``'s ``python script`` children: in the script server."""
    from analysis import common as analysis

    def run(cmd, env, **kwargs):
        assert cmd[0] == sys.executable, cmd
        return script_server(cmd[1], cmd[2:], cwd=os.getcwd(), env=env)

    monkeypatch.setattr(analysis, 'subprocess', SimpleNamespace(run=run))


def _csv(path):
    """(rows, field names) of a CSV file."""
    with open(path, newline='') as f:
        reader = csv.DictReader(f)
        return list(reader), reader.fieldnames


def _md_rows(text):
    """The cells of the markdown table's rows (no ``|---|`` line)."""
    return [[c.strip() for c in ln.strip().strip('|').split('|')]
            for ln in text.splitlines()
            if ln.startswith('|') and not ln.startswith('|---')]


@pytest.fixture
def replaced(monkeypatch):
    """The paths ``mmsoft.utils.atomic`` renames a temp file to, in order."""
    from mmsoft.utils import atomic
    done, replace = [], atomic.os.replace

    def spy(src, dst, *a, **k):
        replace(src, dst, *a, **k)
        done.append(osp.abspath(str(dst)))

    monkeypatch.setattr(atomic.os, 'replace', spy)
    return done


def test_benchmark_attention_tiny_run(tmp_path, capsys, replaced,
                                      script_server, monkeypatch):
    """One CSV row per (method, mode), the markdown rows its values."""
    _isolated_runs_in(script_server, monkeypatch)
    tool = load_tool('analysis/benchmark_attention.py')
    rows = tool.main('--max-p 1 --methods soft --repeats 1 --devices cpu '
                     '--threads 1 --out'.split() + [str(tmp_path)])
    configs = [('soft', 'forward'), ('soft', 'forward_backward')]
    assert [(r['method'], r['mode']) for r in rows] == configs
    written, fields = _csv(tmp_path / 'results.csv')
    assert fields == 'device n method mode time_ms min_ms peak_mb'.split()
    assert [(r['device'], r['n'], r['method'], r['mode']) for r in written
            ] == [('cpu', '784', m, mode) for m, mode in configs]
    for r, ret in zip(written, rows):
        t, t_min, mb = (float(r[k]) for k in ('time_ms', 'min_ms', 'peak_mb'))
        assert 0 < t_min <= t and mb >= 0, r  # median of runs >= fastest
        assert (t, t_min, mb) == (ret['time_ms'], ret['min_ms'],
                                  ret['peak_mb'])
    md = (tmp_path / 'results.md').read_text()
    # one row per method: its forward, then forward_backward ms and MiB
    assert _md_rows(md) == [
        'device | n | method | fwd ms | fwd MiB | fwd+bwd ms | fwd+bwd '
        'MiB'.split(' | '), ['cpu', '784', 'soft'] + [
            f"{float(r[k]):.1f}" for r in written
            for k in ('time_ms', 'peak_mb')
        ]
    ]
    assert md in capsys.readouterr().out  # printed as written
    png = tmp_path / 'memory_time_vs_tokens.png'
    assert png.read_bytes()[:4] == b'\x89PNG'
    assert sorted(replaced) == sorted(
        str(tmp_path / n) for n in ('results.csv', 'results.md', png.name))
    assert sorted(os.listdir(tmp_path)) == sorted(
        ['results.csv', 'results.md', png.name])  # no temp file left


def test_benchmark_amp_smoke_table(tmp_path, capsys):
    import torch
    tool = load_tool('analysis/benchmark_amp.py')
    threads = torch.get_num_threads()
    try:
        rows = tool.main(['--smoke', '--threads', '1', '--out', str(tmp_path)])
    finally:
        torch.set_num_threads(threads)
    (row, ) = rows
    assert row['size'] == '64x64x2' and row['model'] == 'soft_tiny_norm'
    assert row['fp32_ms'] > 0 and row['bf16_ms'] > 0
    assert row['speedup'] == pytest.approx(row['fp32_ms'] / row['bf16_ms'])
    # the same weights and input: the bf16 loss is the float32 one, rounded
    assert row['bf16_loss'] == pytest.approx(row['fp32_loss'], rel=5e-2)
    (written, ), _ = _csv(tmp_path / 'results_amp.csv')
    assert float(written['speedup']) == pytest.approx(row['speedup'])
    md = (tmp_path / 'results_amp.md').read_text()
    assert '| input HxWxB | fp32 ms | bf16 ms |' in md
    assert f'| 64x64x2 | {row["fp32_ms"]:.1f} | {row["bf16_ms"]:.1f} |' in md
    assert f' | {row["speedup"]:.2f}x |' in md
    assert md in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tool.main(['--sizes', '224x224', '--out', str(tmp_path)])
    assert 'is not HxWxB' in capsys.readouterr().err


def test_benchmark_onnx_tiny_run(tmp_path, capsys, replaced):
    pytest.importorskip('onnxruntime')
    tool = load_tool('deployment/benchmark_onnx.py')
    md, hw = tmp_path / 'table.md', '64x96'  # H != W
    assert tool.main([f'demo/soft_cls_demo.py:{hw}'] +
                     '--repeats 1 --warmup 0 --onnx-dir'.split() +
                     [str(tmp_path), '--out', str(md)]) == 0
    onnx = str(tmp_path / f'soft_cls_demo_{hw}.onnx')
    assert osp.getsize(onnx) > 0
    text = md.read_text()
    assert replaced == [onnx, str(md)]
    assert text in capsys.readouterr().out
    table = _md_rows(text)
    assert ' | '.join(table[0]) == (
        'model | input | torch ms | torch iterative ms | onnxruntime ms | '
        'torch / ort | max rel. err')
    assert [r[:2] for r in table[1:]] == [['soft_cls_demo', hw]]
    for cells in table[1:]:
        assert len(cells) == 7
        torch_ms, iter_ms, ort_ms = (float(c) for c in cells[2:5])
        assert min(torch_ms, iter_ms, ort_ms) > 0, cells
        assert cells[5].endswith('x')
        ratio = float(cells[5][:-1])
        # the ratio of the unrounded times, the cells rounded to 0.1 ms
        lo = (torch_ms - .05) / (ort_ms + .05)
        hi = (torch_ms + .05) / max(ort_ms - .05, 1e-9)
        assert lo - .005 <= ratio <= hi + .005, cells
        assert float(cells[6]) < 1e-4  # max rel. err, onnxruntime vs torch


def test_nr_backward_compare_train_demo(tmp_path, capsys, monkeypatch):
    """Two runs (3 iterations) of the det demo, its real run_task first."""
    import demo_tasks as tasks
    calls, real_run_task = [], tasks.run_task

    def run_task(task, data_root, work_dir, cfg, seed, cfg_options):
        k = len(calls)
        calls.append((task, data_root, work_dir, cfg.train_cfg.max_iters, seed,
                      cfg_options))
        if k == 0:
            res = real_run_task(task, data_root, work_dir, cfg=cfg, seed=seed,
                                cfg_options=cfg_options)  # yapf: disable
            m = res['metrics']
            assert 0 <= m['coco/bbox_mAP'] <= m['coco/bbox_mAP_50'] <= 1, m
            assert osp.isfile(res['png']) and res['train_s'] > 0
        metrics = {'coco/bbox_mAP': .125 + k / 8, 'coco/bbox_mAP_50': .5}
        return dict(metrics=metrics, train_s=3.0 + k)

    monkeypatch.setattr(tasks, 'run_task', run_task)
    tool = load_tool('analysis/nr_backward_compare.py')
    monkeypatch.setattr(tool, 'SMOKE_DATA', dict(num_train=1, num_val=1))
    work, data = tmp_path / 'work', tmp_path / 'demo-smoke' / 'coco'
    rows = tool.main('--sizes --train-demo --smoke --data'.split() +
                     [str(tmp_path / 'demo'), '--work-dir',
                      str(work)])
    hook = [dict(type='NRResidualHook', interval=100)]
    assert calls == [('det', str(data), str(work / b), 3, 0, {
        'model.backbone.attn_cfg.nr_backward': b, 'custom_hooks': hook})
        for b in ('eq16', 'exact')]  # yapf: disable
    assert rows == [('eq16', .125, .5, 3.0), ('exact', .25, .5, 4.0)]
    out = capsys.readouterr().out
    assert '| eq16 | 0.125 | 0.500 | 3 |\n| exact | 0.250 | 0.500 | 4 |' in out


def test_benchmark_compile_smoke(tmp_path, capsys, monkeypatch):
    """torch.compile stubbed (compiled: test_models/test_compile.py)."""
    import torch
    compiled = []
    monkeypatch.setattr(torch, 'compile',
                        lambda m, backend: compiled.append(backend) or m)
    tool = load_tool('analysis/benchmark_compile.py')
    rows = tool.main(['--smoke', '--backend', 'aot_eager', '--out-dir',
                      str(tmp_path)])  # yapf: disable
    assert compiled == ['aot_eager'] * 2
    assert [(r['size'], r['batch'], r['mode'])
            for r in rows] == [('64x64', 2, 'forward'), ('64x64', 2, 'train')]
    assert all(r['eager_ms'] > 0 and r['compiled_ms'] > 0 for r in rows)
    assert all(r['speedup'] == round(r['eager_ms'] / r['compiled_ms'], 3)
               for r in rows)
    out = capsys.readouterr().out
    assert ('| size | batch | mode | eager ms | compiled ms | speed-up | '
            'compile s |') in out
    assert '| 64x64 | 2 | train |' in out
    written, _ = _csv(tmp_path / 'benchmark_compile.csv')
    assert [w['mode'] for w in written] == ['forward', 'train']
    assert (tmp_path /
            'benchmark_compile.md').read_text().count('| 64x64 | 2 |') == 2


def test_gpu_check_smoke(tmp_path, capsys):
    tool = load_tool('analysis/gpu_check.py')
    assert tool.main(['--smoke', '--out-dir', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert 'CUDA part NOT run: ' in out
    md = (tmp_path / 'gpu_check.md').read_text()
    for section in tool.SECTIONS:
        assert f'## {section}\n' in md, section
    assert '| soft_norm_tiny_in1k fp32 | loss |' in md
    assert '| soft_norm_tiny_in1k bf16 | loss |' in md
    assert '| 64x64x1 inference | SOFT / softmax |' in md
    assert 'FAIL' not in md and '**all checks passed**' in md
    rows, _ = _csv(tmp_path / 'gpu_check.csv')
    nr = [r for r in rows if r['section'] == 'NR methods' and r['metric']
          .endswith('vs iterative: max rel diff (out / grad)')
          ]  # yapf: disable
    # spectral and lanczos at two sizes, values and exact gradients
    assert len(nr) == 4 and all(r['ok'] == 'True' for r in nr)
    assert all(float(v) < 1e-4 for r in nr for v in r['value'].split(' / '))
    timed = [r for r in rows if r['metric'].endswith('ms (fwd / train)')]
    assert {r['metric'].split()[0] for r in timed} == set(tool.NR_METHODS)
    ratio = [r for r in rows if r['metric'] == 'SOFT / softmax']
    assert len(ratio) == 1 and float(ratio[0]['value']) > 0


#: one recipe of each family the GPU run times
RECIPES = [
    'retinanet_soft_tiny_1x', 'mask_rcnn_soft_tiny_1x',
    'upernet_soft_small_512x512_160k_ade20k', 'soft_tiny_in1k'
]


def test_gpu_check_dry_run_fills_the_model_zoo(tmp_path, capsys, monkeypatch):
    """recipe_gpu.csv's CPU rows, no ImageNet file needed; --sections."""
    monkeypatch.chdir(tmp_path)  # no checkpoints/ here
    tool = load_tool('analysis/gpu_check.py')
    names = RECIPES
    assert tool.main(['--dry-run', '--sections', 'recipe', '--configs'] +
                     names + ['--out-dir', str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f'wrote {tmp_path}/recipe_gpu.csv' in out
    rows, fields = _csv(tmp_path / 'recipe_gpu.csv')
    docs = osp.join(ROOT, 'docs', 'en', 'benchmarks', 'recipe_gpu.csv')
    assert fields == _csv(docs)[1]  # the docs' columns
    assert [r['config'] for r in rows] == names
    for r in rows:
        assert r['gpu'] == tool.DRY_RUN_GPU
        assert float(r['s_per_iter']) > 0 and int(r['peak_mib']) > 0
        assert re.fullmatch(r'\d{4}-\d\d-\d\d', r['date'])
        assert '2 x 64x64 per GPU' in r['note']
    md = (tmp_path / 'gpu_check.md').read_text()
    assert '| retinanet_soft_tiny_1x | s/iter |' in md and 'FAIL' not in md
    assert md.count('not run: not selected (--sections)') == 4
    assert 'torch ' in md and 'mmcv ops: CPU only' in md
    assert 'PARTIAL' not in md and 'does not exist' not in md
    assert {r['section']
            for r in _csv(tmp_path / 'gpu_check.csv')[0]
            } == {'recipe iterations'}


def test_gpu_check_recipe_rows(tmp_path, capsys, monkeypatch):
    """Merged into the CSV by (config, GPU); the recipe families."""
    tool = load_tool('analysis/gpu_check.py')
    path = tmp_path / 'recipe_gpu.csv'

    def row(config, gpu, s):
        return dict(config=config, gpu=gpu, s_per_iter=s, peak_mib='100',
                    date='2026-12-07', note='')  # yapf: disable

    for rows in ((('a', 'H100', '0.5'), ('b', 'H100', '0.6')),
                 (('a', 'H100', '0.4'), ('a', 'H200', '0.3'))):
        tool.merge_recipe_rows(str(path), [row(*r) for r in rows])
    assert [(r['config'], r['gpu'], r['s_per_iter'])
            for r in _csv(path)[0]] == [('b', 'H100', '0.6'),
                                        ('a', 'H100', '0.4'),
                                        ('a', 'H200', '0.3')]
    other = tmp_path / 'other.csv'
    other.write_text('model,ms\nx,1\n')
    with pytest.raises(SystemExit) as e:
        tool.merge_recipe_rows(str(other), [row('a', 'H100', '0.4')])
    assert re.fullmatch('[^\n]*has the columns[^\n]*--recipe-csv[^\n]*',
                        str(e.value)), e.value
    assert other.read_text() == 'model,ms\nx,1\n'
    # --dry-run never writes the docs' CSV
    with pytest.raises(SystemExit) as e:
        tool.parse_args(['--dry-run', '--recipe-csv', str(tmp_path / 'x')])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.endswith("--dry-run writes <out-dir>/recipe_gpu.csv only: "
                        "its CPU rows are no GPU's estimates; leave "
                        '--recipe-csv out')
    args = tool.parse_args(['--out-dir', str(tmp_path)])
    assert args.recipe_csv == osp.join(str(tmp_path), 'recipe_gpu.csv')
    # the recipe families of the shipped configs
    got = set(tool.recipe_configs(tool.shipped_configs()))
    assert set(RECIPES) <= got and all(n.endswith('_in1k') or n.startswith(
        ('retinanet_', 'mask_rcnn_', 'upernet_')) for n in got
    )  # yapf: disable
    assert not any(n.startswith(('atss_', 'gfl_', 'cascade_', 'sparse_'))
                   for n in got)  # yapf: disable
    # out of memory: a passing row, nothing in the CSV; else a failure
    import torch

    def iteration(path, name, *args):
        if name == 'big':
            raise torch.cuda.OutOfMemoryError('CUDA out of memory')
        raise RuntimeError('broken\nsecond line')

    monkeypatch.setattr(tool, 'recipe_iteration', iteration)
    monkeypatch.setattr(torch.cuda, 'get_device_properties',
                        lambda i: SimpleNamespace(total_memory=80 * 2**30))
    report = tool.Report()
    csv_path = tmp_path / 'new' / 'recipe_gpu.csv'
    tool.run_recipes(report, dict(big='big.py', bad='bad.py'), 'cpu',
                     'NVIDIA H100', 5, str(csv_path))
    big, bad = report.rows
    assert (big['value'], big['ok']) == ('out of memory', True)
    assert 'does not fit NVIDIA H100 (80 GiB)' in big['note']
    assert (bad['value'], bad['ok'], bad['note']) == \
        ('error', False, 'RuntimeError: broken')  # yapf: disable
    assert not csv_path.exists()
