"""SafeCheckpointHook: kill-safe, bit-exact resumes, checked reads; the
checkpoint directory's resume search and owner."""
import errno
import logging
import multiprocessing
import os
import os.path as osp
import posixpath
import random
import re
import shutil
import signal
import uuid
import zipfile
from types import SimpleNamespace

import mmengine.hooks.checkpoint_hook as mm
import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import (Crash, Interrupted, dead_pid, flip_tensor_bytes,
                      model_weights)
from mmengine.dataset import DefaultSampler, InfiniteSampler
from mmengine.fileio import LocalBackend
from mmengine.hooks import Hook
from mmengine.logging import MessageHub
from mmengine.model import BaseModel
from mmengine.runner import BaseLoop, Runner
from mmengine.testing.runner_test_case import ToyMetric
from torch.utils.data import BatchSampler, DataLoader, Dataset

import mmsoft  # noqa: F401  (registers SafeCheckpointHook)
from mmsoft.compat import mmengine_checkpoints_allowed
from mmsoft.engine import SafeCheckpointHook
from mmsoft.engine.hooks import checkpoint_hook as ch
from mmsoft.engine.hooks.checkpoint_hook import get_rng_state, set_rng_state
from mmsoft.models.layers import SOFTAttention
from mmsoft.utils import atomic
from mmsoft.utils import checkpoint_io as cio
from mmsoft.utils.strict_load import CheckpointMismatchError

N, SIZE = 20, 6  # 20 samples of 6 x 6: 10 iterations of 2 per epoch
FC_RECORD = SIZE * SIZE * 2 * 4  # fc.weight's tensor record (bytes)
CKPT_ARGS = ('max_keep_ckpts', 'out_dir', 'filename_tmpl')
pytestmark = pytest.mark.usefixtures('one_thread')


def _load(path):
    with mmengine_checkpoints_allowed():
        return torch.load(path)


class FlipDataset(Dataset):  # flipped with numpy and python random

    def __len__(self):
        return N

    def __getitem__(self, i):
        img = np.arange(SIZE * SIZE, dtype=np.float32).reshape(SIZE, SIZE)
        img = (img * (i + 1)) % 7
        if np.random.rand() < 0.5:
            img = img[:, ::-1]
        if random.random() < 0.5:
            img = img[::-1]
        return dict(inputs=torch.from_numpy(img.copy()), data_samples=i % 2)


class DropoutNet(BaseModel):  # dropout: torch RNG

    def __init__(self):
        super().__init__()
        self.fc, self.drop = nn.Linear(SIZE * SIZE, 2), nn.Dropout(0.5)

    def forward(self, inputs, data_samples=None, mode='tensor'):
        logits = self.fc(self.drop(torch.stack(inputs).flatten(1)))
        if mode == 'loss':
            return dict(
                loss=F.cross_entropy(logits, torch.tensor(data_samples)))
        return [dict(pred=int(p)) for p in logits.argmax(1)]


class _On(Hook):

    def __init__(self, **callbacks):
        vars(self).update(callbacks)


def _trained_from(runner):
    """Trains ``runner``; the iteration it started from."""
    start = []
    runner.register_hook(_On(before_train=lambda r: start.append(r.iter)))
    runner.train()
    return start[0]


def _log(runner):
    return open(osp.join(runner.log_dir, f'{runner.timestamp}.log')).read()


