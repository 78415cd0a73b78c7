"""Who fetches a block that several readers want at once (h5forge.read.block_cache.BlockClaims).

Two stores on one folder stand for two processes (a store's claims are its own), except where a
real forked process or DataLoader worker is the point. The last test reads through two
DataLoader workers from moto's S3 on loopback, requests counted at the server.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import pytest
from torch.utils.data import DataLoader

from h5forge.demo import write_image_folder
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read import block_cache
from h5forge.read.block_cache import ENTRY_KIND, BlockClaims, BlockStore
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.fill import FILL_BLOCK_BYTES, FillStore
from tests.fixtures.loaders import as_list
from tests.fixtures.remote_epoch import BATCH_TIMEOUT_S, content
from tests.fixtures.s3_faults import S3Faults
from tests.fixtures.servers import S3RequestLog

SIZE = 5 * 1000  # the stores' file: 5 blocks of BLOCK bytes (the fill store's last is short)
BLOCK = 1024
BLOB = bytes(range(256)) * 4  # block 2's bytes


def _fill_store(root: Path, data: bytes = b"") -> FillStore:
    """The filling entry of a file of SIZE bytes (``data``, when its sha256 matters)."""
    sha256 = hashlib.sha256(data).hexdigest() if data else "0" * 64
    return FillStore(
        str(root / "entry"), ENTRY_KIND, sha256, SIZE, "s3://b/f.h5", 1 << 30, block_bytes=BLOCK
    )


def _four_blocks_kept(root: Path, seed: int) -> tuple[FillStore, bytes, list[tuple[int, int]], Any]:
    """A filling entry holding every block but the last (4), the file's bytes, and a fetch
    from those bytes that logs the spans it is asked for."""
    data = bytes(i % seed for i in range(SIZE))
    store = _fill_store(root, data)
    for k in range(4):
        store.put(k, data[k * BLOCK : (k + 1) * BLOCK])
    spans: list[tuple[int, int]] = []

    def fetch(starts: list[int], ends: list[int]) -> list[Any]:
        spans.extend(zip(starts, ends, strict=True))
        return [data[s:e] for s, e in zip(starts, ends, strict=True)]

    return store, data, spans, fetch


def _block_store(root: Path) -> BlockStore:
    return BlockStore(str(root), "ab" * 32, 1 << 30, BLOCK)


Stores = Callable[[], BlockClaims]


@pytest.fixture(params=["fill", "blocks"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    """Makes stores of one asset in one cache folder, each with claims of its own (as each
    process has): the filling entry of a whole-file cache, or the blocks of a large asset."""
    make = _fill_store if request.param == "fill" else _block_store
    return lambda: make(tmp_path)


def _claim_file(store: BlockClaims, k: int) -> Path:
    return Path(store._claim_path(k))


def _waiting(store: BlockClaims, k: int) -> tuple[threading.Thread, dict[str, Any]]:
    """``store.wait`` for block ``k`` on a thread: its answer and seconds land in the dict."""
    out: dict[str, Any] = {}

    def run() -> None:
        t0 = time.monotonic()
        out["got"] = store.wait({k: BLOCK})
        out["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=run)
    thread.start()
    return thread, out


def test_the_first_claim_fetches_the_others_wait_and_read_the_block_kept(stores: Stores) -> None:
    a, b = stores(), stores()
    assert a.claim(2)
    assert a.claim(2), "a claim held is held"
    assert not b.claim(2), "another's live claim: b waits instead of fetching"
    thread, out = _waiting(b, 2)
    time.sleep(0.3)
    assert thread.is_alive(), "nothing kept, the claim live: b still waits"
    a.put(2, BLOB)
    a.release(2)
    thread.join(10)
    assert out["got"] == {2: BLOB}
    assert out["seconds"] < 3
    assert not _claim_file(a, 2).exists()
    assert not b.claim(2) or b.has(2)  # kept now: a reader finds it before it claims


def test_a_claim_released_without_the_block_sends_the_waiter_to_the_server_at_once(
    stores: Stores,
) -> None:
    """The claimant's fetch failed: the waiter gets nothing, at once, and may claim it."""
    a, b = stores(), stores()
    assert a.claim(2)
    thread, out = _waiting(b, 2)
    time.sleep(0.2)
    a.release(2)
    thread.join(10)
    assert out["got"] == {}
    assert out["seconds"] < 2
    assert b.claim(2)


