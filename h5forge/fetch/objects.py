"""Copying from an fsspec object store: one object to a local file, or a whole prefix.

One object is streamed in large sequential reads, hashed as it arrives and capped at
``max_bytes`` whatever its listed size says. A prefix is planned first (every key checked as a
relative path, the caps applied), then copied into a staging folder with bounded concurrency
and renamed into place under the destination's lock (:func:`h5forge.fetch.staging.exclusive`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from h5forge.errors import UnsafeArchiveError
from h5forge.fetch.body import over_max_bytes
from h5forge.fetch.cache import create_part
from h5forge.fetch.dest import check_dest, write_marker
from h5forge.fetch.staging import commit, discard, exclusive, new_staging
from h5forge.location import CHUNK
from h5forge.paths import split_member_name
from h5forge.progress import progress_bar

__all__ = ["copy_prefix", "stream_object"]

log = logging.getLogger("h5forge.fetch.sources")


def stream_object(
    fs: Any, path: str, part: Path, shown: str, progress: bool, max_bytes: int
) -> tuple[str, int]:
    """Copy one remote object to the new file ``part`` in large sequential reads, hashing.

    At most ``max_bytes`` are read whatever the listed size says (a store can list one size
    and serve another); ``part`` is created exclusively, never through a link.
    """
    listed = fs.size(path)
    if listed is not None and listed > max_bytes:
        raise over_max_bytes(shown, f"is {listed} bytes", max_bytes)
    digest, size = hashlib.sha256(), 0
    with (
        progress_bar(progress, f"download {shown.rsplit('/', 1)[-1]}", listed) as bar,
        fs.open(path, "rb", block_size=CHUNK) as src,
        os.fdopen(create_part(part), "wb") as out,
    ):
        while block := src.read(min(CHUNK, max_bytes + 1 - size)):
            if size + len(block) > max_bytes:
                raise over_max_bytes(shown, f"sent more than {max_bytes} bytes", max_bytes)
            out.write(block)
            digest.update(block)
            size += len(block)
            bar.advance(len(block))
    return digest.hexdigest(), size


def copy_prefix(
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
        check_dest(target)
        staging = new_staging(target)
        try:
            jobs, total = _plan_copy(base, found, staging, shown, max_members, max_bytes)
            _copy_all(fs, jobs, found, workers, progress_bar(progress, f"copy {shown}", total))
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