def _runner(work_dir, name, by_epoch=False, stop_after=None, **kw):
    """``kw``: the hook's (CKPT_ARGS) and the Runner's arguments."""
    torch.manual_seed(0)  # the model is built before the Runner seeds
    ckpt = dict(
        type='SafeCheckpointHook',
        max_keep_ckpts=-1,
        interval=1 if by_epoch else 2,
        by_epoch=by_epoch)
    ckpt.update((k, kw.pop(k)) for k in CKPT_ARGS if k in kw)
    loader = dict(dataset=FlipDataset(), batch_size=2)
    return Runner(
        model=DropoutNet(),
        work_dir=str(work_dir),
        experiment_name=f'{name}_{uuid.uuid4().hex[:8]}',
        randomness=dict(seed=0),
        train_dataloader=dict(loader, sampler=dict(type='DefaultSampler')),
        val_dataloader=dict(
            loader, sampler=dict(type='DefaultSampler', shuffle=False)),
        val_evaluator=[ToyMetric()],
        val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        train_cfg=dict(by_epoch=True, max_epochs=3, val_interval=1)
        if by_epoch else dict(by_epoch=False, max_iters=10, val_interval=3),
        default_hooks=dict(
            checkpoint=ckpt, logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[Crash(stop_after)] if stop_after else None,
        log_processor=dict(by_epoch=by_epoch),
        **kw)


def _interrupted(work, stop_after=6, **kw):
    with pytest.raises(Interrupted):
        _runner(work, 'first', stop_after=stop_after, **kw).train()


@pytest.fixture(scope='module')
def run_copy(tmp_path_factory):
    """``copy(dst, stop_after=None, by_epoch=False)``: the work dir of a run
    stopped after ``stop_after`` iterations (None: finished), copied."""
    runs = {}

    def copy(dst, stop_after=None, by_epoch=False):
        src = runs.get((stop_after, by_epoch))
        if src is None:
            src = tmp_path_factory.mktemp('run') / 'work'
            if stop_after:
                _interrupted(src, stop_after, by_epoch=by_epoch)
            else:
                _runner(src, 'first', by_epoch).train()
            runs[stop_after, by_epoch] = src
        shutil.copytree(src, dst)
        last = dst / 'last_checkpoint'
        last.write_text(last.read_text().replace(str(src), str(dst)))
        return dst

    return copy


@pytest.mark.parametrize(
    'by_epoch,stop_after', [(False, 6), (True, 20)], ids=['iter', 'epoch'])
def test_resume_equals_uninterrupted_run(tmp_path, run_copy, by_epoch,
                                         stop_after):
    work = run_copy(tmp_path / 'work', stop_after, by_epoch)
    resumed = _runner(work, 'again', by_epoch, resume=True)
    resumed.train()
    last = 'epoch_3.pth' if by_epoch else 'iter_10.pth'
    ref = _load(run_copy(tmp_path / 'ref', None, by_epoch) / last)
    weights = model_weights(resumed)
    assert weights.keys() == ref['state_dict'].keys() and all(
        torch.equal(weights[k], ref['state_dict'][k]) for k in weights)
    rng = _load(work / ('epoch_2.pth' if by_epoch else 'iter_6.pth'))
    rng = rng['meta']['mmsoft_rng']
    assert rng['world_size'] == 1 and set(
        rng['states'][0]) >= {'python', 'numpy', 'torch'}


def _files(d):
    return sorted(f for f in os.listdir(d) if f.endswith('.pth'))


def _mtimes(d, names=None):
    names = _files(d) if names is None else names
    return {f: os.stat(d / f).st_mtime_ns for f in names}


def test_copied_work_dir_resumes_its_own_newest_complete_checkpoint(tmp_path):
    """Issue 36 (1); the Runner's loads alone see mmsoft's allow-list."""

    def get():  # a set in torch: its order is no property
        return set(getattr(torch.serialization, 'get_safe_globals', list)())

    # torch's own entries, added when the Runner's environment report first
    # imports torchvision (and it torch._dynamo): added before the snapshot
    import torch._dynamo  # noqa: F401
    before, seen = get(), []
    orig, copy = tmp_path / 'orig', tmp_path / 'copy'
    _interrupted(orig, 4, max_keep_ckpts=3)
    shutil.copytree(orig, copy)
    _interrupted(orig, 8, max_keep_ckpts=3, resume=True)
    mtimes = _mtimes(orig)
    assert list(mtimes) == ['iter_4.pth', 'iter_6.pth', 'iter_8.pth']
    flip_tensor_bytes(copy / 'iter_4.pth', 4, FC_RECORD)
    runner = _runner(copy, 'copy', max_keep_ckpts=3, resume=True)
    runner.register_hook(
        _On(after_load_checkpoint=lambda r, checkpoint: seen.append(
            len(get())),
            before_train=lambda r: seen.append(get())))
    assert _trained_from(runner) == 2 and runner.iter == 10
    assert _mtimes(orig) == mtimes
    assert _files(copy) == ['iter_10.pth', 'iter_6.pth', 'iter_8.pth']
    assert open(copy / 'last_checkpoint').read() == str(copy / 'iter_10.pth')
    assert f'names {orig / "iter_4.pth"}, outside' in _log(runner)
    assert f'skipping checkpoint {copy / "iter_4.pth"}' in _log(runner)
    assert len(seen) == 2 and seen[1] == before and get() == before
    assert seen[0] > len(before) or not hasattr(torch.serialization,
                                                'safe_globals')
    assert 'load_checkpoint' not in vars(runner)  # after_run: unwrapped


def test_kill_during_checkpoint_write_keeps_previous(tmp_path):
    """SIGKILL while iter_4.pth is written: iter_2.pth is resumed."""
    work, put = tmp_path / 'work', LocalBackend.put

    def dying_put(self, obj, filepath):  # half of iter_4.pth, then SIGKILL
        if 'iter_4.pth' in osp.basename(str(filepath)):
            with open(filepath, 'wb') as f:
                f.write(obj[:len(obj) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        return put(self, obj, filepath)

    def killed():
        LocalBackend.put = dying_put  # in the child only
        _runner(work, 'killed', max_keep_ckpts=1).train()

    child = multiprocessing.get_context('fork').Process(target=killed)
    child.start()
    child.join(120)
    assert child.exitcode == -signal.SIGKILL
    names = sorted(os.listdir(work))
    temps = [n for n in names if n.endswith(cio.TMP_SUFFIX)]
    assert 'iter_2.pth' in names and 'iter_4.pth' not in names
    assert len(temps) == 1 and temps[0].startswith('.iter_4.pth.')
    assert ch.check_complete(str(work / 'iter_2.pth')) is None
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_2.pth')
    runner = _runner(work, 'resumed', max_keep_ckpts=1, resume=True)
    assert _trained_from(runner) == 2 and runner.iter == 10
    assert [n for n in os.listdir(work) if '.pth' in n] == ['iter_10.pth']


def _draws():
    out = [random.random(), float(np.random.rand()), float(torch.rand(1))]
    if torch.cuda.is_available():
        out.append(float(torch.rand(1, device='cuda')))
    return out


def test_rng_states_round_trip_weights_only(tmp_path, monkeypatch):
    """CUDA's states (faked) saved when in use, restored on as many GPUs."""
    if torch.cuda.is_available():
        torch.rand(1, device='cuda')  # initialise CUDA: its state is saved
    state, first = get_rng_state(), _draws()
    assert ('cuda' in state) == torch.cuda.is_available()
    torch.save(state, tmp_path / 'rng.pth')
    saved = getattr(torch.serialization, 'get_safe_globals', list)()
    if saved:  # no allow-list needed (torch < 2.4 has none)
        torch.serialization.clear_safe_globals()
    try:
        set_rng_state(torch.load(tmp_path / 'rng.pth', weights_only=True))
    finally:
        if saved:
            torch.serialization.add_safe_globals(saved)
    assert _draws() == first
    gpus = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4])]
    restored, count, cuda = [], [len(gpus)], torch.cuda
    for name, value in (('is_available', True), ('is_initialized', True),
                        ('get_rng_state_all', gpus)):
        monkeypatch.setattr(cuda, name, lambda v=value: v)
    monkeypatch.setattr(cuda, 'device_count', lambda: count[0])
    monkeypatch.setattr(cuda, 'set_rng_state_all', restored.append)
    state = get_rng_state()
    assert state['cuda'] is gpus
    set_rng_state(state)
    assert len(restored) == 1 and all(
        torch.equal(a, b) for a, b in zip(restored[0], gpus))
    count[0] = 4  # resumed on another number of GPUs: CPU states only
    set_rng_state(state)
    set_rng_state({k: v for k, v in state.items() if k != 'cuda'})  # a CPU's
    assert len(restored) == 1
    for available, initialised in ((True, False), (False, True)):
        monkeypatch.setattr(cuda, 'is_available', lambda: available)
        monkeypatch.setattr(cuda, 'is_initialized', lambda: initialised)
        assert 'cuda' not in get_rng_state()


