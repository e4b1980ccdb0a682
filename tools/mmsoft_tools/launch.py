"""What ``tools/train.py`` / ``tools/test.py`` do to a config before the
Runner is built: codebase, CPU distributed, ``--amp``, run name, lock."""
import importlib
import itertools
import logging
import os
import os.path as osp
import sys
from typing import Optional

import torch
from mmengine.logging import print_log

from mmsoft.engine.optimizers import \
    CPUAmpOptimWrapper  # noqa: F401  (registers what enable_amp sets)

#: the codebases (``default_scope`` = the python package)
CODEBASES = {'mmpretrain': 'mmpretrain', 'mmdet': 'mmdet', 'mmseg': 'mmseg'}


def _dicts(node):
    """Every dict in a config node (``cfg.model``, ...), depth first."""
    if isinstance(node, dict):
        yield node
        node = list(node.values())
    if isinstance(node, (list, tuple)):
        for val in node:
            yield from _dicts(val)


def lock_work_dir(cfg, launcher: str = 'none'):
    """The work dir's lock, taken on rank 0 (None on the others)."""
    from mmsoft_tools.data_check import launcher_rank
    from mmsoft_tools.work_dir_lock import WorkDirLock
    if launcher_rank(launcher) != 0:
        return None
    return WorkDirLock(cfg.work_dir).acquire()


def codebase_of(cfg) -> str:
    """The codebase of a config, from its ``default_scope``."""
    scope = cfg.get('default_scope', None)
    if scope not in CODEBASES:
        raise ValueError(
            f'cannot tell which codebase runs this config: default_scope is '
            f'{scope!r}, expected one of {sorted(CODEBASES)} (configs inherit '
            f"it from e.g. 'mmdet::_base_/default_runtime.py')")
    return scope


def import_codebase(cfg) -> str:
    """Import the config's codebase and register all of its modules."""
    scope = codebase_of(cfg)
    utils = importlib.import_module(f'{CODEBASES[scope]}.utils')
    utils.register_all_modules(init_default_scope=False)
    return scope


def _sync_bn_to_bn(node) -> int:
    """Every ``SyncBN`` / ``MMSyncBN`` of a config node -> ``BN``; a count."""
    count = 0
    for sub in _dicts(node):
        if sub.get('type') in ('SyncBN', 'MMSyncBN'):
            sub['type'] = 'BN'
            count += 1
    return count


def _log_rank0(msg, **kwargs):
    """print_log on rank 0 (before the process group exists)."""
    rank = os.environ.get('RANK', os.environ.get('SLURM_PROCID', '0'))
    if rank == '0':
        print_log(msg, logger='current', **kwargs)


def _cuda_set_device_disabled():
    """A context in which ``torch.cuda.set_device`` is a no-op."""
    from unittest import mock
    return mock.patch.object(torch.cuda, 'set_device', lambda device: None)


def setup_cpu_distributed(cfg, launcher: str) -> bool:
    """``--launcher`` without CUDA: gloo, CPU DDP, BN for SyncBN; applied?"""
    if launcher == 'none' or torch.cuda.is_available():
        return False
    from mmengine.dist import init_dist, is_distributed
    from mmengine.registry import MODEL_WRAPPERS
    from mmengine.utils.dl_utils import set_multi_processing

    # (ConfigDict.setdefault returns the plain dict: assign, read back)
    if cfg.get('env_cfg', None) is None:
        cfg.env_cfg = dict()
    env_cfg = cfg.env_cfg
    if env_cfg.get('dist_cfg', None) is None:
        env_cfg.dist_cfg = dict()
    dist_cfg = env_cfg.dist_cfg
    if dist_cfg.get('backend', 'nccl') != 'gloo':
        _log_rank0(f"CUDA is not available: distributed backend "
                   f"{dist_cfg.get('backend', 'nccl')!r} -> 'gloo'")
        dist_cfg['backend'] = 'gloo'

    wrapper = cfg.get('model_wrapper_cfg', None)
    if wrapper is None:
        wrapper = dict(
            type='MMDistributedDataParallel',
            broadcast_buffers=False,
            find_unused_parameters=cfg.get('find_unused_parameters', False))
    wrapper_type = MODEL_WRAPPERS.get(
        wrapper.get('type', 'MMDistributedDataParallel'))
    if isinstance(wrapper_type, type) and issubclass(
            wrapper_type, torch.nn.parallel.DistributedDataParallel):
        wrapper['device_ids'] = None  # CPU module: DDP needs device_ids=None
    cfg.model_wrapper_cfg = wrapper

    n_sync = _sync_bn_to_bn(cfg.get('model', None))
    if cfg.get('sync_bn', None) is not None:
        cfg.sync_bn = None
        n_sync += 1
    if n_sync:
        _log_rank0(
            f'CUDA is not available: {n_sync} SyncBN setting(s) of the config '
            'replaced by BN (SyncBatchNorm has no CPU implementation)',
            level=logging.WARNING)

    if not is_distributed():
        mp_cfg = env_cfg.get('mp_cfg', dict())
        set_multi_processing(**mp_cfg, distributed=True)
        with _cuda_set_device_disabled():
            init_dist(launcher, **dist_cfg)
    return True


