"""Issue 29: the authors' files (from ``tests/reference``) load through
``init_cfg`` Pretrained into the SOFT of a classifier, detector, segmentor,
holding what ``soft2mmsoft.py``'s conversion gives; the one-line report."""
import importlib
import os.path as osp

import pytest
import torch
from conftest import CONFIGS, current_log
from reference import official_soft_ref as ref

from mmsoft.models import SOFT, loading
from mmsoft.models.converters import convert_official_to_mmpretrain
from mmsoft.utils.strict_load import CheckpointMismatchError

#: the SOFT of the demo configs (configs/demo/*.py)
DEMO = dict(embed_dims=[32, 64, 128, 192], num_heads=[1, 2, 4, 6])
RATIOS = (4, 2, 2)
#: codebase, demo config, pretrain_img_size of its backbone
TASKS = {
    'mmpretrain': ('soft_cls_demo.py', 64),
    'mmdet': ('retinanet_soft_demo.py', 160),
    'mmseg': ('upernet_soft_demo.py', 160),
}


def authors_file(path, img_size, depths=(1, 1, 2, 1)):
    """Saves an authors' file of the demo SOFT; returns its conversion."""
    sd = ref.random_official_state_dict(
        DEMO['embed_dims'],
        DEMO['num_heads'],
        list(depths),
        num_classes=5,
        ratios=RATIOS,
        pretrain_img_size=img_size,
        dtype=torch.float32)
    torch.save({'model': sd}, str(path))
    converted, _ = convert_official_to_mmpretrain(sd)
    n = len('backbone.')
    return {k[n:]: v for k, v in converted.items() if k[:n] == 'backbone.'}


def build(task, checkpoint, **init):
    """``task``'s demo model, ``init_cfg`` Pretrained on its backbone."""
    from mmengine.config import Config
    from mmengine.registry import DefaultScope

    from mmsoft_tools import launch
    pytest.importorskip(task)
    cfg = Config.fromfile(osp.join(CONFIGS, 'demo', TASKS[task][0]))
    cfg.model.backbone.init_cfg = dict(
        type='Pretrained', checkpoint=str(checkpoint), **init)
    scope = launch.import_codebase(cfg)
    registry = importlib.import_module(f'{scope}.registry')
    with DefaultScope.overwrite_default_scope(scope):
        return registry.MODELS.build(cfg.model)


def _official_tiny_file(path):
    """A bare authors' state dict of SOFT-Tiny at 224 saved to ``path``."""
    torch.save(
        ref.random_official_state_dict([64, 128, 320, 512], [2, 4, 10, 16],
                                       [1, 2, 3, 2],
                                       pretrain_img_size=224,
                                       dtype=torch.float32), str(path))


@pytest.fixture
def reports(monkeypatch):
    """The report lines :mod:`mmsoft.models.loading` logs."""
    lines = []
    log = loading.print_log

    def record(msg, *a, **k):
        if str(msg).startswith('mmsoft: loaded '):
            lines.append(str(msg))
        return log(msg, *a, **k)

    monkeypatch.setattr(loading, 'print_log', record)
    return lines


@pytest.mark.parametrize('task', list(TASKS))
def test_authors_checkpoint_through_init_cfg(tmp_path, task, reports):
    path = tmp_path / 'soft_demo_authors.pth'
    want = authors_file(path, TASKS[task][1])
    model = build(task, path, prefix='backbone.' if task == 'mmdet' else None)
    model.init_weights()
    got = model.backbone.state_dict()
    assert set(got) == set(want)
    for k, v in want.items():
        assert torch.equal(got[k], v), k
    n = len(want)
    prefix = ", keys under 'backbone.'"
    assert reports == [
        f"mmsoft: loaded {path}: authors' SOFT arch=dict(embed_dims=[32, 64, "
        f'128, 192], num_heads=[1, 2, 4, 6], depths=[1, 1, 2, 1], '
        f"sampling_ratios=[4, 2, 2, 1]) layout ('model'), converted"
        f'{prefix}, {n} tensors, strict'
    ]
    # the backbone computes with them (no leftover random tensor)
    assert all(
        torch.isfinite(v).all() for v in got.values() if v.is_floating_point())


