"""The checks made before any work on a source (``h5forge.preflight``): a URL of a protocol
fsspec does not know, with credentials in it, or naming a host that cannot exist, is refused at
once; what only the fetch can find out (a bucket's contents, a slow resolver) is left to it."""

from __future__ import annotations

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
