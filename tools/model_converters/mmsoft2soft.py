#!/usr/bin/env python
"""Convert an mmsoft / mmpretrain SOFT checkpoint back to the official layout.

    python tools/model_converters/mmsoft2soft.py SRC DST [--stage4-heads N]
        [--trust-checkpoint]

SRC: an mmpretrain ``ImageClassifier`` checkpoint (``backbone.*`` of mmsoft's
SOFT and optionally ``head.fc.*``), e.g. written by ``soft2mmsoft.py`` or by
training with mmpretrain, or a bare SOFT backbone state dict. Checkpoints
saved during mmengine training also hold optimizer and message-hub objects;
they need ``--trust-checkpoint`` to be unpickled.

DST: ``{'state_dict': ..., 'state_dict_ema': ...}`` (the same tensors under
both names, stored once) with the official key names, loadable by the
official ``main.py --eval_checkpoint DST`` (which reads ``state_dict_ema``)
and by timm's ``load_checkpoint``, plus ``meta``. Written atomically; DST
must not be SRC; missing folders above it are created just before
writing.
"""
import os.path as osp
import sys
from collections import OrderedDict

if osp.dirname(osp.dirname(osp.abspath(__file__))) not in sys.path:  # tools/
    sys.path.insert(0, osp.dirname(osp.dirname(osp.abspath(__file__))))

from mmsoft.models.converters import (ConversionError, describe_arch,
                                      extract_state_dict,
                                      mmsoft_to_official_key,
                                      official_model_name, strip_module_prefix)
from mmsoft.utils.strict_load import few_keys
from mmsoft_tools.cli import run_main
from model_converters import checkpoint_files as files


def convert_mmpretrain_to_official(sd, stage4_heads=None, prefix='backbone.'):
    """An mmpretrain classifier's or a bare SOFT backbone's state dict (no
    key under ``prefix``) -> ``(the authors' state dict, arch)``; keys with
    no official counterpart (a neck ...) raise one :class:`ConversionError`
    naming them. The inverse of
    :func:`mmsoft.models.converters.convert_official_to_mmpretrain`."""
    sd = strip_module_prefix(sd)
    pre = prefix if any(k.startswith(prefix) for k in sd) else ''
    out, bad = OrderedDict(), []
    for k, v in sd.items():
        inner = k[len(pre):] if k.startswith(pre) else k
        new = mmsoft_to_official_key(inner)
        # a head inside the backbone or a backbone key outside it: unknown
        if new and (not pre or (inner != k) != new.startswith('head.')):
            out[new] = v
        else:
            bad.append(f'{k} {tuple(v.shape)}')
    if bad:
        raise ConversionError(
            f'the mmsoft checkpoint has keys with no official counterpart '
            f'({len(bad)}: {few_keys(bad)}); only an mmpretrain classifier '
            f"or a bare SOFT backbone converts (not a detector's or a "
            f"segmentor's checkpoint)")
    return out, files.infer_arch(out, stage4_heads)


def parse_args(argv=None):
    return files.converter_parser(
        'Convert an mmsoft (mmpretrain) SOFT checkpoint to the official '
        'fudan-zvg/SOFT layout.',
        src='mmsoft / mmpretrain checkpoint',
        dst='output official checkpoint (.pth)',
        stage4_heads='heads of stage 4 (only used for the printed '
        'architecture; default: stage 3\'s head width)',
        heads_type=files.positive_int).parse_args(argv)


def convert(args, log=print):
    files.check_output_path(args.src, args.dst)
    files.missing_output_dirs(args.dst)  # created just before writing
    files.check_readable(args.src)
    ckpt = files.load_checkpoint_file(args.src, trust=args.trust_checkpoint)
    sd, source = extract_state_dict(ckpt, prefer_ema=False)
    log(f'reading {source!r} of {args.src} ({len(sd)} tensors)')
    out, arch = convert_mmpretrain_to_official(sd, args.stage4_heads)
    files.check_converted(sd, arch, args.src)
    meta = ckpt.get('meta') if isinstance(ckpt, dict) else None
    attn_norm = meta.get('attn_norm') if isinstance(meta, dict) else None
    name = official_model_name(arch, attn_norm)
    log(f'architecture: {describe_arch(arch)}' +
        (f'  (official {name})' if name else ''))
    if attn_norm is None:
        log('note: attention normalisation is not stored in the weights: '
            'use soft_norm_* for attn_norm=True models, soft_* otherwise')
    if not arch['num_classes']:
        log('note: no head.fc.* keys; the official model needs '
            'num_classes=0 (or load with strict=False)')
    files.save_creating_dirs(
        dict(state_dict=out, state_dict_ema=out), args.dst, log)
    log(f'wrote {len(out)} tensors to {args.dst}')
    return out


def main(argv=None):
    return files.run_converter(convert, parse_args(argv))


if __name__ == '__main__':
    run_main(main)  # expected failures: one line (mmsoft_tools.cli)
