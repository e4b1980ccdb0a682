"""Every tool script answers ``--help`` and runs one real invocation.

``--help``: all scripts in one child process (each run as Python runs a
script: ``__main__``, its folder first on ``sys.path``) from a copy of
``tools/`` outside the checkout, as an install ships them in
``mmsoft/.mim/tools`` (what ``mim run`` starts): the scripts find mmsoft as
an installed package (here: the checkout on ``PYTHONPATH``), never through
the folders around them.

Real invocations: :data:`INVOCATIONS` names the test that runs each tool
with its documented options on a tiny case (most live beside the code
they exercise); the tools that had none are run here.
"""
import ast
import csv
import glob
import json
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT, TOOLS, child_env, load_tool

#: tool script (relative to tools/) -> the test that runs it for real
INVOCATIONS = {
    'train.py':
    'test_tools/test_train_test.py::test_det_train_and_test_tools',
    'test.py':
    'test_tools/test_train_test.py::test_det_train_and_test_tools',
    'demo.py':
    'test_configs/test_demo_configs.py::test_demo_smoke',
    'analysis/benchmark.py':
    'test_tools/test_analysis/test_benchmark.py::test_tiny_run_writes_ratios',
    'analysis/benchmark_attention.py':
    'test_tools/test_tool_cli.py::test_benchmark_attention_tiny_run',
    'analysis/benchmark_compile.py':
    'test_tools/test_tool_cli.py::test_benchmark_compile_smoke',
    'analysis/get_flops.py':
    'test_tools/test_analysis/test_analysis_tools.py::'
    'test_get_flops_counts_attention_products_and_nr',
    'analysis/gpu_check.py':
    'test_tools/test_tool_cli.py::test_gpu_check_smoke',
    'analysis/memory_vs_length.py':
    'test_tools/test_analysis/test_analysis_tools.py::'
    'test_memory_vs_length_fixed_m_and_outputs',
    'analysis/nr_backward_compare.py':
    'test_tools/test_tool_cli.py::test_nr_backward_compare_train_demo',
    'analysis/nr_convergence.py':
    'test_tools/test_analysis/test_analysis_tools.py::'
    'test_nr_convergence_on_an_image_folder',
    'analysis/nr_method_crossover.py':
    'test_tools/test_analysis/test_benchmark.py::'
    'test_nr_method_crossover_tool',
    'analysis/spectral_norm.py':
    'test_tools/test_analysis/test_analysis_tools.py::'
    'test_spectral_norm_field_normalisation_lowers_the_norm',
    'analysis/visualize_attention.py':
    'test_tools/test_analysis/test_analysis_tools.py::'
    'test_visualize_attention_rows',
    'deployment/pytorch2onnx.py':
    'test_tools_support/test_deploy.py::test_export_parity',
    'deployment/benchmark_onnx.py':
    'test_tools/test_tool_cli.py::test_benchmark_onnx_tiny_run',
    'misc/make_demo_data.py':
    'test_tools_support/test_demo/test_synthetic.py::test_tool_without_torch',
    'model_converters/soft2mmsoft.py':
    'test_tools/test_model_converters.py::test_cli_round_trip',
    'model_converters/mmsoft2soft.py':
    'test_tools/test_model_converters.py::test_cli_round_trip',
}
#: helpers of the scripts, not tools (files, or folders ending in /)
HELPERS = ('analysis/utils.py', 'demo_support/')

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
    sys.modules.pop('utils', None)
