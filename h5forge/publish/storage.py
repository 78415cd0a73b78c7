"""Publish a finished file to any fsspec URL, verified, with its manifest as the commit marker.

A published asset is two objects: ``NAME.h5`` and ``NAME.h5.manifest.json``. The manifest
(sha256, size, counts, format version, creation time, redacted source) is written last, after
the file has been read back from the destination and matched byte for byte, so a consumer that
finds a manifest can trust the file next to it. When replacing, the old manifest is removed
first, so no reader ever sees a manifest that disagrees with its file.

Local writes never go through a name someone planted: temp files are created exclusively
(:func:`h5forge.files.create_exclusive`) and renamed over their target, which replaces a
symlink at the final name instead of writing through it; cleanup of a killed publish's temp
files removes only regular files of this user with one link, never a symlink or what it
points to.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import io
import json
import logging
import os
import posixpath
import re
import secrets
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from h5forge.errors import ChecksumError, IntegrityError
from h5forge.files import create_exclusive
from h5forge.redact import REDACTED, is_sensitive_key, redact_storage_options, redact_url

__all__ = [
    "FORMAT_NAME",
    "MANIFEST_SUFFIX",
    "PublishResult",
    "check_manifest",
    "manifest_url",
    "publish",
    "put_file",
    "read_manifest",
    "sha256_file",
]

log = logging.getLogger(__name__)

MANIFEST_SUFFIX = ".manifest.json"
FORMAT_NAME = "h5forge"
# Used when ``extra`` carries no "format_version"; the writer passes the file's real version.
_DEFAULT_FORMAT_VERSION = 1
_COMPUTED = frozenset({"format", "sha256", "bytes", "created_at"})
_CHUNK = 8 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PublishResult:
    """What ``publish`` did. URLs are redacted.

    Attributes:
        url: the published file.
        manifest_url: its manifest sidecar.
        sha256: hex digest of the file, verified at the destination.
        bytes: size of the file.
        unchanged: the destination already held this exact asset; nothing was written.
    """

    url: str
    manifest_url: str
    sha256: str
    bytes: int
    unchanged: bool


def sha256_file(
    path_or_url: str | os.PathLike[str],
    *,
    storage_options: Mapping[str, Any] | None = None,
    chunk: int = _CHUNK,
) -> str:
    """Stream a local or remote file through sha256 in ``chunk``-byte reads.

    Args:
        path_or_url: local path or fsspec URL.
        storage_options: passed to fsspec.
        chunk: bytes per read.

    Returns:
        The hex digest.
    """
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be >= 1 byte")
    fs, path = fsspec.core.url_to_fs(os.fspath(path_or_url), **dict(storage_options or {}))
    return _digest(fs, path, chunk)


def _digest(fs: Any, path: str, chunk: int = _CHUNK) -> str:
    digest = hashlib.sha256()
    with fs.open(path, "rb", block_size=chunk) as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def manifest_url(url: str) -> str:
    """The manifest sidecar of ``url``: ``url + ".manifest.json"`` (before any query string)."""
    if "://" in url and "?" in url:
        base, _, query = url.partition("?")
        return f"{base}{MANIFEST_SUFFIX}?{query}"
    return url + MANIFEST_SUFFIX


def read_manifest(url: str, *, storage_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Read and check the manifest of the asset at ``url`` (or of the manifest URL itself).

    Raises:
        FileNotFoundError: no manifest, i.e. the asset was never (completely) published.
        ValueError: the manifest is not valid JSON or lacks format, sha256 or bytes.
    """
    target = url if url.endswith(MANIFEST_SUFFIX) else manifest_url(url)
    fs, path = fsspec.core.url_to_fs(target, **dict(storage_options or {}))
    manifest = _load(fs, path, redact_url(target))
    if manifest is None:
        raise FileNotFoundError(
            f"no manifest at {redact_url(target)!r}: the asset is not published (the manifest "
            "is written last, after the file is verified); publish it again"
        )
    return manifest


