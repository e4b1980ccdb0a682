"""tools/analysis/benchmark.py (model names, a tiny run: a subprocess per
measurement, CSV / markdown with the ratios), nr_method_crossover.py and
nr_accuracy.py, which back docs/en/benchmarks.md's tables."""
import csv
import os
import sys
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, load_tool


def isolated_runs_in(script_server, monkeypatch):
    """``run_isolated``'s ``python script args`` children in the
    :func:`script_server` (a fork with the stacks imported)."""
    from analysis import common as analysis

    def run(cmd, env, **kwargs):
        assert cmd[0] == sys.executable, cmd
        return script_server(cmd[1], cmd[2:], cwd=os.getcwd(), env=env)

    monkeypatch.setattr(analysis, 'subprocess', SimpleNamespace(run=run))


def load():
    return load_tool('analysis/benchmark.py', '_benchmark')


def test_model_names_backbones_and_reuse_memory(monkeypatch):
    """Names -> backbones; a training step times SOFT as
    configs/_base_/soft_dense.py trains it (norm_eval, drop path, residual
    dropout); ``_floor``: A_T W replaced by W (same shapes, other values);
    ``--reuse-memory`` reruns with glibc's settings that keep freed memory
    (a process that has them goes on)."""
    import torch.nn as nn
    from mmengine.config import Config

    from mmsoft.configs import configs_root
    from mmsoft.models.layers import SOFTAttention
    bench = load()
    m = bench.build_backbone('soft_tiny_norm_spectral_ml16')
    attns = [a for a in m.modules() if isinstance(a, SOFTAttention)]
    assert attns and all(a.attn_norm and a.nr_method == 'spectral'
                         and a.sampler.max_landmarks == 16 for a in attns)
    m = bench.build_backbone('soft_small')
    attns = [a for a in m.modules() if isinstance(a, SOFTAttention)]
    assert not any(a.attn_norm for a in attns) and len(attns) == 11
    assert bench.baseline_for('soft_small_norm', ['pvtv2_b2'], None) == \
        'pvtv2_b2'
    with pytest.raises(ValueError, match='unknown model'):
        bench.build_backbone('resnet50')
    dense = Config.fromfile(f'{configs_root()}/_base_/soft_dense.py')
    assert bench.recipe_settings() == {
        k: dense.soft_backbone[k]
        for k in ('norm_eval', 'drop_path_rate', 'residual_drop')
    }
    train = bench.build_backbone('soft_tiny_norm_floor', train=True).train()
    assert train.norm_eval is True
    assert all(not m.training for m in train.modules()
               if isinstance(m, nn.BatchNorm2d))
    assert any(isinstance(m, nn.Dropout) and m.p > 0 for m in train.modules())
    floor = bench.build_backbone('soft_tiny_norm_floor').eval()
    assert floor.norm_eval is False
    full = bench.build_backbone('soft_tiny_norm').eval()
    full.load_state_dict(floor.state_dict())
    x = torch.randn(1, 3, 64, 64)
    with torch.no_grad():
        a, b = floor(x), full(x)
    assert [t.shape for t in a] == [t.shape for t in b]
    assert not torch.allclose(a[0], b[0])
    for k in bench.REUSE_MEMORY:
        monkeypatch.delenv(k, raising=False)
    calls = []
    monkeypatch.setattr('subprocess.call', lambda cmd, env: calls.append(
        (cmd, env)) or 7)
    argv = ['--reuse-memory', '--sizes', '64x64x1', '--alternate']
    assert bench.main(argv) == 7 and not bench.memory_reused()
    (cmd, env), = calls
    assert cmd[1].endswith('benchmark.py') and cmd[2:] == argv
    assert all(env[k] == v for k, v in bench.REUSE_MEMORY.items())
    assert not bench.device_label('cpu', 2).endswith('memory reused')
    for k, v in bench.REUSE_MEMORY.items():
        monkeypatch.setenv(k, v)
    assert bench.memory_reused()
    assert bench.device_label('cpu', 2).endswith('2 threads, memory reused')


