""":mod:`mmsoft.utils.rng_state`: CUDA's RNG states saved when in use and
restored with the same number of GPUs (CUDA faked)."""
import torch

from mmsoft.utils.rng_state import get_rng_state, set_rng_state


def test_cuda_rng_states_round_trip(monkeypatch):
    gpus = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4])]
    restored, count = [], [len(gpus)]
    cuda = torch.cuda
    monkeypatch.setattr(cuda, 'is_available', lambda: True)
    monkeypatch.setattr(cuda, 'is_initialized', lambda: True)
    monkeypatch.setattr(cuda, 'get_rng_state_all', lambda: gpus)
    monkeypatch.setattr(cuda, 'device_count', lambda: count[0])
    monkeypatch.setattr(cuda, 'set_rng_state_all', restored.append)
    state = get_rng_state()
    assert state['cuda'] is gpus
    set_rng_state(state)
    assert len(restored) == 1 and len(restored[0]) == 2
    assert all(torch.equal(a, b) for a, b in zip(restored[0], gpus))
    count[0] = 4  # resumed on another number of GPUs: CPU states only
    set_rng_state(state)
    assert len(restored) == 1
    # a checkpoint of a CPU run: nothing to restore on the GPUs
    set_rng_state({k: v for k, v in state.items() if k != 'cuda'})
    assert len(restored) == 1
    # CUDA available but never used: no CUDA states (none initialised)
    monkeypatch.setattr(cuda, 'is_initialized', lambda: False)
    assert 'cuda' not in get_rng_state()
    monkeypatch.setattr(cuda, 'is_available', lambda: False)
    monkeypatch.setattr(cuda, 'is_initialized', lambda: True)
    assert 'cuda' not in get_rng_state()
