"""Blocks of a remote asset kept on local disk (h5forge.read.block_cache) under RemoteRanges:
over moto's S3 on loopback, requests counted at the server."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from h5forge.asset.ranges import RangeReader
from h5forge.demo import write_image_folder
from h5forge.files import make_marked_dir, mark
from h5forge.location import Location
from h5forge.locks import lock_file
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.block_cache import BLOCKS_KIND, ENTRY_KIND, BlockStore
from h5forge.read.options import ReadOptions
from h5forge.read.state import open_state
from tests.fixtures.servers import S3RequestLog

BLOCK = 64 << 10


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> PackResult:
    root = tmp_path_factory.mktemp("blocks_src")
    write_image_folder(root, classes=("a", "b"), per_class=30, seed=5, size=(40, 40))
    return pack(
        root,
        tmp_path_factory.mktemp("blocks") / "decoded.h5",
        config=PackConfig(ImageConfig(resize="resize", size=(32, 32))),
        workers=1,
    )


def _ranges(path: str, rows: list[int]) -> list[tuple[int, int]]:
    st = open_state(Location(path), ReadOptions(max_pixels=10**8))
    try:
        return [tuple(int(v) for v in st.index.byte_ranges[r]) for r in rows]  # type: ignore[misc]
    finally:
        st.close()


def _read(reader: RangeReader, ranges: list[tuple[int, int]]) -> list[bytes]:
    bufs = [bytearray(n) for _, n in ranges]
    reader.read_into(ranges, [memoryview(b) for b in bufs])
    return [bytes(b) for b in bufs]


@pytest.fixture
def published(packed: PackResult, s3_bucket: str, s3_storage_options: dict[str, Any]) -> str:
    url = f"s3://{s3_bucket}/blocks.h5"
    publish(packed.path, url, storage_options=s3_storage_options)
    return url


def _reader(url: str, options: dict[str, Any], store: BlockStore) -> RangeReader:
    return RangeReader(
        Location(url, options), block_bytes=BLOCK, keep_bytes=16 * BLOCK, store=store
    )


def test_a_second_reader_reads_stored_blocks_without_a_request(
    packed: PackResult,
    published: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    raw = Path(packed.path).read_bytes()
    ranges = _ranges(packed.path, list(range(0, 60, 2)))
    want = [raw[o : o + n] for o, n in ranges]
    first = _reader(published, s3_storage_options, BlockStore(str(tmp_path), "k1", 1 << 30, BLOCK))
    assert _read(first, ranges) == want
    assert first.stats.requests >= 1
    s3_requests.clear()
    # A new process's reader (a worker, the next epoch, another job): from disk, no request.
    again = BlockStore(str(tmp_path), "k1", 1 << 30, BLOCK)
    second = _reader(published, s3_storage_options, again)
    assert _read(second, ranges) == want
    assert second.stats.requests == 0
    assert [r for r in s3_requests() if r.method == "GET" and r.path.endswith("/blocks.h5")] == []
    assert again.hits == second.stats.stored_hits > 0
    # Another asset identity (a republished asset) never sees these blocks.
    other = _reader(published, s3_storage_options, BlockStore(str(tmp_path), "k2", 1 << 30, BLOCK))
    assert _read(other, ranges) == want
    assert other.stats.requests >= 1


def test_a_damaged_block_is_fetched_again_never_returned(
    packed: PackResult, published: str, s3_storage_options: dict[str, Any], tmp_path: Path
) -> None:
    raw = Path(packed.path).read_bytes()
    ranges = _ranges(packed.path, [3, 4, 5])
    store = BlockStore(str(tmp_path), "k", 1 << 30, BLOCK)
    _read(_reader(published, s3_storage_options, store), ranges)
    blocks = sorted(Path(store.entry).glob("*.blk"))
    assert blocks
    for path in blocks:  # a flipped byte in each, one truncated, one replaced by a link
        data = bytearray(path.read_bytes())
        data[len(data) // 3] ^= 0xFF
        path.write_bytes(bytes(data))
    blocks[0].write_bytes(blocks[0].read_bytes()[:100])
    fresh = BlockStore(str(tmp_path), "k", 1 << 30, BLOCK)
    reader = _reader(published, s3_storage_options, fresh)
    assert _read(reader, ranges) == [raw[o : o + n] for o, n in ranges]
    assert fresh.hits == 0
    assert reader.stats.requests >= 1
    # ... and the refetched blocks are stored intact again
    third = BlockStore(str(tmp_path), "k", 1 << 30, BLOCK)
    assert _read(_reader(published, s3_storage_options, third), ranges) == [
        raw[o : o + n] for o, n in ranges
    ]
    assert third.hits > 0


def _plant_link(blk: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(blk.read_bytes())  # even a copy of the right bytes, behind a link
    blk.unlink()
    os.symlink(secret, blk)


def _plant_fifo(blk: Path, tmp_path: Path) -> None:
    # Issue 28, class 3: a FIFO under a block's name (a shared cache_dir) would block the open
    # forever; it is refused unopened.
    if not hasattr(os, "mkfifo"):
        pytest.skip("needs named pipes")
    blk.unlink()
    os.mkfifo(blk)  # no writer ever comes


@pytest.mark.parametrize("plant", [_plant_link, _plant_fifo], ids=["link", "fifo"])
def test_a_planted_link_or_fifo_is_not_followed(
    plant: Any,
    packed: PackResult,
    published: str,
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    """A block replaced by a link or a FIFO is never read through: the block is fetched again."""
    raw = Path(packed.path).read_bytes()
    ranges = _ranges(packed.path, [7])
    store = BlockStore(str(tmp_path), "k", 1 << 30, BLOCK)
    _read(_reader(published, s3_storage_options, store), ranges)
    plant(sorted(Path(store.entry).glob("*.blk"))[0], tmp_path)
    fresh = BlockStore(str(tmp_path), "k", 1 << 30, BLOCK)
    assert _read(_reader(published, s3_storage_options, fresh), ranges) == [
        raw[o : o + n] for o, n in ranges
    ]
    assert fresh.hits == 0


def test_a_folder_another_worker_is_still_marking_is_waited_for(tmp_path: Path) -> None:
    """A worker finding the blocks folder made but not yet marked (another worker between its
    mkdir and its marker, under the entry's lock) waits for that lock and keeps its block
    there, instead of taking the folder for someone else's."""
    store = BlockStore(str(tmp_path), "k", 1 << 30, 1024)
    made, go = threading.Event(), threading.Event()

    def other_worker() -> None:
        with lock_file(store.entry + ".lock"):
            os.mkdir(store.entry)
            made.set()
            go.wait(30)  # the gap between its mkdir and its marker, held open by the test
            mark(store.entry, BLOCKS_KIND)

    other = threading.Thread(target=other_worker)
    other.start()
    assert made.wait(30)
    threading.Timer(0.3, go.set).start()
    blob = np.random.default_rng(0).bytes(1000)
    store.put(0, blob)
    other.join(30)
    assert store.get(0, 1000) == blob
    assert BlockStore(str(tmp_path), "k", 1 << 30, 1024).get(0, 1000) == blob


def test_blocks_are_evicted_least_recently_used_within_the_limit(tmp_path: Path) -> None:
    limit = 10 * 1024
    other = make_marked_dir(tmp_path / "whole", ENTRY_KIND)  # a whole-file entry counts too
    (other / "asset.h5").write_bytes(b"x" * 4096)
    (tmp_path / "not-ours").mkdir()
    (tmp_path / "not-ours" / "big").write_bytes(b"y" * 50_000)  # never counted, never removed
    writer = BlockStore(str(tmp_path), "k", 1 << 30, 1024)
    blobs = {k: np.random.default_rng(k).bytes(1000) for k in range(8)}
    for k, blob in blobs.items():
        writer.put(k, blob)
        os.utime(
            os.path.join(writer.entry, f"{k:010d}.blk"),
            ns=(10**18 + k * 10**9,) * 2,
        )
    store = BlockStore(str(tmp_path), "k", limit, 1024)
    assert store.get(0, 1000) == blobs[0]  # used last: kept by the LRU order
    store.evict()
    kept = {k for k in blobs if store.get(k, 1000) is not None}
    total = sum(f.stat().st_size for f in Path(store.entry).glob("*.blk")) + 4096
    assert total <= limit
    assert 0 in kept
    assert 1 not in kept  # the least recently used went first
    assert (tmp_path / "not-ours" / "big").exists()
    assert (other / "asset.h5").exists()
    # Putting past a tenth of the limit evicts by itself: the cache never grows past it, and
    # the whole-file entry, now the least recently used, goes too.
    for k in range(8, 40):
        store.put(k, np.random.default_rng(k).bytes(1000))
    assert sum(f.stat().st_size for f in Path(store.entry).glob("*.blk")) <= limit
    assert not other.exists()
    assert {k for k in range(8, 40) if store.get(k, 1000) is not None} >= {38, 39}


def test_a_dataset_over_an_asset_larger_than_the_cache_keeps_its_blocks(
    packed: PackResult,
    published: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    from h5forge.read.dataset import H5ImageDataset

    limit = packed.bytes // 2  # no whole-file copy fits: blocks are kept instead (16 KiB)
    local = H5ImageDataset(packed.path)
    rows = list(range(20))  # a third of the file: its blocks fit the limit
    want = [bytes(local[i][0].numpy().tobytes()) for i in rows]
    for epoch in range(2):
        ds = H5ImageDataset(
            published, storage_options=s3_storage_options, cache_dir=tmp_path, cache_limit=limit
        )
        ds.read_batch([59])  # opened in this process (its head read)
        s3_requests.clear()
        images, _ = ds.read_batch(rows)
        got = [bytes(images[i].contiguous().numpy().tobytes()) for i in range(len(rows))]
        assert got == want, epoch
        reads = [r for r in s3_requests() if r.method == "GET" and r.path.endswith("/blocks.h5")]
        if epoch == 0:
            assert reads  # from the server, and kept
        else:  # a new dataset (a new job) reads every sample from the kept blocks
            assert reads == [], reads
    store = ds.options.cache.block_store(Location(published))  # type: ignore[union-attr]
    assert store is not None
    assert not list(tmp_path.glob("*/asset.h5"))  # no whole-file copy was made
    kept = sum(f.stat().st_size for f in tmp_path.glob("blocks-*/*.blk"))
    assert 0 < kept <= limit


@pytest.mark.slow
def test_loader_workers_share_the_kept_blocks(
    packed: PackResult,
    published: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    from h5forge.read.dataset import H5ImageDataset

    rows = list(range(20))
    want = sorted(bytes(H5ImageDataset(packed.path)[i][0].numpy().tobytes()) for i in rows)
    counts = []
    for _ in range(2):  # two jobs, one after the other, each with 2 spawned workers
        ds = H5ImageDataset(
            published,
            storage_options=s3_storage_options,
            cache_dir=tmp_path,
            cache_limit=packed.bytes // 2,
        )
        s3_requests.clear()
        loader = ds.loader(5, sampler=rows, num_workers=2, multiprocessing_context="spawn")
        got = sorted(
            bytes(image.contiguous().numpy().tobytes()) for images, _ in loader for image in images
        )
        assert got == want
        counts.append(
            sum(
                1
                for r in s3_requests()
                if r.method == "GET"
                and r.path.endswith("/blocks.h5")
                and r.range
                and not r.range.startswith("bytes=0-")
            )
        )
    assert counts[0] > 0  # the first job fetched them
    assert counts[1] == 0, counts  # the second job's workers read every block from disk


_FULL_DISK = """
import hashlib, json, os, sys
from h5forge.read.block_cache import BlockStore
root = sys.argv[1]
store = BlockStore(root, "k", 1 << 30, 65536)
blobs = {k: hashlib.sha256(str(k).encode()).digest() * 1875 for k in range(12)}  # 60,000 B
for k, blob in blobs.items():
    store.put(k, blob)  # the disk fills up after a few: never raises
fresh = BlockStore(root, "k", 1 << 30, 65536)
got = {k: fresh.get(k, len(blob)) for k, blob in blobs.items()}
names = sorted(os.listdir(fresh.entry))
print(json.dumps({"kept": [k for k, g in got.items() if g is not None],
                  "right": all(g is None or g == blobs[k] for k, g in got.items()),
                  "files": names}))
"""


def test_a_full_disk_keeps_what_fits_and_never_a_torn_block(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    from tests.fixtures.mounts import in_mounts

    cache = tmp_path / "cache"
    cache.mkdir()
    r = subprocess.run(
        in_mounts([sys.executable, "-c", _FULL_DISK, str(cache)], [(cache, "tmpfs:262144")]),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["right"]  # every block served is the one written
    assert 0 < len(out["kept"]) < 12  # some fitted, the rest were refused by the disk
    blocks = [f for f in out["files"] if f.endswith(".blk")]
    assert len(blocks) == len(out["kept"])  # no torn block left behind ...
    assert set(out["files"]) - set(blocks) == {".h5forge-marker"}  # ... nor a temporary one
    assert "cannot keep block" in r.stderr  # said, not raised
