"""What several test files share (fixtures; ``from conftest import``)."""
import contextlib
import functools
import importlib
import importlib.util
import io
import json
import os
import os.path as osp
import runpy
import signal
import socket
import subprocess
import sys
import zipfile

import pytest
import torch
from mmengine.hooks import Hook

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
CONFIGS = osp.join(ROOT, 'configs')
TOOLS = osp.join(ROOT, 'tools')
sys.path.append(TOOLS)  # the tools' own package, mmsoft_tools
sys.path.append(ROOT)  # projects/ (projects.attention_zoo), from any cwd


def pytest_terminal_summary(terminalreporter, config):
    """pytest-randomly's seed, also under ``-q`` (which hides its header)."""
    seed = getattr(config.option, 'randomly_seed', None)
    if config.pluginmanager.hasplugin('randomly') and isinstance(seed, int):
        terminalreporter.write_line(
            f'test order: random, --randomly-seed={seed} (make test '
            f'SEED={seed} replays it)')


def child_env(**extra):
    """``os.environ`` for this checkout's mmsoft; ``extra`` (None: unset)."""
    path = os.pathsep.join(p for p in (ROOT, os.environ.get('PYTHONPATH'))
                           if p)  # yapf: disable
    env = dict(os.environ, PYTHON=sys.executable, OMP_NUM_THREADS='1',
               PYTHONWARNINGS='ignore', PYTHONPATH=path)  # yapf: disable
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def run(cmd, cwd=ROOT, timeout=600, env=None, **extra_env):
    """``cmd``, text output captured, in ``child_env(**extra_env)``."""
    env = child_env(**extra_env) if env is None else env
    return subprocess.run([str(c) for c in cmd], cwd=str(cwd), env=env,
                          capture_output=True, text=True,
                          timeout=timeout)  # yapf: disable


def run_python(code, **kwargs):
    return run([sys.executable, '-c', code], **kwargs)


def dead_pid():  # the id of a process that has exited
    return run_python('import os; print(os.getpid())').stdout.strip()


@contextlib.contextmanager
def work_dir_holder(work, seconds=120):
    """A child holding ``work``'s ``WorkDirLock`` in the block."""
    code = (f'import sys, time; sys.path.insert(0, {TOOLS!r}); '
            'from mmsoft_tools.work_dir_lock import WorkDirLock; '
            f'lock = WorkDirLock({work!r}).acquire(); '
            f'print("held", flush=True); time.sleep({seconds})')
    holder = subprocess.Popen([sys.executable, '-c', code], cwd=ROOT,
                              env=child_env(), stdout=subprocess.PIPE,
                              text=True)  # yapf: disable
    try:
        assert holder.stdout.readline().strip() == 'held'
        yield holder
    finally:
        holder.kill()
        holder.wait()


#: imports the stacks, then per json request line forks a child that runs
#: the script as ``python script argv`` would; answers ``rc <code>``
SCRIPT_SERVER = r"""
import atexit, json, os, runpy, signal, sys, traceback
import torch, mmcv, mmengine.runner, mmpretrain.models, mmpretrain.datasets
import mmsoft
base = list(sys.path[1:])
print('ready', flush=True)
for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        write = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        for fd, path, mode in ((0, os.devnull, os.O_RDONLY),
                               (1, req['stdout'], write),
                               (2, req['stderr'], write)):
            f = os.open(path, mode, 0o644)
            os.dup2(f, fd)
            os.close(f)
        os.chdir(req['cwd'])
        os.environ.clear()
        os.environ.update(req['env'])
        sys.argv = [req['script']] + req['argv']
        sys.path[:] = [os.path.dirname(req['script'])] + base
        signal.alarm(req['timeout'])  # a hung script: killed, rc -14
        code = 0
        try:
            exec(req['setup'], {})
            runpy.run_path(req['script'], run_name='__main__')
        except SystemExit as e:  # as the interpreter reports it
            code = e.code if isinstance(e.code, int) else e.code is not None
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 1
        # no C++ static destructors: a parent's library thread (onnxruntime)
        # is missing here and destroying what it waits on hangs (torch 2.1)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(int(code))
    _, status = os.waitpid(pid, 0)
    print(f'rc {os.waitstatus_to_exitcode(status)}', flush=True)
"""