def test_a_claim_never_released_holds_a_waiter_claim_seconds_at_most(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A claimant that stalls (or died): the waiter fetches the block itself after
    CLAIM_SECONDS, and the stale claim holds no one off from then on."""
    monkeypatch.setattr(block_cache, "CLAIM_SECONDS", 0.5)
    a, b = stores(), stores()
    assert a.claim(2)
    thread, out = _waiting(b, 2)
    thread.join(10)
    assert out["got"] == {}
    assert 0.4 <= out["seconds"] < 3
    assert b.claim(2), "stale: b fetches it"


@pytest.mark.parametrize("when", ["stale", "future"])
def test_a_claim_dated_out_of_its_window_holds_no_one_off(stores: Stores, when: str) -> None:
    """A claim file older than CLAIM_SECONDS, or dated in the future (a clock moved, a planted
    file), is no claim: waiting on it could last forever."""
    a, b = stores(), stores()
    assert a.claim(2)
    now = time.time()
    at = now - block_cache.CLAIM_SECONDS - 1 if when == "stale" else now + 3600
    os.utime(_claim_file(a, 2), (at, at))
    t0 = time.monotonic()
    assert b.wait({2: BLOCK}) == {}
    assert time.monotonic() - t0 < 1
    assert b.claim(2)


@pytest.mark.parametrize("planted", ["link", "fifo", "folder", "large"])
def test_what_is_planted_at_a_claims_name_is_no_claim_and_never_written_through(
    stores: Stores, tmp_path: Path, planted: str
) -> None:
    a = stores()
    assert a.claim(0)  # the store's folder made
    a.release(0)
    path, outside = _claim_file(a, 2), tmp_path / "outside"
    outside.write_bytes(b"theirs")
    if planted == "link":
        path.symlink_to(outside)
    elif planted == "fifo":
        os.mkfifo(path)
    elif planted == "folder":
        path.mkdir()
    else:
        path.write_bytes(b"x" * 4096)
    assert a.claim(2), "no live claim: the block is fetched"
    assert a.wait({2: BLOCK}) == {}
    a.release(2)
    assert outside.read_bytes() == b"theirs"
    assert os.path.lexists(path), "not ours: left in place"


def test_a_forked_process_holds_none_of_its_parents_claims(tmp_path: Path) -> None:
    """A DataLoader worker forked from a reader that claimed a block does not think the claim
    its own: it waits for the block like any other process."""
    a = _fill_store(tmp_path)
    assert a.claim(2)
    ctx = multiprocessing.get_context("fork")
    answers: Any = ctx.Queue()
    child = ctx.Process(target=lambda: answers.put((a.claim(2), a.wait({2: BLOCK}))))
    child.start()
    time.sleep(0.3)
    a.put(2, BLOB)
    a.release(2)
    claimed, got = answers.get(timeout=30)
    child.join(30)
    assert claimed is False
    assert got == {2: BLOB}


def test_the_seal_removes_the_claims_left_and_only_those(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader killed mid-fetch leaves its claim: the completion waits CLAIM_SECONDS for it,
    then fetches the block itself; once the entry is whole the claim goes with the block
    records. A file of another's at a claim's name stays."""
    monkeypatch.setattr(block_cache, "CLAIM_SECONDS", 0.5)
    dead = _fill_store(tmp_path)
    assert dead.claim(4)  # never released
    a, data, spans, fetch = _four_blocks_kept(tmp_path, 251)
    other = Path(a._claim_path(3))
    other.write_bytes(b"not a claim")
    a.complete(fetch)
    assert spans == [(4 * BLOCK, SIZE)], "the completion fetches the block the claim held"
    assert (tmp_path / "entry" / "asset.h5").read_bytes() == data
    assert not Path(dead._claim_path(4)).exists()
    assert other.read_bytes() == b"not a claim"


def test_the_completion_waits_for_a_block_another_reader_is_fetching(tmp_path: Path) -> None:
    """The last missing block is being fetched by another reader when the entry completes: the
    completion waits for it to be kept instead of fetching it again, so its write never lands
    in the sealed copy."""
    a, data, spans, fetch = _four_blocks_kept(tmp_path, 253)
    b = _fill_store(tmp_path)
    assert b.claim(4)

    def other_reader() -> None:
        time.sleep(0.3)
        b.put(4, data[4 * BLOCK :])
        b.release(4)

    thread = threading.Thread(target=other_reader)
    thread.start()
    a.complete(fetch)
    thread.join(10)
    assert spans == []
    assert (tmp_path / "entry" / "asset.h5").read_bytes() == data
    assert a.local_fd() is not None


# --- two DataLoader workers over S3 ----------------------------------------------------------


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> PackResult:
    """90 samples of 224 x 224 x 3 (~13 MB, 7 fill blocks)."""
    tmp = tmp_path_factory.mktemp("claims_src")
    write_image_folder(tmp / "src", classes=("a", "b"), per_class=45, seed=5, size=(20, 24))
    cfg = PackConfig(ImageConfig(resize="resize", size=(224, 224)))
    return pack(tmp / "src", tmp / "big.h5", config=cfg)


def test_two_workers_needing_one_block_at_once_fetch_it_once(
    big: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    s3_faults: S3Faults,
    tmp_path: Path,
) -> None:
    """Each worker's batch holds samples of one fill block only, and every answer of the store
    takes a second: both workers want the block at once. One fetches it; the other waits for
    it to be kept and reads it from the cache entry."""
    B = FILL_BLOCK_BYTES
    url = f"s3://{s3_bucket}/big.h5"
    publish(big.path, url, storage_options=s3_storage_options)
    with h5py.File(big.path) as h5:
        ranges = h5["byte_ranges"][()]
    k = 2
    inside = [i for i, (a, n) in enumerate(ranges) if a // B == (a + n - 1) // B == k]
    assert len(inside) >= 4
    halves = [inside[: len(inside) // 2], inside[len(inside) // 2 :]]
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=tmp_path / "cache")
    s3_requests.clear()
    s3_faults.late(url, 1.0, times="always", ranged=True)
    loader = DataLoader(
        ds,
        batch_sampler=halves,
        collate_fn=as_list,
        num_workers=2,
        multiprocessing_context="fork",
        timeout=BATCH_TIMEOUT_S,
    )
    got = [sample for batch in loader for sample in batch]
    s3_faults.clear()
    local = H5ImageDataset(big.path)
    assert content(got) == content(local[i] for i in inside)
    name = Path(big.path).name
    gets = [r.range for r in s3_requests() if r.method == "GET" and r.path.endswith(f"/{name}")]
    assert gets == [f"bytes={k * B}-{(k + 1) * B - 1}"], gets