#: mmcv ops whose CPU kernels reject bfloat16 inputs
_NO_BF16_CPU_OPS = {'RoIAlign'}


def _types_in(node) -> set:
    return {d['type'] for d in _dicts(node) if isinstance(d.get('type'), str)}


def enable_amp(cfg) -> str:
    """``--amp``: AmpOptimWrapper on CUDA, else CPUAmpOptimWrapper (bf16)."""
    optim_wrapper = cfg.optim_wrapper.get('type', 'OptimWrapper')
    if optim_wrapper == 'CPUAmpOptimWrapper' or (
            optim_wrapper == 'AmpOptimWrapper' and torch.cuda.is_available()):
        print_log(
            'AMP training is already enabled in your config.',
            logger='current',
            level=logging.WARNING)
        return optim_wrapper
    # without CUDA the config's AmpOptimWrapper becomes CPUAmpOptimWrapper
    if optim_wrapper not in ('OptimWrapper', 'AmpOptimWrapper'):
        raise ValueError('`--amp` is only supported when the optimizer '
                         'wrapper type is `OptimWrapper`, but got '
                         f'{optim_wrapper}.')
    if torch.cuda.is_available():
        cfg.optim_wrapper.type = 'AmpOptimWrapper'
        cfg.optim_wrapper.loss_scale = 'dynamic'
    else:
        cpu_only = _types_in(cfg.get('model', None)) & _NO_BF16_CPU_OPS
        if cpu_only:
            raise ValueError(
                f'--amp without CUDA trains under bfloat16 autocast, but '
                f'this model uses {sorted(cpu_only)}, whose mmcv CPU kernel '
                f'has no bfloat16 version; train it without --amp (or on a '
                f'GPU).')
        _log_rank0(
            '--amp without CUDA: training under bfloat16 CPU autocast '
            '(CPUAmpOptimWrapper, no loss scaling); fp16 AMP needs a GPU.',
            level=logging.WARNING)
        cfg.optim_wrapper.type = 'CPUAmpOptimWrapper'
        cfg.optim_wrapper.pop('loss_scale', None)  # fp16's, not bfloat16's
    return cfg.optim_wrapper.type


def amp_refusal(cfg) -> Optional[str]:
    """Why the fp16 ``AmpOptimWrapper`` cannot train here (no GPU), or None."""
    from mmengine.device import (is_cuda_available, is_mlu_available,
                                 is_musa_available, is_npu_available)
    wrapper = cfg.get('optim_wrapper', None) or {}
    kind = str(wrapper.get('type', '')) if hasattr(wrapper, 'get') else ''
    if kind.split('.')[-1] != 'AmpOptimWrapper' or any(
            f() for f in (is_cuda_available, is_npu_available,
                          is_mlu_available, is_musa_available)):
        return None
    return (f'optim_wrapper.type={kind} (mmengine\'s fp16 AMP) needs a GPU '
            f'and this machine has none (torch.cuda.is_available() is '
            f'False): pass --amp instead (without CUDA: mmsoft\'s '
            f'CPUAmpOptimWrapper, bfloat16 autocast), or train in fp32 '
            f'(optim_wrapper.type=OptimWrapper)')


#: runs named by :func:`name_run` in this process (1, 2, ...)
_RUNS = itertools.count(1)


def name_run(cfg) -> str:
    """``cfg.experiment_name``, with ``_<n>`` for the n-th run of a process."""
    n = next(_RUNS)
    base = cfg.get('experiment_name', None) or osp.splitext(
        osp.basename(cfg.filename or 'run'))[0]
    cfg.experiment_name = base if n == 1 else f'{base}_{n}'
    return cfg.experiment_name


#: the oldest torch whose compiled ``train_step`` runs (2.1 crashes)
COMPILE_MIN_TORCH = '2.4'


def compile_refusal(cfg, torch_version: Optional[str] = None) -> Optional[str]:
    """A line when ``compile`` needs a newer torch, else None."""
    from mmsoft.compat import torch_version as version_of
    comp = cfg.get('compile', False)
    if not comp:
        return None
    if torch_version is None:
        torch_version = torch.__version__
    if version_of(torch_version) >= version_of(COMPILE_MIN_TORCH):
        return None
    return (f'error: compile={comp!r} needs torch >= {COMPILE_MIN_TORCH}: '
            f"with torch {torch_version} mmengine's compiled train_step "
            f'crashes (a torch bug); remove compile from the config (or its '
            f'--cfg-options) or upgrade torch')


def prepare_cfg(cfg, launcher: str = 'none') -> str:
    """Check compile, import the codebase, set up CPU DDP, name the run."""
    refusal = compile_refusal(cfg)
    if refusal is not None:
        sys.exit(refusal)
    scope = import_codebase(cfg)
    setup_cpu_distributed(cfg, launcher)
    name_run(cfg)
    return scope


def shutdown_dist():
    """Tear the process groups down (a barrier first, on success)."""
    import gc

    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()):
        return
    if sys.exc_info()[0] is None:
        try:
            dist.barrier()
        except Exception as e:  # pragma: no cover (a peer already left)
            _log_rank0(
                f'shutdown_dist: barrier failed ({e}); tearing the '
                'process group down anyway',
                level=logging.WARNING)
    dist.destroy_process_group()
    gc.collect()
