"""fetch() against real servers on loopback: HTTP faults, resume, checksums, cache, S3, memory."""

from __future__ import annotations

import hashlib
import io
import logging
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest

from h5forge.errors import ChecksumError, DownloadRefusedError, StoreError, UnsafeArchiveError
from h5forge.fetch.dest import MARKER
from h5forge.fetch.sources import FetchResult, fetch
from h5forge.location import CHUNK, Location
from h5forge.tasks.common import is_transient
from tests.fixtures.archives import GOOD_FILES, tar_bytes
from tests.fixtures.s3_faults import S3Faults, impatient
from tests.fixtures.servers import LoopbackHTTP, S3RequestLog

FAST = {"backoff": 0.01, "timeout": 5.0}


@pytest.fixture
def archive() -> bytes:
    """A .tar.gz whose one top folder is data/, padded with incompressible bytes (~200 KB)."""
    files = {**GOOD_FILES, "data/cat/noise.jpg": os.urandom(200_000)}
    return tar_bytes(files, "w:gz")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _assert_dataset(result: FetchResult, dest: Path) -> None:
    assert result.root == str(dest / "data")
    for name, data in GOOD_FILES.items():
        assert (dest / name).read_bytes() == data


def _gets(http: LoopbackHTTP, path: str) -> list[str | None]:
    return [r.range for r in http.requests_for(path) if r.method == "GET"]


def test_http_two_500s_then_success(http_server: LoopbackHTTP, tmp_path: Path, archive: bytes):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.fail("/d.tar.gz", 500, times=2)

    result = fetch(url, tmp_path / "dest", sha256=_sha(archive), **FAST)

    _assert_dataset(result, tmp_path / "dest")
    assert result.sha256 == _sha(archive)
    assert not result.cached
    assert _gets(http_server, "/d.tar.gz") == [None, None, None]


