"""h5forge.Sampler: one global order at any world size, exact / padded / drop_last, resume."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import h5forge
from h5forge.pack.writer import PackResult
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.order import block_locality, epoch_order, uniform_locality
from h5forge.read.sampler import LOCALITY_BATCHES, Sampler
from tests.fixtures.sampling import interleave


def _ranks(n: int, world: int, **kw: object) -> list[list[int]]:
    return [list(Sampler(n, rank=r, world_size=world, **kw)) for r in range(world)]  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [1, 2, 3, 7])
@pytest.mark.parametrize("n", [0, 1, 10, 23])
def test_every_world_size_walks_the_one_global_order(n: int, world: int) -> None:
    order = epoch_order(n, seed=5, epoch=0).tolist()
    exact = _ranks(n, world, seed=5, exact=True)
    assert interleave(exact) == order  # every sample once, in the global order
    assert max(map(len, exact)) - min(map(len, exact)) <= (1 if n else 0)
    padded = _ranks(n, world, seed=5)
    assert len({len(r) for r in padded}) == 1  # equal counts
    pad = len(interleave(padded)) - n
    assert 0 <= pad < world
    assert interleave(padded) == (order + order * world)[: n + pad]  # wraps to the start
    dropped = _ranks(n, world, seed=5, drop_last=True)
    assert len({len(r) for r in dropped}) == 1
    assert interleave(dropped) == order[: n - n % world]


def test_epochs_advance_by_themselves_or_by_set_epoch() -> None:
    s = Sampler(50, seed=3)
    assert len(s) == 50
    first, second = list(s), list(s)
    assert first == epoch_order(50, seed=3, epoch=0).tolist()
    assert second == epoch_order(50, seed=3, epoch=1).tolist()
    s.set_epoch(0)
    assert list(s) == first
    s.set_epoch(7)
    assert list(s) == epoch_order(50, seed=3, epoch=7).tolist()
    assert list(Sampler(50, shuffle=False)) == list(range(50))
    blocks = Sampler(50, seed=3, block_size=5, window=2)
    assert list(blocks) == epoch_order(50, seed=3, epoch=0, block_size=5, window=2).tolist()


@pytest.mark.parametrize(("before", "after"), [(4, 1), (4, 3), (2, 2), (1, 5)])
def test_a_state_resumes_the_global_sequence_on_another_world_size(before: int, after: int) -> None:
    n, steps = 37, 3
    kw = {"seed": 11, "exact": True}
    old = [Sampler(n, rank=r, world_size=before, **kw) for r in range(before)]  # type: ignore[arg-type]
    for s in old:
        s.set_epoch(2)
    its = [iter(s) for s in old]
    done = [[next(it) for _ in range(steps)] for it in its]
    state = old[0].state_dict()
    assert state["position"] == steps * before
    assert state["epoch"] == 2
    new = [Sampler(n, rank=r, world_size=after, **kw) for r in range(after)]  # type: ignore[arg-type]
    for s in new:
        s.load_state_dict(state)
    assert [len(s) for s in new] == [len(range(steps * before + r, n, after)) for r in range(after)]
    rest = interleave([list(s) for s in new])
    assert interleave(done) + rest == epoch_order(n, seed=11, epoch=2).tolist()
    assert list(new[0]) == list(Sampler(n, rank=0, world_size=after, **kw).indices(3))  # type: ignore[arg-type]


def test_a_finished_epoch_saves_as_the_start_of_the_next() -> None:
    s = Sampler(9, seed=1, rank=1, world_size=2)
    list(s)
    assert s.state_dict()["epoch"] == 1
    assert s.state_dict()["position"] == 0
    fresh = Sampler(9, seed=1, rank=1, world_size=2)
    fresh.load_state_dict(s.state_dict())
    assert list(fresh) == list(s)  # both on epoch 1


@pytest.mark.parametrize(("n", "world"), [(2000, 1), (2000, 3), (10**6, 2), (5, 1)])
def test_locality_measures_this_ranks_first_batches(n: int, world: int) -> None:
    kw = {"seed": 4, "block_size": 16, "window": 4}
    last = Sampler(n, rank=world - 1, world_size=world, **kw)  # type: ignore[arg-type]
    mine = last.indices(0)[: LOCALITY_BATCHES * 64]
    assert last.locality(64) == block_locality(mine, 64, 16)
    assert last.locality(64, block_size=8) == block_locality(mine, 64, 8)
    if world == 1 and n >= 64:  # a batch is one window: 4 blocks (16 x 4 = 64)
        assert last.locality(64) <= 4.0
    uniform = Sampler(n, seed=4)
    assert uniform.locality(64, block_size=16) == block_locality(uniform.indices(0)[:16384], 64, 16)
    with pytest.raises(ValueError, match="no blocks"):
        uniform.locality(64)
    with pytest.raises(ValueError, match="batch_size=0"):
        last.locality(0)


def test_describe_says_the_order_and_its_randomness() -> None:
    blocks = Sampler(2048, seed=1, block_size=16, window=4)
    text = blocks.describe(64)
    baseline = uniform_locality(2048, 64, 16)
    assert text == (
        "blocks of 16 samples, 4 per window: 4.0 distinct blocks per batch of 64 "
        f"vs ~{baseline:.1f} for a uniform shuffle"
    )
    assert 45 < baseline < 64
    assert Sampler(10).describe(4) == "a uniform shuffle"
    assert Sampler(10, shuffle=False).describe(4) == "in order (no shuffle)"


def test_bad_arguments_and_states_are_refused() -> None:
    with pytest.raises(ValueError, match="choose one"):
        Sampler(5, exact=True, drop_last=True)
    with pytest.raises(ValueError, match=r"rank=2 must be in 0\.\.1"):
        Sampler(5, rank=2, world_size=2)
    with pytest.raises(ValueError, match="together"):
        Sampler(5, rank=0)
    with pytest.raises(ValueError, match="seed=-1"):
        Sampler(5, seed=-1)
    s = Sampler(10, seed=2)
    state = s.state_dict()
    with pytest.raises(ValueError, match="not a Sampler state"):
        s.load_state_dict({"epoch": 0})
    with pytest.raises(ValueError, match="saved for seed=3, this sampler has seed=2"):
        s.load_state_dict({**state, "seed": 3})
    with pytest.raises(ValueError, match="saved for n=11"):
        s.load_state_dict({**state, "n": 11})
    with pytest.raises(ValueError, match="saved for block_size=16.*block_size and window"):
        s.load_state_dict({**state, "block_size": 16})
    with pytest.raises(ValueError, match=r"position=11 must be an int in 0\.\.10"):
        s.load_state_dict({**state, "position": 11})
    with pytest.raises(ValueError, match="epoch=-1"):
        s.load_state_dict({**state, "epoch": -1})


def test_sampler_over_a_split_and_the_package_name(packed_decoded: PackResult) -> None:
    assert h5forge.Sampler is Sampler
    train = H5ImageDataset(packed_decoded.path, split="train")
    everything = H5ImageDataset(packed_decoded.path)
    assert 0 < len(train) < len(everything)
    got = Counter(
        np.concatenate(
            [Sampler(train, rank=r, world_size=2, exact=True).indices(0) for r in range(2)]
        ).tolist()
    )
    assert got == Counter(range(len(train)))
    labels = [y for _, ys in train.loader(4, shuffle=True, seed=1) for y in ys.tolist()]
    assert Counter(labels) == Counter(train.targets)
