"""A store that throttles, fails or drops connections, on the loopback S3 (moto) with faults
injected (tests/fixtures/s3_faults.py): a few faults are retried and the read returns the
file's own pixels; a store that keeps failing raises a StoreError naming the URL, the bytes,
what failed, the attempts and the storage option that allows more, within a bound set by the
retry policy, in process and from DataLoader workers."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError, StoreError
from h5forge.location import S3_RETRIES, Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult, pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.read.dataset import H5ImageDataset
from h5forge.verify.checks import verify
from tests.fixtures.s3_faults import S3Faults, impatient

# botocore waits at most 2**i s (standard mode) before its retry i, s3fs 0.1 * 1.7**i s
# before its try i + 1 (5 tries): the longest a read can back off before it gives up, with
# FAST (1 retry) and with the default policy (3 retries).
S3FS_TRIES = 5
_S3FS_WAITS = sum(min(1.7**i * 0.1, 15) for i in range(S3FS_TRIES))
FAST = {"mode": "standard", "max_attempts": 1}


def _backoff_bound(retries: int) -> float:
    """Seconds a read that fails on every attempt can spend waiting, at most, plus slack for
    the requests themselves on a loaded machine: a bound on a hang, not a benchmark."""
    return S3FS_TRIES * sum(min(2**i, 20) for i in range(retries)) + _S3FS_WAITS + 20


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> PackResult:
    root = tmp_path_factory.mktemp("faults_src")
    write_image_folder(root, classes=("a", "b"), per_class=12, seed=5, size=(20, 20))
    return pack(
        root,
        tmp_path_factory.mktemp("faults") / "tiny.h5",
        config=PackConfig(ImageConfig(resize="resize", size=(16, 16))),
        workers=1,
    )


def _published(packed: PackResult, bucket: str, options: dict[str, Any]) -> str:
    url = f"s3://{bucket}/tiny.h5"
    publish(packed.path, url, storage_options=options)
    return url


def _fast(options: dict[str, Any]) -> dict[str, Any]:
    return {**options, "config_kwargs": {"retries": dict(FAST)}}


def _same_batch(got: tuple[Any, Any], want: tuple[Any, Any]) -> None:
    assert torch.equal(got[0].contiguous(), want[0].contiguous())
    assert torch.equal(got[1], want[1])


@pytest.mark.parametrize(
    ("fault", "when"),
    [("503", "read"), ("500", "read"), ("drop", "read"), ("503", "open"), ("drop", "open")],
)
def test_a_few_faults_are_retried_and_the_pixels_are_the_files(
    fault: str,
    when: str,
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    url = _published(packed, s3_bucket, s3_storage_options)
    everything = list(range(packed.num_samples))
    want = H5ImageDataset(packed.path).read_batch(everything)

    def queue() -> None:
        if fault == "drop":
            s3_faults.drop(url, times=3, ranged=True)
        else:
            s3_faults.fail(url, int(fault), times=3, ranged=True)  # type: ignore[arg-type]
        if when == "open":
            s3_faults.fail(url, 503, times=2, method="HEAD")

    if when == "open":
        queue()
    ds = H5ImageDataset(url, storage_options=s3_storage_options)  # opens it in this process
    if when == "read":
        queue()  # the faults meet the reader's range requests
    _same_batch(ds.read_batch(everything), want)
    assert s3_faults.pending == 0, "every fault queued met a request"
    assert len(s3_faults.injected) == 3 + 2 * (when == "open")


@pytest.mark.parametrize("fault", ["503", "500", "drop"])
def test_a_store_that_keeps_failing_raises_a_clear_error_in_bounded_time(
    fault: str,
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    options = _fast(s3_storage_options)
    url = _published(packed, s3_bucket, options)
    ds = H5ImageDataset(url, storage_options=options)
    if fault == "drop":
        s3_faults.drop(url, after=100, times="always", ranged=True)
    else:
        s3_faults.fail(url, int(fault), times="always", ranged=True)  # type: ignore[arg-type]
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        ds.read_batch(list(range(packed.num_samples)))
    took = time.monotonic() - started
    assert took < _backoff_bound(FAST["max_attempts"]), took
    message = str(caught.value)
    made = len(s3_faults.injected)  # one range (the file is one block): every request
    assert message.startswith(f"s3://{s3_bucket}/tiny.h5: reading bytes "), message
    assert "nothing is wrong with the asset" in message
    if fault == "drop":
        assert "dropped the connection mid-answer" in message
        assert "100 of" in message  # aiohttp's own count of the bytes that came
        assert f"after {S3FS_TRIES} attempts" in message
        assert made == S3FS_TRIES
        assert "read_timeout" in message
    else:
        code = "503 SlowDown" if fault == "503" else "500 InternalError"
        assert f"the store answered {code}" in message
        per_try = FAST["max_attempts"] + 1
        # s3fs tries a throttled request again itself; a 500 is botocore's alone.
        tries = S3FS_TRIES if fault == "503" else 1
        counted = (
            f"{tries} tries of {per_try} attempts each ({tries * per_try} requests)"
            if tries > 1
            else f"{per_try} attempts"
        )
        assert f"after {counted}" in message, message
        assert made == tries * per_try
        assert "'max_attempts': 2}}} (now 1)" in message
        assert "config_kwargs" in message
    assert options["config_kwargs"] == {"retries": FAST}  # the caller's own, unchanged


@pytest.mark.parametrize("times", [1, "always"])
def test_a_stalled_answer_times_out_and_is_tried_again(
    times: int | str,
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    # Headers and 100 bytes, then silence (until the test ends): the client's read timeout
    # (1 s here, s3fs's default is 15 s) ends each try; never a hang.
    options = _fast(s3_storage_options)
    options["config_kwargs"]["read_timeout"] = 1
    url = _published(packed, s3_bucket, options)
    ds = H5ImageDataset(url, storage_options=options)
    s3_faults.stall(url, 300, after=100, times=times, ranged=True)  # type: ignore[arg-type]
    everything = list(range(packed.num_samples))
    started = time.monotonic()
    if times == 1:
        _same_batch(ds.read_batch(everything), H5ImageDataset(packed.path).read_batch(everything))
        assert s3_faults.pending == 0
        return
    with pytest.raises(StoreError, match="timed out") as caught:
        ds.read_batch(everything)
    took = time.monotonic() - started
    assert took < S3FS_TRIES * 1 + _backoff_bound(FAST["max_attempts"]), took
    assert f"after {S3FS_TRIES} attempts" in str(caught.value)
    assert "read_timeout" in str(caught.value)


def test_an_answer_trickled_a_byte_at_a_time_is_a_store_error_within_its_bound(
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    # Every byte comes well within the client's read timeout (1 s here), so no read of the
    # client ever times out: only h5forge's bound on the whole call ends the read, after every
    # attempt the client may make (Location.read_timeout), never a hang.
    options = impatient(s3_storage_options)
    url = _published(packed, s3_bucket, options)
    ds = H5ImageDataset(url, storage_options=options)
    s3_faults.trickle(url, 0.2, times="always", ranged=True)
    bound = Location.of(url, options).read_timeout(Path(packed.path).stat().st_size)["timeout"]
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        ds.read_batch(list(range(packed.num_samples)))
    took = time.monotonic() - started
    assert took < bound + 10, (took, bound)
    assert {kind for *_, kind in s3_faults.injected} == {"trickle"}
    message = str(caught.value)
    assert message.startswith(f"s3://{s3_bucket}/tiny.h5: reading "), message
    assert "the store sent its answer too slowly" in message, message
    assert "read_timeout" in message, message


@pytest.mark.parametrize("how", ["sha256", "verify"])
def test_a_whole_file_read_from_a_trickling_store_is_a_store_error_within_its_bound(
    how: str,
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    # The publish's read-back hash and verify read the whole file in ranged reads, each
    # bounded as the reader's are (they streamed it through fs.open, with no bound at all).
    options = impatient(s3_storage_options)
    url = _published(packed, s3_bucket, options)
    where = Location.of(url, options)
    s3_faults.trickle(url, 0.2, times="always", ranged=True)
    bound = where.read_timeout(Path(packed.path).stat().st_size)["timeout"]
    started = time.monotonic()
    with pytest.raises(StoreError, match="the store sent its answer too slowly") as caught:
        where.sha256() if how == "sha256" else verify(where)
    assert not isinstance(caught.value, IntegrityError)  # the store, not the asset
    assert time.monotonic() - started < 2 * bound + 10  # verify's open, then its stream
    assert {kind for *_, kind in s3_faults.injected} == {"trickle"}


@pytest.mark.parametrize("where", ["HEAD", "GET"])
def test_an_open_that_keeps_failing_is_a_store_error_not_a_damaged_file(
    where: str,
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    # HDF5 sees a failed read of the head as it would a damaged file: the open must say the
    # store failed, never "re-pack it".
    options = _fast(s3_storage_options)
    url = _published(packed, s3_bucket, options)
    s3_faults.fail(url, 503, times="always", method=where)
    with pytest.raises(StoreError) as caught:
        H5ImageDataset(url, storage_options=options)
    assert not isinstance(caught.value, IntegrityError)
    message = str(caught.value)
    assert message.startswith(f"s3://{s3_bucket}/tiny.h5: reading "), message
    assert "re-pack" not in message
    per_try = FAST["max_attempts"] + 1
    if where == "HEAD":  # no body, so no SlowDown for s3fs to see: botocore's attempts alone
        assert "answered 503; the store is throttling requests" in message, message
        assert f"after {per_try} attempts over" in message, message
        assert len(s3_faults.injected) == per_try
    else:
        assert "answered 503 SlowDown" in message, message
        assert f"after {S3FS_TRIES} tries of {per_try} attempts each" in message, message
        assert len(s3_faults.injected) == S3FS_TRIES * per_try


def test_a_compressed_read_that_keeps_failing_is_a_store_error_not_a_corrupt_chunk(
    tmp_path: Path,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    # Compressed images are read through HDF5, which reports a failed read of its file object
    # as it reports a chunk that fails its checksum: the read must say the store failed.
    write_image_folder(tmp_path / "src", classes=("a",), per_class=16, seed=9, size=(300, 300))
    result = pack(
        tmp_path / "src",
        tmp_path / "gz.h5",
        config=PackConfig(ImageConfig(resize="resize", size=(256, 256)), compression="gzip"),
        workers=1,
    )
    options = _fast(s3_storage_options)
    url = f"s3://{s3_bucket}/gz.h5"
    publish(result.path, url, storage_options=options)
    assert Path(result.path).stat().st_size > 3 << 19  # its last chunks lie past the head read
    ds = H5ImageDataset(url, storage_options=options)
    s3_faults.fail(url, 503, times="always", ranged=True)
    with pytest.raises(StoreError, match="503 SlowDown") as caught:
        ds.read_batch([len(ds) - 1])
    assert not isinstance(caught.value, IntegrityError)
    assert s3_faults.injected
    s3_faults.clear()  # the store recovers: the same dataset reads again
    want = H5ImageDataset(result.path).read_batch([len(ds) - 1])
    _same_batch(ds.read_batch([len(ds) - 1]), want)


@pytest.mark.slow
def test_loader_workers_raise_the_store_error_in_the_main_process(
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    options = _fast(s3_storage_options)
    url = _published(packed, s3_bucket, options)
    ds = H5ImageDataset(url, storage_options=options)
    s3_faults.fail(url, 503, times="always", ranged=True)
    loader = ds.loader(8, num_workers=2, multiprocessing_context="spawn", timeout=120)
    started = time.monotonic()
    with pytest.raises(StoreError) as caught:
        next(iter(loader))
    assert time.monotonic() - started < _backoff_bound(FAST["max_attempts"]) + 60  # + spawn
    message = str(caught.value)
    assert "DataLoader worker process" in message  # torch names the worker ...
    assert f"s3://{s3_bucket}/tiny.h5: reading " in message  # ... and keeps ours
    assert "503 SlowDown" in message
    assert "max_attempts" in message


@pytest.mark.slow
def test_the_loader_completes_an_epoch_through_throttling_and_drops(
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    url = _published(packed, s3_bucket, s3_storage_options)
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    want = H5ImageDataset(packed.path).read_batch(list(range(packed.num_samples)))
    # Each worker opens the file (its head; the size is the one the cache's check asked for
    # in this process, so no HEAD) and reads its blocks: the faults meet both, whichever
    # worker asks first. (A HEAD's 503 at an open: test_a_few_faults_are_retried_...)
    s3_faults.fail(url, 503, times=3, ranged=True)
    s3_faults.drop(url, times=2, ranged=True)
    loader = ds.loader(6, num_workers=2, multiprocessing_context="spawn", timeout=120)
    images, labels = zip(*((i.contiguous(), t) for i, t in loader), strict=True)
    _same_batch((torch.cat(images), torch.cat(labels)), want)
    assert s3_faults.pending == 0


@pytest.mark.slow
def test_the_default_policy_gives_up_in_bounded_time(
    packed: PackResult,
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
) -> None:
    # No retry option given: Location's S3_RETRIES (standard, 3 retries) under s3fs's 5 tries.
    assert "config_kwargs" not in s3_storage_options
    url = _published(packed, s3_bucket, s3_storage_options)
    ds = H5ImageDataset(url, storage_options=s3_storage_options)
    s3_faults.fail(url, 503, times="always", ranged=True)
    started = time.monotonic()
    with pytest.raises(StoreError, match="503 SlowDown") as caught:
        ds.read_batch([0, 1, 2])
    took = time.monotonic() - started
    retries = int(S3_RETRIES["max_attempts"])
    assert took < _backoff_bound(retries), took
    assert f"{S3FS_TRIES} tries of {retries + 1} attempts each" in str(caught.value)
    assert len(s3_faults.injected) == S3FS_TRIES * (retries + 1)


def test_a_users_own_retry_policy_wins(s3_storage_options: dict[str, Any]) -> None:
    mine = {**s3_storage_options, "config_kwargs": {"max_pool_connections": 4}}
    built = Location("s3://b/k", mine).client_options["config_kwargs"]
    assert built == {"max_pool_connections": 4, "retries": dict(S3_RETRIES)}
    own = {"retries": {"mode": "legacy", "max_attempts": 9}}
    built = Location("s3://b/k", {"config_kwargs": own}).client_options["config_kwargs"]
    assert built == own
    assert Location(str(Path("/x.h5"))).client_options == {}
    assert Location("memory://x/y.h5", {"a": 1}).client_options == {"a": 1}