@pytest.mark.parametrize(
    'code,fix',
    [
        (errno.EFBIG, 'Raise the file size limit (ulimit -f) or write to '
         'another file system'),
        (errno.EROFS, '{work} is read-only: choose another work dir'),
        (errno.EACCES, 'Check the permissions of {work} (ls -ld)'),
        (errno.EPERM, 'Check the permissions of {work} (ls -ld)'),
        (None, 'Free space in {work}'),  # a quota as text, no errno
    ])
def test_write_failure_names_the_fix(tmp_path, code, fix):
    """Issue 52, item 5: the advice follows the error; no earlier checkpoint:
    train again (one: test_checkpoints_are_durable_with_every_ranks_rng)."""
    work, quota = str(tmp_path), 'disk quota exceeded for user train'
    error = OSError(code, os.strerror(code)) if code else OSError(quota)
    reason = f'{os.strerror(code)} (errno {code})' if code else quota
    path = osp.join(work, 'iter_4.pth')
    assert ch._write_failure(SimpleNamespace(work_dir=work), path, error) == (
        f'cannot write checkpoint {path}: {reason}; nothing was written, no '
        f'earlier checkpoint of this run exists. {fix.format(work=work)} and '
        'start the training again (there is nothing to resume)')


class _Log(list):
    """A stand-in logger keeping its ``(level, line)`` s."""

    def __getattr__(self, level):  # info, warning
        if level.startswith('_'):
            raise AttributeError(level)
        return lambda msg: self.append((level, msg))

    def ours(self, level=None):
        """mmsoft's lines (not mmengine's) of ``level`` (any: None)."""
        return [
            m for lv, m in self
            if m.startswith('mmsoft: ') and level in (None, lv)
        ]


class _Loop(BaseLoop):

    def __init__(self, dataloader=None, **attrs):
        self.dataloader = dataloader
        vars(self).update(attrs)

    def run(self):
        pass


class _Runner(SimpleNamespace):
    """What the hook reads of a Runner; ``save_checkpoint`` as mmengine's."""

    def __init__(self, work_dir, loop=None, drop=(), **attrs):
        fields = dict(work_dir=str(work_dir), model=nn.Module(), logger=_Log())
        fields.update(epoch=0, iter=0, max_iters=100, max_epochs=100, rank=0)
        fields.update(hooks=[], _resume=False, _has_loaded=False)
        fields.update(_load_from=None, _train_loop=loop)
        fields.update(message_hub=MessageHub(f'hub_{uuid.uuid4().hex}'))
        fields.update(
            dict(train_loop=loop) if loop is not None else {}, **attrs)
        super().__init__(**{k: v for k, v in fields.items() if k not in drop})

    def save_checkpoint(self, out_dir, filename, *a, meta=None, **k):
        by_epoch = k.get('by_epoch', True)
        if self.rank:
            return
        meta = dict(meta or {})
        meta.setdefault('epoch', self.epoch + 1 if by_epoch else self.epoch)
        meta.setdefault('iter', self.iter if by_epoch else self.iter + 1)
        checkpoint = dict(meta=meta, state_dict=dict(w=torch.ones(1)))
        for hook in self.hooks:
            hook.before_save_checkpoint(self, checkpoint)
        torch.save(checkpoint, osp.join(out_dir, filename))


SCRATCH = 'mmsoft: no checkpoint to resume from in {}; training from scratch'
RESUMING = 'mmsoft: resuming from the newest complete checkpoint {}'


