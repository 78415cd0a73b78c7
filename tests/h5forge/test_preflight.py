"""The checks made before any work on a source (``h5forge.preflight``): a URL of a protocol
fsspec does not know, with credentials in it, or naming a host that cannot exist, is refused at
once; what only the fetch can find out (a bucket's contents, a slow resolver) is left to it."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from h5forge.preflight import check_source, check_url


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("ftp://host.invalid/x", "source ftp://host.invalid/x: host 'host.invalid' does not exist"),
        ("https://no-such.invalid/d.tgz", "host 'no-such.invalid' does not exist"),
        ("nope://bucket/x", "uses protocol 'nope', which fsspec does not know"),
        ("https://user:pw@example.org/d.tgz", "embeds credentials"),
        ("", "source is empty"),
    ],
)
def test_a_source_that_cannot_be_fetched_is_refused(source: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_source(source)


@pytest.mark.parametrize(
    "source",
    [
        "https://127.0.0.1:9/data.tar.gz",  # an address: nothing to look up
        "http://localhost:9/data.tar.gz",
        "s3://bucket-that-may-not-exist/prefix/",  # a bucket, not a host: the fetch's question
        "memory://x/y",
        "zip::https://127.0.0.1:9/a.zip",
    ],
)
def test_what_only_the_fetch_can_tell_is_left_to_it(source: str) -> None:
    check_source(source)


def test_a_local_source_must_exist(tmp_path: Path) -> None:
    check_source(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist: check the path"):
        check_source(str(tmp_path / "absent"))


def test_a_destination_must_be_writable_by_fsspec() -> None:
    with pytest.raises(ValueError, match="read-only in fsspec"):
        check_url("https://example.org/x.h5", what="destination", writable=True)


# --------------------------------------------------------------------------- inside the source


@pytest.mark.parametrize(
    ("source", "path", "message"),
    [
        (
            "{tmp}/src",
            "{tmp}/src/out.h5",
            "destination {tmp}/src/out.h5 is inside the source folder {tmp}/src: what the run "
            "writes there would become part of the source",
        ),
        ("{tmp}/src", "{tmp}/src/a/b/../out.h5", "is inside the source folder {tmp}/src"),
        ("{tmp}/src/", "{tmp}/src", "destination {tmp}/src is the source folder {tmp}/src/ itself"),
        ("{tmp}/src", "{tmp}/link/out.h5", "is inside the source folder"),  # link/ -> src/
        ("{tmp}/link", "{tmp}/src/out.h5", "is inside the source folder {tmp}/link"),
        ("{tmp}/src", "{tmp}/../{name}/src/out.h5", "is inside the source folder"),
        ("{tmp}/src", "~/{home}/src/out.h5", "is inside the source folder"),
        ("{tmp}/new", "{tmp}/new/out.h5", "is inside the source {tmp}/new:"),  # not there yet
        # fsspec's own spellings of a local path: file://, file:, local://, in any case, chained
        ("file://{tmp}/src", "{tmp}/src/out.h5", "is inside the source folder file://{tmp}/src"),
        ("{tmp}/src", "file://{tmp}/src/out.h5", "is inside the source folder {tmp}/src"),
        ("file:{tmp}/src", "{tmp}/src/out.h5", "is inside the source folder"),
        ("local://{tmp}/src", "{tmp}/src/out.h5", "is inside the source folder"),
        ("FILE://{tmp}/src", "{tmp}/src/out.h5", "is inside the source folder"),
        ("simplecache::file://{tmp}/src", "{tmp}/src/o.h5", "is inside the source folder"),
        (
            "{tmp}/d.tar.gz",
            "file://{tmp}/d.tar.gz",
            "destination file://{tmp}/d.tar.gz is the source archive {tmp}/d.tar.gz itself: "
            "the run would replace what it reads",
        ),
        ("{tmp}/d.tar.gz", "{tmp}/hard.h5", "is the source archive {tmp}/d.tar.gz itself"),
        # object stores: bucket, prefix, normalised and as written, aliases of one store
        (
            "s3://b/data",
            "s3://b/data/out.h5",
            "s3://b/data/out.h5 is inside the source s3://b/data",
        ),
        ("s3://b/data/", "s3://b/data/x/../out.h5", "is inside the source s3://b/data/"),
        ("s3://b/data", "s3://b/data//out.h5", "is inside the source s3://b/data"),
        ("s3://b/data", "s3://b/./data/out.h5", "is inside the source s3://b/data"),
        ("s3://b/data.h5", "s3://b/data.h5", "is the source s3://b/data.h5 itself"),
        ("s3://b", "s3://b/o.h5", "is inside the source s3://b:"),
        ("S3://B/data", "s3://b/data/o.h5", "is inside the source S3://B/data"),
        ("s3a://b/data", "s3://b/data/o.h5", "is inside the source s3a://b/data"),
        ("gcs://b/data", "gs://b/data/o.h5", "is inside the source gcs://b/data"),
        ("s3://b/data?versionId=1", "s3://b/data/o.h5", "is inside the source"),
        ("simplecache::s3://b/data", "s3://b/data/o.h5", "is inside the source simplecache::"),
        ("s3://b/data", "simplecache::s3://b/data/o.h5", "is inside the source s3://b/data"),
        ("gs://b", "gs://b/o.h5", "gs://b/o.h5 is inside the source gs://b"),
        ("s3:///b/data", "s3://b/data/o.h5", "is inside the source s3:///b/data"),
        ("memory://x/y", "memory://x/y/o.h5", "is inside the source memory://x/y"),
        ("memory://x/y", "memory:///x/y/o.h5", "is inside the source memory://x/y"),
    ],
)
def test_a_path_the_run_writes_inside_the_source_is_refused(
    tmp_path: Path, source: str, path: str, message: str
) -> None:
    from h5forge.preflight import check_not_in_source

    (tmp_path / "src").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "src")
    (tmp_path / "d.tar.gz").write_bytes(b"archive")
    (tmp_path / "hard.h5").hardlink_to(tmp_path / "d.tar.gz")  # one file, two names
    values = {
        "tmp": tmp_path,
        "name": tmp_path.name,
        "home": os.path.relpath(tmp_path, Path.home()),
    }
    source, path = source.format(**values), path.format(**values)
    with pytest.raises(ValueError, match=re.escape(message.format(**values))) as info:
        check_not_in_source(source, path)
    assert "choose a destination outside" in str(info.value)  # the fix


def test_the_caller_names_what_it_writes_and_the_fix(tmp_path: Path) -> None:
    from h5forge.preflight import check_not_in_source

    with pytest.raises(ValueError, match="cache folder .* is inside the source folder") as info:
        check_not_in_source(
            str(tmp_path), str(tmp_path / "cache"), what="cache folder", fix="pass --cache-dir"
        )
    assert str(info.value).endswith("; pass --cache-dir")


@pytest.mark.parametrize(
    ("source", "path"),
    [
        ("{tmp}/src", "{tmp}/src.h5"),
        ("{tmp}/src", "{tmp}/srcs/out.h5"),  # a name that only starts alike
        ("{tmp}/src/out.h5", "{tmp}/src"),  # the source inside the path: not this rule
        ("{tmp}/d.tar.gz", "{tmp}/d.h5"),
        ("s3://b/data", "s3://b/database.h5"),
        ("s3://b/data", "s3://b/data.h5"),
        ("s3://b/data", "s3://other/data/out.h5"),
        ("s3://b/data", "s3://b/DATA/out.h5"),  # a key has case
        ("s3://b/data", "s3://b"),  # the bucket holds the source: not this rule
        ("s3://b/data", "gs://b/data/out.h5"),
        ("https://host/data", "s3://host/data/out.h5"),
        ("{tmp}/src", "s3://b{tmp}/src/out.h5"),  # a local path and a URL: never one place
        ("s3://b{tmp}/src", "{tmp}/src/out.h5"),
        ("", "{tmp}/out.h5"),
    ],
)
def test_a_path_outside_the_source_passes(tmp_path: Path, source: str, path: str) -> None:
    from h5forge.preflight import check_not_in_source

    (tmp_path / "src").mkdir()
    (tmp_path / "d.tar.gz").write_bytes(b"archive")
    check_not_in_source(source.format(tmp=tmp_path), path.format(tmp=tmp_path))


def test_a_secret_in_a_url_is_never_shown() -> None:
    from h5forge.preflight import check_not_in_source

    with pytest.raises(ValueError, match="is inside the source") as info:
        check_not_in_source(
            "https://h/data?X-Amz-Signature=sig-secret", "https://h/data/o.h5?token=t-secret"
        )
    assert "secret" not in str(info.value)
