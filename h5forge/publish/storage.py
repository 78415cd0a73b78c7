"""Publish a finished file to any fsspec URL, verified, with its sidecar as the commit marker.

A published asset is two objects: ``NAME.h5`` and ``NAME.h5.manifest.json``. The sidecar
(sha256, size, counts, format version, creation time, redacted source) is written last, after
the file has been read back from the destination and matched byte for byte, so a consumer that
finds a sidecar can trust the file next to it. When replacing, the old sidecar is removed
first, so no reader ever sees a sidecar that disagrees with its file.

How the bytes are written (temp name, rename, read-back, stale-temp cleanup) is
:mod:`h5forge.publish.copy`; the sidecar itself is :mod:`h5forge.publish.sidecar`.
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from h5forge.hashing import sha256_file, sha256_of
from h5forge.locks import folder_lock
from h5forge.publish.copy import fsync_dir, put, read_back, remove_stale_temps, temp_copy
from h5forge.publish.sidecar import (
    COMPUTED_FIELDS,
    SIDECAR_SUFFIX,
    load_sidecar,
    sidecar_bytes,
    sidecar_url,
)
from h5forge.redact import redact_url

__all__ = ["PublishResult", "publish", "put_file"]

log = logging.getLogger(__name__)

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class PublishResult:
    """What ``publish`` did. URLs are redacted.

    Attributes:
        url: the published file.
        sidecar_url: its sidecar.
        sha256: hex digest of the file, verified at the destination.
        bytes: size of the file.
        unchanged: the destination already held this exact asset; nothing was written.
    """

    url: str
    sidecar_url: str
    sha256: str
    bytes: int
    unchanged: bool


def publish(
    local_file: str | os.PathLike[str],
    dest_url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    overwrite: bool = False,
    extra: Mapping[str, Any] | None = None,
    sha256: str | None = None,
) -> PublishResult:
    """Copy ``local_file`` to ``dest_url``, verify it there, then write its sidecar.

    Local destinations get a temporary name in the same folder, fsync, a read-back of the
    temp file, then — under a lock on the folder, so concurrent publishers take turns — the old
    sidecar is removed, the file renamed into place and the new sidecar written. Temp files
    of a killed publish are removed by the next one. Other stores get a direct upload (the
    sidecar, not the object, is the commit marker), read back before the sidecar is written.
    Either way the bytes are checked — size and a streamed sha256 — before the sidecar is
    written.

    Args:
        local_file: the finished, sealed file.
        dest_url: where to publish it (local path or fsspec URL).
        storage_options: passed to fsspec; never recorded.
        overwrite: replace a destination that holds different content.
        extra: more sidecar fields: ``counts``, ``format_version``, ``source`` (a URL,
            redacted before recording) and any JSON-serialisable metadata (strings redacted).
        sha256: the local file's sha256 when the caller has just computed it (it is not hashed
            again); the copy at the destination is checked against it either way.

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
    mpath = path + SIDECAR_SUFFIX
    shown, mshown = redact_url(dest_url), redact_url(sidecar_url(dest_url))
    sha = _check_sha256(sha256) if sha256 is not None else sha256_file(local)
    size = os.path.getsize(local)
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
            fs.rm_file(mpath)  # first: a reader must never pair the old sidecar with a new file
        put(fs, path, local=local)
        read_back(fs, path, sha, size, shown)
        put(fs, mpath, data=sidecar_bytes(sha, size, fields))  # last: the commit marker
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

    Returns ``unchanged`` when this exact asset is published; commits (writes the sidecar of)
    a file left without one by an interrupted publish of these same bytes.

    Raises:
        FileExistsError: different content is there and ``overwrite`` is False.
    """
    fs = t.fs
    old = load_sidecar(fs, t.mpath, t.mshown)
    fs.invalidate_cache(t.path)
    if not fs.exists(t.path):
        return None
    if old and old["sha256"] == t.sha and old["bytes"] == t.size == fs.size(t.path):
        log.info("%s already published with sha256 %s; nothing to do", t.shown, t.sha)
        return t.result(unchanged=True)
    if t.overwrite:
        return None
    if old is None and fs.size(t.path) == t.size and sha256_of(fs, t.path) == t.sha:
        # Same bytes without a sidecar: an interrupted publish. Just commit it.
        put(fs, t.mpath, data=sidecar_bytes(t.sha, t.size, dict(t.fields)))
        return t.result(unchanged=False)
    found = old["sha256"] if old else "unknown (no sidecar)"
    raise FileExistsError(
        f"{t.shown!r} already exists with different content (sha256 {found}, "
        f"publishing {t.sha}); pass overwrite=True to replace it"
    )


def _publish_local(t: _Target, local: str) -> PublishResult | None:
    """Copy to a temp name and read it back, then swap it in under a folder lock.

    The old sidecar goes, the file is renamed into place and the new sidecar is written in
    one short critical section, so the asset is unpublished only for a few system calls (not
    for the whole copy), and concurrent publishers of one destination take turns: each one
    re-checks what the other committed before replacing it.
    """
    fs, parent = t.fs, posixpath.dirname(t.path)
    fs.makedirs(parent, exist_ok=True)
    with folder_lock(parent):
        remove_stale_temps(parent, posixpath.basename(t.path))
    with temp_copy(t.path, local) as tmp:
        read_back(fs, tmp.path, t.sha, t.size, t.shown)
        with folder_lock(parent):
            settled = _settled(t)
            if settled is not None:
                return settled
            if fs.exists(t.mpath):
                os.remove(t.mpath)  # first: never the old sidecar beside the new file
            # Unlock before the rename: HDF5 readers take a shared lock on the file they open
            # and would fail on ours. Stale-temp cleanup also runs under the folder lock, so
            # it cannot take the temp file in between.
            tmp.unlock()
            os.rename(tmp.path, t.path)
            fsync_dir(parent)
            put(fs, t.mpath, data=sidecar_bytes(t.sha, t.size, dict(t.fields)))  # the commit marker
    return None


def _check_args(local: str, dest_url: str, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    if not os.path.isfile(local):
        raise FileNotFoundError(f"local_file {local!r} does not exist or is not a file")
    if not dest_url or dest_url.endswith(SIDECAR_SUFFIX):
        raise ValueError(
            f"dest_url={redact_url(dest_url)!r} is not a file URL: pass the asset's URL "
            f"(e.g. s3://bucket/data.h5), not empty or a *{SIDECAR_SUFFIX}"
        )
    fields = dict(extra or {})
    reserved = sorted(COMPUTED_FIELDS & fields.keys())
    if reserved:
        raise ValueError(f"extra sets {reserved}, which publish computes itself; remove them")
    try:
        json.dumps(fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"extra is not JSON-serialisable: {exc}") from exc
    return fields


def _check_sha256(value: str) -> str:
    if not isinstance(value, str) or not _SHA256_HEX.fullmatch(value):
        raise ValueError(f"sha256={value!r} is not 64 lower-case hexadecimal digits")
    return value


def put_file(
    local_file: str | os.PathLike[str],
    dest_url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
) -> None:
    """Copy a (small) local file to ``dest_url``, without verification or sidecar.

    A local destination gets a temp name, fsync and a rename: whatever had the name (a file, a
    planted symlink) is replaced, never written through. Other stores get a plain upload.
    """
    fs, path = fsspec.core.url_to_fs(dest_url, **dict(storage_options or {}))
    put(fs, path, local=os.fspath(local_file))
