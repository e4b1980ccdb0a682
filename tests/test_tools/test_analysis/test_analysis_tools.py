"""tools/analysis tools on tiny settings into tmp_path."""
import csv
import importlib
import json
import os.path as osp

import numpy as np
import pytest
import torch
from conftest import (ROOT, load_tool, needs_torch, save_classifier_checkpoint,
                      tiny_arch)
from test_benchmark import isolated_runs_in

TINY = tiny_arch(num_heads=[1, 2, 2, 2])


def tool(name):
    return load_tool(f'analysis/{name}.py', f'_analysis_{name}')


def outputs_written(out, stem):
    """The figure (a PNG), the markdown table and the CSV's rows."""
    assert osp.getsize(osp.join(out, f'{stem}.md')) > 0
    with open(osp.join(out, f'{stem}.png'), 'rb') as f:
        assert f.read(8) == b'\x89PNG\r\n\x1a\n'
    with open(osp.join(out, f'{stem}.csv')) as f:
        rows = list(csv.DictReader(f))
    assert rows
    return rows


@needs_torch(
    '2.4', 'FlopCounterMode counts the softmax attention products as on '
    'torch >= 2.4 (torch 2.1: 95.6 M for softmax vs 58.4 M for SimA, '
    'expected > 2x)')
def test_get_flops_counts_attention_products_and_nr(tmp_path):
    gf = tool('get_flops')
    rows = gf.main('--models soft_tiny softmax_tiny --shape 64 --backbone-only'
                   ' --arch'.split() + [json.dumps(TINY), '--out',
                                        str(tmp_path)])  # yapf: disable
    by = {r['model']: r for r in outputs_written(tmp_path, 'flops')}
    assert set(by) == {'soft_tiny', 'softmax_tiny'}
    for r in rows:
        assert r['attention_g'] > 0 and r['flops_g'] == pytest.approx(
            r['layers_g'] + r['attention_g'] + r['nr_g'])
    assert float(by['soft_tiny']['nr_g']) > 0
    assert float(by['softmax_tiny']['nr_g']) == 0
    # full attention: n^2 d products per head, SimA n d^2 (n > d here)
    x = torch.randn(1, 3, 128, 128)
    att = {
        t:
        gf.count(gf.build_named(f'{t}_tiny', head=False, arch=TINY),
                 x)['attention']
        for t in ('softmax', 'sima')
    }
    assert att['softmax'] > 2 * att['sima']
    if importlib.util.find_spec('mmpretrain'):  # any config's whole model
        row, = gf.main(['--config', osp.join(ROOT, 'configs',
                                             'soft_tiny_in1k.py'),
                        '--out', str(tmp_path), '--attn-type', 'performer',
                        '--shape', '64'])  # yapf: disable
        assert row['counted'] == 'model (tensor mode)'
        assert row['nr_g'] == 0 and row['params_m'] > 12


def test_get_flops_math():
    """The NR term: T iterations x 2 products of m x m per head and image
    (grids at 64 x 96: 16x24 / 8x12 / 4x6, r = 8 / 4 / 2 -> m = 6); the
    tiny preset: the paper's numbers (Table 8); the bottleneck settings: m
    landmarks."""
    from mmsoft.models.backbones import SOFT
    from mmsoft.models.layers import with_nr
    gf = tool('get_flops')
    model = gf.build_named(
        'soft_tiny', head=False, arch=dict(TINY, depths=[1, 1, 1, 1]))
    x = torch.randn(2, 3, 64, 96)
    res, res1 = gf.count(model, x), gf.count(with_nr(model, iters=1), x)
    assert res['nr'] == 20 * res1['nr'] > 0
    assert res['total'] - res1['total'] == res['nr'] - res1['nr']
    assert res['nr'] == 2 * sum(TINY['num_heads'][:3]) * 20 * 2 * 6**3
    res = gf.count(gf.build_named('soft_tiny'), torch.randn(1, 3, 224, 224))
    assert res['params'] / 1e6 == pytest.approx(13.07, abs=0.005)
    assert (res['total'] - res['nr']) / 1e9 == pytest.approx(1.9, abs=0.05)
    for m in (36, 81):
        kw = gf.bottleneck_overrides(m)
        model = SOFT(dict(kw['arch'], **TINY),  # small channels, same ratios
                     attn_cfg=dict(type='soft', **kw['attn']),
                     out_indices=(2, )).eval()  # yapf: disable
        seen = []
        for mod in model.modules():
            if hasattr(mod, 'sampler'):
                mod.sampler.register_forward_hook(
                    lambda mo, a, out: seen.append(out.shape[2]))
        with torch.no_grad():
            model(torch.randn(1, 3, 224, 224))
        assert seen and set(seen) == {m}


