"""The converter tools' files and arguments (errors: one-line
:class:`~mmsoft.models.converters.ConversionError`), missing ImageNet files."""
import argparse
import os
import os.path as osp
import pickle
import re
import stat
import sys
from collections.abc import Mapping
from typing import Callable, Optional

import torch

from mmsoft.models.converters import (ConversionError, arch_for_mmsoft,
                                      common_shape, describe_arch,
                                      extract_state_dict, infer_official_arch,
                                      mmsoft_to_official_key)


def positive_int(text: str) -> int:
    """argparse type of counts such as ``--stage4-heads``."""
    try:
        value = int(text)
    except (TypeError, ValueError):
        value = None
    if value is None or value < 1:
        raise argparse.ArgumentTypeError(
            f'expected a positive integer, got {text!r}')
    return value


def check_readable(path: str) -> None:
    """An existing file that cannot be read: a one-line ConversionError."""
    from mmsoft.models.converters import ConversionError
    if not osp.isfile(path):
        return
    try:
        with open(path, 'rb') as f:
            f.read(1)
    except OSError as e:
        raise ConversionError(
            f'cannot read {path!r}: {e.strerror or e}' +
            (f' (errno {e.errno})' if e.errno else '') +
            '; check its permissions (ls -l) or copy it somewhere readable'
        ) from None


def load_checkpoint_file(path: str, trust: bool = False):
    """The checkpoint on the CPU, weights only unless ``trust``."""
    from mmsoft.utils.checkpoint_io import describe_damage, refusal_message
    from mmsoft.utils.safe_load import (code_globals, safe_torch_load,
                                        unsafe_globals)

    def refused():
        return [g for g in unsafe_globals(path) if g != 'argparse.Namespace']

    if not os.path.isfile(path):
        raise ConversionError(f'checkpoint {path!r} ' +
                              ('is a directory, not a file' if os.path.
                               isdir(path) else 'does not exist'))
    damage = describe_damage(path)
    if damage is not None:
        raise ConversionError(
            f'checkpoint {path!r} {damage}: the file is damaged and cannot '
            f'be converted; download or copy it again')
    if trust and code_globals(refused()):  # trusting never runs code
        raise ConversionError(refusal_message(path, refused()))
    try:
        if trust:
            ckpt = torch.load(path, map_location='cpu', weights_only=False)
        else:
            ckpt = safe_torch_load(
                path, map_location='cpu', extra=[argparse.Namespace])
    except Exception as e:  # pickle.UnpicklingError and friends
        if trust or not isinstance(e, pickle.UnpicklingError):
            first = (str(e).splitlines() or [''])[0]
            raise ConversionError(
                f'cannot load {path!r} ({type(e).__name__}: {first})'
            ) from None
        raise ConversionError(
            refusal_message(
                path, refused(), 'if you trust the file, run again with '
                '--trust-checkpoint')) from None
    return ckpt


def infer_arch(sd: Mapping, stage4_heads: Optional[int] = None) -> dict:
    """``infer_official_arch``, refusing linear landmarks and odd heads."""
    if stage4_heads is not None and (isinstance(stage4_heads, bool)
                                     or not isinstance(stage4_heads, int)
                                     or stage4_heads < 1):
        raise ConversionError(f'stage-4 heads must be a positive integer, '
                              f'got {stage4_heads!r}')
    arch = infer_official_arch(sd, stage4_heads)
    C = arch['embed_dims']
    for s in range(1, 4):
        lm, dw = (
            common_shape(sd, f'block{s}.*.att.mha.attn.{n}.weight')
            for n in ('Qlandmark_op', 'conv'))
        if len(lm) != 4 or len(dw) != 4:
            raise ConversionError(
                f'cannot infer the architecture: block{s}.*.att.mha.attn.'
                f'Qlandmark_op.weight should be (d, d, r, r) and .conv.weight '
                f'(heads, 1, k, k); found {lm} and {dw} (linear landmark ops, '
                f'sr_ratio 1, are not supported)')
        if dw[0] * lm[0] != C[s - 1]:
            raise ConversionError(
                f'inconsistent stage {s}: {dw[0]} heads (block{s}.*.att.mha.'
                f'attn.conv.weight {dw}) x head width {lm[0]} (Qlandmark_op '
                f'{lm}) != embed dim {C[s - 1]}')
    heads = arch['num_heads'][3]
    if C[3] % heads or not (stage4_heads or C[3] % lm[0] == 0):
        raise ConversionError(
            f'stage-4 heads {heads} do not divide its embed dim {C[3]}' +
            ('' if stage4_heads else f" (stage 3's head width {lm[0]}); "
             f'give them explicitly'))
    return arch


