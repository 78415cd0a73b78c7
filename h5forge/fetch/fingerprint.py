"""A cheap fingerprint of a source, taken before fetching it: has the source changed?

No file is read. A local folder is a walk of ``(relative path, size, mtime_ns)``; a bucket
prefix is its listing's ``(key, size, ETag)``; one object or file is its size with its ETag
(or Last-Modified, or mtime) from one lookup; an HTTP(S) URL is the size, ETag and
Last-Modified of one ranged GET of its first byte (fetch's own client, the body left unread);
a source pinned by sha256 is that digest. A source that cannot be fingerprinted this way (a
server that answers with neither ETag nor Last-Modified, or not with 200/206; an object store
that reports no ETag; a folder over the file-count bound) has none: the build then builds.

Over-building is the safe error: anything that changes a token (a touched file, a rewritten
object) counts as a change, even when the bytes are the same.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from h5forge.fetch.connect import check_headers, open_response
from h5forge.location import Location
from h5forge.paths import MAX_DEPTH

__all__ = ["MAX_FILES", "SourceFingerprint", "files_digest", "source_fingerprint"]

log = logging.getLogger(__name__)

#: Most files (objects) a fingerprint lists: fetch's own bound on a prefix (``max_members``).
MAX_FILES = 1_000_000
_SHA256_LEN = 64
_HTTP_TIMEOUT_S = 30.0  # for the response head, as the downloader's default idle timeout
_MAX_TOKEN = 256  # longer tokens (a server's headers) are recorded as their sha256


@dataclass(frozen=True)
class SourceFingerprint:
    """What a source looked like before it was fetched.

    Attributes:
        kind: ``folder``, ``prefix``, ``object`` or ``pinned``.
        digest: sha256 hex of the canonical (sorted) list of ``files``.
        files: relative path (``""`` for a single object) -> its token (size and change mark).
    """

    kind: str
    digest: str
    files: Mapping[str, str] = field(repr=False)


def files_digest(files: Mapping[str, str]) -> str:
    """sha256 hex of the canonical JSON of ``files`` (sorted ``[path, token]`` pairs)."""
    pairs = sorted(files.items())
    return hashlib.sha256(json.dumps(pairs, separators=(",", ":")).encode()).hexdigest()


def source_fingerprint(
    source: Location,
    *,
    sha256: str | None = None,
    max_files: int = MAX_FILES,
) -> SourceFingerprint | None:
    """The fingerprint of the source at ``source``, or None when it has no cheap one.

    Args:
        source: what ``fetch`` would fetch: a local folder or file, or an fsspec URL (its
            storage options are never recorded).
        sha256: the source's pinned digest; it is the fingerprint when given.
        max_files: a folder or prefix with more files than this has no fingerprint.

    Raises:
        FileNotFoundError: nothing exists at ``source``.
        ValueError: ``sha256`` is not 64 hex digits, or ``max_files`` is below 1.
    """
    if max_files < 1:
        raise ValueError(f"max_files={max_files} must be at least 1")
    if sha256:
        digest = sha256.lower()
        if len(digest) != _SHA256_LEN or any(c not in "0123456789abcdef" for c in digest):
            raise ValueError(f"sha256 {sha256!r} is not 64 hexadecimal digits")
        return _made("pinned", {"": f"sha256:{digest}"})
    shown = str(source)
    if source.url.split("://", 1)[0].lower() in ("http", "https"):
        return _http(source.url, shown, source.options)
    if source.is_local:
        return _local(source.path, shown, max_files)
    path = source.path
    if source.ask("what it is", "isdir", path, listed=max_files):  # s3fs lists the prefix
        return _prefix(source, path, shown, max_files)
    if not source.ask("what it is", "isfile", path):
        raise FileNotFoundError(f"nothing at {shown!r}: no such folder, prefix or archive")
    token = _object_token(source.ask("its identity", "info", path))
    return None if token is None else _made("object", {"": token})


def _http(url: str, shown: str, options: Mapping[str, Any]) -> SourceFingerprint | None:
    """``size:ETag:Last-Modified`` of the URL, from the head of a GET of its first byte."""
    headers = check_headers(dict(options.get("headers") or {}))  # as fetch sends them
    own = {"Range": "bytes=0-0", "Accept-Encoding": "identity"}
    conn, resp, _ = open_response(url, own, headers, _HTTP_TIMEOUT_S, time.monotonic() + 60.0)
    try:
        status = resp.status
        if status in (404, 410):
            raise FileNotFoundError(f"nothing at {shown!r}: HTTP {status}; check the URL")
        etag = resp.getheader("ETag", "") if status in (200, 206) else ""
        modified = resp.getheader("Last-Modified", "") if status in (200, 206) else ""
        if status == 206:  # "bytes 0-0/TOTAL": the total is the file's size
            size = resp.getheader("Content-Range", "").rpartition("/")[2]
        else:
            size = resp.getheader("Content-Length", "")
    finally:  # the body is never read: closing the connection ends the transfer
        resp.close()
        conn.close()
    if not (etag or modified):
        log.info("%s: HTTP %d with neither ETag nor Last-Modified: no fingerprint", shown, status)
        return None
    token = f"{size.strip() if size.strip().isdigit() else '?'}:{etag.strip()}:{modified.strip()}"
    if len(token) > _MAX_TOKEN:  # a server's header, untrusted: a bounded stand-in
        token = "sha256:" + hashlib.sha256(token.encode("latin-1", "replace")).hexdigest()
    return _made("object", {"": token})


def _made(kind: str, files: dict[str, str]) -> SourceFingerprint:
    return SourceFingerprint(kind=kind, digest=files_digest(files), files=files)


def _local(root: str, shown: str, max_files: int) -> SourceFingerprint | None:
    try:
        top = os.stat(root)
    except FileNotFoundError:
        raise FileNotFoundError(f"nothing at {shown!r}: no such folder or archive") from None
    if not stat.S_ISDIR(top.st_mode):
        return _made("object", {"": f"{top.st_size}:{top.st_mtime_ns}"})
    files: dict[str, str] = {}
    seen = {(top.st_dev, top.st_ino)}
    stack: list[tuple[str, str, int]] = [(root, "", 0)]
    while stack:
        folder, rel, depth = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                name = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    st = entry.stat()  # follows links: a changed link target is a change
                except FileNotFoundError:  # a broken link: discover skips it too
                    continue
                if stat.S_ISDIR(st.st_mode):
                    # Discover walks no deeper than MAX_DEPTH; a loop of links is walked once.
                    if depth + 1 <= MAX_DEPTH and (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        stack.append((entry.path, name, depth + 1))
                elif stat.S_ISREG(st.st_mode):
                    if len(files) >= max_files:
                        log.info("%s has over %d files: no fingerprint", shown, max_files)
                        return None
                    files[name] = f"{st.st_size}:{st.st_mtime_ns}"
    return _made("folder", files)


def _prefix(source: Location, path: str, shown: str, max_files: int) -> SourceFingerprint | None:
    base = path.rstrip("/")
    files: dict[str, str] = {}
    # The same listing fetch's copy_prefix makes (one paginated LIST of the prefix).
    listing = source.ask("its listing", "find", base, detail=True, listed=max_files)
    for key, info in listing.items():
        rel = key[len(base) + 1 :] if key.startswith(base + "/") else None
        token = _object_token(info)
        if not rel or token is None:
            log.info("%s: object %r has no key under the prefix or no ETag", shown, key)
            return None
        if len(files) >= max_files:
            log.info("%s has over %d objects: no fingerprint", shown, max_files)
            return None
        files[rel] = token
    return _made("prefix", files)


def _object_token(info: Mapping[str, Any]) -> str | None:
    """``size:mark`` of one object's info, the mark being its ETag, else its modification
    time; None when the store reports neither (then nothing says the object changed)."""
    size = info.get("size")
    for key in ("ETag", "etag", "LastModified", "Last-Modified", "mtime", "last_modified"):
        mark = info.get(key)
        if mark not in (None, ""):
            return f"{size}:{str(mark).strip(chr(34))}"
    return None
