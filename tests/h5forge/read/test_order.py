"""The epoch order: a permutation fixed by (n, seed, epoch), uniform or block-shuffled."""

from __future__ import annotations

import numpy as np
import pytest

from h5forge.read.order import block_locality, epoch_order, uniform_locality


@pytest.mark.parametrize("block_size", [None, 1, 7, 64, 1000])
@pytest.mark.parametrize("n", [0, 1, 5, 999])
def test_every_order_is_a_permutation(n: int, block_size: int | None) -> None:
    order = epoch_order(n, seed=3, epoch=1, block_size=block_size)
    assert order.dtype == np.int64
    assert sorted(order.tolist()) == list(range(n))


def test_the_order_depends_on_seed_and_epoch_only() -> None:
    a = epoch_order(500, seed=1, epoch=2)
    assert np.array_equal(a, epoch_order(500, seed=1, epoch=2))
    assert not np.array_equal(a, epoch_order(500, seed=1, epoch=3))
    assert not np.array_equal(a, epoch_order(500, seed=2, epoch=2))
    assert np.array_equal(epoch_order(10, shuffle=False, seed=9), np.arange(10))


def test_block_shuffle_keeps_batches_within_few_blocks() -> None:
    n, batch, block = 20_000, 64, 256
    uniform = block_locality(epoch_order(n, seed=0), batch, block)
    blocked = block_locality(epoch_order(n, seed=0, block_size=block, window=4), batch, block)
    # a uniform shuffle spreads a batch over ~44 of the 79 blocks (78 * (1 - (77/78)**64))
    assert uniform > 35
    assert blocked <= 5  # four blocks per window, a batch may straddle two windows
    # and the blocks themselves are shuffled: the first window is not the first four blocks
    first = set((epoch_order(n, seed=0, block_size=block)[: 4 * block] // block).tolist())
    assert first != {0, 1, 2, 3}


@pytest.mark.parametrize("block_size", [None, 16, 7])
def test_the_first_count_positions_are_the_head_of_the_order(block_size: int | None) -> None:
    whole = epoch_order(1001, seed=4, epoch=2, block_size=block_size, window=4)
    for count in (0, 1, 63, 64, 65, 500, 1001):
        head = epoch_order(1001, seed=4, epoch=2, block_size=block_size, window=4, count=count)
        assert np.array_equal(head, whole[:count]), count
    assert np.array_equal(epoch_order(9, shuffle=False, count=3), [0, 1, 2])
    with pytest.raises(ValueError, match="count=1002"):
        epoch_order(1001, count=1002)


@pytest.mark.parametrize(
    ("n", "batch", "block"), [(20_000, 64, 256), (50_000, 64, 16), (999, 5, 2)]
)
def test_uniform_locality_estimates_a_uniform_shuffle(n: int, batch: int, block: int) -> None:
    measured = np.mean(
        [block_locality(epoch_order(n, seed=s, epoch=1), batch, block) for s in range(3)]
    )
    assert uniform_locality(n, batch, block) == pytest.approx(measured, rel=0.03)
    assert uniform_locality(10, 64, 16) == 1.0  # one (short) block
    assert uniform_locality(64, 64, 16) == 4.0  # every batch touches every block
    assert uniform_locality(10**12, 64, 16) == pytest.approx(64, abs=0.01)


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"n": -1}, "n=-1"),
        ({"n": 3, "seed": -2}, "seed=-2"),
        ({"n": 3, "epoch": 1.5}, "epoch=1.5"),
        ({"n": 3, "block_size": 0}, "block_size=0"),
        ({"n": 3, "window": True}, "window=True"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word.replace(".", r"\.")):
        epoch_order(**kwargs)