def official_weights(ckpt, src: str, ema: Optional[bool] = None):
    """``(state_dict, entry)`` of an authors' checkpoint (EMA choice)."""
    sd, entry = extract_state_dict(ckpt, prefer_ema=ema is not False)
    emas = ('state_dict_ema', 'model_ema')
    if ema is False and entry in emas:
        raise ConversionError(f'--no-ema given but {src!r} only holds EMA '
                              f'weights ({entry!r})')
    if ema and entry not in emas:
        raise ConversionError(f'--ema given but {src!r} has no '
                              f'state_dict_ema / model_ema entry (found '
                              f'{entry!r})')
    return sd, entry


_MMSOFT_KEY = re.compile(
    r'(stages\.\d+\.|patch_embeds\.\d+\.|pos_embeds\.\d+$)')


def already_mmsoft(ckpt, src: str) -> Optional[str]:
    """The line for a ``src`` already in mmsoft's layout, else None."""
    from mmsoft.models.converters import find_official_state_dict
    if find_official_state_dict(ckpt):
        return None
    try:
        sd, entry = extract_state_dict(ckpt)
    except ConversionError:
        return None
    ours = [
        k for k in sd if _MMSOFT_KEY.match(
            k[len('backbone.'):] if k.startswith('backbone.') else k)
    ]
    if not ours or len(ours) < len(sd) // 2:
        return None
    where = '' if entry == '<bare>' else f'{entry!r} '
    return (f'{src!r} is already an mmsoft checkpoint ({where}keys such as '
            f'{ours[0]!r}) and needs no conversion: use it directly, e.g. '
            f'load_from={src!r} or the backbone\'s init_cfg=dict('
            f"type='Pretrained', checkpoint={src!r}); "
            f'tools/model_converters/mmsoft2soft.py converts it to the '
            f"authors' layout")


