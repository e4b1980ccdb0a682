# Copyright (c) mmsoft contributors.
"""Run a SOFT detector, segmentor or classifier on an image or a folder.

The codebase is read from the config's ``default_scope`` and the images go
through its own inferencer - mmdet ``DetInferencer``, mmseg
``MMSegInferencer`` or mmpretrain ``ImageClassificationInferencer`` - which
also draws the visualisations::

    python demo/image_demo.py INPUT CONFIG CHECKPOINT [--out-dir D]
        [--device cpu] [--score-thr 0.3]

    # after `make demo` (the demo's trained checkpoints):
    python demo/image_demo.py data/demo/coco/val \\
        configs/demo/retinanet_soft_demo.py work_dirs/demo/det/epoch_8.pth \\
        --out-dir outputs/det

INPUT is an image file or a folder (searched recursively for .jpg, .jpeg,
.png, .bmp, .tif, .tiff, .webp). For every image ``<name>`` the script
writes, each file atomically (temporary file + rename):

* ``D/vis/<name>.<ext>`` - the codebase's visualisation (boxes / masks,
  coloured label map, or the predicted class);
* ``D/preds/<name>.json`` - the predictions: ``bboxes`` (x1, y1, x2, y2),
  ``scores``, ``labels``, ``label_names`` (and ``masks`` as RLE) for
  detection; ``labels``, ``label_names``, ``pixel_fractions`` and
  ``sem_seg`` (the label-map PNG ``D/preds/<name>.png``) for segmentation;
  ``pred_label``, ``pred_score``, ``pred_class``, ``pred_scores`` for
  classification;

``<name>`` is the image's path relative to a folder INPUT, without its
extension (with it where two images would share a name: ``x.jpg`` and
``x.png`` give ``preds/x.jpg.json`` and ``preds/x.png.json``). A folder
INPUT is searched without ``D`` when ``D`` lies inside it (the demo's own
outputs are not inputs: a second run gives the same files).
``--score-thr`` is the detection score threshold for drawing (the json
keeps every detection, as mmdet's inferencer does).

The checkpoint must match the config's model (keys, shapes, and the
attention normalisation a converted checkpoint records); ``--partial-load``
allows a partial match and prints what was skipped. In a folder, an image
that cannot be read (empty, truncated, not decodable) is reported and
skipped, the others are processed, and the exit code is 1 at the end.
"""
import argparse
import json
import os
import os.path as osp
import shutil
import sys
import tempfile

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
# the tools' package (mmsoft_tools): tools/ beside demo/ (also installed)
if osp.join(ROOT, 'tools') not in sys.path:
    sys.path.insert(0, osp.join(ROOT, 'tools'))
# a checkout's mmsoft first; an installed copy (mmsoft/.mim/demo) imports
# the installed mmsoft
if (osp.isfile(osp.join(ROOT, 'mmsoft', '__init__.py'))
        and ROOT not in sys.path):
    sys.path.insert(0, ROOT)  # noqa: E402  (run from a checkout)

IMG_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.tif', '.tiff', '.webp')
TASKS = {
    'mmdet': 'detection',
    'mmseg': 'segmentation',
    'mmpretrain': 'classification'
}
PROG = 'image_demo.py'


class DemoError(Exception):
    """A user error: printed as one line, exit code 2."""


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description='Run a SOFT detection / segmentation / classification '
        'config + checkpoint on an image or a folder (through mmdet '
        'DetInferencer, mmseg MMSegInferencer or mmpretrain '
        'ImageClassificationInferencer) and write visualisations and '
        'predictions (json)')
    parser.add_argument('input', help='an image file or a folder of images')
    parser.add_argument('config', help='the config file')
    parser.add_argument('checkpoint', help='the checkpoint file')
    parser.add_argument(
        '--out-dir',
        default='outputs',
        help='output folder (default: outputs): vis/ and '
        'preds/')
    parser.add_argument(
        '--device',
        default=None,
        help="e.g. 'cpu', 'cuda:0' (default: cuda:0 when "
        'available, else cpu)')
    parser.add_argument(
        '--partial-load',
        action='store_true',
        help='allow a checkpoint that matches the model only in part: '
        'predict with the matching tensors and print what was skipped '
        '(without it a mismatch is an error)')
    parser.add_argument(
        '--score-thr',
        type=float,
        default=0.3,
        help='detection: draw boxes with at least this '
        'score (default 0.3)')
    return parser.parse_args(argv)


