"""The strict pretrained load of the SOFT backbone (``SOFTPretrained``).

``init_cfg=dict(type='Pretrained', checkpoint=..., prefix=..., strict=...)``
on :class:`~mmsoft.models.backbones.SOFT` runs :class:`SOFTPretrainedInit`
(registered as ``'SOFTPretrained'`` in MMEngine's root
``WEIGHT_INITIALIZERS``, so it can also be named directly in any
``init_cfg``) instead of MMEngine's ``PretrainedInit``, which loads with
``strict=False`` and only logs a WARNING for wrong weights. The checkpoint
is compared with the module first
(:func:`mmsoft.utils.strict_load.check_state_dict`): missing, unexpected or
mis-shaped tensors raise
:class:`~mmsoft.utils.strict_load.CheckpointMismatchError`, an unconverted
official SOFT checkpoint gets the converter command, and ``strict=False``
allows intended partial loads. Keys of older SOFT checkpoint layouts are
upgraded before the comparison (:func:`upgrade_legacy_keys`).
"""
from collections import OrderedDict
from typing import Mapping, Optional

import torch
from mmengine.logging import print_log
from mmengine.model.weight_init import update_init_info
from mmengine.registry import WEIGHT_INITIALIZERS

from mmsoft.runtime import setup
from mmsoft.utils.strict_load import (CheckpointMismatchError, LoadReport,
                                      check_state_dict, few_keys, strip_prefix)
from .soft import SOFT

__all__ = [
    'SOFTPretrainedInit', 'load_pretrained', 'upgrade_legacy_keys',
    'check_attn_norm', 'check_checkpoint_for_model'
]

#: how a partial load of the backbone's init_cfg is allowed (in the error)
BACKBONE_OPT_IN = 'set model.backbone.init_cfg.strict=False'


def _official_hint(checkpoint, source) -> Optional[str]:
    from mmsoft.models.converters.official_keys import official_soft_hint
    return official_soft_hint(checkpoint, source)


def upgrade_legacy_keys(model: torch.nn.Module, sd: Mapping) -> Mapping:
    """``sd`` with the keys of older SOFT checkpoint layouts renamed for
    every SOFT backbone inside ``model`` (what its ``_load_from_state_dict``
    does while loading), so that they are compared under the new names."""
    for name, mod in model.named_modules():
        if isinstance(mod, SOFT):
            sd = SOFT.upgrade_state_dict(sd, f'{name}.' if name else '')
    return sd


def _attn_norms(model: torch.nn.Module) -> set:
    """The ``attn_norm`` values of the SOFT attentions inside ``model``."""
    from mmsoft.models.layers.soft_attention import SOFTAttention
    return {
        m.attn_norm
        for m in model.modules() if isinstance(m, SOFTAttention)
    }


def check_attn_norm(model: torch.nn.Module,
                    checkpoint,
                    source: str,
                    config: Optional[str] = None) -> None:
    """Refuse weights converted for the other attention normalisation.

    ``soft_*`` and ``soft_norm_*`` weights have the same tensors, so the
    shape check cannot tell them apart; ``soft2mmsoft.py`` records the
    choice (``--norm``) as ``meta['attn_norm']`` (and the official model's
    name as ``meta['official_model']``). When the checkpoint has that record
    and ``model``'s SOFT attentions use the other setting, raise
    :class:`CheckpointMismatchError` naming both and the fixes.
    """
    meta = checkpoint.get('meta') if isinstance(checkpoint, Mapping) else None
    want = meta.get('attn_norm') if isinstance(meta, Mapping) else None
    if not isinstance(want, bool):
        return
    have = _attn_norms(model)
    if not have or have == {want}:
        return
    name = meta.get('official_model') or \
        ('soft_norm_*' if want else 'soft_*')
    kind = 'soft_norm_* (attn_norm=True)' if not want else \
        'soft_* (attn_norm=False)'
    cfg = f' of {config}' if config else ''
    raise CheckpointMismatchError(
        f'checkpoint {source} holds {name} weights (converted with '
        f'attn_norm={want}{", --norm" if want else ", no --norm"}), but the '
        f'model{cfg} is a {kind} model: its SOFT attention has '
        f'attn_norm={not want}. Use a {"soft_norm_*" if want else "soft_*"} '
        f'config or --cfg-options model.backbone.attn_cfg.attn_norm={want}; '
        f'if the weights are {"soft_*" if want else "soft_norm_*"} ones, '
        f'convert them again {"without" if want else "with"} --norm.')