def test_http_resume_asks_only_for_the_rest(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    half = len(archive) // 2
    http_server.drop("/d.tar.gz", after=half)

    result = fetch(url, tmp_path / "dest", sha256=_sha(archive), progress=True, **FAST)

    _assert_dataset(result, tmp_path / "dest")
    assert _gets(http_server, "/d.tar.gz") == [None, f"bytes={half}-"]
    resumed = http_server.requests_for("/d.tar.gz")[1]
    assert resumed.headers.get("If-Range")  # a changed file answers 200, not a wrong splice


@pytest.mark.parametrize("fault", ["bad_range", "ignore_range"])
def test_http_bad_resume_answer_restarts_from_zero(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes, fault: str
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.drop("/d.tar.gz", after=1000)
    getattr(http_server, fault)("/d.tar.gz")

    result = fetch(url, tmp_path / "dest", sha256=_sha(archive), **FAST)

    _assert_dataset(result, tmp_path / "dest")
    ranges = _gets(http_server, "/d.tar.gz")
    assert ranges[:2] == [None, "bytes=1000-"]
    # bad_range: the 206 is refused and a fresh request follows; ignore_range: the 200 is used.
    assert ranges[2:] == ([None] if fault == "bad_range" else [])


@pytest.mark.parametrize("how", ["wrong-expected", "corrupt-body"])
def test_checksum_mismatch_keeps_nothing(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes, how: str
):
    url = http_server.serve("/d.tar.gz", archive)
    expected = _sha(archive)
    if how == "wrong-expected":
        expected = _sha(b"something else")
    else:
        http_server.corrupt("/d.tar.gz")
    actual = _sha(archive) if how == "wrong-expected" else _sha(bytes(b ^ 0xFF for b in archive))

    with pytest.raises(ChecksumError) as info:
        fetch(url, tmp_path / "dest", sha256=expected, cache_dir=tmp_path / "cache", **FAST)

    assert expected in str(info.value)
    assert actual in str(info.value)
    assert not (tmp_path / "dest").exists()
    assert [p for p in (tmp_path / "cache").rglob("*") if p.is_file()] == []
    assert sorted(os.listdir(tmp_path)) == ["cache"]


def test_http_404_names_the_url(http_server: LoopbackHTTP, tmp_path: Path):
    url = http_server.url("/missing.tar")
    with pytest.raises(FileNotFoundError, match="404.*/missing.tar"):
        fetch(url, tmp_path / "dest", **FAST)
    assert len(http_server.requests) == 1  # a 404 is not retried


@pytest.mark.parametrize("status", [400, 405, 451])
def test_an_http_refusal_is_the_downloads_own_permanent_error(
    http_server: LoopbackHTTP, tmp_path: Path, status: int
):
    url = http_server.serve("/d.tar.gz", b"x")
    http_server.fail("/d.tar.gz", status, times=5)
    with pytest.raises(DownloadRefusedError, match=f"HTTP {status}.*/d.tar.gz") as info:
        fetch(url, tmp_path / "dest", **FAST)
    assert not is_transient(info.value)  # the fetch task fails at once, as the message says
    assert len(http_server.requests) == 1


def test_cache_hit_downloads_nothing(http_server: LoopbackHTTP, tmp_path: Path, archive: bytes):
    url = http_server.serve("/d.tar.gz", archive)
    first = fetch(url, tmp_path / "a", sha256=_sha(archive), **FAST)
    # Same dest again (replaced, since fetch made it) and a second dest: both from the cache.
    again = fetch(url + "?X-Amz-Signature=resigned", tmp_path / "a", sha256=_sha(archive))
    other = fetch(url, tmp_path / "b", sha256=_sha(archive))

    assert (first.cached, again.cached, other.cached) == (False, True, True)
    _assert_dataset(other, tmp_path / "b")
    assert len(_gets(http_server, "/d.tar.gz")) == 1
    assert (tmp_path / "a" / MARKER).is_file()


def test_stall_times_out_in_bounded_time(http_server: LoopbackHTTP, tmp_path: Path, archive: bytes):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.stall("/d.tar.gz", seconds=60, times=10)  # headers, then silence

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="d.tar.gz"):
        fetch(url, tmp_path / "dest", timeout=0.3, retries=1, backoff=0.01)
    assert time.monotonic() - started < 5
    assert len(_gets(http_server, "/d.tar.gz")) == 2


def test_stalls_that_make_progress_resume(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.stall("/d.tar.gz", seconds=60, after=5000, times=3)

    # retries=1 is enough: an attempt that kept new bytes does not use up the retry budget.
    result = fetch(
        url, tmp_path / "dest", sha256=_sha(archive), timeout=0.2, retries=1, backoff=0.01
    )

    _assert_dataset(result, tmp_path / "dest")
    assert _gets(http_server, "/d.tar.gz") == [None, "bytes=5000-", "bytes=10000-", "bytes=15000-"]


def test_credentials_never_recorded(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes, caplog: pytest.LogCaptureFixture
):
    http_server.serve("/d.tar.gz", archive)
    http_server.fail("/d.tar.gz", 503)  # makes fetch log a retry line with the URL
    url = http_server.url("/d.tar.gz?X-Amz-Signature=sigsecret&v=1", userinfo="alice:pwsecret")
    caplog.set_level(logging.DEBUG)

    result = fetch(url, tmp_path / "dest", sha256=_sha(archive), **FAST)

    assert result.source_url == http_server.url("/d.tar.gz?X-Amz-Signature=REDACTED&v=1")
    assert "retrying" in caplog.text
    recorded = caplog.text + (tmp_path / "dest" / MARKER).read_text() + repr(result)
    for cache_file in (tmp_path / ".h5forge-cache").rglob("*.json"):
        recorded += cache_file.read_text()
    assert "pwsecret" not in recorded
    assert "sigsecret" not in recorded
    assert http_server.requests[-1].headers["Authorization"].startswith("Basic ")


def test_a_location_carries_its_own_options(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    http_server.serve("/d.tar.gz", archive)
    where = Location(http_server.url("/d.tar.gz"), {"headers": {"X-Token": "tok"}})

    result = fetch(where, tmp_path / "dest", sha256=_sha(archive), **FAST)

    _assert_dataset(result, tmp_path / "dest")
    assert http_server.requests[-1].headers["X-Token"] == "tok"
    with pytest.raises(ValueError, match="carries its own storage options"):
        fetch(where, tmp_path / "again", storage_options={"headers": {"X-Token": "other"}})


def test_redirect_to_other_host_drops_credentials(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    http_server.serve("/real.tar.gz", archive)
    port = http_server.base_url.rsplit(":", 1)[1]
    http_server.redirect("/d.tar.gz", f"http://localhost:{port}/real.tar.gz")
    url = http_server.url("/d.tar.gz", userinfo="alice:pwsecret")

    result = fetch(url, tmp_path / "dest", sha256=_sha(archive), **FAST)

    _assert_dataset(result, tmp_path / "dest")
    first, second = http_server.requests
    assert "Authorization" in first.headers
    assert "Authorization" not in second.headers


def test_local_folder_is_used_in_place(tmp_path: Path):
    (tmp_path / "images" / "cat").mkdir(parents=True)
    (tmp_path / "images" / "cat" / "a.jpg").write_bytes(b"x")

    for url in (str(tmp_path / "images"), (tmp_path / "images").as_uri()):
        result = fetch(url, tmp_path / "dest")
        assert result == FetchResult(str(tmp_path / "images"), url, "", False)
    assert not (tmp_path / "dest").exists()


def test_local_archive_checked_and_extracted(tmp_path: Path, archive: bytes):
    path = tmp_path / "d.tar.gz"
    path.write_bytes(archive)
    with pytest.raises(ChecksumError):
        fetch(path.as_uri(), tmp_path / "dest", sha256="0" * 64)
    result = fetch(path, tmp_path / "dest", sha256=_sha(archive).upper())
    _assert_dataset(result, tmp_path / "dest")
    assert sorted(os.listdir(tmp_path)) == ["d.tar.gz", "dest"]  # no cache for a local file


def test_dest_not_made_by_fetch_is_refused(tmp_path: Path, archive: bytes):
    path = tmp_path / "d.tar.gz"
    path.write_bytes(archive)
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not made by h5forge fetch"):
        fetch(path, tmp_path / "dest")
    assert os.listdir(tmp_path / "dest") == ["precious.txt"]
    (tmp_path / "file").write_text("keep me too")
    with pytest.raises(FileExistsError, match="not a folder"):
        fetch(path, tmp_path / "file")
    assert (tmp_path / "file").read_text() == "keep me too"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"sha256": "abc"}, "sha256='abc'"),
        ({"retries": -1}, "retries=-1"),
        ({"timeout": 0}, "timeout=0"),
        ({"max_members": 0}, "max_members=0"),
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"total_timeout": 0}, "total_timeout=0"),
        ({"min_rate": -1}, "min_rate=-1"),
    ],
)
def test_invalid_arguments(tmp_path: Path, kwargs: dict[str, Any], match: str):
    with pytest.raises(ValueError, match=match):
        fetch(str(tmp_path), tmp_path / "dest", **kwargs)


