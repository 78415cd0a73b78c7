"""Fetch a dataset from a folder, an archive or a prefix at any URL into a local directory.

``fetch`` is the one entry point. Local folders are used in place. Archives (local, ``http(s)``
or any fsspec URL) are downloaded into a content-addressed cache, checked against ``sha256``
and extracted safely. Object-store prefixes (``s3://``, ``gs://``, ``memory://`` ...) are copied
with bounded concurrency. Every location is a :class:`~h5forge.location.Location` except
``http(s)``, which uses our own resumable client (see ``h5forge.fetch.http`` for why).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h5forge.fetch.body import Limits
from h5forge.fetch.cache import cached_download, check_digest
from h5forge.fetch.connect import check_headers
from h5forge.fetch.dest import already_extracted, check_dest, single_root, write_marker
from h5forge.fetch.extract import detect_archive, safe_extract
from h5forge.fetch.http import download
from h5forge.fetch.objects import copy_prefix, stream_object
from h5forge.fetch.staging import commit, discard, exclusive
from h5forge.location import Location
from h5forge.redact import redact_url

__all__ = ["FetchResult", "fetch"]

log = logging.getLogger(__name__)

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")


@dataclass(frozen=True)
class FetchResult:
    """Where a fetched dataset lies.

    Attributes:
        root: local directory holding the dataset (ImageFolder root or sample listing dir).
        source_url: the URL fetched, redacted (no userinfo, no signature tokens).
        sha256: of the archive when the source is one file; ``""`` for a directory.
        cached: the archive came from the content-addressed cache, nothing was downloaded.
    """

    root: str
    source_url: str
    sha256: str
    cached: bool


def fetch(
    url: str | os.PathLike[str] | Location,
    dest: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    retries: int = 5,
    timeout: float = 60.0,
    max_members: int = 1_000_000,
    max_bytes: int = 64 * 2**30,
    progress: bool = False,
    backoff: float = 0.5,
    workers: int = 8,
    max_attempts: int = 100,
    total_timeout: float = 24 * 3600.0,
    min_rate: float = 1024.0,
) -> FetchResult:
    """Make the dataset at ``url`` available as a local directory.

    Args:
        url: local path, URL or :class:`~h5forge.location.Location` of a folder/prefix or
            of one archive (``.tar``, ``.tar.gz``, ``.tgz``, ``.tar.bz2``, ``.tar.xz``,
            ``.zip``; detected by content).
        dest: local folder to create for downloaded or extracted data. It must be new, empty,
            or made by an earlier ``fetch`` (then it is replaced). Unused for local folders,
            which are used in place.
        sha256: expected hex digest of the archive; a mismatch raises and keeps nothing.
        storage_options: passed to fsspec with a URL string (a ``Location`` carries its
            own): ``s3://`` keys, endpoint ...; for ``http(s)``
            only ``headers`` is used. Those headers go only to the URL's own origin (scheme,
            host, port): after a redirect to another origin none of them is sent, not even
            when a later redirect comes back. Headers the downloader sets itself (``Range``,
            ``Host``, ``Accept-Encoding``, ``Connection`` ...) may not be given.
        cache_dir: content-addressed download cache; default ``.h5forge-cache`` next to dest.
            An archive is served from it when the same URL and ``sha256`` were fetched before.
        retries: HTTP attempts in a row that may fail without progress before giving up
            (default 5). Progress means keeping bytes past the most ever kept, so a server
            that restarts, drops or lies the same way every time uses the count up.
        timeout: seconds of network silence (connect or read) before an attempt fails; also
            the bound on receiving a response's head (default 60).
        max_members: most archive members / prefix objects accepted.
        max_bytes: most bytes downloaded (counted as they arrive, whatever the server
            declares, resumes included), and most bytes extracted or copied (default 64 GiB).
        progress: draw a progress bar on stderr.
        backoff: first HTTP retry delay in seconds; doubles per failure, with jitter.
        workers: concurrent object copies for a prefix.
        max_attempts: most HTTP attempts in all, with or without progress (default 100).
        total_timeout: seconds the whole HTTP download may take, retries and their waits
            included (default 24 h).
        min_rate: slowest accepted HTTP body rate in bytes/s, averaged over each ``timeout``
            seconds; a slower attempt fails and counts as one without progress, so a server
            trickling bytes ends with an error (default 1024; 0 disables).

    Returns:
        A :class:`FetchResult`; ``root`` is the single top folder of an archive if it has one.

    Raises:
        ChecksumError: the archive's sha256 differs from ``sha256`` (both digests named).
        UnsafeArchiveError: an archive member or prefix object is unsafe or over a cap; the
            download is over ``max_bytes``; a bucket object holds more or fewer bytes than
            its listing says.
        StoreError: a bucket kept failing a read after its client's retries, or sent an
            answer too slowly (:meth:`~h5forge.location.Location.read_timeout`).
        DownloadRefusedError: an HTTP redirect the downloader does not follow (out of
            http(s), or more than :data:`~h5forge.fetch.connect.MAX_REDIRECTS`), or an HTTP
            answer retrying cannot change; the message names the URL (and the hop).
        TimeoutError, ConnectionError: an HTTP download reached ``retries``, ``max_attempts``
            or ``total_timeout`` (the message names the bound, the URL, the bytes received and
            the time spent).
        FileNotFoundError: nothing exists at ``url``.
        FileExistsError: ``dest`` holds data that ``fetch`` did not make.
        ValueError: an argument is invalid.
    """
    if isinstance(url, Location):  # it carries its own options (refused beside it)
        storage_options = Location.of(url, storage_options).options
        url = url.url
    url = os.fspath(url)
    expected = _validate(url, sha256, retries, timeout, max_members, max_bytes, workers)
    _validate_http(max_attempts, total_timeout, min_rate)
    options = dict(storage_options or {})
    shown = redact_url(url)
    target = Path(os.path.abspath(dest))
    cache = Path(os.path.abspath(cache_dir)) if cache_dir else target.parent / ".h5forge-cache"
    log.info("fetching %s", shown)
    caps = (max_members, max_bytes)
    if url.split("://", 1)[0].lower() in ("http", "https"):
        headers = check_headers(dict(options.get("headers") or {}))
        limits = Limits(
            retries=retries,
            timeout=timeout,
            backoff=backoff,
            max_bytes=max_bytes,
            max_attempts=max_attempts,
            total_timeout=total_timeout,
            min_rate=min_rate,
        )

        def get(part: Path) -> tuple[str, int]:
            return download(url, part, lim=limits, progress=progress, headers=headers)

        blob, digest, hit = cached_download(cache, url, expected, shown, get)
        return _unpack(blob, target, shown, digest, hit, caps)
    where = Location.of(url, options)
    path = where.path
    # s3fs's isdir lists the prefix (pages of it): bounded as the listing of max_members is
    if where.ask("what it is", "isdir", path, listed=max_members):
        if expected:
            raise ValueError(f"sha256 was given but {shown!r} is a folder; pass sha256=None")
        if where.is_local:
            return FetchResult(
                root=os.path.abspath(path), source_url=shown, sha256="", cached=False
            )
        copy_prefix(where, target, shown, max_members, max_bytes, workers, progress)
        return FetchResult(root=single_root(target), source_url=shown, sha256="", cached=False)
    if not where.ask("what it is", "isfile", path):
        raise FileNotFoundError(f"nothing at {shown!r}: no such folder, prefix or archive")
    if where.is_local:  # already local: hash and extract it where it is
        digest = where.sha256()
        check_digest(expected, digest, shown)
        return _unpack(Path(path), target, shown, digest, False, caps)
    blob, digest, hit = cached_download(
        cache,
        url,
        expected,
        shown,
        lambda part: stream_object(where, part, shown, progress, max_bytes),
    )
    return _unpack(blob, target, shown, digest, hit, caps)


def _validate(
    url: str,
    sha256: str | None,
    retries: int,
    timeout: float,
    max_members: int,
    max_bytes: int,
    workers: int,
) -> str:
    if not url:
        raise ValueError("url is empty: pass a local path or a URL such as s3://bucket/data.tar")
    if sha256 is not None and not _SHA256.fullmatch(sha256):
        raise ValueError(f"sha256={sha256!r} is not 64 hex characters; pass the hex digest")
    for name, value, low in (
        ("retries", retries, 0),
        ("max_members", max_members, 1),
        ("max_bytes", max_bytes, 1),
        ("workers", workers, 1),
    ):
        if value < low:
            raise ValueError(f"{name}={value} is out of range: must be >= {low}")
    if not timeout > 0:
        raise ValueError(f"timeout={timeout} is out of range: must be > 0 seconds")
    return (sha256 or "").lower()


def _validate_http(max_attempts: int, total_timeout: float, min_rate: float) -> None:
    if max_attempts < 1:
        raise ValueError(f"max_attempts={max_attempts} is out of range: must be >= 1")
    if not total_timeout > 0:
        raise ValueError(f"total_timeout={total_timeout} is out of range: must be > 0 seconds")
    if not min_rate >= 0:
        raise ValueError(f"min_rate={min_rate} is out of range: must be >= 0 bytes/s")


def _unpack(
    archive: Path, target: Path, shown: str, digest: str, cached: bool, caps: tuple[int, int]
) -> FetchResult:
    if detect_archive(archive) is None:
        raise ValueError(
            f"{shown!r} is a single file but not an archive (.tar, .tar.gz/.tgz, .tar.bz2, "
            ".tar.xz, .zip); point fetch at an archive or a folder"
        )
    with exclusive(target):  # writers of ``target`` take turns; leftovers of dead ones go
        check_dest(target)
        if already_extracted(target, digest):
            log.info("%s already holds the extracted archive (sha256 %s)", target, digest)
            return FetchResult(
                root=single_root(target), source_url=shown, sha256=digest, cached=cached
            )
        incoming = target.with_name(f"{target.name}.incoming-{secrets.token_hex(6)}")
        try:
            safe_extract(archive, incoming, max_members=caps[0], max_bytes=caps[1])
            write_marker(incoming, shown, digest)
            commit(incoming, target, replace=True)
        except BaseException:
            discard(incoming)
            raise
    return FetchResult(root=single_root(target), source_url=shown, sha256=digest, cached=cached)