print('HELP ' + json.dumps(res))
'''


def tool_scripts():
    found = sorted(
        osp.relpath(p, TOOLS)
        for p in glob.glob(osp.join(TOOLS, '**', '*.py'), recursive=True))
    return [p for p in found if not is_helper(p)]


def is_helper(path):
    return any(path == h or (h.endswith('/') and path.startswith(h))
               for h in HELPERS)


def test_every_tool_has_an_invocation_test():
    assert tool_scripts() == sorted(INVOCATIONS), (
        'a tool without an entry in INVOCATIONS (or a stale entry)')
    for script, node in INVOCATIONS.items():
        path, name = node.split('::')
        with open(osp.join(ROOT, 'tests', path)) as f:
            text = f.read()
        tests = {
            n.name
            for n in ast.walk(ast.parse(text))
            if isinstance(n, ast.FunctionDef)
        }
        assert name in tests, node
        stem = osp.splitext(osp.basename(script))[0]
        assert stem in text, f'{node} does not run {script}'


def test_no_tool_edits_sys_path():
    everything = glob.glob(osp.join(TOOLS, '**', '*.py'), recursive=True)
    for script in [osp.relpath(p, TOOLS) for p in everything]:
        with open(osp.join(TOOLS, script)) as f:
            code = f.read()
        assert 'sys.path.insert' not in code and 'sys.path[' not in code, \
            script


@pytest.fixture(scope='module')
def helps(tmp_path_factory):
    """{script: (exit code, output)} of ``--help``, run from a copy of
    tools/ outside the checkout."""
    tmp = tmp_path_factory.mktemp('installed')
    copy = tmp / 'tools'
    shutil.copytree(
        TOOLS, copy, ignore=shutil.ignore_patterns('__pycache__', 'figures'))
    proc = subprocess.run(
        [sys.executable, '-c', HELP_CHILD] +
        [str(copy / s) for s in tool_scripts()],
        cwd=str(tmp),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=600)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith('HELP ')]
    assert line, proc.stdout[-2000:] + proc.stderr[-2000:]
    got = json.loads(line[-1][5:])
    return {osp.relpath(k, str(copy)): v for k, v in got.items()}


@pytest.mark.parametrize('script', sorted(INVOCATIONS))
def test_help(helps, script):
    rc, text = helps[script]
    assert rc == 0, text[-2000:]
    assert text.startswith(f'usage: {osp.basename(script)} '), text[:300]
    assert 'show this help message and exit' in text


def test_python_sh_runs_a_tool_with_this_checkout(tmp_path):
    """``bash tools/python.sh SCRIPT``: the checkout's mmsoft without an
    install (no PYTHONPATH given)."""
    env = child_env(PYTHONPATH=None)
    code = ("import importlib.util as u; print(u.find_spec('mmsoft')"
            '.origin)')
    proc = subprocess.run(['bash',
                           osp.join(TOOLS, 'python.sh'), '-c', code],
                          cwd=str(tmp_path),
                          env=env,
                          capture_output=True,
                          text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == osp.join(ROOT, 'mmsoft', '__init__.py')
    proc = subprocess.run(['bash', osp.join(TOOLS, 'python.sh')],
                          env=env,
                          capture_output=True,
                          text=True)
    assert proc.returncode == 2 and 'usage: bash' in proc.stderr


# ----------------------------------------------- invocations of this file
def test_benchmark_attention_tiny_run(tmp_path):
    tool = load_tool('analysis/benchmark_attention.py')
    rows = tool.main([
        '--max-p', '1', '--methods', 'soft', '--repeats', '1', '--devices',
        'cpu', '--threads', '1', '--out',
        str(tmp_path)
    ])
    assert {(r['method'], r['mode'], r['n'])
            for r in rows} == {('soft', m, 784)
                               for m in ('forward', 'forward_backward')}
    with open(tmp_path / 'results.csv') as f:
        written = list(csv.DictReader(f))
    assert len(written) == 2
    assert all(
        float(r['time_ms']) > 0 and float(r['peak_mb']) >= 0 for r in written)
    assert '| cpu | 784 | soft |' in (tmp_path / 'results.md').read_text()
    assert (tmp_path / 'memory_time_vs_tokens.png').read_bytes()[:4] == \
        b'\x89PNG'


def test_benchmark_onnx_tiny_run(tmp_path, capsys):
    pytest.importorskip('onnxruntime')
    tool = load_tool('deployment/benchmark_onnx.py')
    md = tmp_path / 'table.md'
    # a shipped config by name (not a path from the working directory)
    assert tool.main([
        'demo/soft_cls_demo.py:64x64', '--repeats', '1', '--warmup', '0',
        '--onnx-dir',
        str(tmp_path), '--out',
        str(md)
    ]) == 0
    assert osp.getsize(tmp_path / 'soft_cls_demo_64x64.onnx') > 0
    row = [
        ln for ln in md.read_text().splitlines()
        if ln.startswith('| soft_cls_demo | 64x64 |')
    ]
    assert len(row) == 1
    cells = [c.strip() for c in row[0].strip('|').split('|')]
    assert float(cells[-1]) < 1e-4  # max rel. err of onnxruntime vs torch
    assert all(float(c) > 0 for c in cells[2:5])  # the three times (ms)


def test_nr_backward_compare_train_demo(tmp_path, capsys):
    """--train-demo trains the demo detector with both backward passes
    (the option reaches the backbone's attn_cfg); --smoke keeps it small."""
    tool = load_tool('analysis/nr_backward_compare.py')
    work = tmp_path / 'work'
    rows = tool.main([
        '--sizes', '--train-demo', '--smoke', '--data',
        str(tmp_path / 'demo'), '--work-dir',
        str(work)
    ])
    assert [r[0] for r in rows] == ['eq16', 'exact']
    assert all(0 <= r[1] <= 1 and r[3] > 0 for r in rows)
    out = capsys.readouterr().out
    assert '| eq16 |' in out and '| exact |' in out
    assert osp.isdir(tmp_path / 'demo-smoke' / 'coco')
    for b in ('eq16', 'exact'):
        dumped = glob.glob(str(work / b / '*.py'))
        assert dumped, os.listdir(work / b)
        with open(dumped[0]) as f:
            text = f.read()
        assert f"nr_backward='{b}'" in text


def test_benchmark_compile_smoke(tmp_path, capsys):
    """--smoke: the tiny arch at 64x64, forward and train step, eager vs
    compiled (the aot_eager backend: Dynamo + AOT autograd without
    inductor's code generation, seconds on a small CPU)."""
    tool = load_tool('analysis/benchmark_compile.py')
    rows = tool.main(
        ['--smoke', '--backend', 'aot_eager', '--out-dir',
         str(tmp_path)])
    assert [(r['size'], r['batch'], r['mode'])
            for r in rows] == [('64x64', 2, 'forward'), ('64x64', 2, 'train')]
    assert all(r['eager_ms'] > 0 and r['compiled_ms'] > 0 for r in rows)
    assert all(r['speedup'] == round(r['eager_ms'] / r['compiled_ms'], 3)
               for r in rows)
    out = capsys.readouterr().out
    assert ('| size | batch | mode | eager ms | compiled ms | speed-up | '
            'compile s |') in out
    assert '| 64x64 | 2 | train |' in out
    with open(tmp_path / 'benchmark_compile.csv') as f:
        written = list(csv.DictReader(f))
    assert [w['mode'] for w in written] == ['forward', 'train']
    assert (tmp_path /
            'benchmark_compile.md').read_text().count('| 64x64 | 2 |') == 2


def test_gpu_check_smoke(tmp_path, capsys):
    """--smoke: the CPU subset (one config's fp32 and bf16 steps, the NR
    methods, SOFT vs softmax at 64x64); the CUDA part is reported as not
    run, exit code 0."""
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
    with open(tmp_path / 'gpu_check.csv') as f:
        rows = list(csv.DictReader(f))
    nr = [
        r for r in rows
        if r['section'] == 'NR methods' and r['metric'] == 'max rel diff'
    ]
    assert nr and all(float(r['value']) < 1e-3 for r in nr)
    ratio = [r for r in rows if r['metric'] == 'SOFT / softmax']
    assert len(ratio) == 1 and float(ratio[0]['value']) > 0
