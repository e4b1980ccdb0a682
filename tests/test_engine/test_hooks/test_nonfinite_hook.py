"""NonFiniteLossHook: the first non-finite loss / step stops training
before any NaN checkpoint; non-finite outputs stop naming the cause."""
import glob
import os.path as osp
import re
import uuid
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as torch_dist
import torch.nn as nn
from mmengine.dist.dist import _get_reduce_op
from mmengine.model import BaseModel
from mmengine.optim import OptimWrapper, OptimWrapperDict
from mmengine.runner import Runner
from mmengine.structures import BaseDataElement

import mmsoft  # noqa: F401  (registers the hook)
from mmsoft.engine import NonFiniteLossError, NonFiniteLossHook
from mmsoft.engine.hooks import nonfinite_hook as nf

NAN, ONE = float('nan'), torch.ones(2)


class ToyModel(BaseModel):
    """NaN loss at batches ``nan_at``, NaN gradients at ``nan_grad_at``."""

    def __init__(self, nan_at=(), nan_grad_at=()):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.nan_at, self.nan_grad_at = set(nan_at), set(nan_grad_at)
        self.train_iter = 0

    def forward(self, inputs, targets, mode='loss'):
        loss = ((self.fc(inputs).squeeze(-1) - targets)**2).mean()
        if int(inputs[0, 0].round()) in self.nan_at:
            loss = loss * NAN
        self.train_iter += 1
        if self.train_iter in self.nan_grad_at:
            # value sqrt(0) = 0, gradient inf * 0 = nan for every weight
            loss = loss + (self.fc.weight.sum() * 0).sqrt() + \
                (self.fc.bias.sum() * 0).sqrt()
        return dict(loss=loss)


@pytest.mark.parametrize(
    'kw,stop',
    [
        (dict(), r'non-finite training loss \(\S+\) at epoch 2, iteration '
         r'(9|1[0-6])/24;'),  # lr 1e6: stopped at the first, in epoch 2
        (
            dict(gamma=1., nan_grad_at=(16, )),  # a finite loss, NaN gradients
            r'the optimizer step at epoch 2, iteration 16/24 made .*fc\.weight'
            r'.* although the loss was finite'),
        (dict(gamma=1., nan_at=(3, ), skip=1), None),  # one skip per epoch
    ],
    ids=['loss', 'step', 'skipped'])