def test_bare_authors_state_dict_and_report_names_the_model(tmp_path, reports):
    """An official size is named by attn_norm (soft_* / soft_norm_*)."""
    path = tmp_path / 'soft_tiny.pth'
    _official_tiny_file(path)
    for norm, name in ((True, 'soft_norm_tiny'), (False, 'soft_tiny')):
        reports.clear()
        SOFT(
            'tiny',
            attn_cfg=dict(type='SOFTAttention', attn_norm=norm),
            init_cfg=dict(type='Pretrained',
                          checkpoint=str(path))).init_weights()
        assert reports == [
            f"mmsoft: loaded {path}: authors' {name} layout, converted, "
            f"keys under 'backbone.', 185 tensors, strict"
        ]


def test_wrong_arch_authors_checkpoint_is_an_error(tmp_path):
    path = tmp_path / 'deeper.pth'
    authors_file(path, 64, depths=(1, 1, 3, 1))
    model = build('mmpretrain', path)
    with pytest.raises(CheckpointMismatchError) as exc:
        model.init_weights()
    msg = str(exc.value)  # one line: the arch found and where to set it
    assert msg.startswith(f"checkpoint {path} holds the authors' weights of "
                          'arch=dict(embed_dims=[32, 64, 128, 192], ')
    assert '(depths [1, 1, 3, 1]), not of the configured arch=dict(' in msg
    assert msg.endswith(' in the config') and len(msg.splitlines()) == 1


@pytest.mark.parametrize('prefix', [None, 'backbone.'])
def test_backbone_keys_of_a_whole_model_file(tmp_path, reports, prefix):
    """A whole classifier (mmsoft layout): its ``backbone.`` keys."""
    src = _tiny()
    src.init_weights()
    sd = {f'backbone.{k}': v for k, v in src.state_dict().items()}
    sd['head.fc.weight'] = torch.zeros(5, 192)
    path = tmp_path / 'cls.pth'
    torch.save({'state_dict': sd, 'meta': {}}, str(path))
    dst = _tiny(
        init_cfg=dict(type='Pretrained', checkpoint=str(path), prefix=prefix))
    dst.init_weights()
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k
    assert reports == [
        f"mmsoft: loaded {path}: mmsoft layout ('state_dict'), keys under "
        f"'backbone.', {len(src.state_dict())} tensors, strict"
    ]


def test_init_weights_sets_no_private_state():
    """init_weights is mmengine's (a registered initializer)."""
    import inspect
    assert '_is_init' not in inspect.getsource(SOFT)


def test_partial_authors_load_and_second_init_weights(tmp_path, reports):
    """Another pretraining size: all but pos_embed; a 2nd init is a no-op."""
    path = tmp_path / 'authors_64.pth'
    want = authors_file(path, 64)
    model = SOFT(
        dict(DEMO, depths=[1, 1, 2, 1], sampling_ratios=[4, 2, 2, 1]),
        pretrain_img_size=96,
        init_cfg=dict(type='Pretrained', checkpoint=str(path), strict=False))
    model.init_weights()
    got = model.state_dict()
    for k, v in want.items():
        if k.endswith('pos_embed'):
            assert got[k].shape != v.shape and got[k].abs().sum() > 0, k
        else:
            assert torch.equal(got[k], v), k
    assert reports[0].endswith(f', {len(want) - 4} tensors, strict=False, '
                               f'partial')
    before = {k: v.clone() for k, v in got.items()}
    model.init_weights()
    assert len(reports) == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


# ------------------------------ load_pretrained's report and errors
def _tiny(depths=(1, 1, 2, 1), **kw):
    return SOFT(dict(DEMO, depths=list(depths)), pretrain_img_size=64, **kw)


def _filled(model, value):
    """``model``'s state dict, every floating tensor set to ``value``."""
    return {
        k: torch.full_like(v, value) if v.is_floating_point() else v
        for k, v in model.state_dict().items()
    }


