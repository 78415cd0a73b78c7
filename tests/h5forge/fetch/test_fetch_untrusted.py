"""fetch() against a hostile HTTP server on loopback: headers across origins, redirects out of
http(s), endless and lying bodies, restart loops, trickles; and max_bytes on fsspec objects."""

from __future__ import annotations

import gzip
import hashlib
import os
import socket
import time
from pathlib import Path
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFileSystem

from h5forge.errors import DownloadRefusedError, UnsafeArchiveError
from h5forge.fetch import http as _http
from h5forge.fetch.sources import fetch
from tests.fixtures.archives import GOOD_FILES, tar_bytes
from tests.fixtures.servers import LoopbackHTTP

FAST: dict[str, Any] = {"backoff": 0.01, "timeout": 2.0}
CALLER = {
    "X-Api-Key": "k-secret",
    "Cookie": "session=c-secret",
    "User-Agent": "caller-ua",
    "Authorization": "Bearer t-secret",
}


@pytest.fixture(scope="module")
def archive() -> bytes:
    """A .tar.gz of GOOD_FILES padded with incompressible bytes (~120 KB)."""
    return tar_bytes({**GOOD_FILES, "data/cat/noise.jpg": os.urandom(120_000)}, "w:gz")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _gets(http: LoopbackHTTP, path: str) -> list[str | None]:
    return [r.range for r in http.requests_for(path) if r.method == "GET"]


def _files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file()] if folder.exists() else []


def _assert_nothing_kept(tmp_path: Path) -> None:
    """No destination, and nothing in the cache (no blob, no part file, no meta.json)."""
    assert not (tmp_path / "dest").exists()
    assert _files(tmp_path / "cache") == []


def _fetch(url: str, tmp_path: Path, **kwargs: Any) -> Any:
    return fetch(url, tmp_path / "dest", cache_dir=tmp_path / "cache", **{**FAST, **kwargs})


# --------------------------------------------------------------------------- headers, redirects


def _no_caller_header(headers: dict[str, str]) -> None:
    lowered = {k.lower(): v for k, v in headers.items()}
    for name in ("x-api-key", "cookie", "authorization"):
        assert name not in lowered
    assert lowered["user-agent"] == "h5forge"  # the downloader's own, not the caller's
    assert lowered["accept-encoding"] == "identity"