def _put_tree(fs: Any, base: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        fs.pipe_file(f"{base}/{name}", data)


def test_s3_prefix_copied(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_requests: S3RequestLog, tmp_path: Path
):
    fs, _ = fsspec.core.url_to_fs(f"s3://{s3_bucket}", **s3_storage_options)
    _put_tree(fs, f"{s3_bucket}/sets/v1", GOOD_FILES)
    s3_requests.clear()

    result = fetch(
        f"s3://{s3_bucket}/sets/v1/",
        tmp_path / "dest",
        storage_options=s3_storage_options,
        workers=2,
        progress=True,
    )

    _assert_dataset(result, tmp_path / "dest")
    assert result.sha256 == ""
    assert not result.cached
    gets = [r.path for r in s3_requests() if r.method == "GET" and "list-type" not in r.path]
    assert sorted(gets) == sorted(f"/{s3_bucket}/sets/v1/{n}" for n in GOOD_FILES)


def test_s3_archive_streamed_then_cached(
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_requests: S3RequestLog,
    tmp_path: Path,
    archive: bytes,
):
    url = f"s3://{s3_bucket}/archives/d.tar.gz"
    fs, path = fsspec.core.url_to_fs(url, **s3_storage_options)
    fs.pipe_file(path, archive)
    s3_requests.clear()
    opts = {"storage_options": s3_storage_options, "sha256": _sha(archive)}

    first = fetch(url, tmp_path / "a", **opts)
    object_gets = [r for r in s3_requests() if r.method == "GET" and r.path.endswith("d.tar.gz")]
    second = fetch(url, tmp_path / "b", **opts)

    _assert_dataset(first, tmp_path / "a")
    _assert_dataset(second, tmp_path / "b")
    assert (first.cached, second.cached) == (False, True)
    assert object_gets
    after = [r for r in s3_requests() if r.method == "GET" and r.path.endswith("d.tar.gz")]
    assert after == object_gets  # the cache hit read nothing from the bucket


def test_s3_prefix_with_an_empty_object_and_a_large_one_copied_whole(
    s3_bucket: str, s3_storage_options: dict[str, Any], tmp_path: Path
):
    # An object is copied by its listed size in ranged reads: an empty one is one read
    # answered 416, a large one several reads (8 MiB each) and a last one a byte past its end.
    big = os.urandom(CHUNK + 1234)
    files = {**GOOD_FILES, "data/cat/empty.jpg": b"", "data/dog/big.png": big}
    fs, _ = fsspec.core.url_to_fs(f"s3://{s3_bucket}", **s3_storage_options)
    _put_tree(fs, f"{s3_bucket}/sets/v2", files)

    fetch(f"s3://{s3_bucket}/sets/v2/", tmp_path / "d", storage_options=s3_storage_options)

    for name, data in files.items():
        assert (tmp_path / "d" / name).read_bytes() == data


@pytest.mark.parametrize("what", ["archive", "prefix", "listing"])
def test_an_s3_answer_trickled_a_byte_at_a_time_ends_in_a_store_error_nothing_kept(
    s3_bucket: str,
    s3_storage_options: dict[str, Any],
    s3_faults: S3Faults,
    tmp_path: Path,
    archive: bytes,
    what: str,
):
    # Each byte comes within the client's read timeout (1 s), so only the bound on the whole
    # read ends it (every attempt of the client plus the bytes at MIN_READ_RATE): never a hang.
    options = impatient(s3_storage_options)
    fs, _ = fsspec.core.url_to_fs(f"s3://{s3_bucket}", **s3_storage_options)
    if what == "archive":
        url = slow = f"s3://{s3_bucket}/archives/d.tar.gz"
        fs.pipe_file(url, archive)
    else:
        _put_tree(fs, f"{s3_bucket}/sets/v1", GOOD_FILES)
        url, slow = f"s3://{s3_bucket}/sets/v1/", f"s3://{s3_bucket}/sets/v1/data/cat/b.jpg"
    if what == "listing":  # the bucket's LIST answers: a listing is bounded by max_members
        slow = f"s3://{s3_bucket}"
    s3_faults.trickle(slow, 0.2, times="always", method="GET")
    bound = Location.of(slow, options).read_timeout(len(archive) + 10 * 1024)["timeout"]
    started = time.monotonic()
    with pytest.raises(StoreError, match="the store sent its answer too slowly"):
        fetch(
            url,
            tmp_path / "dest",
            storage_options=options,
            cache_dir=tmp_path / "cache",
            max_members=10,
        )
    assert time.monotonic() - started < bound + 10
    assert {kind for *_, kind in s3_faults.injected} == {"trickle"}
    assert not (tmp_path / "dest").exists()
    assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file()]


