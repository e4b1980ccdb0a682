"""Keys of older mmsoft checkpoints (versions 1 and 2 of the SOFT
backbone's ``_version``) renamed to version 3.

* v1 -> v2: the stages became modules (``patch_embeds.0.*`` ->
  ``stages.0.patch_embed.*``, ``pos_embeds.0`` -> ``stages.0.pos_embed``,
  ``stages.0.1.*`` -> ``stages.0.blocks.1.*``, ``cls_token`` / ``norm.*`` ->
  ``stages.3.cls_token`` / ``stages.3.norm.*``);
* v2 -> v3: mmcv's FFN inside blocks (``ffn.fc1`` -> ``ffn.layers.0.0``,
  ``ffn.fc2`` -> ``ffn.layers.1``).

No pattern matches a version-3 key, so this is safe on files without
version metadata. Used by :meth:`mmsoft.models.SOFT.upgrade_state_dict`
(while loading), :mod:`mmsoft.models.loading` and the converters.
"""
import re
from typing import Dict, Mapping

from ..arch_zoo import NUM_STAGES

__all__ = ['upgrade_legacy_state_dict']

_FFN_LAYER = {'1': 'layers.0.0.', '2': 'layers.1.'}


def upgrade_legacy_state_dict(state_dict: Mapping,
                              prefix: str = '',
                              num_stages: int = NUM_STAGES) -> Dict:
    """``state_dict`` with its version-1 and -2 keys under ``prefix``
    renamed to version 3; other keys are kept as they are, in their order
    (and ``_metadata`` too)."""
    p = re.escape(prefix)
    last = num_stages - 1
    rules = (
        (re.compile(rf'^{p}patch_embeds\.(\d+)\.'),
         rf'{prefix}stages.\1.patch_embed.'),
        (re.compile(rf'^{p}pos_embeds\.(\d+)$'),
         rf'{prefix}stages.\1.pos_embed'),
        (re.compile(rf'^{p}stages\.(\d+)\.(\d+)\.'),
         rf'{prefix}stages.\1.blocks.\2.'),
        (re.compile(rf'^{p}cls_token$'), f'{prefix}stages.{last}.cls_token'),
        (re.compile(rf'^{p}norm\.'), f'{prefix}stages.{last}.norm.'),
    )
    ffn = re.compile(rf'^({p}stages\.\d+\.blocks\.\d+\.ffn\.)fc([12])\.')
    out = type(state_dict)() if isinstance(state_dict, dict) else {}
    for k, v in state_dict.items():
        for pattern, repl in rules:  # v1 -> v2
            new, n = pattern.subn(repl, k)
            if n:
                k = new
                break
        k = ffn.sub(lambda m: m.group(1) + _FFN_LAYER[m.group(2)], k)
        out[k] = v
    meta = getattr(state_dict, '_metadata', None)
    if meta is not None:
        out._metadata = meta
    return out
