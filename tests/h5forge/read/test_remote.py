"""Remote reading: a published asset read from S3 (moto on loopback) and memory:// through a
DataLoader with 2 workers under fork and spawn, with the requests counted at the server.

Request budget asserted here (files this h5forge writes keep all metadata and the index at the
head of the file, see docs/FORMAT.md "Physical placement"):

* opening, per process: **2 requests**, one HEAD (the size) and one ranged GET of the head;
* batched reads: **one ranged GET per sample at most** (touching samples share one), so a
  loader epoch costs at most ``2 x workers + 1.05 x N`` requests.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any, cast

import fsspec
import numpy as np
import pytest
import torch

from h5forge.asset.ranges import RangeReader
from h5forge.demo import write_image_folder
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.options import ReadOptions
from h5forge.read.order import epoch_order
from h5forge.read.state import open_state
from tests.fixtures import remote_epoch
from tests.fixtures.remote_epoch import WORKERS, content, epoch
from tests.fixtures.servers import S3RequestLog

OPEN_REQUESTS = 2  # HEAD + one ranged GET of the head of the file


@pytest.fixture(scope="module")
def packed_120(tmp_path_factory: pytest.TempPathFactory) -> PackResult:
    """120 decoded samples, 24 x 32: enough that one request per sample is a real count."""
    root = tmp_path_factory.mktemp("remote_src")
    write_image_folder(
        root, classes=("a", "b", "c"), per_class=40, seed=11, size=(30, 40), formats=("jpeg", "png")
    )
    return pack(
        root,
        tmp_path_factory.mktemp("remote") / "decoded.h5",
        config=PackConfig(ImageConfig(resize="resize", size=(24, 32))),
        workers=2,
    )


def _local_truth(path: str) -> Counter[tuple[str, int]]:
    ds = H5ImageDataset(path)
    return content(ds[i] for i in range(len(ds)))


def _is_read(method: str, rng: str | None) -> bool:
    return method == "GET" and rng is not None and not rng.startswith("bytes=0-")


@pytest.mark.parametrize(
    ("method", "which"),
    [("fork", "packed_120"), ("spawn", "packed_120"), ("fork", "packed_encoded")],
)
def test_s3_dataloader_reads_each_sample_once_with_few_requests(
    method: str,
    which: str,
    request: pytest.FixtureRequest,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    result: PackResult = request.getfixturevalue(which)
    url = f"s3://{s3_bucket}/{which}.h5"
    publish(result.path, url, storage_options=s3_storage_options)
    truth = _local_truth(result.path)
    n = result.num_samples

    s3_requests.clear()
    # The uncached path (the default cache also asks for the sidecar: test_fill.py).
    ds = H5ImageDataset(url, storage_options=s3_storage_options, cache_dir=False)
    opened = [(r.method, r.range) for r in s3_requests()]
    assert len(opened) <= OPEN_REQUESTS, opened
    assert [m for m, _ in opened] == ["HEAD", "GET"], opened
    assert (opened[1][1] or "").startswith("bytes=0-"), opened
    assert len(ds) == n

    s3_requests.clear()
    if method == "fork":
        # Forked workers copy their parent whole: fork them from a training process of its own
        # (which opens the asset once more), not from this one with its S3 server threads.
        assert remote_epoch.run(url, method, s3_storage_options, cached=False) == truth
        # That process opens the file; its forked workers read through its open state (index
        # and checks) with byte readers of their own, opening nothing again.
        opens = OPEN_REQUESTS
    else:
        assert epoch(ds, method) == truth
        opens = WORKERS * OPEN_REQUESTS
    seen = s3_requests()
    heads = [r for r in seen if r.method == "HEAD"]
    assert all(r.path.endswith(f"/{which}.h5") for r in seen)
    assert len(heads) <= opens // OPEN_REQUESTS, seen  # one per process that opened
    # Reads coalesce (a file this small is one read-ahead block, read once per worker).
    assert len(seen) <= opens + math.ceil(1.05 * n)


@pytest.mark.parametrize("method", [None, "fork"])  # spawned workers cannot see this process's
def test_memory_url_reads_like_the_local_file(
    method: str | None,  # memory://
    packed_120: PackResult,
) -> None:
    url = f"memory://h5forge-test-{uuid.uuid4().hex[:12]}/decoded.h5"
    fs = fsspec.filesystem("memory")
    publish(packed_120.path, url)
    try:
        ds = H5ImageDataset(url)
        assert len(ds) == packed_120.num_samples
        assert epoch(ds, method) == _local_truth(packed_120.path)
        image, label = ds[7]
        local = H5ImageDataset(packed_120.path)[7]
        assert label == local[1]
        assert bool((image == local[0]).all())
    finally:
        fs.rm(url.rsplit("/", 1)[0], recursive=True)


def test_remote_verify_reads_match_local(packed_120: PackResult, tmp_path: Path) -> None:
    # verify_reads=True checks every remote sample against /digests as it arrives.
    url = f"memory://h5forge-test-{uuid.uuid4().hex[:12]}/decoded.h5"
    publish(packed_120.path, url)
    try:
        ds = H5ImageDataset(url, verify_reads=True)
        got = ds.__getitems__(list(range(len(ds)))[::-1])
        local = H5ImageDataset(packed_120.path)
        for k, (image, label) in enumerate(got):
            want = local[len(ds) - 1 - k]
            assert label == want[1]
            assert bool((image == want[0]).all())
    finally:
        fsspec.filesystem("memory").rm(url.rsplit("/", 1)[0], recursive=True)


def test_s3_loader_reads_whole_batches_with_few_requests(
    packed_120: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    # loader(): each worker fetches a batch with one concurrent cat_ranges straight into its
    # slot; same samples as the local file, about one range request per sample.
    url = f"s3://{s3_bucket}/loader.h5"
    publish(packed_120.path, url, storage_options=s3_storage_options)
    truth = _local_truth(packed_120.path)
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    s3_requests.clear()
    loader = ds.loader(
        8,
        shuffle=True,
        num_workers=WORKERS,
        multiprocessing_context="spawn",
        generator=torch.Generator().manual_seed(0),
    )
    got = content(
        (image, label)
        for images, labels in loader
        for image, label in zip(images, labels.tolist(), strict=True)
    )
    assert got == truth
    reads = [r for r in s3_requests() if _is_read(r.method, r.range)]
    assert len(reads) <= math.ceil(1.05 * packed_120.num_samples), len(reads)


def _ranges(path: str, rows: Iterable[int]) -> list[list[int]]:
    index = open_state(Location(path), ReadOptions()).index
    return cast(list[list[int]], index.byte_ranges[list(rows)].tolist())


def _spans(log: S3RequestLog, name: str) -> list[tuple[int, int]]:
    """``(first, last)`` byte of every sample-range GET of ``name`` (head reads excluded)."""
    out = []
    for r in log():
        if r.path.endswith(f"/{name}") and _is_read(r.method, r.range):
            first, _, last = (r.range or "")[6:].partition("-")
            out.append((int(first), int(last)))
    return out


@pytest.mark.parametrize(
    ("max_gap", "max_request"), [(0, 1 << 20), (6000, 20000), (1 << 20, 1 << 30)]
)
def test_coalesced_reads_are_bounded_and_exact(
    max_gap: int,
    max_request: int,
    packed_120: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    # Every 3rd sample of a batch: gaps of 2 samples (4,608 bytes) between wanted ranges.
    url = f"s3://{s3_bucket}/gaps.h5"
    publish(packed_120.path, url, storage_options=s3_storage_options)
    ranges = _ranges(packed_120.path, range(0, 60, 3))
    size = ranges[0][1]
    reader = RangeReader(
        Location(url, s3_storage_options), max_gap=max_gap, max_request=max_request, keep_bytes=0
    )
    s3_requests.clear()
    bufs = [bytearray(n) for _, n in ranges]
    reader.read_into(ranges, [memoryview(b) for b in bufs])
    with open(packed_120.path, "rb") as f:
        for (offset, n), got in zip(ranges, bufs, strict=True):
            f.seek(offset)
            assert f.read(n) == got
    spans = _spans(s3_requests, "gaps.h5")
    assert reader.stats.requests == len(spans)
    assert reader.stats.bytes == sum(b - a + 1 for a, b in spans)
    assert reader.stats.over_read == reader.stats.bytes - size * len(ranges)
    assert all(b - a + 1 <= max(max_request, size) for a, b in spans)
    gap = ranges[1][0] - ranges[0][0] - size
    if max_gap <= gap:  # nothing merged, nothing over-read
        assert (len(spans), reader.stats.over_read) == (len(ranges), 0)
    else:  # merged: each request over-reads at most one gap per extra range it serves
        assert len(spans) < len(ranges)
        assert reader.stats.over_read <= gap * (len(ranges) - len(spans))


def test_block_shuffled_loader_reads_ahead(
    packed_120: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    # A block shuffle's batches draw from few neighbouring blocks: a worker's first batch of a
    # window fetches them in a few requests and its next batches find their samples kept.
    url = f"s3://{s3_bucket}/blocks.h5"
    publish(packed_120.path, url, storage_options=s3_storage_options)
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    order = epoch_order(len(ds), seed=3, block_size=20, window=2).tolist()
    s3_requests.clear()
    loader = ds.loader(8, sampler=order, num_workers=WORKERS, multiprocessing_context="spawn")
    got = content(
        (image, label)
        for images, labels in loader
        for image, label in zip(images, labels.tolist(), strict=True)
    )
    assert got == _local_truth(packed_120.path)
    batches = math.ceil(len(ds) / 8)
    reads = _spans(s3_requests, "blocks.h5")
    assert len(reads) <= batches, reads  # one request per batch at most, not one per sample
    total = sum(b - a + 1 for a, b in reads)
    assert total <= WORKERS * packed_120.bytes  # each worker reads the file at most once


def test_kept_bytes_serve_later_reads(
    packed_120: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
) -> None:
    url = f"s3://{s3_bucket}/kept.h5"
    publish(packed_120.path, url, storage_options=s3_storage_options)
    first = _ranges(packed_120.path, range(0, 120, 3))  # spans most of the file
    second = _ranges(packed_120.path, range(1, 118, 3))  # in the gaps of the first
    with open(packed_120.path, "rb") as f:
        raw = f.read()
    # One read-ahead block larger than the file: the first read rounds up to the whole file.
    for keep, new_requests in ((1 << 20, 0), (0, 1)):
        reader = RangeReader(
            Location(url, s3_storage_options), block_bytes=1 << 20, keep_bytes=keep
        )
        for ranges in (first, second):
            bufs = [bytearray(n) for _, n in ranges]
            s3_requests.clear()
            reader.read_into(ranges, [memoryview(b) for b in bufs])
            assert [bytes(b) for b in bufs] == [raw[o : o + n] for o, n in ranges]
        assert len(_spans(s3_requests, "kept.h5")) == new_requests
        assert reader.stats.kept_hits == (len(second) if keep else 0)
        assert reader.stats.requests == 1 + new_requests


@pytest.mark.parametrize("block_bytes", [4096, 10_000, 1 << 20])
def test_random_batches_read_exact_bytes(block_bytes: int, packed_120: PackResult) -> None:
    # Random batches through coalescing, whole blocks and kept blocks (small enough to evict)
    # return exactly the file's bytes, whatever mix of sources serves a range.
    url = f"memory://h5forge-test-{uuid.uuid4().hex[:12]}/rand.h5"
    publish(packed_120.path, url)
    raw = Path(packed_120.path).read_bytes()
    rng = np.random.default_rng(block_bytes)
    try:
        reader = RangeReader(
            Location(url),
            max_gap=1 << 20,
            max_request=5 * block_bytes // 2,
            block_bytes=block_bytes,
            keep_bytes=3 * block_bytes,
        )
        for _ in range(40):
            rows = rng.choice(120, size=int(rng.integers(1, 40)), replace=False)
            ranges = _ranges(packed_120.path, rows.tolist())
            bufs = [bytearray(n) for _, n in ranges]
            reader.read_into(ranges, [memoryview(b) for b in bufs])
            assert [bytes(b) for b in bufs] == [raw[o : o + n] for o, n in ranges]
        assert reader.stats.kept_hits > 0 or block_bytes > len(raw)
    finally:
        fsspec.filesystem("memory").rm(url.rsplit("/", 1)[0], recursive=True)
