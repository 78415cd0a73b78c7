"""The default read cache and its fill from the reader's own range requests (moto S3 on
loopback, requests counted at the server): what a half-filled entry serves and refuses, what
completes it, and what the default (``cache_dir=None``) caches where.

A file of several fill blocks (:data:`h5forge.read.fill.FILL_BLOCK_BYTES`, more than the 8 MiB
completion leaves to fetch at once) is needed to see an entry half filled: reading one sample
keeps only that sample's blocks.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import zlib
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h5py
import pytest
from torch.utils.data import DataLoader

from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.files import make_marked_dir
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.block_cache import ENTRY_KIND
from h5forge.read.cache import DEFAULT_CACHE_LIMIT, FileCache, default_limit
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.fill import FILL_BLOCK_BYTES
from tests.fixtures.loaders import as_list
from tests.fixtures.remote_epoch import BATCH_TIMEOUT_S, WORKERS, content
from tests.fixtures.s3_faults import S3Faults
from tests.fixtures.servers import S3RequestLog

B = FILL_BLOCK_BYTES


def _pack(root: Path, out: Path, per_class: int, size: int) -> PackResult:
    write_image_folder(root, classes=("a", "b"), per_class=per_class, seed=5, size=(20, 24))
    return pack(root, out, config=PackConfig(ImageConfig(resize="resize", size=(size, size))))


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PackResult]:
    """``big``: 90 samples of 224 x 224 x 3, ~13 MB, 7 fill blocks; ``small``: one block."""
    tmp = tmp_path_factory.mktemp("fill_src")
    big = _pack(tmp / "big", tmp / "big.h5", 45, 224)
    assert big.bytes > 5 * B
    return {"big": big, "small": _pack(tmp / "small", tmp / "small.h5", 10, 16)}


def _publish(r: PackResult, bucket: str, so: dict[str, Any]) -> str:
    url = f"s3://{bucket}/{Path(r.path).name}"
    publish(r.path, url, storage_options=so)
    return url


def _truth(path: str) -> Counter[tuple[str, int]]:
    ds = H5ImageDataset(path)
    return content(ds[i] for i in range(len(ds)))


def _all(ds: H5ImageDataset) -> Counter[tuple[str, int]]:
    return content(ds[i] for i in range(len(ds)))


def _gets(log: S3RequestLog, name: str) -> list[tuple[int, int]]:
    """The byte spans ``[a, b)`` of the object's GETs (its whole size as (0, -1) if unranged)."""
    out = []
    for r in log():
        if r.method == "GET" and r.path.split("?")[0].endswith(f"/{name}"):
            if not r.range:
                out.append((0, -1))
            else:
                a, b = r.range.removeprefix("bytes=").split("-")
                out.append((int(a), int(b) + 1))
    return out


def _fetched(log: S3RequestLog, name: str, k: int) -> bool:
    """Whether full block ``k`` was asked of the server (a GET covering its last byte: opening
    the file reads its first MiB for the HDF5 metadata)."""
    return any(a <= (k + 1) * B - 1 < b or b == -1 for a, b in _gets(log, name))


def _entry(cache: Path) -> Path:
    (entry,) = [p for p in cache.iterdir() if p.is_dir()]
    return entry


def _blocks(entry: Path) -> list[int]:
    return sorted(int(p.name.removesuffix(".have")) for p in entry.glob("*.have"))