def test_cross_origin_redirect_strips_every_caller_header(
    http_server: LoopbackHTTP, other_http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    target = other_http_server.serve("/real.tar.gz", archive)
    http_server.redirect("/d.tar.gz", target)
    url = http_server.url("/d.tar.gz", userinfo="alice:pwsecret")

    result = _fetch(url, tmp_path, sha256=_sha(archive), storage_options={"headers": CALLER})

    assert result.sha256 == _sha(archive)
    [first] = http_server.requests
    assert first.headers["X-Api-Key"] == "k-secret"
    assert first.headers["User-Agent"] == "caller-ua"
    [second] = other_http_server.requests
    _no_caller_header(second.headers)


def test_same_origin_redirect_keeps_caller_headers(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    http_server.serve("/real.tar.gz", archive)
    http_server.redirect("/d.tar.gz", "/real.tar.gz", status=301)

    _fetch(http_server.url("/d.tar.gz"), tmp_path, storage_options={"headers": CALLER})

    for request in http_server.requests:
        assert request.headers["X-Api-Key"] == "k-secret"
        assert request.headers["Cookie"] == "session=c-secret"


def test_headers_stay_stripped_when_a_redirect_comes_back_to_the_origin(
    http_server: LoopbackHTTP, other_http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    http_server.serve("/real.tar.gz", archive)
    http_server.redirect("/d.tar.gz", other_http_server.url("/hop"))
    other_http_server.serve("/hop", b"")
    other_http_server.redirect("/hop", http_server.url("/real.tar.gz"), status=307)

    _fetch(
        http_server.url("/d.tar.gz", userinfo="alice:pw"),
        tmp_path,
        sha256=_sha(archive),
        storage_options={"headers": CALLER},
    )

    first, back = http_server.requests
    assert first.headers["X-Api-Key"] == "k-secret"
    assert "Authorization" in first.headers
    _no_caller_header(other_http_server.requests[0].headers)
    _no_caller_header(back.headers)
    assert back.path == "/real.tar.gz"


@pytest.mark.parametrize(
    "target",
    [
        "file:///etc/passwd",
        "ftp://127.0.0.1/d.tar.gz",
        "data:text/plain,hello",
        "gopher://127.0.0.1/x",
    ],
)
def test_redirect_out_of_http_is_refused(http_server: LoopbackHTTP, tmp_path: Path, target: str):
    http_server.serve("/d.tar.gz", b"")
    http_server.redirect("/d.tar.gz", target, times=5)

    with pytest.raises(DownloadRefusedError, match="refusing to follow a redirect") as info:
        _fetch(http_server.url("/d.tar.gz"), tmp_path)

    assert not isinstance(info.value, UnsafeArchiveError)  # nothing was extracted
    assert isinstance(info.value, OSError)  # a failed download, as every other one
    assert f"{http_server.url('/d.tar.gz')!r} -> {target!r}" in str(info.value)
    assert len(http_server.requests) == 1  # refused at once, not retried
    _assert_nothing_kept(tmp_path)


def test_redirect_loop_is_bounded(http_server: LoopbackHTTP, tmp_path: Path):
    http_server.serve("/a", b"")
    http_server.redirect("/a", "/b", times=100)
    http_server.redirect("/b", "/a", times=100)

    with pytest.raises(DownloadRefusedError, match=r"too many redirects \(> 5\)") as info:
        _fetch(http_server.url("/a"), tmp_path)

    # The 6th redirect is the one refused: /b (the 6th request) -> /a.
    assert f"{http_server.url('/b')!r} -> {http_server.url('/a')!r}" in str(info.value)
    assert len(http_server.requests) == 6  # the first request and 5 redirects
    _assert_nothing_kept(tmp_path)


def test_a_refused_redirect_names_the_hop_redacted_and_fails_the_task_once(
    prefect_harness: str, http_server: LoopbackHTTP, tmp_path: Path
) -> None:
    """Both ends of the refused hop are redacted (signed URLs carry secrets), and the fetch
    task fails at its first attempt: a retry would be redirected the same way."""
    from prefect import flow

    from h5forge.location import Location
    from h5forge.tasks.fetch import fetch_source
    from tests.fixtures.prefect import flow_run_task_runs

    http_server.serve("/d.tar.gz", b"")
    http_server.redirect("/d.tar.gz", "ftp://user:pw-secret@127.0.0.1/x.tgz", times=5)
    asked = http_server.url("/d.tar.gz") + "?X-Amz-Signature=sig-secret"

    @flow(name="refused-redirect-test")
    def fetch_once() -> None:
        fetch_source(Location(asked), dest=str(tmp_path / "dest"))

    state = fetch_once(return_state=True)
    assert state.is_failed()
    with pytest.raises(DownloadRefusedError) as info:
        state.result()
    text = str(info.value)
    assert "-> 'ftp://" in text
    assert http_server.url("/d.tar.gz") in text
    assert "secret" not in text
    [run] = flow_run_task_runs(state.state_details.flow_run_id)
    assert run.run_count == 1
    assert len(http_server.requests) == 1


@pytest.mark.parametrize(
    ("headers", "match"),
    [
        ({"Range": "bytes=0-9"}, "'Range' may not be set"),
        ({"host": "evil"}, "'host' may not be set"),
        ({"Accept-Encoding": "gzip"}, "'Accept-Encoding' may not be set"),
        ({"X-A": "v\r\nX-Injected: 1"}, "CR, LF"),
        ({"Bad Name": "v"}, "not a valid HTTP token"),
    ],
)
def test_bad_caller_headers_are_refused_before_any_request(
    http_server: LoopbackHTTP, tmp_path: Path, headers: dict[str, str], match: str
):
    url = http_server.serve("/d.tar.gz", b"x")
    with pytest.raises(ValueError, match=match):
        _fetch(url, tmp_path, storage_options={"headers": headers})
    assert http_server.requests == []


# --------------------------------------------------------------------------- max_bytes


@pytest.mark.parametrize("chunked", [False, True], ids=["until-close", "chunked"])
def test_endless_body_stops_at_max_bytes(http_server: LoopbackHTTP, tmp_path: Path, chunked: bool):
    url = http_server.serve("/endless.tar.gz", b"x")
    # 200, no Content-Length, bytes until we go (or endless chunks).
    http_server.endless("/endless.tar.gz", chunked=chunked)

    started = time.monotonic()
    with pytest.raises(UnsafeArchiveError) as info:
        _fetch(url, tmp_path, max_bytes=256_000)

    assert time.monotonic() - started < 10  # a hang would take the test's whole timeout
    message = str(info.value)
    assert "endless.tar.gz" in message
    assert "max_bytes=256000" in message
    assert "raise max_bytes" in message
    assert len(http_server.requests) == 1  # over the cap is final, not retried
    _assert_nothing_kept(tmp_path)


def test_endless_body_never_grows_the_file_past_max_bytes(
    http_server: LoopbackHTTP, tmp_path: Path
):
    url = http_server.serve("/endless", b"x")
    http_server.endless("/endless")
    out = tmp_path / "blob.part"
    limits = _http.Limits(
        retries=0,
        timeout=2.0,
        backoff=0.01,
        max_bytes=100_000,
        max_attempts=1,
        total_timeout=30.0,
        min_rate=0.0,
    )

    with pytest.raises(UnsafeArchiveError, match="sent more than 100000 bytes"):
        _http.download(url, out, lim=limits, progress=False)

    assert out.stat().st_size <= 100_000


@pytest.mark.parametrize("endless", [False, True])
def test_a_declared_size_over_max_bytes_is_refused_before_the_body(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes, endless: bool
):
    url = http_server.serve("/d.tar.gz", archive)
    if endless:
        http_server.endless("/d.tar.gz", length=10**12)

    with pytest.raises(UnsafeArchiveError, match=r"declares \d+ bytes.*max_bytes=50000"):
        _fetch(url, tmp_path, max_bytes=50_000)

    assert len(http_server.requests) == 1
    _assert_nothing_kept(tmp_path)


def test_resume_whose_range_ends_past_max_bytes_is_refused(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    # A 206 to the plain request, bytes 0-999: accepted (it starts at byte 0)...
    http_server.partial("/d.tar.gz", 0, 1000)
    # ...then the resume starts at the right offset but ends far past max_bytes.
    http_server.bad_range("/d.tar.gz", content_range=f"bytes 1000-{10**12}/{10**12 + 1}")

    with pytest.raises(UnsafeArchiveError, match=rf"declares {10**12 + 1} bytes \(Content-Ra"):
        _fetch(url, tmp_path, max_bytes=len(archive))

    assert _gets(http_server, "/d.tar.gz") == [None, "bytes=1000-"]
    _assert_nothing_kept(tmp_path)


def test_content_encoding_is_never_decoded(http_server: LoopbackHTTP, tmp_path: Path):
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MB of zeros in ~8 KB
    url = http_server.serve("/bomb.bin", bomb, headers={"Content-Encoding": "gzip"})
    limits = _http.Limits(
        retries=0,
        timeout=2.0,
        backoff=0.01,
        max_bytes=64_000,
        max_attempts=1,
        total_timeout=30.0,
        min_rate=0.0,
    )

    digest, size = _http.download(url, tmp_path / "out", lim=limits, progress=False)

    assert (digest, size) == (_sha(bomb), len(bomb))  # the wire bytes, as sent
    assert http_server.requests[0].headers["Accept-Encoding"] == "identity"


class _LyingMemory(MemoryFileSystem):
    """A store whose listing says every object is 10 bytes, whatever it serves."""

    protocol = "lyingmem"

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        return str(super()._strip_protocol(path.replace("lyingmem://", "memory://", 1)))

    def size(self, path: str) -> int:
        return 10


@pytest.mark.parametrize("protocol", ["memory", "lyingmem"])
def test_fsspec_object_over_max_bytes_is_refused(tmp_path: Path, protocol: str):
    fsspec.register_implementation("lyingmem", _LyingMemory, clobber=True)
    fs = fsspec.filesystem(protocol)
    path = f"/h5forge-untrusted-{tmp_path.name}/big.tar"
    fs.pipe_file(path, os.urandom(300_000))
    try:
        with pytest.raises(UnsafeArchiveError) as info:
            _fetch(f"{protocol}://{path}", tmp_path, max_bytes=100_000)
        if protocol == "memory":
            assert "is 300000 bytes, over max_bytes=100000" in str(info.value)
        else:  # the lie is seen with one byte past the listed size: the rest is never read
            assert "the store has more bytes in" in str(info.value)
            assert "than the 10 it lists" in str(info.value)
        _assert_nothing_kept(tmp_path)
    finally:
        fs.rm(path)


# --------------------------------------------------------------------------- bounded retries


def test_a_server_that_always_drops_ends_at_max_attempts(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.drop("/d.tar.gz", after=1000, times=100)  # progress every time, never done

    with pytest.raises(ConnectionError, match=r"max_attempts=5 attempts: received 5000 bytes"):
        _fetch(url, tmp_path, max_attempts=5)

    assert len(_gets(http_server, "/d.tar.gz")) == 5
    _assert_nothing_kept(tmp_path)


def test_content_length_larger_than_the_body_cannot_loop(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    # Declares twice the file: each fresh attempt gets the whole file, then "drops"; the
    # resume answers 416, which restarts. Re-fetching the same bytes is not progress.
    url = http_server.serve("/d.tar.gz", archive)
    http_server.lie_length("/d.tar.gz", length=2 * len(archive), times=100)

    with pytest.raises(ConnectionError, match="without progress") as info:
        _fetch(url, tmp_path, retries=2)

    assert "d.tar.gz" in str(info.value)
    resume = f"bytes={len(archive)}-"
    assert _gets(http_server, "/d.tar.gz") == [None, resume, None, resume]
    _assert_nothing_kept(tmp_path)


@pytest.mark.parametrize("times", [1, 100])
def test_content_length_smaller_than_the_body_is_detected(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes, times: int
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.lie_length("/d.tar.gz", length=len(archive) - 100, times=times)

    if times == 1:  # once: the short file is thrown away and a fresh request completes
        result = _fetch(url, tmp_path, sha256=_sha(archive))
        assert result.sha256 == _sha(archive)
        assert _gets(http_server, "/d.tar.gz") == [None, None]
        return
    with pytest.raises(ConnectionError, match="more bytes than the"):
        _fetch(url, tmp_path, retries=2)
    assert len(_gets(http_server, "/d.tar.gz")) == 3
    _assert_nothing_kept(tmp_path)


def test_wrong_content_range_and_drops_cannot_loop(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    for _ in range(20):  # drop at 1000, resume answered from byte 0, again and again
        http_server.drop("/d.tar.gz", after=1000)
        http_server.bad_range("/d.tar.gz")

    with pytest.raises(ConnectionError, match="without progress.*bad resume answer"):
        _fetch(url, tmp_path, retries=2)

    assert _gets(http_server, "/d.tar.gz") == [None, "bytes=1000-"] * 2
    _assert_nothing_kept(tmp_path)


@pytest.mark.parametrize(("start", "resumed"), [(0, ["bytes=1000-"]), (500, [None])])
def test_206_to_a_request_without_range(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes, start: int, resumed: list[str | None]
):
    # Starting at 0 the bytes are where they belong: kept, and the rest is asked for.
    # Starting anywhere else: refused, and a fresh request follows.
    url = http_server.serve("/d.tar.gz", archive)
    http_server.partial("/d.tar.gz", start, 1000)

    result = _fetch(url, tmp_path, sha256=_sha(archive))

    assert result.sha256 == _sha(archive)
    assert _gets(http_server, "/d.tar.gz") == [None, *resumed]


def test_200_to_a_range_request_restarts_from_zero(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.drop("/d.tar.gz", after=5000)
    http_server.ignore_range("/d.tar.gz")

    result = _fetch(url, tmp_path, sha256=_sha(archive), max_attempts=2)

    assert result.sha256 == _sha(archive)
    assert _gets(http_server, "/d.tar.gz") == [None, "bytes=5000-"]


def test_200_restarts_that_drop_count_as_no_progress(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.drop("/d.tar.gz", after=5000)
    # Every resume is answered from byte 0 and dropped before the 5,000 bytes once kept.
    http_server.drop("/d.tar.gz", after=3000, whole=True, times=100)

    with pytest.raises(ConnectionError, match="2 attempts in a row without progress"):
        _fetch(url, tmp_path, retries=1)

    assert _gets(http_server, "/d.tar.gz") == [None, "bytes=5000-", "bytes=3000-"]
    _assert_nothing_kept(tmp_path)


def test_total_timeout_ends_a_download_that_keeps_progressing(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.stall("/d.tar.gz", seconds=60, after=100, times=1000)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"total_timeout=1\.5s: received \d+ bytes in"):
        _fetch(url, tmp_path, timeout=0.2, total_timeout=1.5, min_rate=0)
    assert time.monotonic() - started < 6  # 1.5 s and one read's timeout, with margin
    _assert_nothing_kept(tmp_path)


# --------------------------------------------------------------------------- stalls


def test_a_trickle_fails_the_minimum_rate(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.trickle("/d.tar.gz", seconds=0.3, times=10)  # 1 byte every 0.3 s

    started = time.monotonic()
    with pytest.raises(TimeoutError) as info:
        _fetch(url, tmp_path, timeout=0.5, retries=1, min_rate=1000)

    assert time.monotonic() - started < 8  # two attempts of ~0.6 s each, with margin
    message = str(info.value)
    assert "d.tar.gz" in message
    assert "too slow" in message
    assert "min_rate=1000" in message
    assert "received " in message
    assert " bytes in " in message
    assert len(_gets(http_server, "/d.tar.gz")) == 2  # the slow attempts were not progress
    _assert_nothing_kept(tmp_path)


@pytest.mark.parametrize("how", ["trickle", "continues"])
def test_a_response_head_that_never_ends_times_out(
    http_server: LoopbackHTTP, tmp_path: Path, how: str
):
    url = http_server.serve("/d.tar.gz", b"x" * 100)
    if how == "trickle":
        http_server.trickle("/d.tar.gz", seconds=0.05, head=True, times=10)  # ~10 s of head
    else:
        http_server.continues("/d.tar.gz", times=10)  # "100 Continue" forever

    started = time.monotonic()
    with pytest.raises(TimeoutError, match="no complete response head within 0.5s"):
        _fetch(url, tmp_path, timeout=0.5, retries=0)

    assert time.monotonic() - started < 5
    _assert_nothing_kept(tmp_path)


def test_a_failed_download_is_downloaded_again(
    http_server: LoopbackHTTP, tmp_path: Path, archive: bytes
):
    url = http_server.serve("/d.tar.gz", archive)
    http_server.drop("/d.tar.gz", after=50_000, times=3)

    with pytest.raises(ConnectionError):
        _fetch(url, tmp_path, sha256=_sha(archive), max_attempts=2)
    result = _fetch(url, tmp_path, sha256=_sha(archive))

    assert not result.cached  # the partial bytes were never taken as a complete download
    assert result.sha256 == _sha(archive)


def test_nothing_listening_fails_clearly(tmp_path: Path):
    with socket.socket() as probe:  # a free port, closed again: connecting is refused
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/d.tar.gz"

    with pytest.raises(ConnectionError, match="ConnectionRefusedError: Connection refused") as info:
        _fetch(url, tmp_path, retries=1)

    assert url in str(info.value)
    assert "[Errno" not in str(info.value)
    _assert_nothing_kept(tmp_path)


def test_the_part_file_is_never_written_through_a_planted_link(
    http_server: LoopbackHTTP, tmp_path: Path
):
    url = http_server.serve("/d.bin", b"payload")
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "blob.part").symlink_to(victim)
    limits = _http.Limits(
        retries=0,
        timeout=2.0,
        backoff=0.01,
        max_bytes=1000,
        max_attempts=1,
        total_timeout=30.0,
        min_rate=0.0,
    )

    with pytest.raises(FileExistsError, match="refusing to write through it"):
        _http.download(url, tmp_path / "blob.part", lim=limits, progress=False)

    assert victim.read_bytes() == b"keep me"
    assert http_server.requests == []  # refused before anything was asked for