def test_before_run_claims_the_dir_and_checks_the_file(tmp_path, monkeypatch):
    """Training alone claims a local ``out_dir/<work dir name>``; the
    search's result: rank 0's broadcast."""
    work = tmp_path / 'p' / 'run'
    work.mkdir(parents=True)
    runner = _Runner(
        work, loop=_Loop(), drop=('_resume', '_load_from', '_has_loaded'))
    SafeCheckpointHook().before_run(runner)
    assert runner.logger == [] and not hasattr(runner, '_resume')
    assert 'load_checkpoint' not in vars(runner)  # none to wrap
    SafeCheckpointHook().after_run(runner)  # no load_checkpoint to drop

    class Loading(_Runner):

        def load_checkpoint(self, *args, **kwargs):
            return args, kwargs

    runner, hook = Loading(work, loop=_Loop()), SafeCheckpointHook()
    hook.before_run(runner)  # wrapped: the arguments passed on
    assert runner.load_checkpoint(
        'f', strict=True) == (('f', ), dict(strict=True))
    own = runner.load_checkpoint
    hook.before_run(runner)  # an instance's own load_checkpoint is kept
    assert runner.load_checkpoint is own
    hook.after_run(runner)
    assert 'load_checkpoint' not in vars(runner)
    runner = _Runner(work, loop=_Loop(), drop=('_load_from', ), _resume=True)
    SafeCheckpointHook().before_run(runner)  # resume=True: the search
    assert runner.logger.ours() == [SCRATCH.format(work)]
    runner = _Runner(work, _resume=True, _load_from='https://host/gone.pth')
    SafeCheckpointHook().before_run(runner)  # mmengine downloads it
    gone = work / 'gone.pth'
    with pytest.raises(FileNotFoundError) as e:
        SafeCheckpointHook().before_run(
            _Runner(work, _resume=True, _load_from=str(gone)))
    assert str(e.value) == (f'--resume {gone}: no such file (omit the path '
                            'to resume from the newest checkpoint of the '
                            'work dir)')
    for loop, fix in ((_Loop(), ', or leave load_from out'), (None, '')):
        with pytest.raises(FileNotFoundError) as e:  # train / test tools
            SafeCheckpointHook().before_run(
                _Runner(work, loop=loop, _load_from=str(gone)))
        assert str(e.value) == (f'load_from {gone}: no such file; pass an '
                                'existing checkpoint (e.g. <work_dir>/'
                                f'epoch_N.pth){fix}')
    bad = work / 'bad.pth'
    bad.write_bytes(b'PK\x03\x04 truncated')
    runner = _Runner(
        work, drop=('_has_loaded', '_resume'), _load_from=str(bad))
    with pytest.raises(cio.CheckpointError, match=re.escape(str(bad))):
        SafeCheckpointHook().before_run(runner)
    runner = _Runner(work, loop=_Loop(), _resume=True)  # all damaged
    (work / 'iter_2.pth').write_bytes(b'PK\x03\x04 truncated')
    with pytest.raises(cio.CheckpointError) as e:
        SafeCheckpointHook().before_run(runner)
    assert str(e.value) == (
        f"resume: no complete checkpoint in {work}; damaged: "
        f"['{work / 'iter_2.pth'}']. Remove them to train from scratch.")
    # a loaded file is not read again (damaged since it was loaded)
    bad.write_bytes(b'')
    runner = _Runner(work, _load_from=str(bad), _has_loaded=True)
    SafeCheckpointHook().before_run(runner)
    runner._has_loaded = False
    with pytest.raises(cio.CheckpointError, match='is empty'):
        SafeCheckpointHook().before_run(runner)
    monkeypatch.chdir(tmp_path)
    out, work = tmp_path / 'out', tmp_path / 'a' / 'run'
    work.mkdir(parents=True)
    hook = SafeCheckpointHook(out_dir=str(out), filename_tmpl='ckpt_{}.pth')
    runner = _Runner(str(work) + os.sep, loop=_Loop(), _resume=True)
    hook.before_run(runner)
    assert (out / 'run' / ch.OWNER_FILE).read_text() == \
        osp.realpath(work) + '\n'
    assert runner.logger.ours() == [SCRATCH.format(str(work) + os.sep)]
    assert runner._resume is False  # a stale last_checkpoint: not trusted
    ckpt = out / 'run' / 'ckpt_4.pth'
    torch.save(dict(meta=dict(iter=4), state_dict={}), ckpt)
    (work / 'last_checkpoint').write_text(str(ckpt))
    runner = _Runner(work, loop=_Loop(), _resume=True)
    hook.before_run(runner)
    assert runner._load_from == str(ckpt) and runner._resume
    assert runner.logger.ours() == [RESUMING.format(ckpt)]
    runner = _Runner(tmp_path / 'a' / 'eval', _resume=True)  # not training
    hook.before_run(runner)
    assert runner._resume is not True and os.listdir(out) == ['run']
    SafeCheckpointHook(
        out_dir='s3://bucket/ckpts').before_run(_Runner(work, loop=_Loop()))
    assert sorted(os.listdir(tmp_path)) == ['a', 'out', 'p']
    SafeCheckpointHook().before_run(_Runner(work, loop=_Loop()))
    assert not (work / ch.OWNER_FILE).exists()  # the work dir: no owner
    ckpt_dir, other = str(out / 'run'), tmp_path / 'b' / 'run'
    marker = osp.join(ckpt_dir, ch.OWNER_FILE)
    with pytest.raises(ch.CheckpointDirInUse) as e:  # a second run's
        hook.before_run(_Runner(other, loop=_Loop()))
    assert str(e.value) == (
        f'checkpoint directory {ckpt_dir} (default_hooks.checkpoint.out_dir '
        f'/ the work dir\'s name) belongs to the run in work dir '
        f'{osp.realpath(work)} ({marker}), not to this one '
        f'({osp.realpath(other)}): its max_keep_ckpts would delete the other '
        f'run\'s checkpoints and --resume would continue it. Give this run '
        f'another out_dir or a work dir of another name (if you moved that '
        f'work dir here, delete {marker})')
    open(marker, 'w').close()  # an empty owner file: taken over
    hook.before_run(_Runner(other, loop=_Loop()))
    assert open(marker).read() == osp.realpath(other) + '\n'
    sent, other = [], tmp_path / 'c' / 'run'  # rank 1 of another run
    monkeypatch.setattr(ch, 'is_main_process', lambda: False)
    monkeypatch.setattr(ch, 'broadcast_object_list',
                        lambda objs: objs.__setitem__(slice(None), sent))
    sent[:] = [str(ckpt), [], None]
    runner = _Runner(other, loop=_Loop(), _resume=True)
    hook.before_run(runner)
    assert runner._load_from == str(ckpt) and not other.exists()
    assert runner.logger.ours() == [RESUMING.format(ckpt)]
    sent[:] = [None, None, f'checkpoint directory {out} belongs to X']
    with pytest.raises(ch.CheckpointDirInUse, match='belongs to X'):
        hook.before_run(_Runner(other, loop=_Loop()))


