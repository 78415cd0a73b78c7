"""Publish a sharded version packed by :mod:`h5forge.publish.sharded`: its new shards, its
sources map, its manifest, and the pointer last; and the library's whole path for a local folder
(:func:`build_sharded_version`).

:func:`publish_sharded` runs under the asset's lock (local stores), refused if the pointer moved
since the build began (on S3 the pointer moves by a conditional PUT, so another host's publish
in between is refused too). New shards are uploaded concurrently and read back; a shard is
skipped only when the parent version (the latest, which retention always keeps, and which the
``based_on`` check pins) references it; any other shard is uploaded even when an object of that
name exists, because retention may be removing an unreferenced one at the same moment
(docs/versions.md). Shards the Dask workers uploaded (``StagedVersion.in_store``) are checked to
be in the store instead.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import hashlib
import logging
import os
import posixpath
import shutil
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from h5forge.errors import BusyError, ChecksumError, IntegrityError
from h5forge.files import fsync_dir, same_file
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.publish.manifest import (
    manifest_bytes,
    read_manifest,
    shard_key,
)
from h5forge.publish.sharded import (
    DEFAULT_MAX_SHARD_SIZE,
    StagedVersion,
    pack_sharded,
    read_previous,
)
from h5forge.publish.versions import (
    KEY_HEX,
    MAX_SHARD_FILES,
    asset_base,
    check_tree,
    guard_pointer,
    pointer_url,
    read_pointer,
    version_url,
    write_pointer,
)
from h5forge.redact import redact_url

__all__ = [
    "ShardedResult",
    "build_sharded_version",
    "publish_sharded",
    "remove_staged",
    "upload_shard",
]

log = logging.getLogger(__name__)
_UPLOADS = 8  # concurrent shard uploads


@dataclass(frozen=True)
class ShardedResult:
    """What :func:`publish_sharded` did. URLs are redacted.

    Attributes:
        url: the version's manifest; pointer_url: the asset's pointer.
        sha256, version: the manifest's sha256 and its first 16 hex digits.
        parent: the version it replaced as latest ("" for the first).
        shards, shards_new, shards_reused: shards the version lists, uploaded by this publish,
            and referenced from earlier versions.
        bytes_new, bytes_reused: their bytes.
        num_samples: the version's samples.
        removed: the versions retention removed.
    """

    url: str
    pointer_url: str
    sha256: str
    version: str
    parent: str
    shards: int
    shards_new: int
    shards_reused: int
    bytes_new: int
    bytes_reused: int
    num_samples: int
    removed: tuple[str, ...] = ()


def publish_sharded(
    staged: StagedVersion,
    asset: Location,
    *,
    fields: Mapping[str, Any] | None = None,
    sources: Mapping[str, str] | None = None,
    based_on: str | None = None,
    keep_versions: int = 5,
    min_age_s: float = 0.0,
) -> ShardedResult:
    """Publish ``staged`` as the latest version of ``asset`` (see the module's doc).

    Args:
        fields: the manifest's run fields: ``source_url``, ``source_sha256``,
            ``source_fingerprint``, ``lineage`` (a map of strings).
        sources: the per-file map of the source, written beside the manifest (what the next
            build compares).
        based_on: the latest version's sha256 when the build began ("" for none): the publish
            is refused if the pointer names another version now.

    Raises:
        BusyError: ``based_on`` is given and the pointer moved.
        ChecksumError: a shard's copy in the store is not the local bytes (it is deleted).
    """
    from h5forge import __version__
    from h5forge.publish.history import apply_retention, check_retention
    from h5forge.publish.lineage import SOURCES_SUFFIX, write_sources
    from h5forge.publish.versions import asset_lock

    check_retention(keep_versions, min_age_s)
    given = dict(fields or {})
    base = asset_base(asset.url)
    home = asset.with_url(base)
    read_pointer(asset)  # checks the URL and the pointer first
    with asset_lock(asset):
        guard = guard_pointer(asset)  # on S3, the pointer moves only if it is still this one
        pointer = guard.pointer
        latest = pointer.sha256 if pointer is not None else ""
        if based_on is not None and latest != based_on:
            raise BusyError(
                f"{redact_url(pointer_url(base))} moved to version {latest[:KEY_HEX] or 'none'} "
                f"while this build ran (it was based on {based_on[:KEY_HEX] or 'no version'}): "
                "another build published meanwhile; nothing was published, run it again"
            )
        check_tree(home, "shards")
        reused = staged.parent_shards if latest == staged.parent else frozenset()
        todo = [(sha, path) for sha, path in staged.new.items() if sha not in reused]
        placed = _check_in_store(home, staged, reused)
        if todo:
            home.join("shards").fs.makedirs(home.join("shards").path, exist_ok=True)
            with ThreadPoolExecutor(min(_UPLOADS, len(todo))) as pool:
                sent = sum(pool.map(lambda item: upload_shard(home, *item), todo))
        else:
            sent = 0
        sent += sum(placed.values())
        lineage = given.get("lineage") or {}
        manifest = replace(
            staged.manifest,
            source_url=str(given.get("source_url", "")),
            source_sha256=str(given.get("source_sha256", "")),
            source_fingerprint=str(given.get("source_fingerprint", "")),
            created_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds"),
            h5forge_version=__version__,
            parent=latest,
            lineage={str(k): str(v) for k, v in dict(lineage).items()},
        )
        data = manifest_bytes(manifest)
        sha = hashlib.sha256(data).hexdigest()
        url = version_url(base, sha, "sharded")
        check_tree(home, *url[len(base) + 1 :].split("/"))
        where = asset.with_url(url)
        if sources:
            write_sources(where, sources)
        where.put(data=data)
        if latest != sha:
            try:
                write_pointer(asset, sha, parent=latest, kind="sharded", guard=guard)
            except BusyError:  # another host moved it: this version is not one, unlist it
                for orphan in (where.url + SOURCES_SUFFIX, where.url):
                    with contextlib.suppress(FileNotFoundError):
                        where.with_url(orphan).fs.rm_file(where.with_url(orphan).path)
                raise
            log.info("%s now names version %s", redact_url(pointer_url(base)), sha[:KEY_HEX])
        removed = apply_retention(asset, keep_versions=keep_versions, min_age_s=min_age_s)
    all_bytes = sum(e.bytes for e in manifest.shards)
    return ShardedResult(
        url=redact_url(url),
        pointer_url=redact_url(pointer_url(base)),
        sha256=sha,
        version=sha[:KEY_HEX],
        parent=latest,
        shards=len(manifest.shards),
        shards_new=len(todo) + len(placed),
        shards_reused=len(manifest.shards) - len(todo) - len(placed),
        bytes_new=sent,
        bytes_reused=all_bytes - sent,
        num_samples=manifest.num_samples,
        removed=tuple(removed),
    )


def upload_shard(home: Location, sha: str, local: str) -> int:
    """Upload the local shard ``local`` (sha256 ``sha``) to ``home/shards/<sha>.h5`` and read
    it back; its size. ``home`` is the asset's base (:func:`~h5forge.publish.versions.asset_base`).

    On a local store on the same file system as ``local`` (a sealed, fsynced shard of this
    build), the shard is hard-linked into place instead (:func:`_link_shard`): its bytes are
    written once, and the stored file is the very inode that was hashed, so there is nothing
    to read back.

    Raises:
        ChecksumError: the stored copy is not the local bytes (it is deleted).
    """
    from h5forge.publish.storage import read_back

    check_tree(home, *shard_key(sha).split("/"))
    target = home.join(*shard_key(sha).split("/"))
    size = os.path.getsize(local)
    if target.is_local and _link_shard(local, target.path):
        return size
    target.put(local=local)
    read_back(target, sha, size)
    return size


def _link_shard(local: str, path: str) -> bool:
    """Hard-link ``local`` at ``path``, exclusively (never over an existing name, never
    through a link); whether it did. False where the store cannot (another file system, no
    hard links) or ``path`` exists (an unreferenced shard retention may be deleting: the
    caller writes it anew, replacing the name)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    try:
        os.link(local, path, follow_symlinks=False)
    except FileExistsError:
        return False
    except OSError as e:
        if e.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EACCES):
            return False
        raise
    if not same_file(os.lstat(path), os.stat(local)):  # pragma: no cover - a race lost
        raise ChecksumError(f"{redact_url(path)} changed while it was linked; publish again", [])
    fsync_dir(folder)  # persist the new name
    return True


