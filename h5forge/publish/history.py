"""The versions an asset holds under ``BASE/v/``, retention, and the shards they keep.

A listing of a bucket is untrusted input: an entry counts as a version of the asset only when
its folder is named by 16 hex digits and holds ``NAME.h5.manifest.json``, an h5forge sidecar
whose sha256 starts with that name (what :func:`h5forge.publish.release.publish_version`
writes), or, a sharded version, ``NAME.version.json``, a version manifest whose bytes hash to
a sha256 that starts with that name (:mod:`h5forge.publish.manifest`). Anything else is
skipped and counted, never trusted and never deleted.

Shards (``BASE/shards/<sha256>.h5``) are shared by versions, so retention removes a sharded
version's folder only, and :func:`collect_shards` then deletes the shard files that no version
still listed references and that are older than ``min_age_s`` (a publish in flight may have
just uploaded one it is about to reference); docs/versions.md gives the rule and why no
publish can commit a version that names a deleted shard.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import os
import posixpath
import re
from dataclasses import dataclass, field
from typing import Any

from h5forge.location import Location
from h5forge.publish.manifest import (
    MANIFEST_SUFFIX,
    SHARDS_DIR,
    VersionManifest,
    load_manifest,
    shard_key,
)
from h5forge.publish.sidecar import SIDECAR_SUFFIX, load_sidecar
from h5forge.publish.versions import (
    KEY_HEX,
    MAX_SHARD_FILES,
    MAX_VERSIONS,
    asset_base,
    asset_lock,
    check_tree,
    check_version_tree,
    read_pointer,
    version_url,
)
from h5forge.redact import redact_url

__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "DEFAULT_MIN_AGE_S",
    "DEFAULT_SHARD_MIN_AGE_S",
    "MAX_SHARD_FILES",
    "MAX_VERSIONS",
    "VersionInfo",
    "VersionScan",
    "apply_retention",
    "check_retention",
    "collect_shards",
    "list_versions",
    "scan_versions",
]

log = logging.getLogger(__name__)

_KEY = re.compile(rf"[0-9a-f]{{{KEY_HEX}}}")  # fullmatch: no "...\n"
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHARD_FILE = re.compile(r"([0-9a-f]{64})\.h5")


@dataclass(frozen=True)
class VersionInfo:
    """One version of an asset, as its sidecar (or, sharded, its manifest) describes it.

    Attributes:
        sha256: the file's (sharded: the manifest's) full sha256 (hex).
        version: its key, the first 16 hex digits of ``sha256``.
        url: the version's file, or its manifest (redacted).
        bytes: the file's size; sharded, the total size of its shards.
        created_at: when its sidecar (or manifest) was written (ISO 8601, UTC).
        parent: the sha256 of the version that was latest when it was published, "" for none.
        latest: the asset's pointer names this version.
        num_samples: samples in the version, when its sidecar records them.
        kind: ``"file"`` or ``"sharded"``.
        shards: the shards a sharded version lists (None for a file).
    """

    sha256: str
    version: str
    url: str
    bytes: int
    created_at: str
    parent: str
    latest: bool
    num_samples: int | None = None
    kind: str = "file"
    shards: int | None = None


@dataclass(frozen=True)
class VersionScan:
    """What ``BASE/v/`` holds: the versions (oldest first), how many entries were skipped,
    each sharded version's manifest (by its full sha256), and the keys of the skipped entries
    that hold a manifest h5forge cannot take (damaged, or of another asset)."""

    versions: list[VersionInfo]
    skipped: int
    manifests: dict[str, VersionManifest] = field(default_factory=dict)
    damaged: tuple[str, ...] = ()


def scan_versions(asset: Location) -> VersionScan:
    """Read the sidecar of every version under ``BASE/v/``; see :func:`list_versions`."""
    base = asset_base(asset.url)
    name = posixpath.basename(base)
    check_tree(asset.with_url(base), "v")
    versions = asset.with_url(base).join("v")
    fs, vpath = versions.fs, versions.path
    fs.invalidate_cache(vpath)
    try:
        entries = versions.ask("its listing", "ls", vpath, detail=True, listed=MAX_VERSIONS)
    except (FileNotFoundError, NotADirectoryError):
        entries = []
    if len(entries) > MAX_VERSIONS:
        raise ValueError(
            f"{redact_url(base)}/v holds {len(entries)} entries, over {MAX_VERSIONS}: not an "
            "h5forge asset's versions (retention keeps a few); list or clean it by hand"
        )
    pointer = read_pointer(asset.with_url(base))
    latest = pointer.sha256 if pointer else ""
    found: list[tuple[dt.datetime, VersionInfo]] = []
    manifests: dict[str, VersionManifest] = {}
    damaged: list[str] = []
    skipped = 0
    for entry in entries:
        key = posixpath.basename(str(entry.get("name", "")).rstrip("/"))
        info = None
        if _KEY.fullmatch(key) and entry.get("type") == "directory" and not entry.get("islink"):
            # The folder's path is recomputed from the key, never taken from the listing.
            where = versions.join(key, f"{name}.h5").sidecar
            info = _read_version(where, base, key, latest)
            if info is None:  # no sidecar: a sharded version, or not a version
                check_version_tree(asset, key, "sharded")  # never read through a link
                sharded = _read_sharded(versions.join(key, name + MANIFEST_SUFFIX), base, key)
                if isinstance(sharded, str):
                    damaged.append(key)
                elif sharded is not None:
                    order, manifest, sha = sharded
                    manifests[sha] = manifest
                    info = order, _sharded_info(manifest, sha, base, key, latest)
        if info is None:
            skipped += 1
            log.warning("%s/v: skipped %r, not a version h5forge wrote", redact_url(base), key)
        else:
            found.append(info)
    return VersionScan([v for _, v in _ordered(found)], skipped, manifests, tuple(damaged))


def _read_sharded(
    where: Location, base: str, key: str
) -> tuple[dt.datetime, VersionManifest, str] | str | None:
    """The sharded version whose manifest is at ``where``; None when there is no manifest,
    ``"damaged"`` when there is one that is not ours (malformed, of another asset, without
    its time, or its bytes do not hash to its key)."""
    try:
        manifest, sha = load_manifest(where, key)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (IsADirectoryError, ValueError):  # IntegrityError (another hash) is one too
        return "damaged"
    created = _when(manifest.created_at)
    if created is None or manifest.name != posixpath.basename(base):
        return "damaged"
    return created, manifest, sha


def _sharded_info(
    manifest: VersionManifest, sha: str, base: str, key: str, latest: str
) -> VersionInfo:
    created = _when(manifest.created_at)
    assert created is not None  # _read_sharded returns only manifests with a time
    return VersionInfo(
        sha256=sha,
        version=key,
        url=redact_url(version_url(base, sha, "sharded")),
        bytes=sum(s.bytes for s in manifest.shards),
        created_at=created.isoformat(),
        parent=manifest.parent,
        latest=sha == latest,
        num_samples=manifest.num_samples,
        kind="sharded",
        shards=len(manifest.shards),
    )


def _read_version(
    where: Location, base: str, key: str, latest: str
) -> tuple[dt.datetime, VersionInfo] | None:
    """The version whose sidecar is at ``where``, or None when it is not one of ours."""
    try:
        sidecar = load_sidecar(where)
    except (ValueError, NotADirectoryError, IsADirectoryError):
        return None
    if sidecar is None or not sidecar["sha256"].startswith(key):
        return None
    created = _when(sidecar.get("created_at"))
    if created is None:
        return None
    # When publish_version published it (microseconds), else the sidecar's time (seconds).
    order = _when(sidecar.get("published_at")) or created
    parent = sidecar.get("parent", "")
    samples = sidecar.get("num_samples")
    sha = sidecar["sha256"]
    return order, VersionInfo(
        sha256=sha,
        version=key,
        url=redact_url(version_url(base, sha)),
        bytes=sidecar["bytes"],
        created_at=created.isoformat(),
        parent=parent if isinstance(parent, str) and _SHA256.fullmatch(parent) else "",
        latest=sha == latest,
        num_samples=samples if isinstance(samples, int) and not isinstance(samples, bool) else None,
    )


def _when(value: Any) -> dt.datetime | None:
    """An ISO 8601 time with its timezone, or None."""
    try:
        when = dt.datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return when if when is not None and when.tzinfo is not None else None


def _ordered(found: list[tuple[dt.datetime, VersionInfo]]) -> list[tuple[dt.datetime, VersionInfo]]:
    """Oldest first; versions written in the same second are ordered by their lineage."""
    by_sha = {v.sha256: v for _, v in found}

    def depth(v: VersionInfo) -> int:
        seen = {v.sha256}
        n = 0
        while v.parent in by_sha and v.parent not in seen:  # a cycle ends the walk
            v = by_sha[v.parent]
            seen.add(v.sha256)
            n += 1
        return n

    return sorted(found, key=lambda item: (item[0], depth(item[1]), item[1].sha256))


def list_versions(asset: Location) -> list[VersionInfo]:
    """The versions of the asset at ``asset`` (``BASE`` or ``BASE.h5``), oldest first.

    Entries under ``BASE/v/`` that are not versions h5forge wrote (a folder not named by 16
    hex digits, no sidecar, a sidecar of another format or whose sha256 does not start with
    the folder's name) are skipped; :func:`scan_versions` counts them.

    Raises:
        ValueError: ``BASE/v/`` holds more than 10,000 entries, or the pointer is not one.
    """
    return scan_versions(asset).versions


#: Versions a versioned build keeps by default.
DEFAULT_KEEP_VERSIONS = 5
#: One day: a training run that resolved ``latest`` up to a day ago still finds its version,
#: however often the source-changed trigger builds.
DEFAULT_MIN_AGE_S = 86_400.0
#: One day: a shard no version references is deleted only once it is this old, so that a
#: publish in flight (its shards uploaded, its manifest not yet written) keeps the shards it is
#: about to reference; it must exceed the longest publish, from its first shard upload to its
#: pointer, plus one garbage collection (docs/versions.md, "Shards and garbage collection").
DEFAULT_SHARD_MIN_AGE_S = 86_400.0


def check_retention(keep_versions: int, min_age_s: float) -> None:
    """Raise ValueError unless ``keep_versions`` >= 1 and ``min_age_s`` is finite and >= 0."""
    if isinstance(keep_versions, bool) or not isinstance(keep_versions, int) or keep_versions < 1:
        raise ValueError(
            f"keep_versions={keep_versions!r} must be an integer >= 1: the latest version is "
            "always kept"
        )
    if (
        isinstance(min_age_s, bool)
        or not isinstance(min_age_s, (int, float))
        or not math.isfinite(min_age_s)
        or min_age_s < 0
    ):
        raise ValueError(f"min_age_s={min_age_s!r} must be a finite number of seconds >= 0")


def apply_retention(
    asset: Location,
    *,
    keep_versions: int = 5,
    min_age_s: float = 0.0,
    now: dt.datetime | None = None,
    shard_min_age_s: float = DEFAULT_SHARD_MIN_AGE_S,
) -> list[str]:
    """Remove all but the newest ``keep_versions`` versions of the asset at ``asset``; then,
    when it has sharded versions, the shards no version left references
    (:func:`collect_shards`, with ``shard_min_age_s``).

    Never removes the version the pointer names, one younger than ``min_age_s`` seconds, or
    anything :func:`list_versions` does not recognise. Each version goes sidecar first, then
    its preview and its sources map, then its file, so no reader pairs a sidecar with a missing
    file; a sharded version goes manifest first, then what its folder holds beside it.

    Args:
        now: the time ages are measured at (timezone-aware; default: now, UTC).
        shard_min_age_s: shards younger than this are never deleted (a publish in flight may
            be about to reference them).

    Returns:
        The removed versions' file (or manifest) URLs (redacted), oldest first.

    Raises:
        ValueError: an argument is invalid, or the listing or the pointer is not trusted.
        UnsafePathError: on a local store, a link in the asset's tree.
    """
    from h5forge.publish.lineage import SOURCES_SUFFIX
    from h5forge.publish.preview import PREVIEW_SUFFIX  # imports Pillow: only when deleting

    check_retention(keep_versions, min_age_s)
    _check_shard_age(shard_min_age_s, "shard_min_age_s")
    now = _checked_now(now)
    base = asset_base(asset.url)
    name = posixpath.basename(base)
    versions = list_versions(asset.with_url(base))
    folder_of_versions = asset.with_url(base).join("v")
    fs, vpath = folder_of_versions.fs, folder_of_versions.path
    removed = []
    for v in versions[: max(0, len(versions) - keep_versions)]:
        age = (now - dt.datetime.fromisoformat(v.created_at)).total_seconds()
        if v.latest or age < min_age_s:
            continue
        check_tree(asset.with_url(base), "v", v.version)  # never delete through a link
        folder = f"{vpath}/{v.version}"
        file = f"{folder}/{name}.h5"
        if v.kind == "sharded":
            paths = _beside_manifest(folder_of_versions.join(v.version), name)
        else:
            paths = [file + SIDECAR_SUFFIX, file + PREVIEW_SUFFIX, file + SOURCES_SUFFIX, file]
        for path in paths:
            # A preview and a sources map are optional; a file already gone is what we wanted.
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)
        fs.invalidate_cache(folder)
        if folder_of_versions.is_local and not fs.ls(folder):
            fs.rmdir(folder)
        log.info("retention removed %s (created %s)", v.url, v.created_at)
        removed.append(v.url)
    if any(v.kind == "sharded" for v in versions):
        collect_shards(asset, min_age_s=shard_min_age_s, now=now)
    return removed


def _beside_manifest(version: Location, name: str) -> list[str]:
    """What a sharded version's folder holds, manifest first (the version is gone once it is):
    the files named ``NAME.*`` (its sources map, its preview), never anything else."""
    folder = version.path
    manifest = f"{folder}/{name}{MANIFEST_SUFFIX}"
    version.fs.invalidate_cache(folder)
    try:
        entries = version.ask("its listing", "ls", folder, detail=True, listed=MAX_VERSIONS)
        entries = entries[:MAX_VERSIONS]
    except (FileNotFoundError, NotADirectoryError):
        entries = []
    beside = sorted(
        f"{folder}/{base}"
        for e in entries
        if e.get("type") == "file"
        and (base := posixpath.basename(str(e.get("name", ""))))
        and base.startswith(f"{name}.")
        and base != f"{name}{MANIFEST_SUFFIX}"
    )
    return [manifest, *beside]


def collect_shards(
    asset: Location,
    *,
    min_age_s: float = DEFAULT_SHARD_MIN_AGE_S,
    now: dt.datetime | None = None,
) -> list[str]:
    """Delete the shard files under ``BASE/shards/`` that no version of the asset references
    and that are at least ``min_age_s`` seconds old (by their last-modified time).

    The versions are listed (and their manifests read) before the shards are, by a scan no
    commit overlapped (the pointer is the same before and after it, else it is scanned
    again): a version committed later references either shards its parent, the latest,
    references, which the scan kept, or shards its publish wrote, which are younger than
    ``min_age_s`` (docs/versions.md, "Shards and garbage collection"). A shard's age is read
    from the listing and again just before it is deleted (a publish may have uploaded it again
    in between). On a local store all of it runs under the asset's lock, which a publish holds
    from its uploads to its pointer. Nothing is deleted while ``BASE/v/`` holds a damaged
    manifest (its version could need its shards); only files named ``<sha256>.h5`` are ever
    deleted.

    Returns:
        The deleted shards' URLs (redacted).

    Raises:
        ValueError: ``min_age_s`` or ``now`` is invalid; more than :data:`MAX_SHARD_FILES`
            entries under ``BASE/shards/``; the listing or the pointer is not trusted.
        UnsafePathError: on a local store, ``BASE/shards`` or a shard to delete is a link.
    """
    _check_shard_age(min_age_s, "min_age_s")
    now = _checked_now(now)
    base = asset_base(asset.url)
    root = asset.with_url(base)
    check_tree(root, SHARDS_DIR)
    if root.is_local and not os.path.isdir(root.path):
        return []  # no asset here: nothing to collect (and no folder made for the lock)
    with asset_lock(root):  # a local publish uploads and commits under it: never in between
        referenced = _referenced(root)  # first: what is kept (see above)
        if referenced is None:
            return []
        return _sweep(root, referenced, min_age_s, now)


def _sweep(root: Location, referenced: set[str], min_age_s: float, now: dt.datetime) -> list[str]:
    """Delete the files ``<sha256>.h5`` under ``root/shards/`` that are not ``referenced`` and
    at least ``min_age_s`` old at ``now``, by the listing's time and again by a fresh look just
    before each delete (a publish may have uploaded it again since the listing)."""
    shards = root.join(SHARDS_DIR)
    fs = shards.fs
    fs.invalidate_cache(shards.path)
    try:
        entries = shards.ask("its listing", "ls", shards.path, detail=True, listed=MAX_SHARD_FILES)
    except (FileNotFoundError, NotADirectoryError):
        return []
    if len(entries) > MAX_SHARD_FILES:
        raise ValueError(
            f"{redact_url(root.url)}/{SHARDS_DIR} holds {len(entries)} entries, over "
            f"{MAX_SHARD_FILES}: not an h5forge asset's shards; clean it by hand"
        )

    def old(entry: dict[str, Any]) -> bool:  # undated, or young: a publish may reference it
        when = _modified(entry)
        return when is not None and (now - when).total_seconds() >= min_age_s

    removed = []
    for entry in entries:
        fname = posixpath.basename(str(entry.get("name", "")).rstrip("/"))
        named = _SHARD_FILE.fullmatch(fname)
        if named is None or entry.get("type") != "file" or named.group(1) in referenced:
            continue
        if not old(entry):
            continue
        check_tree(root, SHARDS_DIR, fname)  # a link is refused, never followed
        path = f"{shards.path}/{fname}"
        fs.invalidate_cache(path)
        try:
            if not old(shards.ask("its details", "info", path)):
                continue  # uploaded again since the listing
            fs.rm_file(path)
        except FileNotFoundError:
            continue
        url = redact_url(f"{root.url}/{shard_key(named.group(1))}")
        log.info("garbage collection removed %s", url)
        removed.append(url)
    fs.invalidate_cache(shards.path)
    return removed


def _referenced(root: Location) -> set[str] | None:
    """The sha256 of every shard a version of the asset at ``root`` references, from a scan
    that no commit overlapped (the pointer read before and after it is the same); None, with
    a warning, when none could be had or an entry under ``v/`` holds a damaged manifest."""
    shown = redact_url(root.url)
    for _ in range(_SCAN_TRIES):
        before = read_pointer(root)
        scan = scan_versions(root)
        if scan.damaged:
            log.warning(
                "%s: no shard deleted: v/%s holds a version manifest h5forge cannot read (its "
                "version could need shards); remove that folder, or publish the version again",
                shown,
                scan.damaged[0],
            )
            return None
        after = read_pointer(root)
        if before != after:
            continue  # a version was committed meanwhile: scan again
        if after is not None and after.kind == "sharded" and after.sha256 not in scan.manifests:
            break  # the latest version is not readable: delete nothing
        return {s.sha256 for m in scan.manifests.values() for s in m.shards}
    log.warning(
        "%s: no shard deleted: the versions kept changing while they were listed (or the "
        "latest could not be read); the next garbage collection tries again",
        shown,
    )
    return None


_SCAN_TRIES = 3


def _modified(entry: dict[str, Any]) -> dt.datetime | None:
    """A listing entry's last-modified time (local ``mtime``, S3 ``LastModified``, GCS
    ``updated``), or None when it has none."""
    value = next((entry[k] for k in ("mtime", "LastModified", "updated") if k in entry), None)
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and math.isfinite(value):
        return dt.datetime.fromtimestamp(value, dt.timezone.utc)
    if isinstance(value, dt.datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=dt.timezone.utc)
    return _when(value.replace("Z", "+00:00")) if isinstance(value, str) else None


def _check_shard_age(seconds: float, name: str) -> None:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
    ):
        raise ValueError(
            f"{name}={seconds!r} must be a finite number of seconds >= 0: shards younger than "
            "that are kept (a publish in flight may be about to reference them)"
        )


def _checked_now(now: dt.datetime | None) -> dt.datetime:
    if now is None:
        return dt.datetime.now(dt.timezone.utc)
    if now.tzinfo is None:
        raise ValueError(f"now={now!r} must be timezone-aware (e.g. datetime.now(timezone.utc))")
    return now