def test_memory_vs_length_fixed_m_and_outputs(tmp_path, script_server,
                                              monkeypatch):
    mv = tool('memory_vs_length')
    # every reduced attention keeps m = 49 at every n (Fig. 1b setting)
    for attn in ('soft', 'linformer', 'nystromformer'):
        model = mv.build_stack(attn, 1, 24, 2, 49, 4).eval()
        at = model.blocks[0].attn
        for p in (1, 3):
            x = torch.randn(1, 784 * p, 24)
            hw = (28, 28 * p)
            if attn == 'soft':
                q = at._split(at.q(x)) * at.head_dims**-0.25
                m = at.sampler(q, hw).shape[2]
            elif attn == 'linformer':
                m = at.reduced_attention_row(x, hw, 0).shape[-1]
            else:
                m = at._kernels(x, hw)[0].shape[-1]
            assert m == 49
            with torch.no_grad():
                assert model(x, hw).shape == x.shape
    # one measurement (a script_server child); softmax:math over budget
    isolated_runs_in(script_server, monkeypatch)
    rows = mv.main('--attns sima softmax:math --p 1 --layers 1 --dims 24 '
                   '--heads 2 --max-mem-gb 1e-6 --out'.split() +
                   [str(tmp_path)])
    by = {r['attn']: r for r in outputs_written(tmp_path, 'memory')}
    assert by['sima']['status'] == 'ok' and float(by['sima']['time_ms']) > 0
    assert by['softmax:math']['status'].startswith('skipped')
    assert len(rows) == 2


def test_nr_convergence_on_an_image_folder(tmp_path):
    """Per stage and k, over an image folder, with a checkpoint's weights
    (loaded: the same tensors)."""
    import cv2

    from mmsoft.models.backbones import SOFT
    nc = tool('nr_convergence')
    (tmp_path / 'imgs' / 'sub').mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(3):
        cv2.imwrite(
            str(tmp_path / 'imgs' / 'sub' / f'{i}.png'),
            rng.integers(0, 255, (40, 50, 3), dtype=np.uint8))
    torch.manual_seed(3)
    src, ckpt = SOFT(TINY), str(tmp_path / 'w.pth')
    src.init_weights()
    save_classifier_checkpoint(ckpt, src)
    model = nc.build_model('soft_tiny', checkpoint=ckpt, arch=TINY)
    for k, v in src.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k], v)
    rows = nc.main([
        '--arch',
        json.dumps(TINY), '--images', f'mine={tmp_path / "imgs"}',
        '--checkpoint', ckpt, '--out',
        str(tmp_path / 'out')
    ] + '--num-images 2 --size 64 --iters 6 --batch-size 2'.split())
    outputs_written(tmp_path / 'out', 'nr_convergence')
    assert {r['dataset'] for r in rows} == {'mine'}
    assert {r['stage'] for r in rows} == {1, 2, 3}
    for st in (1, 2, 3):
        rs = sorted((r for r in rows if r['stage'] == st),
                    key=lambda r: r['k'])
        assert len(rs) == 7
        # 2 images x heads x layers matrices per stage
        assert rs[0]['matrices'] == 2 * TINY['num_heads'][st - 1]
        assert all(np.isfinite([r['mean'], r['max']]).all() for r in rs)
        assert rs[-1]['mean'] < rs[0]['mean'] <= 1 + 1e-6


def test_spectral_norm_field_normalisation_lowers_the_norm(tmp_path):
    sn = tool('spectral_norm')
    rows = sn.main('--lengths 4 16 36 --samples 2 --out'.split() +
                   [str(tmp_path)])
    assert len(outputs_written(tmp_path, 'spectral_norm')) == 6
    for m in (4, 16, 36):
        rs = [r for r in rows if r['m'] == m]
        # Prop. 6: D^-1/2 A^+ D^-1/2 has the smaller norm
        assert all(r['norm_pinv'] < r['pinv'] for r in rs)
        # well-conditioned small A: NR = exact pinv (normalised variant)
        for r in rs:
            assert r['norm_pinv'] == pytest.approx(
                r['exact_norm_pinv'], rel=1e-3)
    # landmarks of the field get more similar as the grid gets finer
    g = torch.Generator().manual_seed(0)
    L = sn.field_landmarks(6, 8, 4.0, 2.0, 64, g)
    assert L.shape == (36, 8)
    assert ((L[:, None] - L[None]).square().sum(-1) / 2).mean() < 8
    # --source model: one synthetic image, one sample per head of stage 3
    rows = sn.main('--source model --model soft_tiny_norm --lengths 4 '
                   '--samples 1 --out'.split() + [str(tmp_path / 'model')])
    assert len(rows) == 10 and all(r['m'] == 4 for r in rows)
    outputs_written(tmp_path / 'model', 'spectral_norm')


def test_visualize_attention_rows(tmp_path):
    va = tool('visualize_attention')
    rows = va.main('--models softmax_tiny linformer_tiny soft_tiny_norm '
                   '--size 64 --stage 0 --query 0.25 0.75 --out'.split() +
                   [str(tmp_path)])
    csv_rows = outputs_written(tmp_path, 'attention')
    assert len(csv_rows) == len(rows) == 2 + 2 + 2  # 2 heads in stage 1
    for r in rows:
        assert (r['query_y'], r['query_x']) == (4, 12)  # of a 16 x 16 map
        if r['model'] in ('softmax_tiny', 'linformer_tiny'):
            assert r['sum'] == pytest.approx(1, abs=1e-5) and r['min'] >= 0
    raw = np.load(tmp_path / 'attention_rows.npz')
    assert raw['soft_tiny_norm'].shape == (2, 16, 16)
