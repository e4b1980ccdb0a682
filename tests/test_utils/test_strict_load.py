"""Issue 13: mismatched weights are an error naming the keys; a partial
load is an opt-in (``strict=False``, StrictLoadHook's ``allow_partial``)."""
import logging
import types

import pytest
import torch
from conftest import current_log, tiny_arch

from mmsoft.engine.hooks.strict_load_hook import StrictLoadHook as _hook
from mmsoft.engine.hooks.strict_load_hook import resume_refusal
from mmsoft.models.backbones import SOFT
from mmsoft.models.loading import check_attn_norm, check_checkpoint_for_model
from mmsoft.utils.strict_load import (CheckpointMismatchError,
                                      check_state_dict, compare_state_dicts,
                                      few_keys)

ARCH = tiny_arch([8, 16, 16, 32], [1, 2, 2, 2])
ARCH2 = tiny_arch([8, 16, 24, 32], [1, 2, 2, 2], [1, 1, 2, 1])


def test_compare_counts_and_few_keys():
    z = torch.zeros
    r = compare_state_dicts(
        dict(a=z(2), b=z(3), **{'bn.num_batches_tracked': torch.tensor(0)}),
        dict(a=z(2), b=z(4), c=z(1)))
    assert r.missing == () and r.unexpected == ('c', )
    assert r.mismatched == (('b', (4, ), (3, )), ) and r.matched == 1
    keys = [f'k{i}' for i in range(8)]
    assert few_keys(keys[:5]) == 'k0, k1, k2, k3, k4'
    assert few_keys(keys, 2) == 'k0, k1, ... (+6 more)'


WRONG = (' (its SOFT attention): the weights would load and give wrong '
         'results. ')


@pytest.mark.parametrize('attn_norm,meta,args,msg', [
    (False, dict(attn_norm=True, official_model='soft_norm_tiny'),
     ('n.pth', 'c.py'), 'checkpoint n.pth holds soft_norm_tiny weights '
     '(converted with attn_norm=True, --norm), but the model of c.py has '
     'attn_norm=False' + WRONG + 'Use a soft_norm_* config or --cfg-options '
     'model.backbone.attn_cfg.attn_norm=True; if the weights are soft_* '
     'ones, convert them again without --norm.'),
    (False, dict(mmsoft_attn_norm=[True]), ('t.pth', ),
     'checkpoint t.pth was trained with attn_norm=True (recorded in its '
     'meta), but the model has attn_norm=False' + WRONG + 'Use the config '
     'it was trained with or --cfg-options model.backbone.attn_cfg.'
     'attn_norm=True.'),
    (True, dict(attn_norm=False),
     ('n.pth', ), 'checkpoint n.pth holds soft_* weights (converted with '
     'attn_norm=False, no --norm), but the model has attn_norm=True' + WRONG +
     'Use a soft_* config or --cfg-options model.backbone.attn_cfg.'
     'attn_norm=False; if the weights are soft_norm_* ones, convert them '
     'again with --norm.'),
    (True, dict(mmsoft_attn_norm=[False, True]), ('t.pth', ),
     'checkpoint t.pth was trained with attn_norm=False / attn_norm=True '
     '(recorded in its meta), but the model has attn_norm=True' + WRONG +
     'Use the config it was trained with or its attn_cfg settings.'),
])
def test_attn_norm_of_converted_or_trained_weights_is_checked(
        attn_norm, meta, args, msg):
    """The recorded attn_norm against the model's; matching / none passes."""
    model = SOFT(
        ARCH, attn_cfg=dict(type='SOFTAttention', attn_norm=attn_norm))
    with pytest.raises(CheckpointMismatchError) as exc:
        check_attn_norm(model, dict(meta=meta), *args)
    assert str(exc.value) == msg
    cfg = 'model = dict(backbone=dict(attn_cfg=dict(attn_norm=%s)))\n' % (
        not attn_norm)
    for ok in (dict(meta=dict(attn_norm=attn_norm)),
               dict(meta=dict(mmsoft_attn_norm=[attn_norm])),
               dict(meta=dict(mmsoft_attn_norm=[str(not attn_norm)])),
               dict(meta=dict(cfg=cfg)), {}, [1]):
        check_attn_norm(model, ok, 'ok.pth')


class _Whole(torch.nn.Module):
    """A whole model: a SOFT backbone and a head."""

    def __init__(self, arch=ARCH, attn_norm=False):
        super().__init__()
        self.backbone = SOFT(
            arch, attn_cfg=dict(type='SOFTAttention', attn_norm=attn_norm))
        self.head = torch.nn.Linear(2, 3)

    def test_step(self, data):  # what BaseTTAModel asks of its model
        return data


def _runner(model, **attrs):
    """What StrictLoadHook reads of a Runner."""
    return types.SimpleNamespace(model=model, **attrs)


