"""Issue 13: the SOFT backbone validates its arguments at construction
(one error naming the option) and handles empty batches / list inputs."""
import pytest
import torch
from conftest import tiny_arch

from mmsoft.models.backbones import SOFT
from mmsoft.models.layers import SOFTAttention

ARCH = tiny_arch([8, 16, 16, 32], [1, 2, 2, 2])


@pytest.mark.parametrize('kwargs, match', [
    (dict(nr_iters=0), 'nr_iters'),
    (dict(nr_iters=2.5), 'nr_iters'),
    (dict(nr_iters='20'), 'nr_iters'),
    (dict(nr_iters=True), 'nr_iters'),
    (dict(max_landmarks=2.5), 'max_landmarks'),
    (dict(max_landmarks='49'), 'max_landmarks'),
    (dict(max_landmarks=0), 'max_landmarks'),
    (dict(pretrain_img_size=16), 'pretrain_img_size'),
    (dict(pretrain_img_size=224.0), 'pretrain_img_size'),
    (dict(out_indices=()), 'out_indices'),
    (dict(out_indices=[]), 'out_indices'),
    (dict(drop_path_rate=1.0), 'drop_path_rate'),
    (dict(drop_path_rate=-0.1), 'drop_path_rate'),
    (dict(drop_rate=1.5), 'drop_rate'),
    (dict(arch=dict(ARCH, dw_kernel_sizes=[4, 5, 3])), 'dw_kernel_sizes'),
    (dict(arch=dict(ARCH, dw_kernel_sizes=[9, -5, 3])), 'dw_kernel_sizes'),
    (dict(arch=dict(ARCH, dw_kernel_sizes=[9, 5, 2.5])), 'dw_kernel_sizes'),
    (dict(attn_type='softmax', nr_iters=5), 'nr_iters=5'),
    (dict(attn_type='performer', attn_norm=False), 'attn_norm=False'),
    (dict(attn_type='sima', sampling='avgpool'), "sampling='avgpool'"),
    (dict(attn_type='softmax', max_landmarks=16), 'max_landmarks=16'),
    (dict(attn_type='linformer', nr_method='spectral'), 'nr_method'),
    (dict(attn_type='soft_norm', attn_norm=False), 'attn_norm=False'),
])
def test_bad_arguments_are_rejected_naming_the_option(kwargs, match):
    kwargs.setdefault('arch', ARCH)
    with pytest.raises(ValueError, match=match):
        SOFT(**kwargs)


@pytest.mark.parametrize('kwargs', [
    dict(nr_iters=1),
    dict(max_landmarks=16),
    dict(max_landmarks=None),
    dict(pretrain_img_size=32),
    dict(drop_path_rate=0.5),
    dict(arch=dict(ARCH, dw_kernel_sizes=[7, 0, 1])),
    dict(attn_type='linformer', max_landmarks=16),
    dict(attn_type='nystromformer', max_landmarks=16),
    dict(attn_type='softmax'),
    dict(attn_type='soft_norm', attn_norm=True),
    dict(attn_type='soft', attn_norm=False, nr_iters=5, sampling='avgpool'),
])
def test_valid_arguments_are_accepted(kwargs):
    kwargs.setdefault('arch', ARCH)
    model = SOFT(**kwargs).eval()
    outs = model(torch.randn(1, 3, 64, 64))
    assert all(torch.isfinite(o).all() for o in outs)


def test_layer_checks():
    with pytest.raises(ValueError, match='nr_iters'):
        SOFTAttention(16, 2, 2, nr_iters=0)
    with pytest.raises(ValueError, match='dw_kernel_size'):
        SOFTAttention(16, 2, 2, dw_kernel_size=4)


@pytest.mark.parametrize('out_type, out_indices', [('featmap', (0, 1, 2, 3)),
                                                   ('cls_token', (1, 3)),
                                                   ('featmap', (2, ))])
@pytest.mark.parametrize('hw', [(64, 64), (37, 53)])
def test_empty_batch_returns_empty_outputs(out_type, out_indices, hw):
    model = SOFT(ARCH, out_type=out_type, out_indices=out_indices)
    for mode in (False, True):
        model.train(mode)
        empty = model(torch.zeros(0, 3, *hw))
        one = model(torch.zeros(1, 3, *hw))
        assert len(empty) == len(one)
        for e, o in zip(empty, one):
            assert e.shape == (0, ) + o.shape[1:]
            assert e.dtype == o.dtype


def test_list_input_is_a_clear_type_error():
    model = SOFT(ARCH)
    with pytest.raises(TypeError, match='stack'):
        model([torch.zeros(3, 32, 32)])