def test_resume_from_another_dir_forgets_its_checkpoint_names(
        tmp_path, monkeypatch):
    """Also a killed run's partial checkpoint; a remote out_dir."""
    other, work = tmp_path / 'other', tmp_path / 'run'
    work.mkdir()
    (work / 'best_acc_iter_4.pth').write_bytes(b'x')
    stale = work / f'.iter_4.pth.{dead_pid()}.0123abcd{cio.TMP_SUFFIX}'
    stale.write_bytes(b'x')
    info = dict(
        keep_ckpt_ids=[6, 8],
        best_ckpt=str(other / 'best_acc_iter_4.pth'),
        best_ckpt_loss=str(other / 'best_loss_iter_2.pth'),
        best_ckpt_top=str(work / 'best_top_iter_6.pth'),
        best_score=0.5,
        note=str(other / 'x.txt'))
    resumed = dict(_resume=True, _has_loaded=True)
    forgot = dict(
        best_ckpt=str(work / 'best_acc_iter_4.pth'), best_ckpt_loss=None)
    for attrs, want in ((resumed, dict(forgot, keep_ckpt_ids=[])),
                        (dict(drop=('_resume', ), _has_loaded=True),
                         {}), (dict(drop=('_has_loaded', ), _resume=True), {}),
                        (dict(resumed, drop=('_load_from', )), forgot)):
        runner = _Runner(
            work, loop=_Loop(), _load_from=str(other / 'x.pth'), **attrs)
        for key, value in info.items():
            runner.message_hub.update_info(key, value)
        SafeCheckpointHook().before_train(runner)
        assert dict(runner.message_hub.runtime_info) == dict(info, **want)
        assert runner.logger.ours('warning') == ([
            f'mmsoft: removed {stale}, a partial checkpoint left by a '
            'killed run'
        ] if attrs is resumed else [])
    assert os.listdir(work) == ['best_acc_iter_4.pth']
    # a remote out_dir: one warning; mmengine's rules apply there
    remote = SimpleNamespace(join_path=posixpath.join)
    monkeypatch.setattr(mm.FileClient, 'infer_client', lambda *a: remote)
    monkeypatch.setattr(mm, 'get_file_backend', lambda *a, **k: remote)
    runner = _Runner(work, loop=_Loop(), _load_from=str(other), **resumed)
    runner.message_hub.update_info('keep_ckpt_ids', [6, 8])
    SafeCheckpointHook(out_dir='mem://bucket/ckpts').before_train(runner)
    assert runner.logger.ours('warning') == [
        'mmsoft: checkpoints go to a non-local storage backend; they are '
        'written by mmengine (not atomically)'
    ]
    assert runner.message_hub.get_info('keep_ckpt_ids') == [6, 8]


def _resume_with(runner, checkpoint, **kwargs):
    """``after_load_checkpoint`` of ``checkpoint``, ``before_train``."""
    hook = SafeCheckpointHook(**kwargs)
    hook.after_load_checkpoint(runner, checkpoint)
    hook.before_train(runner)


RESTORED = 'mmsoft: RNG states restored'
SEEDED = 'mmsoft: train sampler seed 5 -> 7 (from the checkpoint)'
WORLD = ('mmsoft: the checkpoint holds RNG states of {} process(es), this '
         'run has 1: RNG states not restored')
RESUMED = dict(_resume=True)


def _iterating(**loop):  # a built iterator
    return dict(_resume=True, loop=dict(dataloader_iterator=iter(()), **loop))


@pytest.mark.parametrize('attrs,seed,world,n,kw,lines', [
    (dict(drop=('_resume', ), _has_loaded=True), 7, 1, 1, {}, []),
    (dict(_resume=True, _has_loaded=True), 7, 1, 1, {}, [SEEDED, RESTORED]),
    (RESUMED, 5, None, 0, {}, []),  # the seed unchanged
    (RESUMED, None, None, 0, {}, []),  # neither saved
    (RESUMED, None, 2, 2, {}, [WORLD.format(2)]),
    (RESUMED, None, 1, 0, {}, [WORLD.format(1)]),  # no states
    (RESUMED, None, 1, 1, dict(save_rng=False), []),
    # a checkpoint without a meta dict restores nothing
    (RESUMED, [torch.ones(1)], None, 0, {}, []),
    (RESUMED, dict(meta=['x']), None, 0, {}, []),
    # restored after the replay of `iter` batches; a loop without `iter`
    (_iterating(iter=1), None, 1, 1, {}, []),
    (_iterating(iter=0), None, 1, 1, {}, [RESTORED]),
    (_iterating(), None, 1, 1, {}, [RESTORED]),
])  # yapf: disable
def test_rng_states_and_seed_come_back_on_a_resume_of_as_many_ranks(
        tmp_path, attrs, seed, world, n, kw, lines):
    attrs, sampler = dict(attrs), SimpleNamespace(seed=5)
    loop = _Loop(SimpleNamespace(sampler=sampler), **attrs.pop('loop', {}))
    state = get_rng_state()
    want = _draws()
    rng = dict(world_size=world, **(dict(states=[state] * n) if n else {}))
    meta = dict(iter=4, **(dict(mmsoft_rng=rng) if world else {}))
    if isinstance(seed, int):
        meta['mmsoft_sampler_seed'] = seed
    runner = _Runner(tmp_path, loop=loop, **attrs)
    _resume_with(
        runner,
        dict(meta=meta) if seed is None or isinstance(seed, int) else seed,
        **kw)
    assert runner.logger.ours() == lines
    assert (_draws() == want) == (RESTORED in lines)
    assert sampler.seed == (7 if SEEDED in lines else 5)


class _Prefetching:
    """An iterator that takes its first batches when built (workers)."""

    def __init__(self, loader):
        it = iter(loader)
        self.batches = [next(it) for _ in range(3)]

    def __next__(self):
        return self.batches.pop(0)


def test_sampler_seed_saved_where_found_and_restored(tmp_path):
    """Also each SOFT attention's ``attn_norm`` (``mmsoft_attn_norm``)."""
    data = list(range(16))
    seeded = DefaultSampler(data, seed=5)
    mmdet_like = DataLoader(data, batch_sampler=BatchSampler(seeded, 2, False))
    plain = SimpleNamespace(sampler=SimpleNamespace(seed=5))
    unseeded = SimpleNamespace(
        sampler=SimpleNamespace(), batch_sampler=SimpleNamespace())
    cases = [(_Loop(mmdet_like), seeded, 5), (_Loop(plain), plain.sampler, 5),
             (_Loop(unseeded), None, None), (None, None, None)]  # None: val
    for loop, sampler, saved in cases:
        runner = _Runner(tmp_path, loop=loop)
        checkpoint = dict(meta={})
        SafeCheckpointHook(
            save_rng=False).before_save_checkpoint(runner, checkpoint)
        assert checkpoint == dict(meta={} if saved is None else dict(
            mmsoft_sampler_seed=saved))
        runner._resume = True
        _resume_with(runner, dict(meta=dict(mmsoft_sampler_seed=7)))
        assert runner.logger.ours() == ([SEEDED] if saved else [])
        assert sampler is None or sampler.seed == 7

    def loader(seed):
        return DataLoader(
            data, batch_size=4, sampler=InfiniteSampler(data, seed=seed))

    train = loader(5)
    loop = _Loop(train, dataloader_iterator=_Prefetching(train))
    runner = _Runner(tmp_path, loop=loop, _resume=True, _has_loaded=True)
    _resume_with(runner, dict(meta=dict(mmsoft_sampler_seed=7)))
    want = iter(loader(7))
    assert [next(loop.dataloader_iterator).tolist() for _ in range(3)] == \
        [next(want).tolist() for _ in range(3)]
    model = nn.Sequential(
        SOFTAttention(8, 1, 1, attn_norm=True),
        SOFTAttention(8, 1, 1, attn_norm=False))
    checkpoint = dict(meta={})
    SafeCheckpointHook(save_rng=False).before_save_checkpoint(
        _Runner(tmp_path, model=model), checkpoint)
    assert checkpoint == dict(meta=dict(mmsoft_attn_norm=[False, True]))


