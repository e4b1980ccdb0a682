"""Random-number-generator states of one process, as plain checkpoint data.

:func:`get_rng_state` captures python's ``random``, numpy's global
``RandomState``, torch's CPU generator and (when CUDA is initialised) every
CUDA device's generator; :func:`set_rng_state` restores them. The result
holds only ints, floats, strings, tuples and uint8 tensors, so it loads with
``torch.load(weights_only=True)`` without any allow-list.
"""
import random
from typing import Dict

import numpy as np
import torch

__all__ = ['get_rng_state', 'set_rng_state']


def get_rng_state() -> Dict:
    """The RNG states of this process."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = dict(
        python=random.getstate(),
        numpy=(name, torch.from_numpy(keys.astype(np.int64)), int(pos),
               int(has_gauss), float(cached)),
        torch=torch.get_rng_state(),
    )
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict) -> None:
    """Restore states captured by :func:`get_rng_state`."""
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state(
        (name, np.asarray(keys, dtype=np.int64).astype(np.uint32), int(pos),
         int(has_gauss), float(cached)))
    torch.set_rng_state(state['torch'].cpu())
    cuda = state.get('cuda')
    if cuda is not None and torch.cuda.is_available() and \
            len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