def test_strict_load_hook_names_the_loaded_file():
    """A mismatch names load_from (or checkpoint), opt-in and config."""
    other = {'state_dict': _Whole(ARCH2).state_dict()}
    for attrs, source in ((dict(_load_from='w/e.pth'), 'w/e.pth'),
                          (dict(_load_from=None), 'checkpoint')):
        with pytest.raises(CheckpointMismatchError) as exc:
            _hook().after_load_checkpoint(_runner(_Whole(), **attrs), other)
        msg = str(exc.value)
        assert msg.startswith(f'checkpoint {source} does not match the '
                              f'model (_Whole): ')
        assert msg.endswith('If a partial load is intended (e.g. another '
                            "head), set allow_partial=True on the config's "
                            'StrictLoadHook (custom_hooks).')
    _hook(allow_partial=True).after_load_checkpoint(
        _runner(_Whole(), _load_from='w/e.pth'), other)  # logged only
    # the attention-normalisation refusal names the Runner's config
    model, cfg = _Whole(), types.SimpleNamespace(filename='my_cfg.py')
    ckpt = {'state_dict': model.state_dict(), 'meta': {'attn_norm': True}}
    with pytest.raises(CheckpointMismatchError) as exc:
        _hook().after_load_checkpoint(
            _runner(model, _load_from='n.pth', cfg=cfg), ckpt)
    assert str(exc.value).startswith('checkpoint n.pth holds soft_norm_* '
                                     'weights (converted with attn_norm=True,'
                                     ' --norm), but the model of my_cfg.py '
                                     'has attn_norm=False')


@pytest.mark.parametrize('ckpt,problem', [
    ([1, 2], 'it holds a list, not a dict'),
    (dict(state_dict={}), 'it has no meta, message_hub'),
    (dict(meta={}), 'it has no message_hub, meta.epoch, meta.iter'),
    (dict(meta=dict(epoch=1, iter=9), message_hub={}), None),
])
def test_resume_refusal(ckpt, problem):
    """--resume of a non-training file: one line naming load_from."""
    want = '' if problem is None else (
        f'--resume w.pth: not a training checkpoint ({problem}); --resume '
        'continues a run from an epoch_N.pth / iter_N.pth written by '
        'tools/train.py. To start training from these weights, pass '
        '--cfg-options load_from=w.pth instead')
    assert resume_refusal(ckpt, 'w.pth') == want
    if want:
        runner = _runner(None, _load_from='w.pth', _resume=True)
        with pytest.raises(CheckpointMismatchError) as exc:
            _hook().after_load_checkpoint(runner, ckpt)
        assert str(exc.value) == want


def _training_checkpoint(model, optimizer):
    """What Runner.save_checkpoint writes (the parts the hook reads)."""
    opt = optimizer(model.parameters(), lr=0.1).state_dict()
    return dict(state_dict=model.state_dict(), meta=dict(epoch=1, iter=2),
                message_hub={}, optimizer=opt)  # yapf: disable


def _resuming(model, optimizer, **kw):
    """A Runner resuming ``e.pth`` with ``optimizer`` (lr 0.1, ``kw``)."""
    opt = optimizer(model.parameters(), **{'lr': 0.1, **kw})
    return _runner(
        model,
        _load_from='e.pth',
        _resume=True,
        optim_wrapper=types.SimpleNamespace(optimizer=opt))


def test_strict_load_hook_refuses_other_settings_for_resume():
    """A resume refuses a new lr / weight_decay or another optimizer."""
    model = _Whole()
    ckpt = _training_checkpoint(model, torch.optim.SGD)
    ckpt['optimizer']['param_groups'][0]['initial_lr'] = 0.1
    _hook().after_load_checkpoint(_resuming(model, torch.optim.SGD), ckpt)
    for key, new, was in (('lr', 0.01, '0.1'), ('weight_decay', 0.05, '0')):
        with pytest.raises(CheckpointMismatchError) as exc:
            _hook().after_load_checkpoint(
                _resuming(model, torch.optim.SGD, **{key: new}), ckpt)
        assert str(exc.value) == (
            f"--resume e.pth: the config's optim_wrapper.optimizer.{key} is "
            f'{new:g}, the checkpoint was trained with {was}: a resume '
            'restores the saved optimizer and schedule, so the run would '
            f'continue at {was}. To train these weights with {key} {new:g} '
            'in a new schedule, pass --cfg-options load_from=e.pth instead '
            f'of --resume; to continue the run, drop the new {key}')
    adamw = _training_checkpoint(model, torch.optim.AdamW)
    adamw['optimizer']['param_groups'][0].update(
        initial_lr=0.1, decay_mult=0.0)  # added by mmengine, not torch
    with pytest.raises(CheckpointMismatchError) as exc:
        _hook().after_load_checkpoint(_resuming(model, torch.optim.SGD), adamw)
    # AdamW's settings that SGD lacks: by torch version (2.1 to 2.14)
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    own = [
        k for k in ('decoupled_weight_decay', 'fused')
        if k not in sgd.param_groups[0]
        and k in adamw['optimizer']['param_groups'][0]
    ]
    has = ', '.join(sorted(['amsgrad', 'betas', 'capturable', 'eps', *own]))
    assert str(exc.value) == (
        "--resume e.pth: the checkpoint was trained with another optimizer "
        f"than the config's optim_wrapper.optimizer (SGD): its state has "
        f'{has} and no '
        'dampening, momentum, nesterov, so it cannot continue in SGD. Resume '
        'with the optimizer it was trained with, or start a new run from '
        'these weights with --cfg-options load_from=e.pth (without --resume)')
    _hook().after_load_checkpoint(_resuming(model, torch.optim.AdamW),
                                  adamw)  # same
    # a torch that added a setting: one way only, not another optimizer
    older = _training_checkpoint(model, torch.optim.AdamW)
    older['optimizer']['param_groups'][0].pop('capturable')
    _hook().after_load_checkpoint(_resuming(model, torch.optim.AdamW), older)
    # load_from (no resume) is no resume: nothing to continue
    sgd = _resuming(model, torch.optim.SGD).optim_wrapper
    _hook().after_load_checkpoint(
        _runner(model, _load_from='e.pth', optim_wrapper=sgd), adamw)