def test_the_given_prefix_wins_over_backbone_keys(tmp_path, reports):
    """``prefix`` (with or without its dot) over ``backbone.`` keys."""
    model = _tiny()
    sd = {f'backbone.{k}': v for k, v in _filled(model, 0.).items()}
    sd.update({f'ema.{k}': v for k, v in _filled(model, 1.).items()})
    path = tmp_path / 'ema.pth'
    torch.save(sd, str(path))
    for prefix in ('ema', 'ema.'):
        reports.clear()
        loading.load_pretrained(model, str(path), prefix=prefix)
        assert all(
            torch.all(v == 1.) for v in model.state_dict().values()
            if v.is_floating_point())
        assert reports == [
            f"mmsoft: loaded {path}: mmsoft layout, keys under 'ema.', "
            f'{len(sd) // 2} tensors, strict'
        ]


def test_a_mismatch_names_the_module_and_the_prefix(tmp_path):
    """The strict refusal names the module and the prefix applied."""
    sd = _tiny(depths=[1, 1, 3, 1]).state_dict()
    bare, whole = tmp_path / 'bare.pth', tmp_path / 'whole.pth'
    torch.save(sd, str(bare))
    torch.save({f'backbone.{k}': v for k, v in sd.items()}, str(whole))
    for path, under in ((bare, ''), (whole,
                                     " (checkpoint keys under 'backbone.')")):
        with pytest.raises(CheckpointMismatchError) as exc:
            loading.load_pretrained(_tiny(), str(path))
        assert str(exc.value).startswith(
            f'checkpoint {path} does not match SOFT{under}: ')


def test_a_whole_model_is_compared_key_for_key(tmp_path):
    """Into a whole model, a whole-model file's keys are compared as is."""
    for backbone in (_tiny(), torch.nn.Linear(2, 2)):  # some keys / none
        whole = torch.nn.Module()
        whole.backbone = backbone
        path = tmp_path / 'other_whole.pth'
        torch.save(
            {
                f'backbone.{k}': v
                for k, v in _tiny(depths=[1, 1, 3, 1]).state_dict().items()
            }, str(path))
        with pytest.raises(CheckpointMismatchError) as exc:
            loading.load_pretrained(whole, str(path))
        assert str(exc.value).startswith(f'checkpoint {path} does not match '
                                         f'Module: ')


def test_attention_normalisation_of_the_file_is_checked(tmp_path):
    """A file of another attn_norm is refused, naming the file."""
    src = _tiny()
    path = tmp_path / 'norm.pth'
    torch.save({
        'state_dict': src.state_dict(),
        'meta': {
            'attn_norm': True
        }
    }, str(path))
    dst = _tiny(attn_cfg=dict(type='SOFTAttention', attn_norm=False))
    with pytest.raises(CheckpointMismatchError, match='attn_norm') as exc:
        loading.load_pretrained(dst, str(path))
    assert str(path) in str(exc.value)


def test_the_report_goes_to_the_current_logger(tmp_path):
    """A record of mmengine's current logger, not a print."""
    model = _tiny()
    path = tmp_path / 'own.pth'
    torch.save(model.state_dict(), str(path))
    with current_log() as records:
        loading.load_pretrained(model, str(path))
    assert [r.getMessage() for r in records] == [
        f'mmsoft: loaded {path}: mmsoft layout, '
        f'{len(model.state_dict())} tensors, strict'
    ]


def test_a_preset_arch_is_named_in_the_wrong_arch_error(tmp_path):
    """An official size's file into another: the fix is the preset."""
    path = tmp_path / 'soft_tiny.pth'
    _official_tiny_file(path)
    with pytest.raises(CheckpointMismatchError) as exc:
        loading.load_pretrained(
            SOFT(
                dict(
                    embed_dims=[32, 64, 128, 256],
                    num_heads=[1, 2, 4, 16],
                    depths=[1, 1, 1, 1]),
                pretrain_img_size=32), str(path))
    # other widths (stage-4 heads as the file's): the neck / head follow
    assert str(exc.value).endswith(
        ': use --cfg-options model.backbone.arch=tiny and neck / head '
        'in_channels [64, 128, 320, 512]')