def unique_names(rels):
    """Output names of image paths relative to the input folder: the path
    without its extension, or with it (``x.jpg``, ``x.png``) where two
    images would otherwise share a name (compared case-insensitively, for
    case-insensitive file systems); a number is appended if even that
    collides."""
    stems = [osp.splitext(r)[0] for r in rels]
    count = {}
    for stem in stems:
        count[stem.lower()] = count.get(stem.lower(), 0) + 1
    names, taken = [], set()
    for rel, stem in zip(rels, stems):
        name = stem if count[stem.lower()] == 1 else rel
        base, i = name, 2
        while name.lower() in taken:
            name, i = f'{base}_{i}', i + 1
        taken.add(name.lower())
        names.append(name)
    return names


def _own_outputs(path, out_dir):
    """The folders of ``out_dir`` that a folder INPUT must not search: the
    whole ``out_dir`` when it lies inside INPUT (e.g. the default
    ``outputs/`` with INPUT ``.``), its ``vis`` / ``preds`` when it is
    INPUT itself (real paths)."""
    if out_dir is None:
        return set()
    out = osp.realpath(out_dir)
    if out == osp.realpath(path):
        return {osp.join(out, 'vis'), osp.join(out, 'preds')}
    return {out}


def list_images(path, out_dir=None):
    """[(image path, output name)] of an image file or a folder; the
    demo's own outputs in ``out_dir`` are not inputs."""
    if osp.isfile(path):
        return [(path, osp.splitext(osp.basename(path))[0])]
    if not osp.isdir(path):
        raise DemoError(f'input not found: {path}')
    found, skip = [], _own_outputs(path, out_dir)
    for dirpath, dirnames, filenames in os.walk(path):
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith('.image_demo.')
            and osp.realpath(osp.join(dirpath, d)) not in skip)
        for fname in sorted(filenames):
            if fname.lower().endswith(IMG_EXTENSIONS):
                found.append(osp.join(dirpath, fname))
    if not found:
        raise DemoError(f'no images ({", ".join(IMG_EXTENSIONS)}) in folder '
                        f'{path}')
    names = unique_names([osp.relpath(f, path) for f in found])
    return list(zip(found, names))


def image_problem(img):
    """Why ``img`` cannot be used (empty, truncated, not decodable), or
    None (:func:`mmsoft_tools.data_check.image_damage`)."""
    from mmsoft_tools.data_check import image_damage
    return image_damage(img, decode=True)


def check_inputs(args):
    """One clear line for each kind of bad input, before loading a model.
    A single INPUT image that cannot be read is an error; in a folder, such
    images are reported and skipped (:func:`run`)."""
    images = list_images(args.input, args.out_dir)
    if not osp.isfile(args.config):
        raise DemoError(f'config file not found: {args.config}')
    remote = args.checkpoint.startswith(('http://', 'https://'))
    if not (remote or osp.isfile(args.checkpoint)):
        raise DemoError(f'checkpoint file not found: {args.checkpoint}')
    if osp.isfile(args.input):
        problem = image_problem(args.input)
        if problem:
            raise DemoError(f'cannot read image: {args.input} ({problem})')
    from mmsoft_tools.cli import ToolError, check_device, checkpoint_problem
    try:
        check_device(args.device)  # --device cuda without CUDA
    except ToolError as e:
        raise DemoError(str(e)) from None
    problem = checkpoint_problem(args.checkpoint)  # damaged, unreachable
    if problem:
        raise DemoError(problem)
    return images


def _jsonable(x):
    import numpy as np
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, bytes):
        return x.decode()
    return x


def write_json(path, obj):
    from mmsoft.utils.atomic import atomic_write
    atomic_write(path, json.dumps(_jsonable(obj)), makedirs=True)


