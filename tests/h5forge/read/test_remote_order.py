"""The order ``loader(shuffle=True)`` picks for a remote URL (blocks), on S3 (moto on loopback):
resumed mid-epoch, resumed again, through torchdata's StatefulDataLoader, split between ranks,
and refused when a state was saved by a loader that read another order."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from h5forge.pack.writer import PackResult
from h5forge.publish.storage import publish
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.loader import block_geometry
from h5forge.read.multi import H5MultiDataset
from h5forge.read.order import epoch_order
from h5forge.read.sampler import Sampler
from tests.fixtures.sampling import batches_of, interleave, pixels_to_index

BATCH = 8  # blocks of 2 samples, 4 per window, over the fixture's 36 samples
SEED = 7
# torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated (a warning) in torch 2.13.
SET_VITAL = "ignore:'set_vital' is deprecated:UserWarning"


@pytest.fixture
def remote(
    packed_decoded: PackResult, s3_bucket: str, s3_storage_options: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The fixture asset published to the test's bucket: ``(url, storage_options)``."""
    url = f"s3://{s3_bucket}/decoded.h5"
    publish(packed_decoded.path, url, storage_options=s3_storage_options)
    return url, s3_storage_options


def _indices(batches: list[Any]) -> list[list[int]]:
    return [b[0] for b in batches]


def _blocks(n: int, epoch: int) -> list[int]:
    size, window = block_geometry(BATCH)
    return epoch_order(n, seed=SEED, epoch=epoch, block_size=size, window=window).tolist()