def check_checkpoint_for_model(model: torch.nn.Module,
                               checkpoint,
                               source: str,
                               allow_partial: bool = False,
                               opt_in: str = '',
                               config: Optional[str] = None) -> LoadReport:
    """Check a loaded checkpoint (dict) against a whole model before it is
    loaded: keys and shapes (:func:`check_state_dict`, legacy SOFT keys
    upgraded, ``module.`` prefixes stripped, the converter command for an
    unconverted official checkpoint) and the attention normalisation
    recorded by the converter (:func:`check_attn_norm`). Used by
    ``StrictLoadHook`` (``tools/train.py`` ``load_from`` / ``--resume``,
    ``tools/test.py``), ``demo/image_demo.py`` and the ONNX export."""
    from mmsoft.utils.strict_load import unwrap_model
    model = unwrap_model(model)
    sd = checkpoint.get('state_dict', checkpoint) \
        if isinstance(checkpoint, Mapping) else checkpoint
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {source} holds a {type(sd).__name__}, not a state '
            f'dict')
    report = check_state_dict(
        model.state_dict(),
        upgrade_legacy_keys(model, strip_prefix(sd)),
        source,
        f'the model ({type(model).__name__})',
        allow_partial=allow_partial,
        opt_in=opt_in,
        hint=lambda: _official_hint(checkpoint, source))
    check_attn_norm(model, checkpoint, source, config)
    return report


def load_pretrained(module: torch.nn.Module,
                    checkpoint: str,
                    prefix: Optional[str] = None,
                    map_location='cpu',
                    strict: bool = True,
                    opt_in: str = '') -> LoadReport:
    """``init_cfg=dict(type='Pretrained', ...)`` with a strict check.

    Reads ``checkpoint`` with MMEngine's loader, takes its ``state_dict``
    (the keys under ``prefix``, e.g. ``'backbone.'`` of a whole classifier
    checkpoint; the other keys, such as the head, are ignored), checks it
    against ``module`` (:func:`~mmsoft.utils.strict_load.check_state_dict`;
    ``strict=False`` allows partial loads) and loads the matching tensors.
    """
    from mmengine.runner.checkpoint import _load_checkpoint
    ckpt = _load_checkpoint(checkpoint, map_location=map_location)
    sd = ckpt['state_dict'] if isinstance(ckpt, Mapping) and \
        'state_dict' in ckpt else ckpt
    if not isinstance(sd, Mapping):
        raise CheckpointMismatchError(
            f'checkpoint {checkpoint} holds a {type(sd).__name__}, not a '
            f'state dict')
    sd = strip_prefix(sd)
    if prefix:
        p = prefix if prefix.endswith('.') else prefix + '.'
        selected = OrderedDict(
            (k[len(p):], v) for k, v in sd.items() if k.startswith(p))
        if not selected:
            hint = _official_hint(ckpt, checkpoint)
            raise CheckpointMismatchError(
                f'checkpoint {checkpoint} has no tensor under the prefix '
                f'{p!r} (init_cfg.prefix); its keys look like '
                f'{few_keys(list(map(str, sd)))}' +
                (f'\n  {hint}' if hint else ''))
        sd = selected
    sd = upgrade_legacy_keys(module, sd)
    target = type(module).__name__ + (f' (checkpoint keys under {prefix!r})'
                                      if prefix else '')
    report = check_state_dict(
        module.state_dict(),
        sd,
        str(checkpoint),
        target,
        allow_partial=not strict,
        opt_in=opt_in,
        hint=lambda: _official_hint(ckpt, str(checkpoint)))
    check_attn_norm(module, ckpt, str(checkpoint))
    bad = {k for k, _, _ in report.mismatched}
    module.load_state_dict(
        OrderedDict((k, v) for k, v in sd.items() if k not in bad),
        strict=False)
    print_log(
        f'{type(module).__name__}: loaded {report.matched} tensors '
        f'from {checkpoint}',
        logger='current')
    return report


@WEIGHT_INITIALIZERS.register_module(name='SOFTPretrained')
class SOFTPretrainedInit:
    """Initialise a module from a checkpoint, strictly (module docstring).

    Args:
        checkpoint (str): the checkpoint file (or URL) to load.
        prefix (str, optional): load the keys under this prefix (e.g.
            ``'backbone.'`` of a whole classifier checkpoint). Default: None.
        map_location (str): where tensors are loaded. Default: 'cpu'.
        strict (bool): a mismatch is an error; False logs it and loads the
            matching tensors (loading nothing is an error even then).
            Default: True.
        opt_in (str): how to allow a partial load, shown in the error.
            Default: the backbone's ``init_cfg.strict=False``.
    """

    def __init__(self,
                 checkpoint: str,
                 prefix: Optional[str] = None,
                 map_location='cpu',
                 strict: bool = True,
                 opt_in: str = BACKBONE_OPT_IN):
        self.checkpoint = checkpoint
        self.prefix = prefix
        self.map_location = map_location
        self.strict = strict
        self.opt_in = opt_in

    def __call__(self, module: torch.nn.Module) -> None:
        setup()  # verified loader, allow-list (mmsoft.runtime)
        load_pretrained(
            module,
            self.checkpoint,
            prefix=self.prefix,
            map_location=self.map_location,
            strict=self.strict,
            opt_in=self.opt_in)
        if hasattr(module, '_params_init_info'):
            update_init_info(module, init_info=self._get_init_info())

    def _get_init_info(self) -> str:
        return f'{self.__class__.__name__}: load from {self.checkpoint}'