def _move_vis(tmp_vis_dir, out_dir, name):
    """The one visualisation file the inferencer wrote -> vis/<name>.ext."""
    files = [
        f for f in os.listdir(tmp_vis_dir)
        if osp.isfile(osp.join(tmp_vis_dir, f))
    ]
    if len(files) != 1:
        raise RuntimeError(f'expected one visualisation in {tmp_vis_dir}, '
                           f'found {files}')
    ext = osp.splitext(files[0])[1]
    dst = osp.join(out_dir, 'vis', name + ext)
    os.makedirs(osp.dirname(dst), exist_ok=True)
    os.replace(osp.join(tmp_vis_dir, files[0]), dst)  # same file system
    return dst


class Predictor:
    """The codebase's inferencer for one config + checkpoint."""

    def __init__(self, cfg, checkpoint, device, score_thr, partial_load=False):
        from mmsoft_tools.launch import codebase_of
        self.scope = codebase_of(cfg)
        self.task = TASKS[self.scope]
        self.score_thr = score_thr
        from mmsoft.compat import mmengine_checkpoints_allowed

        # the inferencers torch.load a training checkpoint (its message
        # hub): mmengine's objects allowed for this load only
        with self._scope(), mmengine_checkpoints_allowed():
            self._build(cfg, checkpoint, device)
        self._check_weights(cfg, checkpoint, partial_load)

    def _check_weights(self, cfg, checkpoint, partial_load):
        """The inferencers load with ``strict=False`` (a WARNING): check
        the checkpoint against the model they built (keys, shapes, the
        converter's attention normalisation) and refuse a mismatch."""
        if checkpoint.startswith(('http://', 'https://')):
            return
        from mmsoft.models.loading import (check_checkpoint_for_model,
                                           read_checkpoint)
        from mmsoft.utils.strict_load import CheckpointMismatchError
        ckpt = read_checkpoint(checkpoint, mmap=True)  # tensors stay on disk
        try:
            check_checkpoint_for_model(
                self.inferencer.model,
                ckpt,
                checkpoint,
                allow_partial=partial_load,
                opt_in='pass --partial-load',
                config=getattr(cfg, 'filename', None))
        except CheckpointMismatchError as e:
            raise DemoError(str(e)) from None

    def _scope(self):
        # the codebase's registries, whatever default scope an earlier
        # inferencer in this process left behind
        from mmengine.registry import DefaultScope
        return DefaultScope.overwrite_default_scope(self.scope)

    def _build(self, cfg, checkpoint, device):
        if self.scope == 'mmdet':
            from mmdet.apis import DetInferencer
            self.inferencer = DetInferencer(
                model=cfg, weights=checkpoint, device=device, scope='mmdet')
        elif self.scope == 'mmseg':
            from mmseg.apis import MMSegInferencer
            self.inferencer = MMSegInferencer(
                model=cfg, weights=checkpoint, device=device, scope='mmseg')
        else:
            from mmpretrain.apis import ImageClassificationInferencer
            self.inferencer = ImageClassificationInferencer(
                model=cfg, pretrained=checkpoint, device=device)

    def classes(self):
        meta = getattr(self.inferencer.model, 'dataset_meta', None) or \
            getattr(self.inferencer.model, '_dataset_meta', None) or {}
        return meta.get('classes')

    def __call__(self, img, tmp):
        """Predict one image; the visualisation goes to ``tmp/vis``.
        Returns the prediction dict (json-able)."""
        with self._scope():
            return self._predict(img, tmp)

    def _predict(self, img, tmp):
        vis_dir = osp.join(tmp, 'vis')
        if self.scope == 'mmdet':
            res = self.inferencer(
                img,
                out_dir=tmp,
                no_save_pred=True,
                pred_score_thr=self.score_thr)
            pred = dict(res['predictions'][0])
            classes = self.classes()
            if classes is not None:
                pred['label_names'] = [classes[i] for i in pred['labels']]
            return pred
        if self.scope == 'mmseg':
            import numpy as np
            res = self.inferencer(
                img, out_dir=tmp, img_out_dir='vis', pred_out_dir='pred')
            sem = np.asarray(res['predictions'])
            labels, counts = np.unique(sem, return_counts=True)
            classes = self.classes()
            pred = dict(
                height=int(sem.shape[0]),
                width=int(sem.shape[1]),
                labels=labels.tolist(),
                pixel_fractions=(counts / sem.size).tolist())
            if classes is not None:
                pred['label_names'] = [classes[i] for i in labels]
            pred['_sem_seg'] = sem
            return pred
        os.makedirs(tmp, exist_ok=True)
        res = self.inferencer(img, show_dir=vis_dir)[0]
        return dict(res)