def test_a_remote_url_reads_blocks_by_default_and_says_so(
    remote: tuple[str, dict[str, Any]],
    packed_decoded: PackResult,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, options = remote
    ds = H5ImageDataset(url, storage_options=options)
    table = pixels_to_index(H5ImageDataset(packed_decoded.path))
    with caplog.at_level("INFO", logger="h5forge.read.loader"):
        loader = ds.loader(BATCH, shuffle=True, seed=SEED)
    assert (loader.order.block_size, loader.order.window) == (2, 4)
    summary = loader.order_summary
    assert summary.startswith("blocks of 2 samples, 4 per window: ")
    assert "(shuffle=True on a remote URL); shuffle='uniform' for a uniform order" in summary
    ours = [r.getMessage() for r in caplog.records if r.name == "h5forge.read.loader"]
    assert ours == [f"loader(shuffle=True) reads {summary}"]
    got = _indices(batches_of(loader, table))
    assert sum(got, []) == _blocks(len(ds), 0)
    # A batch is one window: 4 blocks of 2 neighbours, never more.
    assert all(len({i // 2 for i in b}) <= 4 for b in got)
    uniform = ds.loader(BATCH, shuffle="uniform", seed=SEED)
    assert uniform.order.block_size is None
    # Several assets as one keep the uniform shuffle wherever they are (blocks when named).
    multi = H5MultiDataset([url], storage_options=options)
    assert multi.loader(BATCH, shuffle=True).order.block_size is None
    assert multi.loader(BATCH, shuffle="blocks").order.block_size == 2
    assert sum(_indices(batches_of(uniform, table)), []) == epoch_order(len(ds), seed=SEED).tolist()


def test_resumed_in_epoch_two_and_resumed_again_the_rest_matches(
    remote: tuple[str, dict[str, Any]], packed_decoded: PackResult
) -> None:
    url, options = remote
    table = pixels_to_index(H5ImageDataset(packed_decoded.path))

    def fresh() -> Any:
        return H5ImageDataset(url, storage_options=options).loader(BATCH, shuffle=True, seed=SEED)

    whole = fresh()
    epochs = [_indices(batches_of(whole, table)) for _ in range(4)]
    n = len(table)
    assert [sum(e, []) for e in epochs] == [_blocks(n, e) for e in range(4)]
    first = fresh()
    for _ in range(2):
        batches_of(first, table)  # epochs 0 and 1, whole
    head = _indices(batches_of(first, table, limit=2))  # 2 batches of epoch 2
    state = first.state_dict()
    assert state["sampler"]["epoch"] == 2
    assert state["sampler"]["position"] == 2 * BATCH
    second = fresh()
    second.load_state_dict(state)
    middle = _indices(batches_of(second, table, limit=1))  # resumed, then saved again
    third = fresh()
    third.load_state_dict(second.state_dict())
    rest = _indices(batches_of(third, table))
    assert head + middle + rest == epochs[2]
    assert _indices(batches_of(third, table)) == epochs[3]  # the next epoch, uninterrupted
    # The first resume, its iteration left after one batch: a new iteration is the next epoch.
    assert _indices(batches_of(second, table)) == epochs[3]


@pytest.mark.filterwarnings(SET_VITAL)
@pytest.mark.parametrize("workers", [0, pytest.param(2, marks=pytest.mark.slow)])
def test_stateful_dataloader_over_the_block_sampler_resumes_exactly(
    remote: tuple[str, dict[str, Any]], packed_decoded: PackResult, workers: int
) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    url, options = remote
    table = pixels_to_index(H5ImageDataset(packed_decoded.path))
    size, window = block_geometry(BATCH)
    kw: dict[str, Any] = {"batch_size": BATCH, "num_workers": workers}
    if workers:
        # spawn, not fork: this process hosts the S3 server's threads
        kw.update(multiprocessing_context="spawn", persistent_workers=True)

    def fresh() -> Any:
        ds = H5ImageDataset(url, storage_options=options)
        return StatefulDataLoader(
            ds, sampler=Sampler(ds, seed=SEED, block_size=size, window=window), **kw
        )

    loader = fresh()
    batches_of(loader, table)  # epoch 0
    head = _indices(batches_of(loader, table, limit=3))
    state = loader.state_dict()
    resumed = fresh()
    resumed.load_state_dict(state)
    rest = _indices(batches_of(resumed, table))
    n = len(table)
    assert sum(head + rest, []) == _blocks(n, 1)
    assert sum(_indices(batches_of(resumed, table)), []) == _blocks(n, 2)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_ranks_cover_the_block_order_exactly_once(
    remote: tuple[str, dict[str, Any]], packed_decoded: PackResult, world: int
) -> None:
    url, options = remote
    ds = H5ImageDataset(url, storage_options=options)
    table = pixels_to_index(H5ImageDataset(packed_decoded.path))
    size, window = block_geometry(BATCH)
    ranks = []
    for rank in range(world):
        sampler = Sampler(
            ds, seed=SEED, block_size=size, window=window, rank=rank, world_size=world, exact=True
        )
        sampler.set_epoch(1)
        ranks.append(sum(_indices(batches_of(ds.loader(BATCH, sampler=sampler), table)), []))
    n = len(ds)
    assert interleave(ranks) == _blocks(n, 1)
    assert Counter(sum(ranks, [])) == Counter(range(n))
    assert max(map(len, ranks)) - min(map(len, ranks)) <= 1


def test_a_local_state_is_refused_by_a_remote_default_loader(
    remote: tuple[str, dict[str, Any]], packed_decoded: PackResult
) -> None:
    url, options = remote
    local_ds = H5ImageDataset(packed_decoded.path)
    remote_ds = H5ImageDataset(url, storage_options=options)
    table = pixels_to_index(local_ds)
    local = local_ds.loader(BATCH, shuffle=True, seed=SEED)
    batches_of(local, table, limit=2)
    with pytest.raises(
        ValueError,
        match=r"saved by a loader reading a uniform shuffle, this one reads blocks of 2 x 4"
        r".*give both shuffle='uniform'",
    ):
        remote_ds.loader(BATCH, shuffle=True, seed=SEED).load_state_dict(local.state_dict())
    # The same name on both sides moves the state: the rest is the local order's.
    local = local_ds.loader(BATCH, shuffle="uniform", seed=SEED)
    head = _indices(batches_of(local, table, limit=2))
    moved = remote_ds.loader(BATCH, shuffle="uniform", seed=SEED)
    moved.load_state_dict(local.state_dict())
    rest = _indices(batches_of(moved, table))
    assert sum(head + rest, []) == epoch_order(len(table), seed=SEED).tolist()
