"""What ``tools/train.py`` / ``tools/test.py`` do to a config of any of
the three codebases before the Runner is built: import the codebase of its
``default_scope``, ``--launcher pytorch`` / ``slurm`` without CUDA
(:func:`setup_cpu_distributed`), ``--amp`` (:func:`enable_amp`), a run name
of its own (:func:`name_run`), one run per work dir (:func:`lock_work_dir`)
and the process group's tear-down (:func:`shutdown_dist`)."""
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

__all__ = [
    'quiet_init_weights', 'lock_work_dir', 'CODEBASES', 'codebase_of',
    'import_codebase', 'setup_cpu_distributed', 'enable_amp', 'name_run',
    'compile_refusal', 'COMPILE_MIN_TORCH', 'prepare_cfg', 'amp_refusal'
]

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
    """The work dir's lock (:class:`mmsoft_tools.work_dir_lock.WorkDirLock`,
    taken on rank 0; None on the others): another live run there raises
    ``WorkDirLockedError``."""
    from mmsoft_tools.data_check import launcher_rank
    from mmsoft_tools.work_dir_lock import WorkDirLock
    if launcher_rank(launcher) != 0:
        return None
    return WorkDirLock(cfg.work_dir).acquire()


def quiet_init_weights(model) -> None:
    """``model.init_weights()`` without mmengine's INFO line per parameter
    (hundreds, burying a tool's output); warnings still show."""
    from mmengine.logging import MMLogger
    logger = MMLogger.get_current_instance()
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        model.init_weights()
    finally:
        logger.setLevel(level)


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
    """Every ``SyncBN`` / ``MMSyncBN`` of a config node -> ``BN``, in place;
    returns how many. In the config: the Runner builds and wraps the model
    in DDP in one go (DDP refuses SyncBatchNorm on CPU), too early for
    mmengine's ``revert_sync_batchnorm``."""
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
    """``--launcher pytorch`` / ``slurm`` without CUDA, where mmengine
    0.10.7 assumes a GPU per process (``init_dist`` calls
    ``torch.cuda.set_device``; DDP gets ``device_ids=[local_rank]``): the
    gloo backend, the process group initialised here while ``set_device``
    is a no-op, a CPU DDP (``device_ids=None``) and ``BN`` for ``SyncBN``
    (no CPU kernel; each process keeps its statistics). Returns True when
    applied (never with CUDA or ``launcher='none'``)."""
    if launcher == 'none' or torch.cuda.is_available():
        return False
    from mmengine.dist import init_dist, is_distributed
    from mmengine.registry import MODEL_WRAPPERS
    from mmengine.utils.dl_utils import set_multi_processing

    # (ConfigDict.setdefault returns the plain dict it was given, not the
    # ConfigDict it stores: assign, then read back)
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


#: mmcv ops whose CPU kernels reject bfloat16 inputs (RoI-based detectors:
#: Mask / Cascade Mask / Sparse R-CNN)
_NO_BF16_CPU_OPS = {'RoIAlign'}


def _types_in(node) -> set:
    return {d['type'] for d in _dicts(node) if isinstance(d.get('type'), str)}


def enable_amp(cfg) -> str:
    """What ``--amp`` does (returns the optim wrapper type set): mmengine's
    ``AmpOptimWrapper`` with a dynamic loss scale on CUDA, as in mmdet;
    without CUDA (no fp16 autocast there) mmsoft's ``CPUAmpOptimWrapper``
    under bfloat16 autocast, refused for mmcv ops without a bfloat16 CPU
    kernel."""
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
    """Why the config's ``optim_wrapper`` (mmengine's fp16
    ``AmpOptimWrapper``) cannot train here, without a GPU, or None (its own
    assertion comes after the Runner's log)."""
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
    """``cfg.experiment_name`` (returned): the config's (or its file's)
    name, ``_<n>`` appended for the n-th run of this process. mmengine
    fetches a run's logger, message hub and visualizer by
    ``<name>_<timestamp>``: two runs in one second of one process (a
    sweep, a test) shared them. Every rank counts alike."""
    n = next(_RUNS)
    base = cfg.get('experiment_name', None) or osp.splitext(
        osp.basename(cfg.filename or 'run'))[0]
    cfg.experiment_name = base if n == 1 else f'{base}_{n}'
    return cfg.experiment_name


#: the oldest torch whose ``torch.compile`` of mmengine's ``train_step``
#: the support matrix ran (torch 2.1 crashes in ``stack_batch``)
COMPILE_MIN_TORCH = '2.4'


def compile_refusal(cfg, torch_version: Optional[str] = None) -> Optional[str]:
    """One line when ``cfg`` asks mmengine to ``compile`` on a torch
    (default: the installed one) older than :data:`COMPILE_MIN_TORCH`."""
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
    """:func:`compile_refusal`, :func:`import_codebase`,
    :func:`setup_cpu_distributed` and :func:`name_run`; returns the
    codebase (default scope)."""
    refusal = compile_refusal(cfg)
    if refusal is not None:
        sys.exit(refusal)
    scope = import_codebase(cfg)
    setup_cpu_distributed(cfg, launcher)
    name_run(cfg)
    return scope


def shutdown_dist():
    """Tear the process groups down before the interpreter exits: left to
    finalization, gloo's threads can abort the process ("terminate called
    without an active exception") after a finished run. A barrier first on
    success (no rank leaves another in the last collective; skipped while
    an exception propagates: a peer may be gone), then
    ``destroy_process_group()`` and a garbage collection (DDP wrappers and
    work handles freed with the interpreter alive)."""
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
