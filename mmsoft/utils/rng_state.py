"""RNG states of one process (python, numpy, torch, CUDA) as plain data that
``torch.load(weights_only=True)`` reads without an allow-list."""
import random
from typing import Dict

import numpy as np
import torch


def get_rng_state() -> Dict:
    """The RNG states of this process."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = dict(
        python=random.getstate(),
        numpy=(name, torch.from_numpy(keys.astype(np.int64)), int(pos),
               int(has_gauss), float(cached)),
        torch=torch.get_rng_state())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict) -> None:
    """Restore states captured by :func:`get_rng_state`."""
    version, internal, gauss = state['python']
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state['numpy']
    np.random.set_state((name, np.asarray(keys).astype(np.uint32), int(pos),
                         int(has_gauss), float(cached)))
    torch.set_rng_state(state['torch'].cpu())
    cuda = state.get('cuda')
    if cuda is not None and torch.cuda.is_available() and \
            len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([s.cpu() for s in cuda])
