#!/usr/bin/env python
"""Convert an official SOFT checkpoint (fudan-zvg/SOFT, timm) to mmsoft.

    python tools/model_converters/soft2mmsoft.py SRC DST [--ema|--no-ema]
        [--norm] [--stage4-heads N] [--trust-checkpoint]

SRC may be any timm layout: ``{'state_dict': ...}``, ``{'state_dict_ema':
...}`` (used when present unless ``--no-ema``), ``{'model': ...}`` or a bare
state dict; ``module.`` prefixes are stripped. The architecture (widths,
depths, heads, sampling ratios, kernel sizes, MLP ratios) is read from tensor
shapes and printed as an mmsoft arch preset or arch dict; every tensor is
checked against mmsoft's SOFT of that arch (unknown, missing or mis-shaped
keys: one line naming them, nothing written).

DST is an mmpretrain ``ImageClassifier`` checkpoint ``{'state_dict': ...,
'meta': ...}`` with keys ``backbone.*`` (mmsoft's SOFT) and ``head.fc.*``
(``LinearClsHead``), loadable e.g. with
``--cfg-options model.backbone.init_cfg.checkpoint=DST`` or ``load_from``.
It is written atomically (on any error, SIGINT or SIGTERM nothing is
written); DST must not be SRC; missing folders above it (``weights/``) are
created just before writing. A damaged
SRC (empty, truncated, CRC error) is reported as such.

``soft_*`` and ``soft_norm_*`` checkpoints have identical tensors, so the
attention normalisation cannot be read from the weights: pass ``--norm`` for
``soft_norm_*`` checkpoints (SOFTAttention attn_norm=True); without it the
checkpoint is taken to be a ``soft_*`` one (attn_norm=False).
"""
import os.path as osp
import sys

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmsoft.models.converters import (ConversionError, arch_for_mmsoft,
                                      convert_official_to_mmpretrain,
                                      describe_arch, match_arch_preset,
                                      official_model_name)
from mmsoft_tools.cli import run_main
from model_converters import checkpoint_files as files


def parse_args(argv=None):
    p = files.converter_parser(
        'Convert an official SOFT (timm) checkpoint to an mmpretrain/mmsoft '
        'checkpoint.',
        src='official checkpoint (.pth / .pth.tar)',
        dst='output mmsoft checkpoint (.pth)',
        stage4_heads='heads of the softmax stage 4 (not visible in the '
        'weights; default: keep stage 3\'s head width, 16 for every '
        'official model)',
        heads_type=files.positive_int)
    ema = p.add_mutually_exclusive_group()
    ema.add_argument(
        '--ema',
        dest='ema',
        action='store_true',
        default=None,
        help='require the EMA weights (state_dict_ema)')
    ema.add_argument(
        '--no-ema',
        dest='ema',
        action='store_false',
        help='use the raw weights even if EMA weights exist')
    p.add_argument(
        '--norm',
        action='store_true',
        help='the checkpoint is a soft_norm_* model '
        '(attn_norm=True); not visible in the weights')
    return p.parse_args(argv)


def convert(args, log=print):
    files.check_output_path(args.src, args.dst)
    files.missing_output_dirs(args.dst)  # created just before writing
    files.check_readable(args.src)
    ckpt = files.load_checkpoint_file(args.src, trust=args.trust_checkpoint)
    done = files.already_mmsoft(ckpt, args.src)
    if done:
        raise ConversionError(done)
    sd, source = files.official_weights(ckpt, args.src, args.ema)
    log(f'reading {source!r} of {args.src} ({len(sd)} tensors)')
    arch = files.infer_arch(sd, args.stage4_heads)
    files.check_converted(sd, arch, args.src, official=True)
    out, _ = convert_official_to_mmpretrain(sd, args.stage4_heads)

    preset = match_arch_preset(arch)
    mm_arch = preset if preset is not None else arch_for_mmsoft(arch)
    name = official_model_name(arch, args.norm)
    log(f'architecture: {describe_arch(arch)}' +
        (f'  (official {name})' if name else ''))
    if not arch['stage4_heads_given']:
        log(f'note: stage-4 heads are not visible in the weights; assumed '
            f'{arch["num_heads"][3]} (stage 3\'s head width '
            f'{arch["embed_dims"][2] // arch["num_heads"][2]}); override '
            f'with --stage4-heads')
    why = '--norm given' if args.norm else 'no --norm: a soft_* checkpoint'
    log(f'note: attention normalisation is not visible in the weights; '
        f'attn_cfg.attn_norm={args.norm} ({why})')
    if args.norm:
        log("note: the backbone's default nr_init for attn_norm=True is the "
            "official alpha rule per sample ('soft_norm_per_sample', = the "
            "official model at batch size 1); nr_init='soft_norm_per_batch' "
            "reproduces the official batched code bit for bit")
    backbone = dict(
        type='SOFT',
        arch=mm_arch,
        attn_cfg=dict(type='SOFTAttention', attn_norm=args.norm),
        out_indices=(3, ),
        out_type='cls_token')
    if arch['in_channels'] != 3:
        backbone['in_channels'] = arch['in_channels']
    if arch['pretrain_img_size'] != 224:
        backbone['pretrain_img_size'] = arch['pretrain_img_size']
    model_cfg = dict(backbone=backbone)
    if arch['num_classes']:
        model_cfg['head'] = dict(
            type='LinearClsHead',
            num_classes=arch['num_classes'],
            in_channels=arch['embed_dims'][3])
    else:
        log('note: no classification head in the checkpoint; writing '
            'backbone.* keys only')
    log(f'model config: {model_cfg}')
    meta = dict(
        converted_from=osp.abspath(args.src),
        source_entry=source,
        converter='tools/model_converters/soft2mmsoft.py',
        official_model=name,
        attn_norm=args.norm,
        arch=mm_arch,
        num_classes=arch['num_classes'],
        model_cfg=model_cfg)
    files.save_creating_dirs(dict(state_dict=out, meta=meta), args.dst, log)
    log(f'wrote {len(out)} tensors to {args.dst}')
    return out, meta


def main(argv=None):
    return files.run_converter(convert, parse_args(argv))


if __name__ == '__main__':
    run_main(main)  # expected failures: one line (mmsoft_tools.cli)
