"""source_fingerprint: a local folder, a bucket prefix, one object, a pinned source — no reads."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import fsspec
import pytest

from h5forge.fetch.fingerprint import files_digest, source_fingerprint
from h5forge.location import Location


def _tree(root: Path) -> Path:
    for rel in ("a/1.jpg", "a/2.jpg", "b/3.png"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(rel.encode() * 10)
    return root


def test_a_folder_fingerprint_changes_with_a_touch_an_addition_and_a_removal(
    tmp_path: Path,
) -> None:
    root = _tree(tmp_path / "src")
    first = source_fingerprint(Location(str(root)))
    assert first is not None
    assert first.kind == "folder"
    assert set(first.files) == {"a/1.jpg", "a/2.jpg", "b/3.png"}
    assert first.digest == files_digest(first.files)
    again = source_fingerprint(Location(str(root)))
    assert again is not None
    assert again.digest == first.digest
    st = os.stat(root / "a/1.jpg")
    os.utime(root / "a/1.jpg", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    touched = source_fingerprint(Location(str(root)))
    assert touched is not None
    assert touched.digest != first.digest
    (root / "b/4.png").write_bytes(b"new")
    added = source_fingerprint(Location(str(root)))
    assert added is not None
    assert "b/4.png" in added.files
    assert added.digest != touched.digest
    (root / "a/2.jpg").unlink()
    removed = source_fingerprint(Location(str(root)))
    assert removed is not None
    assert "a/2.jpg" not in removed.files


def test_a_folder_over_the_file_bound_has_no_fingerprint(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    assert source_fingerprint(Location(str(root)), max_files=3) is not None
    assert source_fingerprint(Location(str(root)), max_files=2) is None


def test_a_link_loop_is_walked_once(tmp_path: Path) -> None:
    root = _tree(tmp_path / "src")
    (root / "a" / "loop").symlink_to(root)
    fp = source_fingerprint(Location(str(root)))
    assert fp is not None
    assert set(fp.files) == {"a/1.jpg", "a/2.jpg", "b/3.png"}


def test_pinned_http_and_missing_sources(tmp_path: Path) -> None:
    sha = "ab" * 32
    pinned = source_fingerprint(Location("https://example.org/data.tar.gz"), sha256=sha.upper())
    assert pinned is not None
    assert pinned.kind == "pinned"
    assert pinned.files == {"": f"sha256:{sha}"}
    with pytest.raises(ValueError, match="64 hexadecimal"):
        source_fingerprint(Location(str(tmp_path)), sha256="12")
    with pytest.raises(FileNotFoundError, match="nothing at"):
        source_fingerprint(Location(str(tmp_path / "absent")))
    archive = tmp_path / "x.tar"
    archive.write_bytes(b"x" * 10)
    one = source_fingerprint(Location(str(archive)))
    assert one is not None
    assert one.kind == "object"
    assert one.files[""].startswith("10:")


def test_a_prefix_uses_the_listing_etags_and_reads_no_object(
    s3_bucket: str, s3_storage_options: dict[str, Any], s3_requests: Any
) -> None:
    url = f"s3://{s3_bucket}/images"
    fs, path = fsspec.core.url_to_fs(url, **s3_storage_options)
    for rel in ("a/1.jpg", "b/2.jpg"):
        fs.pipe_file(f"{path}/{rel}", rel.encode())
    s3_requests.clear()
    first = source_fingerprint(Location(url + "/", s3_storage_options))
    assert first is not None
    assert first.kind == "prefix"
    assert set(first.files) == {"a/1.jpg", "b/2.jpg"}
    assert not [r for r in s3_requests() if r.method == "GET" and "list-type" not in r.path]
    fs.pipe_file(f"{path}/a/1.jpg", b"other bytes")
    changed = source_fingerprint(Location(url, s3_storage_options))
    assert changed is not None
    assert changed.files["a/1.jpg"] != first.files["a/1.jpg"]
    assert changed.files["b/2.jpg"] == first.files["b/2.jpg"]
    one = source_fingerprint(Location(f"{url}/b/2.jpg", s3_storage_options))
    assert one is not None
    assert one.kind == "object"
    assert one.files[""] == first.files["b/2.jpg"]


def test_an_http_source_is_its_size_etag_and_last_modified_from_one_ranged_get(
    http_server: Any,
) -> None:
    data = b"archive bytes " * 1000
    url = http_server.serve("/set.tar", data, {"Last-Modified": "Tue, 01 Dec 2026 10:00:00 GMT"})
    first = source_fingerprint(Location(url, {"headers": {"X-Token": "t"}}))
    assert first is not None
    assert first.kind == "object"
    size, etag, modified = first.files[""].split(":", 2)
    assert (int(size), modified) == (len(data), "Tue, 01 Dec 2026 10:00:00 GMT")
    assert etag.strip('"')
    (request,) = http_server.requests_for("/set.tar")
    assert (request.method, request.range) == ("GET", "bytes=0-0")  # the body is not fetched
    assert request.headers["X-Token"] == "t"  # the caller's headers, as fetch sends them
    assert source_fingerprint(Location(url)) == first  # stable while the server's answer is

    http_server.serve("/set.tar", data, {"Last-Modified": "Wed, 02 Dec 2026 10:00:00 GMT"})
    touched = source_fingerprint(Location(url))
    assert touched is not None
    assert touched.digest != first.digest
    http_server.serve("/set.tar", data[::-1], {"Last-Modified": "Tue, 01 Dec 2026 10:00:00 GMT"})
    replaced = source_fingerprint(Location(url))  # same size and date: the ETag tells them apart
    assert replaced is not None
    assert replaced.digest not in (first.digest, touched.digest)

    huge = http_server.serve("/huge.tar", data, {"Last-Modified": "x" * 5000})
    bounded = source_fingerprint(Location(huge))
    assert bounded is not None
    assert bounded.files[""].startswith("sha256:")
    assert len(bounded.files[""]) == 7 + 64


def test_an_http_source_that_is_absent_or_refused(http_server: Any) -> None:
    with pytest.raises(FileNotFoundError, match="HTTP 404"):
        source_fingerprint(Location(http_server.url("/absent.tar")))
    url = http_server.serve("/set.tar", b"x" * 100)
    http_server.fail("/set.tar", status=503)
    assert source_fingerprint(Location(url)) is None  # no mark to compare: the build builds
    with pytest.raises(ValueError, match="may not be set"):
        source_fingerprint(Location(url, {"headers": {"Range": "bytes=0-"}}))
