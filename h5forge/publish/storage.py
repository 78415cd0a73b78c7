"""Publish a finished file to any fsspec URL, verified, with its sidecar as the commit marker.

A published asset is two objects: ``NAME.h5`` and ``NAME.h5.manifest.json``. The sidecar
(sha256, size, counts, format version, creation time, redacted source) is written last, after
the file has been read back from the destination and matched byte for byte, so a consumer that
finds a sidecar can trust the file next to it. When replacing, the old sidecar is removed
first, so no reader ever sees a sidecar that disagrees with its file.

How the bytes are written (temp name, rename) is :meth:`h5forge.location.Location.put`; here
are the read-back and the cleanup of a killed publish's temp files (:func:`remove_stale_temps`
removes only those whose lock it can take, and only regular files of this user with one link,
never a symlink or what it points to); the sidecar itself is :mod:`h5forge.publish.sidecar`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from h5forge.errors import ChecksumError
from h5forge.files import NOFOLLOW, NONBLOCK, fsync_dir
from h5forge.location import SIDECAR_SUFFIX, TEMP_MARK, Location, temp_copy
from h5forge.locks import flock, folder_lock
from h5forge.publish.sidecar import (
    COMPUTED_FIELDS,
    load_sidecar,
    sidecar_bytes,
)

__all__ = ["PublishResult", "publish", "read_back", "remove_stale_temps"]

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
    dest_url: str | Location,
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
        dest_url: where to publish it (local path, fsspec URL or :class:`Location`).
        storage_options: passed to fsspec with a URL string; never recorded.
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
    dest = Location.of(dest_url, storage_options)
    fields = _check_args(local, dest, extra)
    sha = _check_sha256(sha256) if sha256 is not None else Location.of(local).sha256()
    asset = _Asset(sha, os.path.getsize(local), fields)
    settled = _settled(dest, asset, overwrite=overwrite)  # fail fast, before copying anything
    if settled is not None:
        return settled
    if dest.is_local:
        settled = _publish_local(dest, asset, local, overwrite=overwrite)
        if settled is not None:
            return settled
    else:
        sidecar = dest.sidecar
        if sidecar.ask("whether it exists", "exists", sidecar.path):
            # First: a reader must never pair the old sidecar with a new file.
            sidecar.fs.rm_file(sidecar.path)
        dest.put(local=local)
        read_back(dest, asset.sha, asset.size)
        sidecar.put(data=asset.sidecar())  # last: the commit marker
    log.info("published %s (%d bytes, sha256 %s)", dest, asset.size, asset.sha)
    return asset.result(dest, unchanged=False)


@dataclass(frozen=True)
class _Asset:
    """What one publish writes: the file's digest and size, and its sidecar's fields."""

    sha: str
    size: int
    fields: dict[str, Any]

    def sidecar(self) -> bytes:
        return sidecar_bytes(self.sha, self.size, dict(self.fields))

    def result(self, dest: Location, *, unchanged: bool) -> PublishResult:
        return PublishResult(str(dest), str(dest.sidecar), self.sha, self.size, unchanged=unchanged)


def _settled(dest: Location, asset: _Asset, *, overwrite: bool) -> PublishResult | None:
    """What the destination already holds decides the publish, or None to go ahead.

    Returns ``unchanged`` when this exact asset is published; commits (writes the sidecar of)
    a file left without one by an interrupted publish of these same bytes.

    Raises:
        FileExistsError: different content is there and ``overwrite`` is False.
    """
    fs, path = dest.fs, dest.path
    old = load_sidecar(dest.sidecar)
    fs.invalidate_cache(path)
    if not dest.ask("whether it exists", "exists", path):
        return None
    size = dest.ask("its size", "size", path)
    if old and old["sha256"] == asset.sha and old["bytes"] == asset.size == size:
        log.info("%s already published with sha256 %s; nothing to do", dest, asset.sha)
        return asset.result(dest, unchanged=True)
    if overwrite:
        return None
    if old is None and size == asset.size and dest.sha256() == asset.sha:
        # Same bytes without a sidecar: an interrupted publish. Just commit it.
        dest.sidecar.put(data=asset.sidecar())
        return asset.result(dest, unchanged=False)
    found = old["sha256"] if old else "unknown (no sidecar)"
    raise FileExistsError(
        f"{str(dest)!r} already exists with different content (sha256 {found}, "
        f"publishing {asset.sha}); pass overwrite=True to replace it"
    )


def _publish_local(
    dest: Location, asset: _Asset, local: str, *, overwrite: bool
) -> PublishResult | None:
    """Copy to a temp name and read it back, then swap it in under a folder lock.

    The old sidecar goes, the file is renamed into place and the new sidecar is written in
    one short critical section, so the asset is unpublished only for a few system calls (not
    for the whole copy), and concurrent publishers of one destination take turns: each one
    re-checks what the other committed before replacing it.
    """
    path, sidecar = dest.path, dest.sidecar
    parent = posixpath.dirname(path)
    dest.fs.makedirs(parent, exist_ok=True)
    with folder_lock(parent):
        remove_stale_temps(parent, posixpath.basename(path))
    with temp_copy(path, local) as tmp:
        read_back(dest.with_url(tmp.path), asset.sha, asset.size)
        with folder_lock(parent):
            settled = _settled(dest, asset, overwrite=overwrite)
            if settled is not None:
                return settled
            if sidecar.fs.exists(sidecar.path):
                os.remove(sidecar.path)  # first: never the old sidecar beside the new file
            # Unlock before the rename: HDF5 readers take a shared lock on the file they open
            # and would fail on ours. Stale-temp cleanup also runs under the folder lock, so
            # it cannot take the temp file in between.
            tmp.unlock()
            os.rename(tmp.path, path)
            fsync_dir(parent)
            sidecar.put(data=asset.sidecar())  # the commit marker
    return None


def _check_args(local: str, dest: Location, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    if not os.path.isfile(local):
        raise FileNotFoundError(f"local_file {local!r} does not exist or is not a file")
    if dest.url.endswith(SIDECAR_SUFFIX):
        raise ValueError(
            f"dest_url={str(dest)!r} is not a file URL: pass the asset's URL "
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


def remove_stale_temps(parent: str, name: str) -> None:
    """Remove temp files of ``name`` (and of its sidecar) left by a killed publish.

    Call it under :func:`h5forge.locks.folder_lock`: a live publisher unlocks its temp file
    only under that lock, just before renaming it away.
    """
    prefixes = (f".{name}{TEMP_MARK}", f".{name}{SIDECAR_SUFFIX}{TEMP_MARK}")
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as entries:
        stale = [
            e.path
            for e in entries
            if e.name.startswith(prefixes) and e.is_file(follow_symlinks=False)
        ]
    for tmp in stale:
        try:  # never through a link, never blocking on a FIFO swapped in meanwhile
            fd = os.open(tmp, os.O_RDONLY | NOFOLLOW | NONBLOCK)
        except OSError:  # gone meanwhile, or now a link (ELOOP): not a temp file of ours
            continue
        try:
            st = os.fstat(fd)
            ours = (
                stat.S_ISREG(st.st_mode)
                and st.st_nlink == 1
                and (not hasattr(os, "getuid") or st.st_uid == os.getuid())
            )
            if ours and flock(fd, wait=False):
                log.info("removing %s, left by an interrupted publish", tmp)
                os.remove(tmp)
        finally:
            os.close(fd)


def read_back(where: Location, sha: str, size: int) -> None:
    """Compare the size and streamed sha256 of the file at ``where`` with the local file's."""
    fs, path = where.fs, where.path
    fs.invalidate_cache(path)
    found_size = where.ask("its size", "size", path)
    found_sha = where.sha256() if found_size == size else "(not read: size differs)"
    if found_size != size or found_sha != sha:
        fs.rm_file(path)
        raise ChecksumError(
            f"read-back of {str(where)!r} does not match the local file: expected sha256 {sha} "
            f"and {size} bytes, found {found_sha} and {found_size} bytes; the object was deleted, "
            "publish again",
            [
                f"sha256 expected={sha} actual={found_sha}",
                f"bytes expected={size} actual={found_size}",
            ],
        )