def _check_in_store(
    home: Location, staged: StagedVersion, reused: frozenset[str]
) -> dict[str, int]:
    """The bytes of each shard of ``staged.in_store`` that this publish adds (not listed by
    the latest version), after checking that every one is in the store with its size: it
    was uploaded before the lock was taken, and nothing but a kept version protects it.
    One listing of ``shards/`` (a few requests per thousand shards), not a request a shard."""
    if not staged.in_store:
        return {}
    sizes = {e.sha256: e.bytes for e in staged.manifest.shards}
    folder = home.join("shards")
    folder.fs.invalidate_cache(folder.path)
    try:
        listed = folder.ask("its listing", "ls", folder.path, detail=True, listed=MAX_SHARD_FILES)
    except FileNotFoundError:
        listed = []
    found = {posixpath.basename(str(i["name"]).rstrip("/")): i.get("size") for i in listed}
    placed: dict[str, int] = {}
    for sha in sorted(staged.in_store):
        key = shard_key(sha)
        size = found.get(posixpath.basename(key))
        if size != sizes[sha]:
            raise FileNotFoundError(
                f"shard {sha[:KEY_HEX]} of this build is not in the store as uploaded "
                f"({redact_url(str(home.join(*key.split('/'))))}: "
                f"{'missing' if size is None else f'{size} bytes'}, expected {sizes[sha]} "
                "bytes); it was removed after its upload (or the version it was found in is "
                "gone): nothing was published, run the build again"
            )
        if sha not in reused:
            placed[sha] = sizes[sha]
    return placed