def _saving(work_dir, epoch=0, iter=0, rank=0, **kwargs):
    """A hook (``interval=1``, ``kwargs``) saving for a stand-in runner."""
    hook = SafeCheckpointHook(**dict(dict(interval=1), **kwargs))
    runner = _Runner(
        work_dir,
        loop=_Loop(),
        epoch=epoch,
        iter=iter,
        rank=rank,
        hooks=[hook])
    hook.before_train(runner)
    return hook, runner


def test_best_checkpoint_is_atomic_and_holds_the_training_rng(tmp_path):
    hook, runner = _saving(
        tmp_path, epoch=1, iter=10, save_best='acc', rule='greater')
    for epoch, acc in ((2, 0.5), (3, 0.7)):
        hook.after_train_epoch(runner)  # epoch_<epoch>.pth
        runner.epoch, runner.iter = epoch, epoch * 10
        state = get_rng_state()
        hook.before_val(runner)
        want = _draws()  # validation draws
        hook.after_val_epoch(runner, dict(acc=acc))
        for name in (f'epoch_{epoch}.pth', f'best_acc_epoch_{epoch}.pth'):
            meta = _load(tmp_path / name)['meta']
            assert meta['epoch'] == epoch, name
            set_rng_state(meta['mmsoft_rng']['states'][0])
            assert _draws() == want, name
        set_rng_state(state)
        _draws()
        hook.after_val(runner)
        assert _draws() == want
    assert sorted(os.listdir(tmp_path)) == [
        'best_acc_epoch_3.pth', 'epoch_2.pth', 'epoch_3.pth', 'last_checkpoint'
    ]


def test_checkpoints_are_durable_with_every_ranks_rng(tmp_path, monkeypatch):
    """Files and directory fsynced; ENOSPC (issue 27, item 8); a fixed name
    replaced; ``runner.val()`` alone and rank 1 write nothing."""
    synced, fsync, sent, save = [], atomic._fsync, [], torch.save
    monkeypatch.setattr(atomic, '_fsync',
                        lambda path: synced.append(path) or fsync(path))
    _draws()
    other = get_rng_state()  # another rank's
    monkeypatch.setattr(ch, 'all_gather_object',
                        lambda obj: sent.append(obj) or [obj, other])
    monkeypatch.chdir(tmp_path)
    work = tmp_path / 'run'
    work.mkdir()
    hook, runner = _saving(work, iter=3, interval=2, by_epoch=False)
    _draws()
    hook.after_train_iter(runner, 0)
    assert (work / 'last_checkpoint').read_text() == str(work / 'iter_4.pth')
    assert sorted(os.listdir(work)) == ['iter_4.pth', 'last_checkpoint']
    assert os.listdir(tmp_path) == ['run']
    names = [osp.basename(p) for p in synced]
    assert [n.split('.')[1] for n in names if n.startswith('.')] == \
        ['iter_4', 'last_checkpoint']
    assert synced.count(str(work)) == 2
    meta = _load(work / 'iter_4.pth')['meta']
    rng = meta['mmsoft_rng']
    assert meta['iter'] == 4 and len(sent) == 1 and rng['world_size'] == 2
    assert [s['python'] for s in rng['states']] == \
        [sent[0]['python'], other['python']] != [other['python']] * 2
    mtimes = _mtimes(work)

    def full(obj, f, *args, **kwargs):  # the disk is full
        open(f, 'wb').write(b'x' * 100)
        raise OSError(28, 'No space left on device')

    monkeypatch.setattr(torch, 'save', full)
    runner.iter = 5
    with pytest.raises(cio.CheckpointWriteError) as e:
        hook.after_train_iter(runner, 0)
    assert e.value.errno == 28 and str(e.value) == (
        f'cannot write checkpoint {work / "iter_6.pth"}: No space left on '
        f'device (errno 28); nothing was written, the previous checkpoint '
        f'{work / "iter_4.pth"} was kept (last_checkpoint still names it). '
        f'Free space in {work} and continue with tools/train.py ... --resume')
    assert _mtimes(work) == mtimes  # no temporary:
    assert sorted(os.listdir(work)) == ['iter_4.pth', 'last_checkpoint']
    monkeypatch.setattr(torch, 'save', save)
    hook, runner = _saving(
        work, by_epoch=False, max_keep_ckpts=1, filename_tmpl='latest.pth')
    for runner.iter in (1, 2):
        hook.after_train_iter(runner, 0)
        assert _load(work / 'latest.pth')['meta']['iter'] == runner.iter + 1
    hook = SafeCheckpointHook(3, False, save_rng=False)  # CheckpointHook's
    assert (hook.interval, hook.by_epoch, hook.save_rng) == (3, False, False)
    assert SafeCheckpointHook().save_rng is True
    for hook in (SafeCheckpointHook(), hook):
        runner = _Runner(tmp_path / 'val')
        for _ in range(2):
            hook.before_val(runner)
            hook.after_val_epoch(runner, dict(acc=1.0))
            hook.after_val(runner)
    for module in (mm, ch):
        monkeypatch.setattr(module, 'is_main_process', lambda: False)
    hook, runner = _saving(tmp_path, rank=1, by_epoch=False, save_rng=False)
    hook.after_train_iter(runner, 0)
    assert os.listdir(tmp_path) == ['run']