def test_nonfinite_training_never_replaces_the_good_checkpoint(
        tmp_path, kw, stop):
    """Epoch 1 at lr 0.01, then lr x ``gamma`` (1e8)."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    x[:, 0] = torch.arange(8.)  # the batch id
    y = x @ torch.tensor([0.01, 1., -1., 2.])
    runner = Runner(
        model=ToyModel(kw.get('nan_at', ()), kw.get('nan_grad_at', ())),
        experiment_name=f'nonfinite_{uuid.uuid4().hex[:8]}',
        work_dir=str(tmp_path),
        train_dataloader=dict(
            dataset=[dict(inputs=a, targets=b) for a, b in zip(x, y)],
            batch_size=1,
            sampler=dict(type='DefaultSampler', shuffle=False),
            collate_fn=dict(type='default_collate')),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01)),
        param_scheduler=dict(
            type='MultiStepLR',
            by_epoch=True,
            milestones=[1],
            gamma=kw.get('gamma', 1e8)),
        train_cfg=dict(by_epoch=True, max_epochs=3),
        default_hooks=dict(
            checkpoint=dict(
                type='CheckpointHook', interval=1, max_keep_ckpts=1)),
        custom_hooks=[
            dict(
                type='NonFiniteLossHook', max_skipped_steps=kw.get('skip', 0))
        ],
        default_scope='mmengine',
        randomness=dict(seed=0),
        log_level='WARNING')
    names = [type(h).__name__ for h in runner.hooks]
    assert names.index('NonFiniteLossHook') < names.index('CheckpointHook')
    if stop is None:
        runner.train()  # a warning per skipped step: below
    else:
        with pytest.raises(NonFiniteLossError, match=stop):
            runner.train()
    ckpts = glob.glob(str(tmp_path / 'epoch_*.pth'))
    assert [osp.basename(c) for c in ckpts] == \
        ['epoch_3.pth' if stop is None else 'epoch_1.pth']
    sd = torch.load(ckpts[0], weights_only=False)['state_dict']
    assert all(torch.isfinite(v).all() for v in sd.values())
    if stop is None or 'training loss' in stop:  # a NaN loss's step: none
        assert all(torch.isfinite(p).all() for p in runner.model.parameters())


# ------------------------------------------------ on stand-in runners
def _stub_runner(work_dir=None, max_iters=10, it=2, model=None, wrapper=None):
    log = SimpleNamespace(errors=[], warnings=[])
    log.error, log.warning = log.errors.append, log.warnings.append
    loop = dict(max_iters=max_iters) if max_iters else {}
    where = dict(work_dir=work_dir) if work_dir else {}
    return SimpleNamespace(
        model=model or nn.Linear(1, 1),
        optim_wrapper=wrapper,
        logger=log,
        train_loop=SimpleNamespace(**loop),
        iter=it,
        epoch=0,
        **where)


def test_no_checkpoint_with_nonfinite_parameters():
    """Named without ``module.`` (a wrapped model); more than 3: '...'."""
    model = nn.Sequential(*[nn.Linear(1, 1) for _ in range(2)])
    hook, runner = NonFiniteLossHook(), _stub_runner(None, 24, 4, model)
    hook.before_save_checkpoint(runner, {})  # finite: nothing happens
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(NAN)
    runner.model = nn.DataParallel(model)
    with pytest.raises(NonFiniteLossError) as e:
        hook.before_save_checkpoint(runner, {})
    assert str(e.value) == (
        'NonFiniteLossHook: refusing to save a checkpoint at iteration 5/24: '
        '4 parameter tensor(s) (0.weight, 0.bias, 1.weight, ...) hold nan / '
        'inf; training stopped. Lower the learning rate or enable gradient '
        'clipping (optim_wrapper.clip_grad).')
    with torch.no_grad():
        model[1].bias.fill_(1.)
    assert nf._bad_params(model) == \
        '3 parameter tensor(s) (0.weight, 0.bias, 1.weight)'


@pytest.mark.parametrize('skips,work_dir,max_iters,logged',
                         [(0, 'w', 24, False), (2, 'w', 24, False),
                          (0, None, 24, True), (0, 'w', None, True)])
def test_stop_message_is_the_documented_line(skips, work_dir, max_iters,
                                             logged):
    """Every fix of docs/en/faq.md; a loss only in the outputs: after it."""
    hook = NonFiniteLossHook(skips) if skips else NonFiniteLossHook()
    runner = hook._runner = _stub_runner(work_dir, max_iters, it=11)
    if work_dir is None:
        hook.before_train_iter(runner, 2)
    nan = torch.tensor([1., NAN])
    for outputs in (None, {}, dict(loss=torch.tensor(1.5)), ['not a dict']):
        hook.after_train_iter(runner, 2, outputs=outputs)
    for _ in range(skips):
        assert hook._check(nan)  # skipped
    with pytest.raises(NonFiniteLossError) as e:
        if logged:
            hook.after_train_iter(runner, 2, outputs=dict(loss=nan))
        else:
            hook._check(nan)
    where = 'iteration 12' + ('/24' if max_iters else '')
    skipped = ' after 2 skipped step(s)' if skips else ''
    kept = (f'; the checkpoints in {work_dir} are from before the fault'
            if work_dir else '')
    assert str(e.value) == (
        f'NonFiniteLossHook: non-finite training loss (nan) at {where}'
        f'{skipped}; training stopped before the optimizer step{kept}. Lower '
        f'the learning rate or enable gradient clipping '
        f'(optim_wrapper.clip_grad), or allow skipped steps with '
        f"custom_hooks=[dict(type='NonFiniteLossHook', "
        f'max_skipped_steps=N)].')
    assert runner.logger.errors == [str(e.value)]
    assert len(runner.logger.warnings) == skips


def _guarded(hook, accumulate=1, it=0, wrappers=('', )):
    """A runner with a guarded OptimWrapper (several: an OptimWrapperDict)
    of a Linear(2, 1); the calls its original ``update_params`` got."""
    model, calls = nn.Linear(2, 1), []
    built = {
        name:
        OptimWrapper(
            torch.optim.SGD(model.parameters(), lr=0.1),
            accumulative_counts=accumulate)
        for name in wrappers
    }
    for wrapper in built.values():
        original = wrapper.update_params
        wrapper.update_params = lambda loss, *a, _o=original, **k: (
            calls.append((a, k)) or _o(loss, *a, **k))
    wrapper = built[''] if wrappers == ('', ) else OptimWrapperDict(**built)
    runner = _stub_runner(
        max_iters=4 if it == 0 else 10, it=it, model=model, wrapper=wrapper)
    hook.before_train(runner)
    hook.before_train_iter(runner, it)
    return runner, model, calls


def test_guard_wraps_once_and_stops_a_step_that_breaks_parameters(monkeypatch):
    """Wrapped once; skipped steps change nothing in every wrapper."""
    hook = NonFiniteLossHook()
    runner, model, calls = _guarded(hook)
    model.frozen = nn.Parameter(torch.tensor([NAN]), requires_grad=False)
    guarded = runner.optim_wrapper.update_params
    hook.before_train(runner)
    assert runner.optim_wrapper.update_params is guarded
    guarded(
        model(torch.ones(1, 2)).sum(), {}, zero_kwargs=dict(set_to_none=True))
    assert calls == [(({}, ), dict(zero_kwargs=dict(set_to_none=True)))]
    runner.optim_wrapper.optimizer.param_groups[0]['lr'] = 3e38
    loss = model(torch.full((1, 2), 2.)).sum()  # weight gradients 2: inf
    with pytest.raises(NonFiniteLossError) as info:
        guarded(loss)
    assert str(info.value) == (
        'NonFiniteLossHook: the optimizer step at iteration 1/4 made 1 '
        'parameter tensor(s) (weight) nan / inf although the loss was finite '
        f'({loss.item()}): the gradients or the update overflowed; training '
        'stopped. Lower the learning rate or enable gradient clipping '
        '(optim_wrapper.clip_grad).')
    # each wrapper guarded; a skipped step warns, drops the accumulated
    # gradients and leaves the weights
    hook = NonFiniteLossHook(max_skipped_steps=2)
    runner, model, _ = _guarded(hook, accumulate=2, it=4, wrappers='ab')
    before = model.weight.detach().clone()
    runner.optim_wrapper['a'].update_params(model(torch.ones(1, 2)).sum())
    assert model.weight.grad.abs().sum() > 0  # accumulated, no step yet
    for name in 'ab':
        hook.before_train_iter(runner, 4)
        loss = model(torch.ones(1, 2)).sum() * NAN
        assert runner.optim_wrapper[name].update_params(loss) is None
        assert model.weight.grad is None or not model.weight.grad.any()
    assert torch.equal(model.weight, before)
    assert runner.logger.warnings == [
        f'NonFiniteLossHook: non-finite loss (nan) at iteration 5/10: step '
        f'skipped ({n}/2 in a row)' for n in (1, 2)
    ]
    runner, model, _ = _guarded(NonFiniteLossHook())
    flags = []  # 1: the loss was finite everywhere, 2: the parameters not
    monkeypatch.setattr(nf, '_any_rank',
                        lambda flag: flags.append(flag) or len(flags) == 2)
    with pytest.raises(
            NonFiniteLossError,
            match='made parameters on another '
            'rank nan / inf although the loss was finite'):
        runner.optim_wrapper.update_params(model(torch.ones(1, 2)).sum())
    assert flags == [False, False]  # this rank's loss and parameters


def test_any_rank_value_and_max_skipped_steps(monkeypatch):
    """``_any_rank``: one all_reduce (MAX) on the communication device."""
    assert [
        nf._value(v) for v in (torch.tensor([1., 2.]), torch.tensor([]), 3,
                               None, 'no number')
    ] == [1.5, 0, 3, 0, 0]
    for value in (-1, 1.5, True):
        with pytest.raises(
                ValueError,
                match=r'^NonFiniteLossHook: max_skipped_steps must be an int '
                rf'>= 0, got {re.escape(repr(value))}$'):
            NonFiniteLossHook(max_skipped_steps=value)
    assert nf._any_rank(False) is False and nf._any_rank(True) is True
    calls, theirs = [], []  # one rank: the flag itself (above)

    def all_reduce(t, op='sum'):
        calls.append(t.device)
        assert _get_reduce_op(op) == torch_dist.ReduceOp.MAX
        t.copy_(torch.maximum(t, theirs[0]))

    monkeypatch.setattr(nf, 'get_world_size', lambda: 2)
    monkeypatch.setattr(nf, 'get_comm_device', lambda: torch.device('cpu'))
    monkeypatch.setattr(nf, 'all_reduce', all_reduce)
    for mine, other in ((False, False), (True, False), (False, True)):
        theirs[:] = [torch.tensor([float(other)])]
        with torch.device('meta'):  # only the communication device will do
            assert nf._any_rank(mine) is (mine or other)
    assert calls == [torch.device('cpu')] * 3


#: an output and the names of its fields that hold nan / inf
FIELDS = [
    (torch.tensor([1., NAN]), ['output']),  # a bare tensor
    (torch.tensor([1j, complex(NAN, 0)]), ['output']),
    (np.array([1., np.inf]), ['output']),
    (np.array([1., 2.]), []),
    (np.array([1j, complex(0, np.inf)]), ['output']),
    (torch.tensor([1, 2]), []),  # integers
    ('nan', []),  # neither tensor nor array
    (dict(gt_label=NAN * ONE, ignored_mask=NAN * ONE, score=ONE), []),
    (dict(a=dict(b=NAN * ONE, c=ONE)), ['a.b']),
    (dict(a=[ONE, np.array([NAN])]), ['a']),  # a list keeps its name
    ([ONE, NAN * ONE,
      torch.tensor([NAN], dtype=torch.float64)], ['output', 'output']),
    (BaseDataElement(pred_score=NAN * ONE,
                     gt_score=NAN * ONE), ['pred_score']),
]


@pytest.mark.parametrize('i', range(len(FIELDS)))
def test_nonfinite_fields_names_the_outputs_holding_nan(i):
    output, fields = FIELDS[i]
    assert nf._nonfinite(nf._leaves(output)) == fields


#: cause -> the end of the stop line (``{}``: test / validation)
CAUSES = dict(
    weights="the model's weights hold nan / inf: 1 parameter tensor(s) "
    '(weight); {} stopped, its metrics would be meaningless. The checkpoint '
    'is broken: test an earlier one.',
    inputs='the inputs from the data pipeline hold nan / inf; {} stopped, '
    'its metrics would be meaningless. Check the data pipeline and the image '
    'files.',
    std='model.data_preprocessor.std [0.0, 0.333333] has a 0 (a division by '
    'zero); {} stopped, its metrics would be meaningless. Give the std of the '
    'data the model was trained with.',
    overflow='the inputs, the weights and the preprocessing are finite: the '
    'computation overflowed; {} stopped, its metrics would be meaningless. '
    'Evaluate in float32 (without --amp / fp16).')


@pytest.mark.parametrize(
    'cause,std,mode',
    [('weights', None, 'test'), ('inputs', [1.], 'test'),
     ('inputs-dict', None, 'val'), ('std', torch.tensor([0., 1 / 3]), 'val'),
     ('overflow', torch.ones(1), 'test'),
     ('overflow', [0.], 'test')],  # a std that is no tensor: not read
    ids=['weights', 'inputs', 'inputs-dict', 'std', 'overflow', 'list-std'])
def test_nonfinite_outputs_stop_naming_the_cause(cause, std, mode):
    """Issue 52, item 4: the first image, three fields, the cause."""
    model, logged = nn.Linear(2, 2), []
    if std is not None:
        model.data_preprocessor = SimpleNamespace(std=std)
    runner = SimpleNamespace(
        model=model, logger=SimpleNamespace(error=logged.append), work_dir='w')
    nan_in = cause.startswith('inputs')
    inputs = torch.full((2, 2), NAN if nan_in else 1.)
    batch = [inputs] if cause == 'inputs' else dict(
        inputs=inputs, data_samples=ONE if nan_in else NAN * ONE)
    cause = cause.split('-')[0]  # inputs-dict: inputs
    check = getattr(NonFiniteLossHook(), f'after_{mode}_iter')
    assert check(runner, 4, batch, [dict(s=ONE)]) is None
    if cause == 'weights':
        with torch.no_grad():
            model.weight[0, 0] = NAN
    nan = torch.tensor([NAN])
    images = cause in ('weights', 'std')  # data samples with img_path
    outputs = [
        dict(a=ONE),
        BaseDataElement(
            pred_score=nan, gt_score=nan, metainfo=dict(img_path='img_4.png'))
    ] if images else [dict(d=nan, c=nan, b=nan, a=nan),
                      dict(e=ONE)]
    with pytest.raises(NonFiniteLossError) as e:
        check(runner, 4, batch, outputs)
    fields = 'pred_score; first image img_4.png' if images else 'a, b, c'
    what = 'validation' if mode == 'val' else 'test'
    assert logged == [str(e.value)] and str(e.value) == (
        f'NonFiniteLossHook: the {what} outputs of batch 5 hold nan / inf '
        f'({fields}): {CAUSES[cause].format(what)}')


def test_outputs_of_another_rank_stop_this_one(monkeypatch):
    """Also: ``check_outputs=False`` checks nothing; outputs that are one
    data element (no list)."""
    monkeypatch.setattr(nf, '_any_rank', lambda flag: True)
    runner = SimpleNamespace(model=nn.Linear(2, 2))
    with pytest.raises(NonFiniteLossError) as e:
        NonFiniteLossHook().after_val_iter(runner, 0, None, [dict(s=ONE)])
    assert str(e.value) == ('NonFiniteLossHook: the validation outputs of '
                            'another rank hold nan / inf; validation stopped')
    runner.logger = SimpleNamespace(error=lambda msg: None)
    with pytest.raises(NonFiniteLossError) as e:
        NonFiniteLossHook().after_test_iter(runner, 0, None,
                                            BaseDataElement(pred=NAN * ONE))
    assert str(e.value) == ('NonFiniteLossHook: the test outputs of batch 1 '
                            'hold nan / inf (pred): ' +
                            CAUSES['overflow'].format('test'))
    assert NonFiniteLossHook(
        check_outputs=False).after_val_iter(runner, 0, None,
                                            [dict(s=NAN * ONE)]) is None