def test_tiny_run_writes_ratios(tmp_path, capsys, script_server, monkeypatch):
    """4 measurements as 4 scripts; ``--alternate``: every model in each
    round in this process, ratios to the baseline."""
    isolated_runs_in(script_server, monkeypatch)
    bench, out = load(), tmp_path / 'bench'
    bench.main('--models soft_tiny_norm_ml16 pvtv2_b1 --sizes 64x64x1 '
               '--modes forward forward_backward --repeats 1 --threads 1 '
               '--out'.split() + [str(out)])
    assert 'FAILED' not in capsys.readouterr().out
    rows = list(csv.DictReader(open(out / 'results.csv')))
    assert {(r['model'], r['mode']) for r in rows} == {
        (m, mode) for m in ('soft_tiny_norm_ml16', 'pvtv2_b1')
        for mode in ('forward', 'forward_backward')}  # yapf: disable
    assert all(float(r['time_ms']) > 0 for r in rows)
    # the machine, for the figure's panels: the CPU and --threads
    assert {r['device'] for r in rows} == {
        f'CPU: {bench.cpu_name()}, 1 thread'}  # yapf: disable
    assert 'x pvtv2_b1' in (out / 'results.md').read_text()
    assert (out / 'benchmark.png').stat().st_size > 0
    assert bench.main(
        '--alternate --models soft_tiny_norm soft_tiny_norm_floor'
        ' pvtv2_b1 --sizes 64x64x1 --modes forward --repeats 2 '
        '--threads 1 --out'.split() + [str(tmp_path / 'alt')]) == 0
    assert capsys.readouterr().out.count('round ') == 2
    rows = list(csv.DictReader(open(tmp_path / 'alt' / 'alternate.csv')))
    assert [r['model'] for r in rows
            ] == ['soft_tiny_norm', 'soft_tiny_norm_floor', 'pvtv2_b1']
    assert rows[0]['baseline'] == 'pvtv2_b1' and float(rows[0]['ratio']) > 0
    assert rows[2]['ratio'] == ''


def test_nr_method_crossover_tool(capsys):
    mod = load_tool('analysis/nr_method_crossover.py', '_nr_crossover')
    # the rule: smallest m from which spectral wins at every larger m
    assert mod.crossover([(49, 1, 2), (81, 2, 1), (128, 5, 1)]) == 81
    assert mod.crossover([(49, 2, 1), (81, 1, 2), (128, 5, 1)]) == 128
    assert mod.crossover([(49, 1, 2), (81, 1, 2)]) is None
    rows, best = mod.main('--ms 12 24 --batch 2 --head-dims 8 --repeats 1 '
                          '--backward --threads 1'.split())
    assert [r[0] for r in rows] == [12, 24]
    assert all(r[1] > 0 and r[2] > 0 for r in rows)
    out = capsys.readouterr().out
    assert '| 24 |' in out and ('spectral wins from m' in out
                                or 'not faster' in out)


def parsed_rows(out):
    return [
        dict(kv.split('=') for kv in line.split())
        for line in out.splitlines() if line.startswith('size=')
    ]


def test_nr_accuracy_tool(tmp_path, capsys):
    """Every method against the float64 official 20 steps, per layer:
    within the bounds of docs/en/benchmarks.md; the table written;
    ``--config`` with a detector's ``--checkpoint`` too; a file that lacks
    a backbone tensor is refused."""
    from mmsoft.models.backbones import SOFT
    from mmsoft.utils.strict_load import CheckpointMismatchError
    from mmsoft_tools.cli import load_config
    mod = load_tool('analysis/nr_accuracy.py', '_nr_accuracy')
    assert mod.main('--model soft_tiny_norm --sizes 64x96 --layers 0 1 '
                    '--threads 1 --out'.split() + [str(tmp_path)]) == 0
    rows = parsed_rows(capsys.readouterr().out)
    assert len(rows) == 2 * 4  # two layers, four methods
    assert {r['method'] for r in rows} == {
        'auto', 'lanczos', 'spectral', 'iterative'}  # yapf: disable
    assert all(int(r['krylov']) > 1 for r in rows if r['method'] == 'lanczos')
    assert (tmp_path / 'nr_accuracy.csv').read_text().count('\n') == 9
    cfg = os.path.join(ROOT, 'configs', 'demo', 'retinanet_soft_demo.py')
    bb = dict(load_config(cfg).model.backbone)
    for key in ('type', 'init_cfg'):
        bb.pop(key, None)
    torch.manual_seed(0)
    state = {f'backbone.{k}': v for k, v in SOFT(**bb).state_dict().items()}
    ckpt = tmp_path / 'det.pth'
    torch.save(dict(state_dict=state, meta={}), ckpt)
    args = ['--config', cfg, '--checkpoint', str(ckpt)] + \
        '--sizes 64x96 --layers 0 --methods auto --threads 1'.split()
    assert mod.main(args) == 0
    out = capsys.readouterr().out
    assert 'randomly initialised' not in out
    rows += parsed_rows(out)
    assert len(rows) == 9 and rows[-1]['layer'] == '0', out
    for r in rows:
        assert float(r['out_err']) < 1e-5, r
        assert float(r['eval_err']) < 1e-5, r
        assert float(r['grad_err']) < 1e-4, r
    del state['backbone.stages.0.pos_embed']  # a file of another model
    torch.save(dict(state_dict=state, meta={}), ckpt)
    with pytest.raises(CheckpointMismatchError, match='pos_embed'):
        mod.main(args)
