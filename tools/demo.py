"""The main job of the README (`make demo`).

Until the embedded demo data set lands, this is a smoke run: it builds an
mmdet RetinaNet with a SOFT-Tiny backbone from ``configs/demo``, generates a
synthetic scene, runs the detector on it on the CPU (random weights, so the
boxes are not meaningful yet) and writes the picture with the predictions.
"""
import argparse
import os
import os.path as osp
import sys
import time

import numpy as np

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))


def synthetic_scene(h=480, w=640, seed=0):
    """A textured background with several filled shapes of several colours."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w]
    img = np.stack([
        120 + 40 * np.sin(xx / 23.0 + c) * np.cos(yy / 17.0 - c)
        for c in range(3)
    ], -1)
    img += rng.normal(0, 12, img.shape)
    boxes = []
    for _ in range(6):
        bh, bw = rng.integers(40, 160, 2)
        y0, x0 = rng.integers(0, h - bh), rng.integers(0, w - bw)
        colour = rng.integers(0, 256, 3)
        if rng.random() < 0.5:
            img[y0:y0 + bh, x0:x0 + bw] = colour
        else:
            cy, cx = y0 + bh / 2, x0 + bw / 2
            mask = ((yy - cy) / (bh / 2))**2 + ((xx - cx) / (bw / 2))**2 <= 1
            img[mask] = colour
        boxes.append((x0, y0, x0 + bw, y0 + bh))
    return np.clip(img, 0, 255).astype(np.uint8), boxes


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=osp.join(
        ROOT, 'configs/demo/retinanet_soft_tiny_smoke.py'))
    parser.add_argument('--out', default=osp.join(ROOT, 'work_dirs/demo'))
    args = parser.parse_args()

    import torch
    from mmdet.apis import inference_detector, init_detector
    from mmengine.config import Config

    import mmsoft  # noqa: F401  (registers SOFT)

    os.makedirs(args.out, exist_ok=True)
    print(f'[demo] building RetinaNet + SOFT-Tiny from {args.config}',
          flush=True)
    cfg = Config.fromfile(args.config)
    torch.manual_seed(0)
    model = init_detector(cfg, checkpoint=None, device='cpu')
    n_backbone = sum(p.numel() for p in model.backbone.parameters())
    n_total = sum(p.numel() for p in model.parameters())
    print(f'[demo] parameters: backbone {n_backbone / 1e6:.2f}M, detector '
          f'{n_total / 1e6:.2f}M', flush=True)

    img, _ = synthetic_scene()
    img_path = osp.join(args.out, 'scene.png')
    import mmcv
    mmcv.imwrite(img[..., ::-1], img_path)
    t0 = time.perf_counter()
    result = inference_detector(model, img_path)
    dt = time.perf_counter() - t0
    pred = result.pred_instances
    print(f'[demo] inference on a {img.shape[1]}x{img.shape[0]} image: '
          f'{dt:.2f} s, {len(pred)} boxes (random weights: not meaningful)',
          flush=True)
    keep = pred[pred.scores.argsort(descending=True)[:10]]
    vis = img.copy()
    for x0, y0, x1, y1 in keep.bboxes.round().int().tolist():
        vis[max(y0, 0):y1, [max(x0, 0), min(x1, vis.shape[1] - 1)]] = (255, 0, 0)
        vis[[max(y0, 0), min(y1, vis.shape[0] - 1)], max(x0, 0):x1] = (255, 0, 0)
    out_png = osp.join(args.out, 'smoke_predictions.png')
    tmp = out_png + '.tmp.png'
    mmcv.imwrite(vis[..., ::-1], tmp)
    os.replace(tmp, out_png)
    print(f'[demo] wrote {out_png}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
