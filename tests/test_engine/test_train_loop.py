"""A tiny SOFT ImageClassifier (mmpretrain, mmcv's RandomFlip) trained,
interrupted and resumed bit-exactly by a Runner with SafeCheckpointHook."""
import pytest
import torch
from conftest import Crash, Interrupted, model_weights, tiny_arch
from mmengine.hooks import Hook
from mmengine.runner import Runner
from torch.utils.data import Dataset

import mmsoft  # noqa: F401  (registers mmsoft.SOFT, SafeCheckpointHook)
from mmsoft.compat import mmengine_checkpoints_allowed

ARCH = tiny_arch()
BACKBONE = dict(
    type='mmsoft.SOFT',
    arch=ARCH,
    out_type='cls_token',
    out_indices=(3, ),
    drop_path_rate=0.3)  # torch RNG in training
NUM_CLASSES, SIZE, N = 3, 64, 12  # 6 iterations of 2: one epoch
MAX_ITERS = 6
MILESTONE = 5  # the lr drops x0.1 from iteration index 5 on

pytestmark = pytest.mark.usefixtures('one_thread')


class RandomImages(Dataset):
    """n random images; mmpretrain's through RandomFlip, PackInputs."""

    metainfo = dict(classes=('a', 'b', 'c'))

    def __init__(self, n=N):
        import mmpretrain.datasets  # noqa: F401  (the transforms)
        from mmcv.transforms import Compose
        self.n = n
        self.pipeline = Compose([
            dict(
                type='mmpretrain.RandomFlip',
                prob=[0.3, 0.3],
                direction=['horizontal', 'vertical']),
            dict(type='mmpretrain.PackInputs')
        ])

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        img = torch.randint(
            0, 256, (3, SIZE, SIZE), generator=g, dtype=torch.uint8)
        return self.pipeline(
            dict(img=img.permute(1, 2, 0).numpy(), gt_label=i % 3))


class Recorder(Hook):
    """Records the state a loop starts from and the iterations it runs."""

    def __init__(self):
        self.iters, self.lrs = [], []

    def before_train(self, runner):
        self.start = runner.iter, model_weights(runner)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        self.iters.append(runner.iter)
        self.lrs.append(runner.optim_wrapper.get_lr()['lr'][0])


def _runner(work_dir, name, stop_after=None, train=True, **kwargs):
    data = dict(
        dataset=RandomImages(),
        sampler=dict(type='DefaultSampler', shuffle=True),
        batch_size=2,
        num_workers=0)
    eval_data = dict(
        dataset=RandomImages(n=4),
        sampler=dict(type='DefaultSampler', shuffle=False),
        batch_size=4,
        num_workers=0)
    model = dict(
        type='ImageClassifier',
        backbone=BACKBONE,
        neck=None,
        head=dict(
            type='LinearClsHead',
            num_classes=NUM_CLASSES,
            in_channels=ARCH['embed_dims'][-1]),
        data_preprocessor=dict(mean=[127.5] * 3, std=[127.5] * 3))
    evaluator, key = dict(type='Accuracy', topk=(1, )), 'accuracy/top1'
    recorder = Recorder()
    train_kw = dict(
        train_dataloader=data,
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)),
        param_scheduler=dict(
            type='MultiStepLR', milestones=[MILESTONE], by_epoch=False),
        train_cfg=dict(by_epoch=False, max_iters=MAX_ITERS, val_interval=3),
    ) if train else {}
    runner = Runner(
        model=model,
        work_dir=str(work_dir),
        experiment_name=name,
        default_scope='mmpretrain',
        val_dataloader=eval_data,
        val_evaluator=evaluator,
        val_cfg=dict(),
        test_dataloader=eval_data,
        test_evaluator=evaluator,
        test_cfg=dict(),
        default_hooks=dict(
            checkpoint=dict(
                type='SafeCheckpointHook',
                interval=2,
                by_epoch=False,
                save_best=key,
                rule='greater'),
            logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[recorder] + ([Crash(stop_after)] if stop_after else []),
        log_processor=dict(by_epoch=False),
        randomness=dict(seed=0),
        **train_kw,
        **kwargs)
    return runner, recorder, key


def _assert_same(a, b):
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def _saved(path):
    with mmengine_checkpoints_allowed():  # weights only (torch's default)
        return torch.load(path, map_location='cpu')


def test_train_checkpoint_resume_test(tmp_path):
    """Then val / test, also from a test-only ``Runner(load_from=...)``."""
    pytest.importorskip('mmpretrain')
    work_dir = tmp_path / 'work_dir'

    # 1. train, interrupted after 4 of 6 iterations; checkpoints at 2 and 4
    runner, rec, key = _runner(work_dir, 'first', stop_after=4)
    with pytest.raises(Interrupted):
        runner.train()
    assert rec.iters == [0, 1, 2, 3]
    ckpt_path = work_dir / 'iter_4.pth'
    assert ckpt_path.is_file() and (work_dir / 'iter_2.pth').is_file()
    assert (work_dir / 'last_checkpoint').read_text().strip() == str(ckpt_path)
    ckpt = _saved(ckpt_path)
    assert ckpt['meta']['iter'] == 4
    _assert_same(ckpt['state_dict'], model_weights(runner))

    # 2. the same config with resume=True picks iter_4.pth and finishes
    runner2, rec2, _ = _runner(work_dir, 'resumed', resume=True)
    runner2.train()
    assert rec2.start[0] == 4  # the iteration counter continued
    _assert_same(rec2.start[1], ckpt['state_dict'])  # from the checkpoint
    assert rec2.iters == [4, 5] and runner2.iter == MAX_ITERS
    # the param scheduler resumed too: the lr drop at MILESTONE happened
    assert rec2.lrs == pytest.approx([0.1, 0.01])
    assert (work_dir / f'iter_{MAX_ITERS}.pth').is_file()
    assert runner2.message_hub.get_info('best_score') is not None

    # an uninterrupted run ends with the same weights (bitwise: the RNG
    # states of the flips and drop path were restored)
    ref, rec_ref, _ = _runner(tmp_path / 'ref', 'reference')
    ref.train()
    assert rec_ref.lrs == pytest.approx([0.1] * 5 + [0.01])
    _assert_same(model_weights(runner2), model_weights(ref))

    assert key in runner2.val()
    assert key in runner2.test()

    # 3. load_from + resume=True: resume from an explicit, older checkpoint
    runner3, rec3, _ = _runner(
        work_dir,
        'from_iter_2',
        stop_after=3,
        resume=True,
        load_from=str(work_dir / 'iter_2.pth'))
    with pytest.raises(Interrupted):
        runner3.train()
    assert rec3.start[0] == 2 and rec3.iters == [2]
    _assert_same(rec3.start[1], _saved(work_dir / 'iter_2.pth')['state_dict'])

    # 4. a test-only runner loading a full training checkpoint (tools/test.py)
    last = work_dir / f'iter_{MAX_ITERS}.pth'
    runner4, _, _ = _runner(
        work_dir, 'test_only', train=False, load_from=str(last))
    assert key in runner4.test()
    _assert_same(model_weights(runner4), _saved(last)['state_dict'])
