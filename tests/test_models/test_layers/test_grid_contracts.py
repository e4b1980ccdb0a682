"""The documented contracts of SOFT's landmark grid (``mmsoft.models.layers.
grid``): :func:`landmark_grid` (the strided grid, clamped to
``landmark_hw`` or shrunk, aspect kept, to at most ``max_landmarks``) and
:func:`reduce_map` (r x r average pooling, stride r, then adaptive pooling
to that grid), checked against values worked out by hand."""

import pytest
import torch
from conftest import deadline

from mmsoft.models.layers import landmark_grid, reduce_map

#: 2 ** 53 + 1: the first int that a float64 cannot hold
BIG = 2**53 + 1


@pytest.mark.parametrize(
    'hw, r, cap, want',
    [
        # no cap: max(1, H // r) x max(1, W // r)
        ((13, 40), 4, None, (3, 10)),
        ((3, 2), 4, None, (1, 1)),
        # within the cap (product equal to it included): unchanged
        ((8, 8), 2, 16, (4, 4)),
        # (exactly: a float round trip, int(BIG * 1.0), would lose 1)
        ((BIG, 1), 1, BIG, (BIG, 1)),
        # s = sqrt(cap / (gh gw)) = 1/2: floor(gh s) x floor(gw s) lands
        # exactly on the cap, which is not over it: no further shrinking
        ((4, 4), 1, 4, (2, 2)),
        ((12, 8), 1, 24, (6, 4)),
        # gh s a whole number: exactly that (25 * sqrt(49 / 625) = 7, 17 *
        # sqrt(36 / 289) = 6, 17 * sqrt(9 / 289) = 3), not one below it
        ((100, 100), 4, 49, (7, 7)),
        ((17, 17), 1, 36, (6, 6)),
        ((68, 68), 4, 9, (3, 3)),
        # s = 1 / sqrt(60): floor(3.87) x floor(2.58)
        ((30, 20), 1, 10, (3, 2)),
        # 1-wide maps: s = 1/sqrt(2) (1/2 with r = 4) gives 5 x 0 -> 5 x 1
        # (8 x 0 -> 8 x 1), over the cap: the long side shrinks to the cap
        ((8, 1), 1, 4, (4, 1)),
        ((1, 8), 1, 4, (1, 4)),
        ((64, 4), 4, 4, (4, 1)),
        ((4, 64), 4, 4, (1, 4)),
    ])
def test_landmark_grid_documented_sizes(hw, r, cap, want):
    """The grid is max(1, H // r) x max(1, W // r); over ``max_landmarks``
    it becomes floor(gh s) x floor(gw s), s = sqrt(cap / (gh gw)), each
    side at least 1, then one side at a time is cut while the product is
    over the cap (only a side longer than 1 can be cut)."""
    with deadline():
        got = landmark_grid(hw, r, cap)
    assert got == want
    if cap is not None:
        assert got[0] * got[1] <= cap


@pytest.mark.parametrize('hw, r, fixed, want', [((28, 28), 4, (7, 5), (7, 5)),
                                                ((13, 40), 4, (7, 5), (3, 5)),
                                                ((6, 6), 4, (24, 24), (1, 1))])
def test_landmark_grid_fixed_grid_is_clamped(hw, r, fixed, want):
    """``landmark_hw`` fixes the grid, clamped to the strided grid (never
    up-sampled)."""
    assert landmark_grid(hw, r, landmark_hw=fixed) == want


def test_reduce_map_is_the_mean_of_each_r_by_r_cell():
    """r x r average pooling with stride r: non-overlapping cells, each
    landmark the mean of its cell."""
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    want = x.reshape(2, 3, 2, 2, 3, 2).mean((3, 5))
    torch.testing.assert_close(reduce_map(x, 2), want)


def test_reduce_map_pads_a_map_smaller_than_r_with_zeros():
    """A map shorter than r is zero-padded at the bottom: the one 2 x 2
    cell of a 1 x 3 map at r = 2 holds two values and two zeros (the
    third column is a partial cell, dropped)."""
    x = torch.tensor([[[[1., 2., 4.]]]], dtype=torch.float64)
    out = reduce_map(x, 2)
    assert out.shape == (1, 1, 1, 1)
    assert out.item() == (1. + 2.) / 4


def test_reduce_map_pools_the_cells_down_to_the_capped_grid():
    """8 x 8 at r = 2 is a 4 x 4 grid; ``max_landmarks=4`` makes it 2 x 2
    by adaptive average pooling: each landmark the mean of a 4 x 4 block
    of the map."""
    x = torch.randn(1, 2, 8, 8, dtype=torch.float64)
    want = x.reshape(1, 2, 2, 4, 2, 4).mean((3, 5))
    torch.testing.assert_close(reduce_map(x, 2, max_landmarks=4), want)


@pytest.mark.parametrize(
    'kw', [dict(), dict(max_landmarks=12),
           dict(landmark_hw=(9, 9))])
def test_reduce_map_leaves_a_map_that_is_its_grid_unchanged(kw):
    """r = 1 and no binding cap / fixed grid: the map is its own grid and
    nothing is pooled; it comes back bit for bit (signed zeros too)."""
    x = torch.tensor([[-0., 1.5, -2.], [3., -0., 0.25], [-1., 2., -0.]])
    x = x.expand(2, 1, 3, 3)
    out = reduce_map(x, 1, **kw)
    assert torch.equal(out, x)
    assert torch.equal(out.signbit(), x.signbit())
