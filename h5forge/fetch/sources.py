"""Fetch a dataset from a folder, an archive or a prefix at any URL into a local directory.

``fetch`` is the one entry point. Local folders are used in place. Archives (local, ``http(s)``
or any fsspec URL) are downloaded into a content-addressed cache, checked against ``sha256``
and extracted safely. Object-store prefixes (``s3://``, ``gs://``, ``memory://`` ...) are copied
with bounded concurrency. Every location goes through ``fsspec.core.url_to_fs`` except
``http(s)``, which uses our own resumable client (see ``h5forge.fetch.http`` for why).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import re
import secrets
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from h5forge.errors import UnsafeArchiveError
from h5forge.fetch import http as _http
from h5forge.fetch.cache import cached_download, check_digest
from h5forge.fetch.extract import detect_archive, safe_extract
from h5forge.fetch.staging import commit, discard, exclusive, new_staging
from h5forge.hashing import sha256_file
from h5forge.paths import split_member_name
from h5forge.progress import progress_bar
from h5forge.redact import redact_url

__all__ = ["MARKER", "FetchResult", "fetch"]

log = logging.getLogger(__name__)

MARKER = ".h5forge-fetch.json"  # written in dest; lets a later fetch replace what it made
_SHA256 = re.compile(r"[0-9a-fA-F]{64}")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class FetchResult:
    """Where a fetched dataset lies.

    Attributes:
        root: local directory holding the dataset (ImageFolder root or manifest dir).
        source_url: the URL fetched, redacted (no userinfo, no signature tokens).
        sha256: of the archive when the source is one file; ``""`` for a directory.
        cached: the archive came from the content-addressed cache, nothing was downloaded.
    """

    root: str
    source_url: str
    sha256: str
    cached: bool


def fetch(
    url: str | os.PathLike[str],
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
        url: local path or URL of a folder/prefix or of one archive (``.tar``, ``.tar.gz``,
            ``.tgz``, ``.tar.bz2``, ``.tar.xz``, ``.zip``; detected by content).
        dest: local folder to create for downloaded or extracted data. It must be new, empty,
            or made by an earlier ``fetch`` (then it is replaced). Unused for local folders,
            which are used in place.
        sha256: expected hex digest of the archive; a mismatch raises and keeps nothing.
        storage_options: passed to fsspec (``s3://`` keys, endpoint ...); for ``http(s)``
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
            download is over ``max_bytes``; an HTTP redirect leads to a non-http(s) URL.
        TimeoutError, ConnectionError: an HTTP download reached ``retries``, ``max_attempts``
            or ``total_timeout`` (the message names the bound, the URL, the bytes received and
            the time spent).
        FileNotFoundError: nothing exists at ``url``.
        FileExistsError: ``dest`` holds data that ``fetch`` did not make.
        ValueError: an argument is invalid.
    """
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
        headers = _http.check_headers(dict(options.get("headers") or {}))
        limits = _http.Limits(
            retries=retries,
            timeout=timeout,
            backoff=backoff,
            max_bytes=max_bytes,
            max_attempts=max_attempts,
            total_timeout=total_timeout,
            min_rate=min_rate,
        )

        def download(part: Path) -> tuple[str, int]:
            return _http.download(url, part, lim=limits, progress=progress, headers=headers)

        blob, digest, hit = cached_download(cache, url, expected, shown, download)
        return _unpack(blob, target, shown, digest, hit, caps)
    fs, path = fsspec.core.url_to_fs(url, **options)
    if fs.isdir(path):
        if expected:
            raise ValueError(f"sha256 was given but {shown!r} is a folder; pass sha256=None")
        if isinstance(fs, LocalFileSystem):
            return FetchResult(
                root=os.path.abspath(path), source_url=shown, sha256="", cached=False
            )
        _copy_prefix(fs, path, target, shown, max_members, max_bytes, workers, progress)
        return FetchResult(root=_single_root(target), source_url=shown, sha256="", cached=False)
    if not fs.isfile(path):
        raise FileNotFoundError(f"nothing at {shown!r}: no such folder, prefix or archive")
    if isinstance(fs, LocalFileSystem):  # already local: hash and extract it where it is
        digest = sha256_file(path)
        check_digest(expected, digest, shown)
        return _unpack(Path(path), target, shown, digest, False, caps)
    blob, digest, hit = cached_download(
        cache,
        url,
        expected,
        shown,
        lambda part: _stream_object(fs, path, part, shown, progress, max_bytes),
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


def _stream_object(
    fs: Any, path: str, part: Path, shown: str, progress: bool, max_bytes: int
) -> tuple[str, int]:
    """Copy one remote object to the new file ``part`` in large sequential reads, hashing.

    At most ``max_bytes`` are read whatever the listed size says (a store can list one size
    and serve another); ``part`` is created exclusively, never through a link.
    """
    listed = fs.size(path)
    if listed is not None and listed > max_bytes:
        raise _http.over_max_bytes(shown, f"is {listed} bytes", max_bytes)
    digest, size = hashlib.sha256(), 0
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    with (
        progress_bar(progress, f"download {shown.rsplit('/', 1)[-1]}", listed) as bar,
        fs.open(path, "rb", block_size=_CHUNK) as src,
        os.fdopen(os.open(part, flags, 0o666), "wb") as out,
    ):
        while block := src.read(min(_CHUNK, max_bytes + 1 - size)):
            if size + len(block) > max_bytes:
                raise _http.over_max_bytes(shown, f"sent more than {max_bytes} bytes", max_bytes)
            out.write(block)
            digest.update(block)
            size += len(block)
            bar.advance(len(block))
    return digest.hexdigest(), size


def _unpack(
    archive: Path, target: Path, shown: str, digest: str, cached: bool, caps: tuple[int, int]
) -> FetchResult:
    if detect_archive(archive) is None:
        raise ValueError(
            f"{shown!r} is a single file but not an archive (.tar, .tar.gz/.tgz, .tar.bz2, "
            ".tar.xz, .zip); point fetch at an archive or a folder"
        )
    with exclusive(target):  # writers of ``target`` take turns; leftovers of dead ones go
        _check_dest(target)
        if _already_extracted(target, digest):
            log.info("%s already holds the extracted archive (sha256 %s)", target, digest)
            return FetchResult(
                root=_single_root(target), source_url=shown, sha256=digest, cached=cached
            )
        incoming = target.with_name(f"{target.name}.incoming-{secrets.token_hex(6)}")
        try:
            safe_extract(archive, incoming, max_members=caps[0], max_bytes=caps[1])
            _write_marker(incoming, shown, digest)
            commit(incoming, target, replace=True)
        except BaseException:
            discard(incoming)
            raise
    return FetchResult(root=_single_root(target), source_url=shown, sha256=digest, cached=cached)


def _already_extracted(target: Path, digest: str) -> bool:
    """``target`` is a complete extraction of the archive with this sha256 (its marker says so).

    The marker is written inside the folder before it is renamed into place, so a marker means
    a complete extraction. Reusing it keeps a second fetch of the same archive from replacing
    the folder under a build that is reading it.
    """
    try:
        marker = json.loads((target / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and bool(digest) and marker.get("sha256") == digest


def _copy_prefix(
    fs: Any,
    path: str,
    target: Path,
    shown: str,
    max_members: int,
    max_bytes: int,
    workers: int,
    progress: bool,
) -> None:
    base = path.rstrip("/")
    found = fs.find(base, detail=True)
    with exclusive(target):  # writers of ``target`` take turns; leftovers of dead ones go
        _check_dest(target)
        staging = new_staging(target)
        try:
            jobs, total = _plan_copy(base, found, staging, shown, max_members, max_bytes)
            _copy_all(fs, jobs, found, workers, progress_bar(progress, f"copy {shown}", total))
            _write_marker(staging, shown, "")
            commit(staging, target, replace=True)
        except BaseException:
            discard(staging)
            raise
    log.info("copied %d objects (%d bytes) from %s", len(jobs), total, shown)


def _plan_copy(
    base: str, found: dict[str, Any], staging: Path, shown: str, max_members: int, max_bytes: int
) -> tuple[list[tuple[str, Path]], int]:
    """``(object key, local path)`` of every object under ``base``, checked, and their bytes."""
    jobs: list[tuple[str, Path]] = []
    total = 0
    for key, info in sorted(found.items()):
        rel = key[len(base) + 1 :] if key.startswith(base + "/") else None
        parts = split_member_name(rel) if rel else "is outside the prefix"
        if isinstance(parts, str) or not parts:
            raise UnsafeArchiveError(f"unsafe object {key!r} under {shown!r}: {parts}")
        total += int(info.get("size") or 0)
        if len(jobs) >= max_members or total > max_bytes:
            raise UnsafeArchiveError(
                f"prefix {shown!r} exceeds max_members={max_members} or "
                f"max_bytes={max_bytes} at object {key!r}; raise the cap if it is trusted"
            )
        local = staging.joinpath(*parts)
        local.parent.mkdir(parents=True, exist_ok=True)
        jobs.append((key, local))
    return jobs, total


def _copy_all(
    fs: Any, jobs: list[tuple[str, Path]], found: dict[str, Any], workers: int, bar_cm: Any
) -> None:
    """Copy ``jobs`` with at most ``workers`` in flight; the first failure cancels the rest."""
    with bar_cm as bar, ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(fs.get_file, key, str(local)): key for key, local in jobs}
        try:
            for done in as_completed(futures):
                done.result()
                bar.advance(int(found[futures[done]].get("size") or 0))
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


def _check_dest(target: Path) -> None:
    """``dest`` must be new, empty, or made by an earlier fetch (never a file or a link)."""
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise FileExistsError(
            f"dest {str(target)!r} exists and is not a folder; pass a new or empty folder"
        )
    made_by_fetch = (target / MARKER).is_file()
    if target.is_dir() and not made_by_fetch and any(target.iterdir()):
        raise FileExistsError(
            f"dest {str(target)!r} is not empty and was not made by h5forge fetch; "
            "pass a new or empty folder"
        )


def _write_marker(folder: Path, shown: str, digest: str) -> None:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    (folder / MARKER).write_text(json.dumps({"source_url": shown, "sha256": digest, "at": now}))


def _single_root(target: Path) -> str:
    """The archive's one top folder if it has exactly one, else ``target`` itself."""
    tops = [e for e in os.scandir(target) if not e.name.startswith(".") and e.name != "__MACOSX"]
    if len(tops) == 1 and tops[0].is_dir(follow_symlinks=False):
        return tops[0].path
    return str(target)