def check_manifest(
    url: str,
    manifest: Mapping[str, Any],
    *,
    sha256: str,
    bytes: int,
    num_samples: int,
    num_classes: int,
    format_version: int,
    counts: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """Compare what the file at ``url`` is with what its manifest promises.

    The verify command, the re-verify flow and anyone holding a manifest call this one
    function. ``sha256`` and ``bytes`` must be in the manifest; ``num_samples``,
    ``num_classes``, ``format_version`` and ``counts`` (split -> class -> n; compared when
    given) must agree when the manifest records them.

    Raises:
        IntegrityError: one line per disagreement, naming the field, the manifest's value and
            the file's.
    """
    found: dict[str, Any] = {
        "bytes": bytes,
        "sha256": sha256,
        "num_samples": num_samples,
        "num_classes": num_classes,
        "format_version": format_version,
    }
    if counts is not None:
        found["counts"] = {split: dict(per) for split, per in counts.items()}
    failures = [f"manifest lacks {k!r}" for k in ("bytes", "sha256") if k not in manifest]
    for key, actual in found.items():
        if key in manifest and manifest[key] != actual:
            failures.append(f"{key}: manifest says {manifest[key]!r}, the file has {actual!r}")
    if failures:
        raise IntegrityError(
            f"{redact_url(url)} does not match its manifest (sha256, size, counts, format version)",
            failures,
        )


def _load(fs: Any, path: str, shown: str) -> dict[str, Any] | None:
    fs.invalidate_cache(path)
    try:
        raw = fs.cat_file(path)
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ValueError(f"manifest {shown!r} is not valid JSON: {exc}") from exc
    if not (
        isinstance(data, dict)
        and data.get("format") == FORMAT_NAME
        and isinstance(data.get("sha256"), str)
        and _SHA256.fullmatch(data["sha256"])
        and isinstance(data.get("bytes"), int)
    ):
        raise ValueError(
            f"manifest {shown!r} is not an h5forge manifest: need format={FORMAT_NAME!r}, "
            "a 64-hex sha256 and an integer bytes"
        )
    return data


def publish(
    local_file: str | os.PathLike[str],
    dest_url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    extra: Mapping[str, Any] | None = None,
) -> PublishResult:
    """Copy ``local_file`` to ``dest_url``, verify it there, then write its manifest.

    Local destinations get a temporary name in the same folder, fsync, a read-back of the
    temp file, then — under a lock on the folder, so concurrent publishers take turns — the old
    manifest is removed, the file renamed into place and the new manifest written. Temp files
    of a killed publish are removed by the next one. Other stores get a direct upload (the
    manifest, not the object, is the commit marker), read back before the manifest is written.
    Either way the bytes are checked — size and a streamed sha256 — before the manifest is
    written.

    Args:
        local_file: the finished, sealed file.
        dest_url: where to publish it (local path or fsspec URL).
        storage_options: passed to fsspec; never recorded.
        overwrite: replace a destination that holds different content.
        extra: more manifest fields: ``counts``, ``format_version``, ``source`` (a URL,
            redacted before recording) and any JSON-serialisable metadata (strings redacted).

    Returns:
        A :class:`PublishResult`; ``unchanged`` when the same asset was already there.

    Raises:
        FileExistsError: different content is published at ``dest_url`` and ``overwrite``
            is False.
        ChecksumError: the read-back differs from the local file (the bad object is deleted).
        FileNotFoundError: ``local_file`` does not exist.
        ValueError: an argument is invalid.
    """
    local = os.fspath(local_file)
    fields = _check_args(local, dest_url, extra)
    fs, path = fsspec.core.url_to_fs(dest_url, **dict(storage_options or {}))
    mpath = path + MANIFEST_SUFFIX
    shown, mshown = redact_url(dest_url), redact_url(manifest_url(dest_url))
    sha, size = sha256_file(local), os.path.getsize(local)
    target = _Target(fs, path, mpath, shown, mshown, sha, size, fields, overwrite)
    settled = _settled(target)  # fail fast, before copying anything
    if settled is not None:
        return settled
    if isinstance(fs, LocalFileSystem):
        settled = _publish_local(target, local)
        if settled is not None:
            return settled
    else:
        if fs.exists(mpath):
            fs.rm_file(mpath)  # first: a reader must never pair the old manifest with a new file
        _put(fs, path, local=local)
        _read_back(fs, path, sha, size, shown)
        _put(fs, mpath, data=_manifest(sha, size, fields))  # last: the commit marker
    log.info("published %s (%d bytes, sha256 %s)", shown, size, sha)
    return target.result(unchanged=False)


@dataclass(frozen=True)
class _Target:
    """One publish: where to, what (digest and size), and how (overwrite)."""

    fs: Any
    path: str
    mpath: str
    shown: str
    mshown: str
    sha: str
    size: int
    fields: dict[str, Any]
    overwrite: bool

    def result(self, *, unchanged: bool) -> PublishResult:
        return PublishResult(self.shown, self.mshown, self.sha, self.size, unchanged=unchanged)


def _settled(t: _Target) -> PublishResult | None:
    """What the destination already holds decides the publish, or None to go ahead.

    Returns ``unchanged`` when this exact asset is published; commits (writes the manifest of)
    a file left without one by an interrupted publish of these same bytes.

    Raises:
        FileExistsError: different content is there and ``overwrite`` is False.
    """
    fs = t.fs
    old = _load(fs, t.mpath, t.mshown)
    fs.invalidate_cache(t.path)
    if not fs.exists(t.path):
        return None
    if old and old["sha256"] == t.sha and old["bytes"] == t.size == fs.size(t.path):
        log.info("%s already published with sha256 %s; nothing to do", t.shown, t.sha)
        return t.result(unchanged=True)
    if t.overwrite:
        return None
    if old is None and fs.size(t.path) == t.size and _digest(fs, t.path) == t.sha:
        # Same bytes without a manifest: an interrupted publish. Just commit it.
        _put(fs, t.mpath, data=_manifest(t.sha, t.size, dict(t.fields)))
        return t.result(unchanged=False)
    found = old["sha256"] if old else "unknown (no manifest)"
    raise FileExistsError(
        f"{t.shown!r} already exists with different content (sha256 {found}, "
        f"publishing {t.sha}); pass overwrite=True to replace it"
    )


def _publish_local(t: _Target, local: str) -> PublishResult | None:
    """Copy to a temp name and read it back, then swap it in under a folder lock.

    The old manifest goes, the file is renamed into place and the new manifest is written in
    one short critical section, so the asset is unpublished only for a few system calls (not
    for the whole copy), and concurrent publishers of one destination take turns: each one
    re-checks what the other committed before replacing it.
    """
    fs, parent = t.fs, posixpath.dirname(t.path)
    fs.makedirs(parent, exist_ok=True)
    with _folder_lock(parent):
        _remove_stale_temps(parent, posixpath.basename(t.path))
    with _temp_copy(t.path, local) as tmp:
        _read_back(fs, tmp.path, t.sha, t.size, t.shown)
        with _folder_lock(parent):
            settled = _settled(t)
            if settled is not None:
                return settled
            if fs.exists(t.mpath):
                os.remove(t.mpath)  # first: never the old manifest beside the new file
            # Unlock before the rename: HDF5 readers take a shared lock on the file they open
            # and would fail on ours. Stale-temp cleanup also runs under the folder lock, so
            # it cannot take the temp file in between.
            tmp.unlock()
            os.rename(tmp.path, t.path)
            _fsync_dir(parent)
            _put(fs, t.mpath, data=_manifest(t.sha, t.size, dict(t.fields)))  # the commit marker
    return None


def _check_args(local: str, dest_url: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    if not os.path.isfile(local):
        raise FileNotFoundError(f"local_file {local!r} does not exist or is not a file")
    if not dest_url or dest_url.endswith(MANIFEST_SUFFIX):
        raise ValueError(
            f"dest_url={redact_url(dest_url)!r} is not a file URL: pass the asset's URL "
            f"(e.g. s3://bucket/data.h5), not empty or a *{MANIFEST_SUFFIX}"
        )
    fields = dict(extra or {})
    reserved = sorted(_COMPUTED & fields.keys())
    if reserved:
        raise ValueError(f"extra sets {reserved}, which publish computes itself; remove them")
    try:
        json.dumps(fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"extra is not JSON-serialisable: {exc}") from exc
    return fields


def _manifest(sha: str, size: int, fields: dict[str, Any]) -> bytes:
    """The manifest JSON; every recorded string goes through redaction first."""
    counts = fields.pop("counts", {}) if "counts" in fields else {}
    scrubbed = redact_storage_options({k: v for k, v in fields.items() if k != "source"})
    manifest: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": fields.get("format_version", _DEFAULT_FORMAT_VERSION),
        "sha256": sha,
        "bytes": size,
        "counts": counts,  # class names may look like secret keys ("key"): kept verbatim
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "source": redact_url(str(fields.get("source", ""))),
    }
    for key, value in scrubbed.items():
        manifest.setdefault(key, REDACTED if is_sensitive_key(key) else value)
    return json.dumps(manifest, indent=2, sort_keys=True).encode()


def put_file(
    local_file: str | os.PathLike[str],
    dest_url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Copy a (small) local file to ``dest_url``, without verification or manifest.

    A local destination gets a temp name, fsync and a rename: whatever had the name (a file, a
    planted symlink) is replaced, never written through. Other stores get a plain upload.
    """
    fs, path = fsspec.core.url_to_fs(dest_url, **dict(storage_options or {}))
    _put(fs, path, local=os.fspath(local_file))


def _put(fs: Any, path: str, *, local: str | None = None, data: bytes | None = None) -> None:
    """Write a file: temp + fsync + rename where the store has real renames, else upload."""
    if not isinstance(fs, LocalFileSystem):
        if local is not None:
            fs.put_file(local, path)
        else:
            fs.pipe_file(path, data)
        fs.invalidate_cache(path)
        return
    parent = posixpath.dirname(path)
    fs.makedirs(parent, exist_ok=True)
    with _temp_copy(path, local, data) as tmp:
        tmp.unlock()
        os.rename(tmp.path, path)
    _fsync_dir(parent)  # persist the rename itself


_TEMP = ".tmp-"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class _Temp:
    """A temp file being written: its path, and the open handle whose flock marks it live."""

    def __init__(self, path: str, handle: IO[bytes]) -> None:
        self.path, self._handle = path, handle

    def unlock(self) -> None:
        """Close the handle (releasing the flock); the file stays."""
        self._handle.close()


@contextmanager
def _temp_copy(path: str, local: str | None, data: bytes | None = None) -> Iterator[_Temp]:
    """A fsynced copy of ``local`` (or ``data``) at a temp name beside ``path``, locked.

    The temp file stays flock-ed until :meth:`_Temp.unlock`, which marks it as live: a later
    publish removes only temp files whose lock it can take (their writer died, e.g. killed).
    The temp file is removed on exit unless it was renamed away.
    """
    parent, name = posixpath.split(path)
    token = secrets.token_hex(6)
    tmp = posixpath.join(parent, f".{name}{_TEMP}{token}")
    # Created under another name and locked before it gets its temp name, so a temp file
    # whose lock can be taken is always a dead writer's.
    fresh = posixpath.join(parent, f".{name}.new-{token}")
    # Exclusive: a name planted beside the destination (a symlink, a hard link) is refused.
    out = os.fdopen(create_exclusive(fresh, 0o644), "wb")
    try:
        _lock(out.fileno(), blocking=True)
        os.rename(fresh, tmp)
        src: IO[bytes]
        with open(local, "rb") if local else io.BytesIO(data or b"") as src:
            while block := src.read(_CHUNK):
                out.write(block)
        out.flush()
        os.fsync(out.fileno())
        yield _Temp(tmp, out)
    finally:
        out.close()
        for leftover in (fresh, tmp):
            with contextlib.suppress(FileNotFoundError):
                os.remove(leftover)


def _remove_stale_temps(parent: str, name: str) -> None:
    """Remove temp files of ``name`` (and of its manifest) left by a killed publish.

    Call it under :func:`_folder_lock`: a live publisher unlocks its temp file only under that
    lock, just before renaming it away.
    """
    prefixes = (f".{name}{_TEMP}", f".{name}{MANIFEST_SUFFIX}{_TEMP}")
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as entries:
        stale = [
            e.path
            for e in entries
            if e.name.startswith(prefixes) and e.is_file(follow_symlinks=False)
        ]
    for tmp in stale:
        try:  # never through a link, never blocking on a FIFO swapped in meanwhile
            fd = os.open(tmp, os.O_RDONLY | _NOFOLLOW | _NONBLOCK)
        except OSError:  # gone meanwhile, or now a link (ELOOP): not a temp file of ours
            continue
        try:
            st = os.fstat(fd)
            ours = (
                stat.S_ISREG(st.st_mode)
                and st.st_nlink == 1
                and (not hasattr(os, "getuid") or st.st_uid == os.getuid())
            )
            if ours and _lock(fd, blocking=False):
                log.info("removing %s, left by an interrupted publish", tmp)
                os.remove(tmp)
        finally:
            os.close(fd)


def _lock(fd: int, *, blocking: bool) -> bool:
    """flock ``fd`` exclusively; False when ``blocking`` is False and someone else holds it."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no cleanup of stale temps, no turn-taking
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except BlockingIOError:
        return False
    return True


@contextmanager
def _folder_lock(folder: str) -> Iterator[None]:
    """Hold an exclusive flock on ``folder`` (publishers into it take turns in here)."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        _lock(fd, blocking=True)
        yield
    finally:
        os.close(fd)


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_back(fs: Any, path: str, sha: str, size: int, shown: str) -> None:
    """Compare the destination's size and streamed sha256 with the local file's."""
    fs.invalidate_cache(path)
    found_size = fs.size(path)
    found_sha = _digest(fs, path) if found_size == size else "(not read: size differs)"
    if found_size != size or found_sha != sha:
        fs.rm_file(path)
        raise ChecksumError(
            f"read-back of {shown!r} does not match the local file: expected sha256 {sha} and "
            f"{size} bytes, found {found_sha} and {found_size} bytes; the object was deleted, "
            "publish again",
            [
                f"sha256 expected={sha} actual={found_sha}",
                f"bytes expected={size} actual={found_size}",
            ],
        )