def test_check_checkpoint_for_model_inputs():
    """Strict; wrappers and ``module.`` keys; non-dicts; authors' files."""
    from mmengine.model import BaseTTAModel
    from reference import official_soft_ref as ref

    class TTA(BaseTTAModel):

        def merge_preds(self, data_samples_list):
            return data_samples_list

    model = _Whole()
    sd = model.state_dict()
    partial = {k: v for k, v in sd.items() if not k.startswith('head.')}
    with pytest.raises(CheckpointMismatchError) as exc:
        check_checkpoint_for_model(model, partial, 'p.pth')
    assert 'head.weight' in str(exc.value)
    assert 'If a partial load' not in str(exc.value)
    report = check_checkpoint_for_model(TTA(module=model), sd, 'w.pth')
    assert report.ok and report.matched == len(sd)
    wrapped = torch.nn.DataParallel(model)
    assert check_checkpoint_for_model(wrapped, {'state_dict': sd}, 'w.pth').ok
    ddp_keys = {f'module.{k}': v for k, v in sd.items()}
    assert check_checkpoint_for_model(model, ddp_keys, 'd.pth').matched == \
        len(sd)
    with pytest.raises(CheckpointMismatchError) as exc:
        check_checkpoint_for_model(model, [1, 2], 'l.pth')
    assert str(exc.value) == 'checkpoint l.pth holds a list, not a state dict'
    authors = ref.random_official_state_dict([8, 8, 8, 8], [1, 1, 1, 1],
                                             [1, 1, 1, 1],
                                             pretrain_img_size=32,
                                             dtype=torch.float32)
    with pytest.raises(CheckpointMismatchError) as exc:
        check_checkpoint_for_model(model, {'model': authors}, 'a/o.pth')
    assert 'soft2mmsoft.py a/o.pth weights/o.pth [--norm' in str(exc.value)


@pytest.mark.parametrize('matched', [0, 1])
def test_check_state_dict_error_is_the_documented_line(matched):
    """The refusal, the opt-in if any tensor loads; allow_partial warns."""
    model = {f'm{i}': torch.zeros(1) for i in range(matched)}
    ckpt = dict(model, only_ckpt=torch.zeros(1))
    model['only_model'] = torch.zeros(1)
    none = ' (none: a checkpoint of another model?)' if not matched else ''
    n = matched + 1
    head = (f'checkpoint ck.pth does not match the model: {matched} of its '
            f'{n} tensors would load{none}. '
            f"1 of the model's {n} tensors are missing from the "
            "checkpoint: only_model; 1 of the checkpoint's "
            f'{n} tensors are not in the model (unexpected): only_ckpt.')
    for opt_in in (None, 'set strict=False'):
        with pytest.raises(CheckpointMismatchError) as info:
            check_state_dict(model, ckpt, 'ck.pth', opt_in=opt_in)
        fix = ' If a partial load is intended (e.g. another head), ' \
            'set strict=False.' if matched and opt_in else ''
        assert str(info.value) == head + fix
    if not matched:
        with pytest.raises(
                CheckpointMismatchError,
                match=r'^checkpoint ck\.pth '
                r'does not match SOFT: 0 of its 1 tensors .*none:'):
            check_state_dict(
                model, ckpt, 'ck.pth', target='SOFT', allow_partial=True)
        return
    with current_log() as records:
        r = check_state_dict(
            model, ckpt, 'ck.pth', target='SOFT', allow_partial=True)
    assert r.matched == matched
    assert [(rec.levelno, rec.getMessage()) for rec in records] == [
        (logging.WARNING, 'partial load (allowed): checkpoint ck.pth does '
         "not match SOFT: 1 of its 2 tensors would load.\n  1 of the model's "
         "2 tensors are missing from the checkpoint: only_model\n  1 of the "
         "checkpoint's 2 tensors are not in the model (unexpected): "
         'only_ckpt')
    ]