@pytest.fixture(scope='session')
def script_server(tmp_path_factory):
    """``run(script, argv, ...)``: forked from a process with the stacks."""
    pytest.importorskip('mmpretrain')
    server = subprocess.Popen([sys.executable, '-c', SCRIPT_SERVER], cwd=ROOT,
                              env=child_env(), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE,
                              text=True)  # yapf: disable
    assert server.stdout.readline().strip() == 'ready'
    tmp, count = tmp_path_factory.mktemp('script_server'), [0]

    def run_script(script, argv, cwd=ROOT, env=None, setup='', timeout=300):
        count[0] += 1
        out, err = (tmp / f'{count[0]}.{s}' for s in ('out', 'err'))
        req = dict(script=str(script), argv=[str(a) for a in argv],
                   cwd=str(cwd), env=child_env() if env is None else env,
                   stdout=str(out), stderr=str(err), setup=setup,
                   timeout=timeout)  # yapf: disable
        server.stdin.write(json.dumps(req) + '\n')
        server.stdin.flush()
        answer = server.stdout.readline().split()
        assert answer[:1] == ['rc'], f'the script server stopped: {answer}'
        return subprocess.CompletedProcess([script] + argv, int(answer[1]),
                                           out.read_text(), err.read_text())

    yield run_script
    server.stdin.close()
    server.wait(timeout=60)


@contextlib.contextmanager
def current_log(level=None):
    """The records of a fresh current MMLogger in the block."""
    import logging

    from mmengine.logging import MMLogger
    records, handler = [], logging.Handler()
    name = f'mmsoft_test_log_{id(records)}'
    logger = MMLogger.get_instance(
        name, logger_name=name, log_level=level or logging.INFO)
    handler.emit = records.append
    logger.addHandler(handler)
    try:
        assert MMLogger.get_current_instance() is logger
        yield records
    finally:
        logger.removeHandler(handler)
        MMLogger._instance_dict.pop(name, None)


@contextlib.contextmanager
def deadline(seconds=2.0):
    """``TimeoutError`` in the block after ``seconds`` (SIGALRM)."""

    def _expire(signum, frame):
        raise TimeoutError(f'still running after {seconds} s')

    old = signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def load_module(path, name):
    """The file at ``path`` as a module ``name`` (not in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_tool(relpath, name=None):
    """``tools/<relpath>``, its folder on ``sys.path`` as when run."""
    path = osp.join(TOOLS, relpath)
    if osp.dirname(path) not in sys.path:
        sys.path.insert(0, osp.dirname(path))
    return load_module(path, name or '_tool_' + relpath[:-3].replace('/', '_'))


def tool_namespace(name, run_name='tools'):
    """The namespace of ``tools/<name>.py`` run, not as ``__main__``."""
    return runpy.run_path(osp.join(TOOLS, name + '.py'), run_name=run_name)


def tiny_arch(embed_dims=(16, 32, 32, 64), num_heads=(1, 1, 1, 2),
              depths=(1, 1, 1, 1), **extra):  # yapf: disable
    """A tiny SOFT ``arch`` dict (lists, as a config writes them)."""
    return dict(embed_dims=list(embed_dims), num_heads=list(num_heads),
                depths=list(depths), **extra)  # yapf: disable


def save_classifier_checkpoint(path, backbone, head=None, **extra):
    """``{'state_dict': backbone.* + head, **extra}`` saved; the dict."""
    sd = {f'backbone.{k}': v for k, v in backbone.state_dict().items()}
    sd.update(head or {})
    torch.save(dict(state_dict=sd, **extra), str(path))
    return sd


def random_model(cfg):
    """A config's model, built in its codebase, ``init_weights``-ed."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from mmsoft_tools import launch
    cfg = cfg if isinstance(cfg, Config) else Config.fromfile(str(cfg))
    scope = launch.import_codebase(cfg)
    with DefaultScope.overwrite_default_scope(scope):
        model = importlib.import_module(f'{scope}.registry').MODELS.build(
            cfg.model)
        model.init_weights()
    return model