def test_memory_prefix_and_archive(tmp_path: Path, archive: bytes):
    fs = fsspec.filesystem("memory")
    base = f"/h5forge-fetch-{tmp_path.name}"
    try:
        _put_tree(fs, f"{base}/tree", GOOD_FILES)
        fs.pipe_file(f"{base}/d.tgz", archive)
        _assert_dataset(fetch(f"memory://{base}/tree", tmp_path / "t"), tmp_path / "t")
        _assert_dataset(fetch(f"memory://{base}/d.tgz", tmp_path / "a"), tmp_path / "a")
        with pytest.raises(FileNotFoundError, match="nothing at"):
            fetch(f"memory://{base}/absent", tmp_path / "x")
    finally:
        fs.rm(base, recursive=True)


def test_memory_prefix_with_traversal_key_is_refused(tmp_path: Path):
    fs = fsspec.filesystem("memory")
    base = f"/h5forge-fetch-{tmp_path.name}"
    try:
        fs.pipe_file(f"{base}/ok.jpg", b"x")
        fs.store[f"{base}/sub/../../escape.jpg"] = fs.store[f"{base}/ok.jpg"]
        with pytest.raises(UnsafeArchiveError, match="escape.jpg"):
            fetch(f"memory://{base}", tmp_path / "dest")
        assert sorted(os.listdir(tmp_path)) == []
    finally:
        fs.store.pop(f"{base}/sub/../../escape.jpg", None)
        fs.rm(base, recursive=True)


def test_single_file_that_is_not_an_archive(http_server: LoopbackHTTP, tmp_path: Path):
    data = b"<html>login page</html>"
    url = http_server.serve("/d.tar.gz", data)
    with pytest.raises(ValueError, match="not an archive"):
        fetch(url, tmp_path / "dest", sha256=_sha(data), **FAST)
    assert not (tmp_path / "dest").exists()


def test_archive_bomb_from_http_is_refused(http_server: LoopbackHTTP, tmp_path: Path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("big.bin")
        info.size = 2 << 20
        tf.addfile(info, io.BytesIO(b"\0" * info.size))
    url = http_server.serve("/bomb.tgz", buf.getvalue())
    with pytest.raises(UnsafeArchiveError, match="'big.bin'"):
        fetch(url, tmp_path / "dest", max_bytes=1 << 20, **FAST)
    assert sorted(os.listdir(tmp_path)) == [".h5forge-cache"]