def remove_staged(staged: StagedVersion) -> None:
    """Delete the local shards of ``staged`` (once published, or abandoned)."""
    folders = {posixpath.dirname(p) for p in staged.new.values()}
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


def build_sharded_version(
    source: str | os.PathLike[str],
    asset: Location,
    *,
    config: PackConfig | None = None,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    workers: int | None = None,
    max_bad_fraction: float = 0.01,
    keep_versions: int = 5,
    min_age_s: float = 0.0,
    work: str | os.PathLike[str] | None = None,
) -> ShardedResult | None:
    """Build a local ImageFolder (or listing folder) ``source`` as a new sharded version of
    ``asset``, incrementally on its latest sharded version; None when the latest version is
    built from this very source and configuration (nothing is written).

    The library's whole path (the build flow runs the same steps as stages): fingerprint,
    :func:`read_previous`, :func:`pack_sharded` into ``work`` (a temporary folder by default),
    :func:`publish_sharded` based on the latest version seen at the start.
    """
    import tempfile

    from h5forge.discover.catalog import discover
    from h5forge.fetch.fingerprint import source_fingerprint
    from h5forge.pack.reuse import unchanged_paths

    config = PackConfig() if config is None else config
    fingerprint = source_fingerprint(Location.of(source))
    pointer = read_pointer(asset)
    if pointer is not None and pointer.kind == "sharded" and fingerprint is not None:
        # A no-op reads the manifest alone (the shards' indexes only when there is work; a
        # manifest that is not the pointer's is left to read_previous, which says so).
        with contextlib.suppress(IntegrityError):
            latest = read_manifest(asset.with_url(pointer.url), pointer.sha256)
            if (latest.source_fingerprint, latest.config_sha256) == (
                fingerprint.digest,
                config.sha256(),
            ):
                return None
    previous = read_previous(asset, pointer)
    files = dict(fingerprint.files) if fingerprint is not None else {}
    unchanged = (
        frozenset(unchanged_paths(previous.sources or {}, files)) if previous else frozenset()
    )
    catalog = discover(source)
    with tempfile.TemporaryDirectory(dir=work, prefix="h5forge-shards-") as tmp:
        staged = pack_sharded(
            catalog,
            tmp,
            config=config,
            max_shard_size=max_shard_size,
            workers=workers,
            max_bad_fraction=max_bad_fraction,
            previous=previous,
            unchanged=unchanged,
            name=posixpath.basename(asset_base(asset.url)),
        )
        return publish_sharded(
            staged,
            asset,
            fields={
                "source_url": redact_url(str(source)),
                "source_fingerprint": fingerprint.digest if fingerprint else "",
            },
            sources=files or None,
            based_on=pointer.sha256 if pointer is not None else "",
            keep_versions=keep_versions,
            min_age_s=min_age_s,
        )