@pytest.mark.parametrize('by_epoch,limit', [(False, 4), (True, 2),
                                            (False, 10)])
def test_resume_past_the_schedule_end_stops_in_one_line(
        tmp_path, run_copy, by_epoch, limit):
    """Issue 52, items 4, 6 (a new lr: tests/test_utils/test_strict_load)."""
    work = run_copy(tmp_path / 'work', None, by_epoch)
    runner = _runner(work, 'again', by_epoch, resume=True)
    runner.register_hook(dict(type='StrictLoadHook'))
    unit, key = ('epoch', 'max_epochs') if by_epoch else ('iter', 'max_iters')
    runner._train_loop[key] = limit
    done, before = 3 if by_epoch else 10, _mtimes(work)
    if limit == done:  # nothing to train
        runner.train()
        return
    with pytest.raises(CheckpointMismatchError) as e:
        runner.train()
    assert str(e.value) == (
        f'--resume {work}/{unit}_{done}.pth: the checkpoint is at {unit} '
        f'{done}, past the schedule\'s end (train_cfg.{key}={limit}): '
        f'nothing would train. Raise it (--cfg-options train_cfg.{key}'
        f'=...) or resume an earlier checkpoint')
    assert _mtimes(work) == before and _files(work) == sorted(before)
    assert not [f for f in os.listdir(work) if cio.TMP_SUFFIX in f]


@pytest.mark.parametrize('how',
                         ['resume-auto', 'load_from', 'scratch', 'partial'])
def test_a_strict_load_reads_no_pretrained_file(tmp_path, run_copy, how):
    """Issue 52, item 4 (--resume PATH: test_faults.py)."""
    work = run_copy(tmp_path / 'work', None, True)
    kwargs = dict(resume=True) if how in ('resume-auto', 'scratch') else \
        dict(load_from=str(work / 'epoch_3.pth'))
    runner = _runner(work if how == 'resume-auto' else tmp_path / 'again',
                     'again', True, **kwargs)

    def no_file(runner):  # an init_cfg naming a missing pretrained file
        runner.model.init_cfg = [
            dict(type='Constant', layer='Linear', val=0.),
            dict(type='Pretrained', checkpoint=f'{runner.work_dir}/no.pth')
        ]

    runner.register_hook(_On(before_run=no_file), priority='HIGHEST')
    runner.register_hook(
        dict(type='StrictLoadHook', allow_partial=how == 'partial'))
    runner._train_loop['max_epochs'] = 4
    if how in ('scratch', 'partial'):
        with pytest.raises(FileNotFoundError, match='no.pth'):
            runner.train()
        return
    runner.train()
    assert runner.epoch == 4 and runner.model.fc.weight.abs().sum() > 0


@pytest.mark.parametrize(
    'by_epoch,stop_at,crash,after,elsewhere',
    [
        (False, 6, None, [6, 9, 10], False),
        (True, None, 25, [3], False),  # stopped after epoch 2's validation
        (True, 2, None, [2, 3], True),  # resumed into another work dir
    ])
def test_validation_stopped_after_a_checkpoint_runs_on_resume(
        tmp_path, by_epoch, stop_at, crash, after, elsewhere):
    """Issue 52, item 4; another work dir's marker is kept."""
    work, validated, pending = tmp_path / 'work', [], []
    marker = work / '.mmsoft-val-pending'

    def step(runner):
        return runner.epoch if by_epoch else runner.iter

    def stop(runner, batch_idx, data_batch=None, outputs=None):
        if step(runner) == stop_at and batch_idx == 1:
            raise Interrupted()

    first = _runner(work, 'first', by_epoch, stop_after=crash)
    first.register_hook(_On(after_val_iter=stop))
    with pytest.raises(Interrupted):
        first.train()
    assert osp.isfile(marker) == (crash is None)
    if elsewhere:
        ckpt = open(work / 'last_checkpoint').read().strip()
        resumed = _runner(
            tmp_path / 'copy', 'again', by_epoch, resume=True, load_from=ckpt)
    else:
        resumed = _runner(work, 'again', by_epoch, resume=True)
    resumed.register_hook(
        _On(after_val_epoch=lambda r, metrics=None: validated.append(step(r)),
            before_train_iter=lambda r, batch_idx, data_batch=None: pending.
            append(osp.exists(marker))))
    resumed.train()
    assert validated == after
    assert pending[0] is elsewhere and osp.exists(marker) is elsewhere
    unit = 'epoch' if by_epoch else 'iteration'
    stopped = re.findall(
        rf'the validation of {unit} (\d+) \(\S+\) did not finish \(the '
        r'run was stopped during it\): validating it now, before training '
        r'goes on', _log(resumed))
    assert stopped == ([] if crash else [str(stop_at)])


def test_unfinished_validation_needs_its_marker_and_a_val_loop(
        tmp_path, monkeypatch):
    """A readable marker of the resumed local checkpoint, a val loop."""
    monkeypatch.chdir(tmp_path)
    ran, url = [], 'mem://b/iter_4.pth'  # its 'marker': ./mem:/b/...
    record = '{"checkpoint": "iter_4.pth", "epoch": 0, "iter": 4}'
    for where in (tmp_path, tmp_path / 'mem:' / 'b'):
        where.mkdir(parents=True, exist_ok=True)
        (where / ch.VAL_MARKER).write_text(record)

    def validates(backend=LocalBackend(), **attrs):
        attrs = dict(
            dict(
                val_loop=SimpleNamespace(run=lambda: ran.append(1)),
                _load_from=str(tmp_path / 'iter_4.pth')), **attrs)
        runner = _Runner(tmp_path, loop=_Loop(), **attrs)
        hook = SafeCheckpointHook()
        hook.file_backend, hook.out_dir = backend, str(tmp_path)
        hook._validate_unfinished(runner, dict(epoch=0, iter=4))
        return [ran.pop() for _ in list(ran)] == [1]

    assert validates()
    assert not validates(drop=('val_loop', ))
    assert not validates(backend=SimpleNamespace())  # not local
    assert not validates(_load_from=url)
    assert not validates(drop=('_load_from', ))
    (tmp_path / ch.VAL_MARKER).write_text('{"checkpoint": "iter_4')
    assert not validates()
    hook = SafeCheckpointHook()
    hook._val_marker = str(tmp_path / ch.VAL_MARKER) + '.gone'
    hook.after_val(None)
    assert hook._val_marker is None


