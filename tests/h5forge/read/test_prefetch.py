"""Prefetch: each loader worker is told the batch it reads next and fetches its bytes in the
background (h5forge.read.loader, RemoteRanges.prefetch), over moto's S3 on loopback."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import s3fs

from h5forge.asset.ranges import RangeReader
from h5forge.location import Location
from h5forge.read.sampler import Sampler
from tests.fixtures.lookahead import Recording
from tests.fixtures.servers import S3RequestLog

BLOCK = 64 << 10


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_each_worker_is_told_the_batch_it_reads_next(
    tmp_path: Path, method: str, workers: int
) -> None:
    ds = Recording(50, "")
    kw: dict[str, Any] = {"num_workers": workers}
    if workers:
        kw["multiprocessing_context"] = method
    loader = ds.loader(4, sampler=Sampler(50, seed=3), **kw)
    for e in range(2):  # two epochs: the look-ahead ends with each epoch
        ds.folder = str(tmp_path / str(e))  # workers get it with the dataset, each epoch
        os.mkdir(ds.folder)
        got = [b.tolist() for b in loader]
        assert sorted(i for b in got for i in b) == list(range(50))
        logs = list((tmp_path / str(e)).iterdir())
        assert len(logs) == max(1, workers)
        for log in logs:
            calls = [json.loads(line) for line in log.read_text().splitlines()]
            reads = [c[1] for c in calls if c[0] == "read"]
            # A worker is told, before each read, the next batch it reads in the epoch; but
            # its first batch of the process, which nothing fetched ahead, is read first and
            # the next one told after it (its own requests go first): each epoch's workers
            # are new processes here; without workers, only the first epoch's batch is.
            first = e == 0 or workers > 0
            assert calls[0][0] == ("read" if first else "ahead"), (log.name, e)
            if first and len(reads) > 1:
                assert calls[1] == ["ahead", reads[1]], (log.name, e)
                calls = calls[2:]
                reads = reads[1:]
            told = [
                calls[i - 1][1] if i and calls[i - 1][0] == "ahead" else None
                for i, c in enumerate(calls)
                if c[0] == "read"
            ]
            assert told[:-1] == reads[1:], (log.name, e)
            assert told[-1] is None  # nothing after its last batch of the epoch


@pytest.fixture
def blob_url(s3_bucket: str, s3_storage_options: dict[str, Any]) -> tuple[str, bytes]:
    data = os.urandom(40 * BLOCK + 123)
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    fs.pipe(f"{s3_bucket}/blob.bin", data)
    return f"s3://{s3_bucket}/blob.bin", data


def _reader(url: str, options: dict[str, Any], keep: int = 16 * BLOCK) -> RangeReader:
    # No gap merging: each request is then one block or one range, as the test names them.
    return RangeReader(Location(url, options), block_bytes=BLOCK, keep_bytes=keep, max_gap=0)


def _gets(log: S3RequestLog) -> list[Any]:
    return [r for r in log() if r.method == "GET" and r.path.endswith("/blob.bin")]


def test_a_prefetched_batch_is_read_without_a_request_of_its_own(
    blob_url: tuple[str, bytes], s3_storage_options: dict[str, Any], s3_requests: S3RequestLog
) -> None:
    url, data = blob_url
    rd = _reader(url, s3_storage_options)
    ranges = [(3 * BLOCK + 10, BLOCK), (9 * BLOCK, 2 * BLOCK - 7), (20 * BLOCK + 5, 100)]
    s3_requests.clear()
    rd.prefetch(ranges)
    bufs = [memoryview(bytearray(n)) for _, n in ranges]
    rd.read_into(ranges, bufs)
    for (o, n), b in zip(ranges, bufs, strict=True):
        assert bytes(b) == data[o : o + n]
    fetched = _gets(s3_requests)
    # The blocks read at least half (3, 9, 10) came ahead, adjacent ones in one request (9
    # and 10); the 10 bytes of block 4 and the 100 of block 20 are too little to fetch them
    # whole: the read asks for exactly those itself.
    assert sorted(r.range for r in fetched) == sorted(
        [f"bytes={3 * BLOCK}-{4 * BLOCK - 1}", f"bytes={9 * BLOCK}-{11 * BLOCK - 1}"]
        + [f"bytes={4 * BLOCK}-{4 * BLOCK + 9}", f"bytes={20 * BLOCK + 5}-{20 * BLOCK + 104}"]
    )
    s3_requests.clear()
    rd.prefetch(ranges[1:2])  # blocks 9 and 10 are kept now: nothing to fetch
    rd.read_into(ranges[1:2], bufs[1:2])
    assert _gets(s3_requests) == []


def test_prefetch_is_bounded_by_what_a_reader_keeps(
    blob_url: tuple[str, bytes], s3_storage_options: dict[str, Any], s3_requests: S3RequestLog
) -> None:
    url, data = blob_url
    rd = _reader(url, s3_storage_options, keep=6 * BLOCK)
    assert rd.remote is not None
    ranges = [(k * BLOCK, BLOCK) for k in range(0, 30, 2)]  # 15 whole blocks
    s3_requests.clear()
    rd.prefetch(ranges)
    for future in list(rd.remote._pending.values()):
        future.result()
    ahead = sorted(r.range for r in _gets(s3_requests))  # the first 6 blocks, no more
    assert ahead == sorted(f"bytes={k * BLOCK}-{(k + 1) * BLOCK - 1}" for k in range(0, 12, 2))
    bufs = [memoryview(bytearray(n)) for _, n in ranges]
    rd.read_into(ranges, bufs)
    assert all(bytes(b) == data[o : o + n] for (o, n), b in zip(ranges, bufs, strict=True))


def test_a_failed_prefetch_is_forgotten_and_the_read_fetches_itself(
    blob_url: tuple[str, bytes], s3_storage_options: dict[str, Any]
) -> None:
    url, data = blob_url
    rd = _reader(url, s3_storage_options)
    assert rd.remote is not None
    real = rd.remote._fetch
    calls: list[int] = []

    def first_fails(starts: list[int], ends: list[int]) -> list[Any]:
        calls.append(len(starts))
        if len(calls) == 1:
            raise ConnectionResetError("the prefetch's connection was dropped")
        return real(starts, ends)

    rd.remote._fetch = first_fails
    ranges = [(5 * BLOCK, 2 * BLOCK)]
    rd.prefetch(ranges)
    buf = memoryview(bytearray(2 * BLOCK))
    rd.read_into(ranges, [buf])
    assert bytes(buf) == data[5 * BLOCK : 7 * BLOCK]
    assert len(calls) == 2  # the failed prefetch, then the read's own fetch


def test_readers_of_one_process_keep_blocks_within_one_budget(
    blob_url: tuple[str, bytes],
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from h5forge.asset import coalesce

    url, data = blob_url
    budget = coalesce._ProcessBlocks(6 * BLOCK)  # this process's, without earlier tests' blocks
    monkeypatch.setattr(coalesce, "_PROCESS", budget)
    first, second = (_reader(url, s3_storage_options, keep=8 * BLOCK) for _ in range(2))
    assert first.remote is not None
    assert second.remote is not None
    for rd, blocks in ((first, range(0, 4)), (second, range(10, 15))):
        ranges = [(k * BLOCK, BLOCK) for k in blocks]
        bufs = [memoryview(bytearray(BLOCK)) for _ in ranges]
        rd.read_into(ranges, bufs)
        assert [bytes(b) for b in bufs] == [data[o : o + n] for o, n in ranges]
    # 9 blocks were kept, 6 fit: the 3 least recently used (the first reader's) were dropped.
    assert sorted(first.remote._kept) == [3]
    assert sorted(second.remote._kept) == list(range(10, 15))
    assert budget.held == 6 * BLOCK


def test_readers_with_a_store_keep_blocks_within_their_own_smaller_budget(
    blob_url: tuple[str, bytes],
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """A sharded version's worker reads several shards, each with its cache store: what the
    budget drops from memory, the store gives back without a request."""
    from h5forge.asset import coalesce
    from h5forge.read.block_cache import BlockStore

    url, data = blob_url
    plain = coalesce._ProcessBlocks(16 * BLOCK)
    stored = coalesce._ProcessBlocks(4 * BLOCK)
    monkeypatch.setattr(coalesce, "_PROCESS", plain)
    monkeypatch.setattr(coalesce, "_PROCESS_STORED", stored)
    readers = [
        RangeReader(
            Location(url, s3_storage_options),
            block_bytes=BLOCK,
            keep_bytes=8 * BLOCK,
            max_gap=0,
            store=BlockStore(str(tmp_path), f"k{i}", 1 << 30, BLOCK),
        )
        for i in range(2)
    ]
    spans = (range(0, 3), range(10, 13))
    for rd, blocks in zip(readers, spans, strict=True):
        ranges = [(k * BLOCK, BLOCK) for k in blocks]
        bufs = [memoryview(bytearray(BLOCK)) for _ in ranges]
        rd.read_into(ranges, bufs)
        assert [bytes(b) for b in bufs] == [data[o : o + n] for o, n in ranges]
    kept = [sorted(rd.remote._kept) for rd in readers if rd.remote is not None]
    assert kept == [[2], [10, 11, 12]]  # 6 blocks read, 4 fit: the oldest 2 dropped
    assert stored.held == 4 * BLOCK
    assert plain.held == 0
    s3_requests.clear()
    buf = memoryview(bytearray(BLOCK))
    readers[0].read_into([(0, BLOCK)], [buf])  # dropped from memory, kept in the store
    assert bytes(buf) == data[:BLOCK]
    assert _gets(s3_requests) == []


def test_readers_reading_at_once_on_threads_within_one_budget_read_right(
    blob_url: tuple[str, bytes],
    s3_storage_options: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A batch across shards reads each shard's share on a thread (sharded.fill): readers of
    one process keep blocks within one budget while each drops the others' blocks. Each read
    here takes a block its reader kept (in memory at the read's start) and a new one (a fetch,
    during which another reader's new block may push the kept one out of the budget): every
    read returns the file's bytes."""
    import sys
    import threading

    from h5forge.asset import coalesce

    url, data = blob_url
    budget = coalesce._ProcessBlocks(3 * BLOCK)  # fewer than the readers keep between them
    monkeypatch.setattr(coalesce, "_PROCESS", budget)
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # threads switch often: the readers' steps interleave
    try:
        readers = [_reader(url, s3_storage_options, keep=4 * BLOCK) for _ in range(4)]
        wrong: list[str] = []

        def read(i: int, rd: RangeReader) -> None:
            try:
                for r in range(12):
                    old, new = (i * 10 + r) % 40, (i * 10 + r + 1) % 40
                    ranges = [(old * BLOCK + 100, BLOCK // 2), (new * BLOCK + 200, BLOCK // 2)]
                    bufs = [memoryview(bytearray(n)) for _, n in ranges]
                    rd.read_into(sorted(ranges), bufs)
                    for (o, n), b in zip(sorted(ranges), bufs, strict=True):
                        if bytes(b) != data[o : o + n]:
                            wrong.append(f"reader {i}, bytes {o}-{o + n}")
            except Exception as e:  # the race this guards against raised RuntimeError
                wrong.append(f"reader {i}: {e!r}")

        threads = [threading.Thread(target=read, args=(i, rd)) for i, rd in enumerate(readers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(before)
    assert wrong == []
    assert budget.held <= 3 * BLOCK