def _save_label_map(path, sem):
    import cv2
    import numpy as np

    from mmsoft.utils.atomic import atomic_path
    dtype = np.uint8 if sem.max(initial=0) < 256 else np.uint16
    # cv2 takes the format from the name: keep the extension
    with atomic_path(path, suffix=osp.splitext(path)[1], makedirs=True) as tmp:
        if not cv2.imwrite(tmp, sem.astype(dtype)):
            raise OSError(f'cannot write {path}')


def run(args):
    images = check_inputs(args)
    import mmsoft  # noqa: F401 (registers SOFT)
    # before the inferencer's torch.load (which unpickles anything before
    # torch 2.6): a damaged or code-running file stops here, in one line
    from mmsoft.utils.checkpoint_io import (CheckpointError, CheckpointRefused,
                                            load_verified)
    from mmsoft_tools.cli import load_config
    if osp.isfile(args.checkpoint):
        try:
            load_verified(args.checkpoint)
        except (CheckpointError, CheckpointRefused) as e:
            raise DemoError(str(e)) from None
    cfg = load_config(args.config)  # a syntax error: one line
    try:
        predictor = Predictor(cfg, args.checkpoint, args.device,
                              args.score_thr, args.partial_load)
    except ValueError as e:  # e.g. no codebase for this default_scope
        if 'default_scope' in str(e):
            raise DemoError(str(e)) from e
        raise
    out_dir = args.out_dir
    os.makedirs(out_dir, exist_ok=True)
    tmp_root = tempfile.mkdtemp(prefix='.image_demo.', dir=out_dir)
    written, failed = [], []
    try:
        for img, name in images:
            problem = image_problem(img)
            if problem:  # report it, go on with the rest of the folder
                failed.append((img, problem))
                print(
                    f'{PROG}: skipped {img}: {problem}',
                    file=sys.stderr,
                    flush=True)
                continue
            tmp = osp.join(tmp_root, 'work')
            shutil.rmtree(tmp, ignore_errors=True)
            pred = predictor(img, tmp)
            vis = _move_vis(osp.join(tmp, 'vis'), out_dir, name)
            record = dict(
                img_path=osp.abspath(img),
                task=predictor.task,
                config=args.config,
                checkpoint=args.checkpoint,
                vis=osp.relpath(vis, out_dir))
            sem = pred.pop('_sem_seg', None)
            if sem is not None:
                png = osp.join(out_dir, 'preds', name + '.png')
                _save_label_map(png, sem)
                record['sem_seg'] = osp.relpath(png, out_dir)
            record.update(pred)
            js = osp.join(out_dir, 'preds', name + '.json')
            write_json(js, record)
            written.append((img, vis, js))
            print(f'{img} -> {vis}, {js}', flush=True)
    finally:
        shutil.rmtree(tmp_root, ignore_errors=True)
    print(f'{predictor.task}: {len(written)} image(s); visualisations in '
          f'{osp.join(out_dir, "vis")}, predictions in '
          f'{osp.join(out_dir, "preds")}')
    if failed:
        raise SkippedImages(
            f'{len(failed)} of {len(images)} image(s) could not be read and '
            f'were skipped: ' + ', '.join(img for img, _ in failed))
    return written


class SkippedImages(Exception):
    """Some images of a folder were skipped: exit code 1 at the end."""


def main(argv=None):
    args = parse_args(argv)
    try:
        run(args)
    except DemoError as e:
        print(f'{PROG}: error: {e}', file=sys.stderr)
        return 2
    except SkippedImages as e:
        print(f'{PROG}: error: {e}', file=sys.stderr)
        return 1
    return 0


if __name__ == '__main__':
    from mmsoft_tools.cli import run_main
    run_main(main)  # other expected failures (full disk ...): one line