# ------------------------------- the checkpoint directory: search, owner
def _ckpt(path, meta=True):
    sd = dict(w=torch.zeros(2))
    torch.save(dict(meta={}, state_dict=sd) if meta else sd, path)
    return str(path)


def _dirs(tmp_path, *names):
    for name in names:
        (tmp_path / name).mkdir()
    return (tmp_path / name for name in names)


def test_candidates_and_what_is_wrong_with_one(tmp_path, monkeypatch):
    """By N, then mtime; ``extra`` last; other names left out."""
    work, out = _dirs(tmp_path, 'work', 'out')
    for name in ('iter_9.pth', 'iter_10.pth', 'iter_2.pth.bak',
                 '.iter_12.pth.99.0123abcd.mmsoft-tmp', 'best.pth',
                 'iter_1.pth'):
        (work / name).write_bytes(b'x')
    os.utime(work / 'iter_1.pth', (1e9, 1e9))  # older than best.pth
    (out / 'iter_10.pth').write_bytes(b'x')
    os.utime(work / 'iter_10.pth', (1e9, 1e9))
    os.utime(out / 'iter_10.pth', (2e9, 2e9))  # the newer of the two
    (out / 'epoch_3.pth').write_bytes(b'x')
    found = ch.checkpoint_candidates(
        [str(work), str(out), str(tmp_path / 'gone')],
        [str(work / 'best.pth'),
         str(tmp_path / 'missing.pth'), None])
    assert found == [
        str(out / 'iter_10.pth'),
        str(work / 'iter_10.pth'),
        str(work / 'iter_9.pth'),
        str(out / 'epoch_3.pth'),
        str(work / 'iter_1.pth'),
        str(work / 'best.pth'),
    ]
    os.utime(work / 'iter_10.pth', (3e9, 3e9))  # now the work dir's
    assert ch.checkpoint_candidates([str(work), str(out)])[:2] == \
        [str(work / 'iter_10.pth'), str(out / 'iter_10.pth')]
    # a zip but no checkpoint: the load error's type and first line
    path = str(tmp_path / 'notes.pth')
    with zipfile.ZipFile(path, 'w') as z:
        z.writestr('notes.txt', 'not a checkpoint')
    with pytest.raises(Exception) as e:
        ch.load_verified(path)
    first = str(e.value).splitlines()[0]
    assert first and ch.check_complete(path) == \
        f'cannot be loaded ({type(e.value).__name__}: {first})'
    monkeypatch.setattr(ch, 'load_verified', lambda p:
                        (_ for _ in ()).throw(EOFError()))
    assert ch.check_complete(path) == 'cannot be loaded (EOFError: )'


def test_resume_search_warnings(tmp_path, monkeypatch):
    """One warning per foreign, damaged or missing file; the newest wins."""
    logged, warning = [], ('current', logging.WARNING)
    monkeypatch.setattr(
        ch, 'print_log', lambda msg, *how: logged.append(msg)
        if how == warning else None)
    work, out, other = _dirs(tmp_path, 'work', 'out', 'other')
    last = osp.join(work, 'last_checkpoint')
    foreign = _ckpt(other / 'iter_8.pth')
    (work / 'last_checkpoint').write_text(foreign)
    (out / 'iter_6.pth').write_bytes(b'')
    _ckpt(work / 'iter_4.pth', meta=False)
    good = _ckpt(work / 'iter_2.pth')
    assert ch.find_newest_complete(str(work), str(out))[0] == good
    assert logged == [
        f'mmsoft: {last} names {foreign}, outside this run\'s checkpoint '
        f'directory (a copied or moved work dir?): ignored; resuming from '
        f'the newest checkpoint of {work} / {out}',
        f'mmsoft: skipping checkpoint {out / "iter_6.pth"} is empty (0 '
        f'bytes); it was not loaded (use an earlier or a fresh copy)',
        f'mmsoft: skipping checkpoint {work / "iter_4.pth"}: it is not a '
        f'training checkpoint (no meta)',
    ]
    logged.clear()
    (work / 'last_checkpoint').write_text(good + '\n')  # older than iter_4
    os.unlink(work / 'iter_4.pth')
    newest = _ckpt(work / 'iter_4.pth')
    assert ch.find_newest_complete(str(work)) == (newest, [])
    os.unlink(newest)
    os.rename(good, work / 'final.pth')
    (tmp_path / 'link').symlink_to(work, target_is_directory=True)
    named = str(tmp_path / 'link' / 'final.pth')
    (work / 'last_checkpoint').write_text(named)
    assert ch.find_newest_complete(str(work), str(out)) == (named, [
        (str(out / 'iter_6.pth'), ch.check_complete(str(out / 'iter_6.pth')))
    ])
    assert len(logged) == 1 and 'outside' not in logged[0]
    logged.clear()
    gone = str(work / 'iter_10.pth')
    (work / 'last_checkpoint').write_text(gone)
    for f in (out / 'iter_6.pth', work / 'final.pth'):
        os.unlink(f)
    assert ch.find_newest_complete(str(work), str(out)) == (None, [])
    ch.find_newest_complete(str(work), str(out), quiet=True)
    assert logged == [
        f'mmsoft: last_checkpoint names {gone}, which does not exist'
    ]