def check_hooks(cfg):  # mmsoft's hooks in a shipped config
    hooks = {h['type'] for h in cfg.custom_hooks}
    assert {'StrictLoadHook', 'NonFiniteLossHook'} <= hooks, hooks
    assert cfg.default_hooks.checkpoint.type == 'SafeCheckpointHook'


def demo_support():  # (demo_synthetic, demo_tasks), or skipped
    for codebase in ('mmdet', 'mmseg', 'mmpretrain'):
        pytest.importorskip(codebase)
    import demo_synthetic
    import demo_tasks
    return demo_synthetic, demo_tasks


def tiny_demo_data(num_train):
    """``make_demo_data`` overrides: det / seg ``num_train`` and 2, cls 5."""
    tiny = {t: dict(num_train=num_train, num_val=2) for t in ('det', 'seg')}
    tiny['cls'] = dict(num_train=5, num_val=5)
    return tiny


def cls_demo_config(tmp, **batch_size):
    """``tmp/cls.py``: the cls demo on 2 + 4 images; per-split batch size."""
    import demo_synthetic
    demo_synthetic.make_demo_data(
        str(tmp / 'data'), tasks=('cls', ), workers=1, log=None,
        overrides={'cls': dict(num_train=2, num_val=4)})  # yapf: disable
    root = str(tmp / 'data' / 'imagenet') + '/'
    lines = [f"_base_ = {osp.join(CONFIGS, 'demo', 'soft_cls_demo.py')!r}",
             f'data_root = {root!r}',
             'train_dataloader = dict(dataset=dict(data_root=data_root))'] + [
        f'{split}_dataloader = dict(batch_size={n}, '
        'dataset=dict(data_root=data_root))'
        for split, n in batch_size.items()]  # yapf: disable
    (tmp / 'cls.py').write_text('\n'.join(lines) + '\n')
    return str(tmp / 'cls.py')


_AUTHORS_FILES = {}


def authors_file(path, arch):
    """An authors'-layout file of ``arch`` (zeros); its number of tensors."""
    if arch not in _AUTHORS_FILES:
        from reference.official_soft_ref import random_official_state_dict

        from mmsoft.models.arch_zoo import ARCH_ZOO
        a, meta = ARCH_ZOO[arch], lambda *shape, generator, dtype: torch.empty(
            shape, dtype=dtype, device='meta')
        with pytest.MonkeyPatch.context() as m:  # shapes only: no random data
            m.setattr(torch, 'randn', meta)
            m.setattr(torch, 'rand', meta)
            sd = random_official_state_dict(
                *(a[k] for k in ('embed_dims', 'num_heads', 'depths')),
                num_classes=1000,
                pretrain_img_size=224,
                dtype=torch.float32)
        buf = io.BytesIO()
        torch.save({'model': {k: torch.zeros((), dtype=v.dtype).expand(
            v.shape) for k, v in sd.items()}}, buf)  # yapf: disable
        _AUTHORS_FILES[arch] = (buf.getvalue(), len(sd))
    os.makedirs(osp.dirname(str(path)) or '.', exist_ok=True)
    with open(str(path), 'wb') as f:
        f.write(_AUTHORS_FILES[arch][0])
    return _AUTHORS_FILES[arch][1]


class Reduce:
    """Pickles as ``fn(*args)``: what a crafted checkpoint runs at load."""

    def __init__(self, fn, *args):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


def flip_tensor_bytes(path, n, size=None):
    """Flip ``n`` bytes mid-record of ``size``-byte (else largest) tensors."""
    with zipfile.ZipFile(path) as z:
        records = [i for i in z.infolist() if '/data/' in i.filename]
    records = [max(records, key=lambda i: i.file_size)] if size is None \
        else [i for i in records if i.file_size == size]
    raw = bytearray(open(path, 'rb').read())
    for info in records:
        off = info.header_offset
        name_len = int.from_bytes(raw[off + 26:off + 28], 'little')
        extra_len = int.from_bytes(raw[off + 28:off + 30], 'little')
        start = off + 30 + name_len + extra_len + info.file_size // 2
        for i in range(n):
            raw[start + i] ^= 0xFF
    open(path, 'wb').write(bytes(raw))