@pytest.mark.parametrize("damage", ["none", "flipped", "record", "record-link", "record-fifo"])
def test_a_damaged_block_is_fetched_again_never_served(
    damage: str,
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    big = assets["big"]
    url, name = _publish(big, s3_bucket, s3_storage_options), Path(big.path).name
    cache = tmp_path / "cache"
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    first = content([ds[0]])
    entry = _entry(cache)
    assert not (entry / "asset.h5").exists()  # half filled: one sample's blocks
    k = _blocks(entry)[0]
    assert 0 < len(_blocks(entry)) < big.bytes // B
    good = Path(big.path).read_bytes()[k * B : (k + 1) * B]
    fill, have = entry / "fill.h5", entry / f"{k:010d}.have"
    assert fill.read_bytes()[k * B : (k + 1) * B] == good
    decoy = tmp_path / "decoy"
    record = zlib.crc32(good).to_bytes(4, "big")  # a block's record: its CRC-32 (fill.py)
    decoy.write_bytes(record)  # the right record, outside the entry
    if damage == "flipped":  # the record says what the block was: the bytes no longer hash to it
        with open(fill, "r+b") as f:
            f.seek(k * B + len(good) // 2)
            byte = f.read(1)
            f.seek(k * B + len(good) // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif damage == "record":
        have.write_bytes(bytes(a ^ 0xFF for a in record))
    elif damage == "record-link":  # a link is never read through, nor written through
        have.unlink()
        have.symlink_to(decoy)
    elif damage == "record-fifo":  # never waited on
        have.unlink()
        os.mkfifo(have)
    s3_requests.clear()
    again = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    assert content([again[0]]) == first == content([H5ImageDataset(big.path)[0]])
    assert _fetched(s3_requests, name, k) is (damage != "none"), _gets(s3_requests, name)
    # Fetched again, the block and its record are whole again in the entry.
    assert fill.read_bytes()[k * B : (k + 1) * B] == good
    assert have.is_file()
    assert not have.is_symlink()
    assert have.read_bytes() == record
    assert decoy.read_bytes() == record


@pytest.mark.parametrize("planted", ["link", "fifo"])
def test_a_planted_fill_file_is_never_read_or_written_through(
    planted: str,
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    big = assets["big"]
    url, name = _publish(big, s3_bucket, s3_storage_options), Path(big.path).name
    cache = tmp_path / "cache"
    H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)[0]
    entry = _entry(cache)
    k = _blocks(entry)[0]
    (entry / "fill.h5").unlink()
    decoy = tmp_path / "decoy.h5"
    decoy.write_bytes(bytes(big.bytes))  # the file's size, all zeros
    if planted == "link":
        (entry / "fill.h5").symlink_to(decoy)
    else:
        os.mkfifo(entry / "fill.h5")
    s3_requests.clear()
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    with caplog.at_level(logging.WARNING, logger="h5forge.read.fill"):
        assert _all(ds) == _truth(big.path)
    assert _fetched(s3_requests, name, k)  # not served from the decoy
    assert "reading it from the server" in caplog.text
    assert decoy.read_bytes() == bytes(big.bytes)  # nothing written through
    assert not (entry / "asset.h5").exists()


def test_a_server_serving_other_bytes_fails_the_completion_hash(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    small = assets["small"]
    url = _publish(small, s3_bucket, s3_storage_options)
    good = Path(small.path).read_bytes()
    bad = bytearray(good)
    bad[-100] ^= 0xFF  # same size (the sidecar's size check passes): sample pixels
    Location(url, s3_storage_options).fs.pipe(url.removeprefix("s3://"), bytes(bad))
    cache = tmp_path / "cache"
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    with pytest.raises(IntegrityError) as refused:
        _all(ds)
    message = str(refused.value)
    for part in (url, hashlib.sha256(good).hexdigest(), hashlib.sha256(bad).hexdigest()):
        assert part in message, message
    # Nothing of the entry is kept: no fill file, no records, no folder (lock files aside).
    assert [p for p in cache.rglob("*") if not p.name.endswith(".lock")] == []


@pytest.mark.slow
def test_persistent_workers_read_the_completed_copy_in_their_second_epoch(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    big = assets["big"]
    url, name = _publish(big, s3_bucket, s3_storage_options), Path(big.path).name
    ds = H5ImageDataset(url, storage_options=s3_storage_options)  # the default cache
    s3_requests.clear()
    loader = DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        collate_fn=as_list,
        num_workers=WORKERS,
        persistent_workers=True,
        multiprocessing_context="spawn",
        timeout=BATCH_TIMEOUT_S,
    )
    truth = _truth(big.path)
    assert content(s for batch in loader for s in batch) == truth
    spans = _gets(s3_requests, name)
    assert spans
    assert all(b - a < big.bytes for a, b in spans), spans  # no whole-file download
    entry = _entry(Path(os.environ["XDG_CACHE_HOME"]) / "h5forge" / "read")
    # Sealed by the worker that noticed, on a thread of its own, beside its later batches.
    assert _within(60, lambda: not (entry / "fill.h5").exists())
    assert (entry / "asset.h5").read_bytes() == Path(big.path).read_bytes()
    s3_requests.clear()
    assert content(s for batch in loader for s in batch) == truth
    assert _gets(s3_requests, name) == []  # the same workers now read the local copy


def test_the_default_cache_is_the_users_and_false_turns_it_off(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    small = assets["small"]
    url, name = _publish(small, s3_bucket, s3_storage_options), Path(small.path).name
    root = Path(os.environ["XDG_CACHE_HOME"]) / "h5forge" / "read"
    off = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=False)
    assert off.options.cache is None
    assert _all(off) == _truth(small.path)
    assert not root.exists()  # nothing cached, the folder not even made
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    assert ds.options.cache is not None
    assert ds.options.cache.root == str(root)
    assert _all(ds) == _truth(small.path)
    assert (_entry(root) / "asset.h5").read_bytes() == Path(small.path).read_bytes()
    # A second dataset (a second job) asks the server nothing for the object's bytes: the
    # object's HEAD and its sidecar only.
    s3_requests.clear()
    assert _all(H5ImageDataset(url, storage_options=s3_storage_options)) == _truth(small.path)
    assert _gets(s3_requests, name) == []
    assert len(s3_requests()) <= 3, s3_requests()
    # Off reads from the server again, cache or not.
    s3_requests.clear()
    assert _all(off) == _truth(small.path)
    assert _gets(s3_requests, name)
    # A local file is never cached.
    assert H5ImageDataset(small.path).options.cache is None


def test_an_asset_without_sidecar_is_read_uncached_by_default_refused_with_a_cache_dir(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    small = assets["small"]
    url = f"s3://{s3_bucket}/bare.h5"
    Location(url, s3_storage_options).fs.put(small.path, url.removeprefix("s3://"))
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    assert _all(ds) == _truth(small.path)
    root = Path(os.environ["XDG_CACHE_HOME"]) / "h5forge" / "read"
    assert [p for p in root.rglob("*") if not p.name.endswith(".lock")] == []
    with pytest.raises(ValueError, match=r"sidecar.*cache_dir=False"):
        H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=tmp_path / "c")


def test_an_unusable_default_folder_reads_uncached_with_a_warning(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    small = assets["small"]
    url = _publish(small, s3_bucket, s3_storage_options)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))  # h5forge/ cannot be made under a file
    with caplog.at_level(logging.WARNING, logger="h5forge.read.options"):
        ds = H5ImageDataset(url, storage_options=s3_storage_options)
    assert ds.options.cache is None
    assert "reading uncached" in caplog.text
    assert str(blocker) in caplog.text
    assert _all(ds) == _truth(small.path)


@pytest.mark.parametrize("value", [True, 0, 1.5, b"/tmp/c"])
def test_cache_dir_of_another_type_is_refused_naming_the_allowed_values(
    value: Any, assets: dict[str, PackResult]
) -> None:
    with pytest.raises(ValueError, match=r"must be a folder, None .*False"):
        H5ImageDataset(assets["small"].path, cache_dir=value)


def test_the_default_limit_is_half_the_free_disk_at_most_50_gib_beside_what_is_held(
    tmp_path: Path,
) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    fs = os.statvfs(root)
    free = fs.f_bavail * fs.f_frsize
    empty = default_limit(str(root))
    assert empty <= DEFAULT_CACHE_LIMIT
    assert abs(empty - min(DEFAULT_CACHE_LIMIT, free // 2)) <= 64 << 20  # others write too
    assert FileCache(str(root)).limit_bytes is not None
    assert abs(FileCache(str(root)).limit - empty) <= 64 << 20
    assert default_limit(str(tmp_path / "missing")) == 1
    # What the cache holds counts beside the free space: a full cache is not shrunk by it.
    # (32 MiB written take 16 MiB off half the free space and add 32 MiB held: +16 MiB.)
    entry = root / "e"
    make_marked_dir(entry, ENTRY_KIND)
    (entry / "asset.h5").write_bytes(os.urandom(32 << 20))
    if free // 2 + (32 << 20) < DEFAULT_CACHE_LIMIT:
        assert default_limit(str(root)) - empty > 8 << 20


def test_a_block_damaged_on_disk_fails_no_completion_it_is_fetched_again(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    """A kept block flipped on disk after its record, and not read again before the entry
    completes: the whole-file hash fails, which is no fault of the server; every block is
    fetched again once, the entry completes and no IntegrityError is raised."""
    big = assets["big"]
    url = _publish(big, s3_bucket, s3_storage_options)
    cache = tmp_path / "cache"
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    ds[0]
    entry = _entry(cache)
    k = _blocks(entry)[0]
    with open(entry / "fill.h5", "r+b") as f:
        f.seek(k * B + B // 2)
        byte = f.read(1)
        f.seek(k * B + B // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    again = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    # From the last sample back: the entry completes (the rest fetched at once) before
    # sample 0's block is read again.
    assert content(again[i] for i in reversed(range(len(again)))) == _truth(big.path)
    assert (entry / "asset.h5").read_bytes() == Path(big.path).read_bytes()


def test_an_entry_left_whole_but_unsealed_is_sealed_by_a_job_that_only_reads_it(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    """A job killed after its entry held every block, before the whole-file check: the next
    job reads every block from the entry (never from the server) and seals it on the way."""
    big = assets["big"]
    url, name = _publish(big, s3_bucket, s3_storage_options), Path(big.path).name
    cache, truth = tmp_path / "cache", _truth(big.path)
    assert _all(H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)) == truth
    entry = _entry(cache)
    # What such a job leaves: the fill file and every block's record, no seal.
    data = (entry / "asset.h5").read_bytes()
    (entry / "asset.h5").rename(entry / "fill.h5")
    (entry / "entry.json").unlink()
    blocks = -(-len(data) // B)
    for k in range(blocks):
        record = zlib.crc32(data[k * B : (k + 1) * B]).to_bytes(4, "big")
        (entry / f"{k:010d}.have").write_bytes(record)
    s3_requests.clear()
    assert _all(H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)) == truth
    assert not any(_fetched(s3_requests, name, k) for k in range(blocks)), _gets(s3_requests, name)
    assert (entry / "asset.h5").read_bytes() == data
    assert not (entry / "fill.h5").exists()
    assert not list(entry.glob("*.have"))


def _all_but(
    r: PackResult, url: str, so: dict[str, Any], cache: Path, gone: tuple[int, ...]
) -> tuple[Path, bytes, list[int], int]:
    """An entry of every block of ``r`` (at ``url``) but those of ``gone`` (-1: the last):
    holes (zeros) where they go, no record of them. Returns the entry, the file's bytes, the
    missing blocks and a sample inside a kept block (its read finds little missing and
    completes the entry)."""
    assert _all(H5ImageDataset(url, storage_options=so, cache_dir=cache)) == _truth(r.path)
    entry = _entry(cache)
    data = (entry / "asset.h5").read_bytes()
    blocks = -(-len(data) // B)
    missing = sorted(k % blocks for k in gone)
    (entry / "asset.h5").unlink()
    (entry / "entry.json").unlink()
    with open(entry / "fill.h5", "wb") as f:
        f.truncate(len(data))
        for k in range(blocks):
            if k not in missing:
                f.seek(k * B)
                f.write(data[k * B : (k + 1) * B])
                record = zlib.crc32(data[k * B : (k + 1) * B]).to_bytes(4, "big")
                (entry / f"{k:010d}.have").write_bytes(record)
    kept = next(k for k in range(blocks) if k not in missing)
    with h5py.File(r.path) as h5:
        ranges = h5["byte_ranges"][()]
    first = next(i for i, (a, n) in enumerate(ranges) if a // B == (a + n - 1) // B == kept)
    return entry, data, missing, first


def _within(seconds: float, done: Callable[[], bool]) -> bool:
    """Whether ``done()`` holds, now or within ``seconds`` (a worker's finishing thread)."""
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()


@pytest.mark.parametrize("gone", [(0, 3), (2, -1), (-1,)])  # -1: the last, short block
def test_an_entry_missing_a_few_blocks_fetches_them_once_while_it_hashes_and_seals(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
    gone: tuple[int, ...],
) -> None:
    """The completion fetches the few blocks no batch kept on a helper thread while it hashes
    the kept ones before the first of them (none when block 0 is missing): each is asked for
    once, no kept block is, and the sealed copy is the file's bytes."""
    big = assets["big"]
    url, name = _publish(big, s3_bucket, s3_storage_options), Path(big.path).name
    cache, truth = tmp_path / "cache", _truth(big.path)
    entry, data, missing, first = _all_but(big, url, s3_storage_options, cache, gone)
    blocks = -(-len(data) // B)
    s3_requests.clear()
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    ds[first]
    assert (entry / "asset.h5").read_bytes() == data
    assert not (entry / "fill.h5").exists()
    spans = {k: (k * B, min((k + 1) * B, len(data))) for k in range(blocks)}
    gets = _gets(s3_requests, name)  # the open's reads of HDF5 metadata besides
    assert sorted(k for k, span in spans.items() for g in gets if g == span) == missing, gets
    assert not [
        g
        for g in gets
        if any(g[0] <= spans[k][0] < spans[k][1] <= g[1] for k in spans if k not in missing)
    ]
    assert _all(ds) == truth


def test_a_cold_cached_open_asks_the_object_s_size_once(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
) -> None:
    """The cache's check asks the object's HEAD (beside its sidecar); the open that fills the
    entry reads the file with that size instead of asking again."""
    big = assets["big"]
    url, name = _publish(big, s3_bucket, s3_storage_options), Path(big.path).name
    s3_requests.clear()
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=tmp_path / "cache")
    heads = [r for r in s3_requests() if r.method == "HEAD" and r.path.endswith(f"/{name}")]
    assert len(heads) == 1, s3_requests()
    assert content([ds[len(ds) - 1]]) == content([H5ImageDataset(big.path)[len(ds) - 1]])


def test_a_worker_hands_out_the_batch_that_completes_the_entry_before_its_seal(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
    tmp_path: Path,
) -> None:
    """In a DataLoader worker the entry is finished on a thread of its own: the batch that
    found little missing is handed out while the missing block's answer stalls at the server
    (a worker that finished first would outwait the loader's timeout), and the worker's exit
    waits for the seal."""
    big = assets["big"]
    url = _publish(big, s3_bucket, s3_storage_options)
    cache = tmp_path / "cache"
    entry, data, _, first = _all_but(big, url, s3_storage_options, cache, (-1,))
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    assert (entry / "fill.h5").exists()  # opened here: the worker reads no metadata
    s3_faults.stall(url, 600, ranged=True)  # the missing block's answer, until cleared
    loader = DataLoader(
        ds,
        batch_size=1,
        sampler=[first],
        collate_fn=as_list,
        num_workers=1,
        multiprocessing_context="fork",
        timeout=BATCH_TIMEOUT_S / 4,
    )
    batches = iter(loader)
    assert content(next(batches)) == content([H5ImageDataset(big.path)[first]])
    assert _within(60, lambda: bool(s3_faults.injected)), "the finishing asks for the block"
    assert (entry / "fill.h5").exists()  # not sealed: its last block has not come
    s3_faults.clear()  # the stalled answer ends, cut short: fetched again, then sealed
    assert list(batches) == []  # the worker exits, after its finishing thread
    assert (entry / "asset.h5").read_bytes() == data
    assert not (entry / "fill.h5").exists()


@pytest.mark.slow
def test_a_worker_whose_finishing_finds_other_bytes_raises_at_its_next_batch(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    tmp_path: Path,
) -> None:
    """The server's bytes do not hash to the sidecar's sha256: a worker's finishing thread
    removes the entry, and the next batch the worker reads raises the IntegrityError (the
    batch that noticed was handed out before the hash)."""
    small = assets["small"]
    url = _publish(small, s3_bucket, s3_storage_options)
    good = Path(small.path).read_bytes()
    bad = bytearray(good)
    bad[-100] ^= 0xFF  # same size: sample pixels
    Location(url, s3_storage_options).fs.pipe(url.removeprefix("s3://"), bytes(bad))
    cache = tmp_path / "cache"
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    loader = DataLoader(
        ds,
        batch_size=1,
        collate_fn=as_list,
        num_workers=1,
        persistent_workers=True,
        multiprocessing_context="fork",
        timeout=BATCH_TIMEOUT_S,
    )
    batches = iter(loader)
    next(batches)  # its read kept the file's one block: the entry is finished beside
    # Removed, with everything it held (lock files aside).
    assert _within(60, lambda: not [p for p in cache.rglob("*") if p.suffix != ".lock"])
    with pytest.raises(IntegrityError) as refused:  # by the first batch the worker reads next
        for _ in batches:  # (those it read ahead come first)
            pass
    assert hashlib.sha256(bytes(bad)).hexdigest() in str(refused.value)


def test_a_worker_finishes_a_file_larger_than_the_bound_in_the_batch_that_noticed(
    assets: dict[str, PackResult],
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A file larger than ``BESIDE_BYTES`` (its hash could outlast the time torch gives a
    worker to exit) is finished before the batch that noticed is handed out."""
    from h5forge.read import fill

    big = assets["big"]
    url = _publish(big, s3_bucket, s3_storage_options)
    cache = tmp_path / "cache"
    entry, data, _, first = _all_but(big, url, s3_storage_options, cache, (-1,))
    monkeypatch.setattr(fill, "BESIDE_BYTES", len(data) - 1)  # the forked worker's too
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=cache)
    loader = DataLoader(
        ds,
        batch_size=1,
        sampler=[first],
        collate_fn=as_list,
        num_workers=1,
        persistent_workers=True,
        multiprocessing_context="fork",
        timeout=BATCH_TIMEOUT_S,
    )
    assert content(next(iter(loader))) == content([H5ImageDataset(big.path)[first]])
    assert (entry / "asset.h5").read_bytes() == data  # sealed before the batch came
