"""launcher/data/sampling.py: which block each rank reads - disjoint, complete per epoch, deterministic and
resumable, pinned across library versions."""

from __future__ import annotations

from launcher.data.sampling import BlockOrder
from tests.data.corpus import one_line_error


def test_ranks_are_disjoint_and_cover_every_block_each_epoch():
    world, micro, n_blocks = 3, 2, 12
    orders = [BlockOrder(n_blocks, world, rank, seed=7, micro_batch=micro) for rank in range(world)]
    assert orders[0].micro_steps_per_epoch == 2
    for epoch in range(3):
        steps = range(epoch * 2, epoch * 2 + 2)
        seen = [index for order in orders for step in steps for index in order.batch(step)]
        assert sorted(seen) == list(range(n_blocks))
        assert all(order.epoch(steps[0]) == epoch for order in orders)


def test_leftover_blocks_are_dropped_per_epoch_without_overlap():
    orders = [BlockOrder(10, 3, rank, seed=1) for rank in range(3)]  # 3 blocks per rank, 1 left over
    for epoch in range(4):
        seen = [i for order in orders for step in range(epoch * 3, epoch * 3 + 3) for i in order.batch(step)]
        assert len(set(seen)) == 9


def test_order_is_deterministic_resumable_and_seeded():
    order = BlockOrder(50, 2, 1, seed=3)
    forward = [order.batch(step, 4) for step in range(40)]
    fresh = BlockOrder(50, 2, 1, seed=3)  # a resumed run: asks for late steps first
    assert [fresh.batch(step, 4) for step in reversed(range(40))] == forward[::-1]
    assert [BlockOrder(50, 2, 1, seed=4).batch(step, 4) for step in range(40)] != forward
    assert BlockOrder(50, 2, 0, seed=3).permutation(0).tolist() != list(range(50))  # actually shuffled


def test_epoch_rollover_is_seamless():
    order = BlockOrder(10, 1, 0, seed=0, micro_batch=4)
    first, second = order.permutation(0).tolist(), order.permutation(1).tolist()
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    assert order.batch(0) + order.batch(1) == first[:8]
    assert order.batch(2) == first[8:] + second[:2]
    assert order.micro_steps_per_epoch == 2
    assert BlockOrder(1, 1, 0, seed=0, micro_batch=4).micro_steps_per_epoch == 1


def test_order_is_pinned_so_resume_survives_library_upgrades():
    # splitmix64-keyed, not numpy's or torch's RNG: this list must never change (a resumed run depends on it)
    assert BlockOrder(8, 1, 0, seed=0).permutation(0).tolist() == [0, 7, 3, 1, 5, 4, 6, 2]


def test_fewer_blocks_than_ranks():
    assert "yields 2 blocks, fewer than the 4 ranks" in one_line_error(BlockOrder, 2, 4, 0, 0)