@pytest.fixture(scope='module')
def metafiles_read_once():
    """mmengine reads every codebase metafile per ``mmdet::`` base: once."""
    from mmengine.config import utils
    with pytest.MonkeyPatch.context() as m:
        m.setattr(utils, 'load', functools.lru_cache(None)(utils.load))
        yield


@pytest.fixture
def one_thread():
    """One intra-op thread (spin-waits made a Runner test 20x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


class Interrupted(Exception):
    pass


class Crash(Hook):
    """Interrupts training after iteration ``stop_after`` (a killed job)."""

    priority = 'LOWEST'

    def __init__(self, stop_after):
        self.stop_after = stop_after

    def after_train_iter(self, runner, batch_idx, **kwargs):
        if runner.iter + 1 == self.stop_after:
            raise Interrupted(self.stop_after)


def model_weights(runner):
    sd = runner.model.state_dict()
    return {k: v.detach().clone() for k, v in sd.items()}


def needs_torch(version, reason):
    """Skipped on an older torch, ``pytest -rs`` printing why."""
    return pytest.mark.needs_torch(version, reason)


def pytest_configure(config):
    config.addinivalue_line(
        'markers', 'needs_torch(version, reason): skipped on an older '
        'torch, with the reason printed (see conftest.needs_torch)')


def pytest_collection_modifyitems(config, items):
    from mmsoft.compat import torch_version as _version
    have = _version(torch.__version__)
    for item in items:
        params = getattr(getattr(item, 'callspec', None), 'params', {})
        if params.get('device', 'cpu') == 'cpu' and any(
                v is torch.float16 or v in ('float16', 'fp16')
                for v in params.values()):
            item.add_marker(
                needs_torch(  # torch 2.1 has neither
                    '2.4', 'float16 autocast and float16 kernels on the CPU'))
        for version, reason in (m.args for m in item.iter_markers(
                'needs_torch') if have < _version(m.args[0])):  # yapf: disable
            item.add_marker(pytest.mark.skip(
                reason=f'needs torch >= {version}: {reason} (this is torch '
                f'{torch.__version__})'))  # yapf: disable
            break


def device_types():
    """``cpu``, and ``cuda`` where available; ``MMSOFT_TEST_DEVICE``: one."""
    want = os.environ.get('MMSOFT_TEST_DEVICE', '')
    if want not in ('', 'cpu', 'cuda'):
        raise ValueError(f'MMSOFT_TEST_DEVICE={want!r}: use cpu or cuda '
                         f'(or leave it unset for cpu and, if available, '
                         f'cuda)')
    if want:
        return [want]
    return ['cpu'] + (['cuda'] if torch.cuda.is_available() else [])


@pytest.fixture(params=device_types())
def device(request):
    if request.param == 'cuda' and not torch.cuda.is_available():
        pytest.fail('MMSOFT_TEST_DEVICE=cuda, but torch.cuda.is_available() '
                    'is False: run on a CUDA machine or unset it')
    return request.param


def smooth_kernel(*batch, m=60, d=8, seed=0, dtype=torch.float64, freq=4,
                  stretch=6):  # yapf: disable
    """A SOFT-like kernel on which 20 NR iterations do not converge."""
    from mmsoft.models.layers import gaussian_kernel
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, m, dtype=torch.float64)[:, None]
    f = torch.rand(*batch, 1, d, generator=g, dtype=torch.float64) * freq
    x = torch.sin(stretch * t * f +
                  torch.randn(*batch, 1, d, generator=g, dtype=torch.float64))
    x = x + 0.05 * torch.randn(*batch, m, d, generator=g, dtype=x.dtype)
    return gaussian_kernel(x, x).to(dtype)