def _special(path: str) -> Optional[str]:
    """What ``path`` is if a directory, device, FIFO or socket, else None."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next(
        (what
         for test, what in ((stat.S_ISDIR, 'a directory'),
                            (stat.S_ISCHR, 'a character device'),
                            (stat.S_ISBLK, 'a block device'),
                            (stat.S_ISFIFO, 'a FIFO'),
                            (stat.S_ISSOCK, 'a socket')) if test(mode)), None)


def check_output_path(src: str, dst: str) -> None:
    """Refuse an output that is a directory, special, or the input."""
    kind = _special(dst)
    if kind == 'a directory':
        raise ConversionError(
            f'output {dst!r} is a directory; give a file name, e.g. '
            f'{os.path.join(dst, os.path.basename(src))!r}')
    if kind is not None:
        raise ConversionError(
            f'output {dst!r} is {kind}, not a regular file: refusing to '
            f'replace it; give a file name')
    if os.path.realpath(src) == os.path.realpath(dst) or (
            os.path.exists(dst) and os.path.exists(src)
            and os.path.samefile(src, dst)):
        raise ConversionError(
            f'output {dst!r} is the input file {src!r}: refusing to replace '
            f'it; choose another output path')


def save_atomic(obj, path: str, writer=None) -> None:
    """``writer(obj, file)`` (default ``torch.save``) atomically, durably."""
    from mmsoft.utils.atomic import atomic_path
    with atomic_path(path, durable=True) as tmp:
        with open(tmp, 'xb') as f:
            (writer or torch.save)(obj, f)


def save_checkpoint_atomic(obj, path: str) -> None:
    """``torch.save`` atomically; OS errors as ConversionError."""
    from mmsoft.utils.atomic import remove_stale_temps
    path = os.path.abspath(path)
    d = os.path.dirname(path)
    if _special(path):
        raise ConversionError(f'output {path!r} is {_special(path)}, not a '
                              'regular file: refusing to replace it')
    if not os.path.isdir(d):
        raise ConversionError(f'output directory {d!r} does not exist')
    remove_stale_temps(d, name=os.path.basename(path))
    try:
        save_atomic(obj, path)
    except OSError as e:
        raise ConversionError(f'cannot write {path!r}: {e.strerror or e}' +
                              (f' (errno {e.errno})' if e.errno else '') +
                              '; nothing was written') from None


def missing_output_dirs(dst):
    """The missing folders above ``dst``, deepest first."""
    missing, d = [], osp.dirname(osp.abspath(dst))
    while not osp.lexists(d):
        missing.append(d)
        d = osp.dirname(d)
    if not osp.isdir(d):
        raise ConversionError(
            f'cannot create the output directory of {dst!r}: {d!r} is a '
            f'file, not a directory; choose another output path')
    return missing


def save_creating_dirs(obj, dst, log=print):
    """Save, creating missing folders (removed again on failure)."""
    created = missing_output_dirs(dst)

    def remove_created():
        for d in created:  # deepest first; only empty ones
            if osp.isdir(d) and not os.listdir(d):
                os.rmdir(d)

    if created:
        try:
            os.makedirs(created[0], exist_ok=True)
        except OSError as e:
            remove_created()
            raise ConversionError(
                f'cannot create the output directory {osp.dirname(dst)!r}: '
                f'{e.strerror or e}; choose another output path') from None
        log(f'created the output directory {osp.dirname(dst)}')
    try:
        save_checkpoint_atomic(obj, dst)
    except BaseException:
        remove_created()
        raise


def converter_parser(description: str, src: str, dst: str, stage4_heads: str,
                     heads_type: Callable) -> argparse.ArgumentParser:
    """``src``, ``dst``, ``--stage4-heads``, ``--trust-checkpoint``."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument('src', help=src)
    p.add_argument('dst', help=dst)
    p.add_argument(
        '--stage4-heads', type=heads_type, default=None, help=stage4_heads)
    p.add_argument(
        '--trust-checkpoint',
        action='store_true',
        help='unpickle arbitrary objects in SRC (only for files you trust)')
    return p


def run_converter(convert: Callable, args) -> int:
    """``convert(args)``: 0, or 1 after ``error: ...`` on stderr."""
    try:
        convert(args)
    except ConversionError as e:
        print(f'error: {e}', file=sys.stderr)
        return 1
    return 0


def check_converted(sd: Mapping,
                    arch: Mapping,
                    src: str,
                    official: bool = False) -> None:
    """Missing, unexpected or mis-shaped tensors: a ConversionError."""
    from mmsoft.models.backbones import SOFT
    from mmsoft.utils.strict_load import (CheckpointMismatchError,
                                          check_state_dict)
    model = SOFT(
        arch_for_mmsoft(arch),
        in_channels=arch['in_channels'],
        pretrain_img_size=arch['pretrain_img_size'])
    pre = 'backbone.' if any(k.startswith('backbone.') for k in sd) else ''
    want = {pre + k: v for k, v in model.state_dict().items()}
    if arch['num_classes']:
        c = arch['embed_dims'][3]
        want['head.fc.weight'] = torch.empty(arch['num_classes'], c)
        want['head.fc.bias'] = torch.empty(arch['num_classes'])
    if official:
        want = {
            mmsoft_to_official_key(k[len(pre):] if k.startswith(pre) else k): v
            for k, v in want.items()
        }
    try:
        check_state_dict(want, sd, repr(src),
                         f'the SOFT of its shapes ({describe_arch(arch)})')
    except CheckpointMismatchError as e:
        raise ConversionError(str(e)) from None
