"""Copying from an fsspec object store: one object to a local file, or a whole prefix.

An object is copied as the store lists it: its listed size (capped by ``max_bytes``) in
``CHUNK``-byte ranged reads, each checked for its length and bounded in time as a whole
(:meth:`h5forge.location.Location.read_timeout`: an answer trickled a byte at a time ends in
a :class:`~h5forge.errors.StoreError`), hashed as it arrives, into a file created exclusively.
A store can list one size and serve more: no byte past the listed size is ever asked for. A
prefix is planned first (every key checked as a relative path, the caps applied), then copied
into a staging folder with bounded concurrency and renamed into place under the destination's
lock (:func:`h5forge.fetch.staging.exclusive`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from h5forge.errors import IntegrityError, UnsafeArchiveError
from h5forge.fetch.body import over_max_bytes
from h5forge.fetch.cache import create_part
from h5forge.fetch.dest import check_dest, write_marker
from h5forge.fetch.staging import commit, discard, exclusive, new_staging
from h5forge.files import create_exclusive
from h5forge.location import Location
from h5forge.paths import split_member_name
from h5forge.progress import progress_bar

__all__ = ["copy_prefix", "stream_object"]

log = logging.getLogger("h5forge.fetch.sources")


def stream_object(
    where: Location, part: Path, shown: str, progress: bool, max_bytes: int
) -> tuple[str, int]:
    """Copy the object at ``where`` to the new file ``part``: ``(sha256, bytes)``.

    Its listed size is read, at most ``max_bytes``; ``part`` is created exclusively, never
    through a link.
    """
    listed = where.ask("the size", "size", where.path)
    if listed is None:
        raise OSError(f"{shown} lists no size; h5forge copies an object by its listed size")
    if listed > max_bytes:
        raise over_max_bytes(shown, f"is {listed} bytes", max_bytes)
    name = shown.rsplit("/", 1)[-1]
    with progress_bar(progress, f"download {name}", listed) as bar:
        digest = _copy_object(where, where.path, int(listed), create_part(part), bar.advance)
    return digest, int(listed)


def _copy_object(
    where: Location, path: str, size: int, fd: int, advance: Callable[[int], object]
) -> str:
    """:meth:`~h5forge.location.Location.download` of object ``path``: its sha256; a store
    with more or fewer bytes than it lists is refused as unsafe."""
    try:
        return where.download(fd, path=path, size=size, advance=advance)
    except IntegrityError as e:
        raise UnsafeArchiveError(str(e)) from e


def copy_prefix(
    where: Location,
    target: Path,
    shown: str,
    max_members: int,
    max_bytes: int,
    workers: int,
    progress: bool,
) -> None:
    base = where.path.rstrip("/")
    found = where.ask("its listing", "find", base, detail=True, listed=max_members)
    with exclusive(target):  # writers of ``target`` take turns; leftovers of dead ones go
        check_dest(target)
        staging = new_staging(target)
        try:
            jobs, total = _plan_copy(base, found, staging, shown, max_members, max_bytes)
            _copy_all(where, jobs, found, workers, progress_bar(progress, f"copy {shown}", total))
            write_marker(staging, shown, "")
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
    where: Location,
    jobs: list[tuple[str, Path]],
    found: dict[str, Any],
    workers: int,
    bar_cm: Any,
) -> None:
    """Copy ``jobs`` (each its listed size) with at most ``workers`` in flight; the first
    failure cancels the rest."""

    def copy(key: str, local: Path) -> None:
        size = int(found[key].get("size") or 0)
        _copy_object(where, key, size, create_exclusive(local, 0o666), lambda n: None)

    with bar_cm as bar, ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(copy, key, local): key for key, local in jobs}
        try:
            for done in as_completed(futures):
                done.result()
                bar.advance(int(found[futures[done]].get("size") or 0))
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise
