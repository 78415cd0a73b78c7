"""The versions an asset holds under ``BASE/v/``, read from their sidecars, and retention.

A listing of a bucket is untrusted input: an entry counts as a version of the asset only when
its folder is named by 16 hex digits and holds ``NAME.h5.manifest.json``, an h5forge sidecar
whose sha256 starts with that name (what :func:`h5forge.publish.release.publish_version`
writes). Anything else is skipped and counted, never trusted and never deleted.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import math
import posixpath
import re
from dataclasses import dataclass
from typing import Any

from h5forge.location import Location
from h5forge.publish.sidecar import SIDECAR_SUFFIX, load_sidecar
from h5forge.publish.versions import (
    KEY_HEX,
    asset_base,
    check_tree,
    read_pointer,
    version_url,
)
from h5forge.redact import redact_url

__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "DEFAULT_MIN_AGE_S",
    "MAX_VERSIONS",
    "VersionInfo",
    "VersionScan",
    "apply_retention",
    "check_retention",
    "list_versions",
    "scan_versions",
]

log = logging.getLogger(__name__)

MAX_VERSIONS = 10_000  # entries under BASE/v/ read at most; more is not an asset we keep
_KEY = re.compile(rf"[0-9a-f]{{{KEY_HEX}}}")  # fullmatch: no "...\n"
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class VersionInfo:
    """One version of an asset, as its sidecar describes it.

    Attributes:
        sha256: the file's full sha256 (hex).
        version: its key, the first 16 hex digits of ``sha256``.
        url: the version's file (redacted).
        bytes: the file's size.
        created_at: when its sidecar was written (ISO 8601, UTC).
        parent: the sha256 of the version that was latest when it was published, "" for none.
        latest: the asset's pointer names this version.
        num_samples: samples in the file, when the sidecar records them.
    """

    sha256: str
    version: str
    url: str
    bytes: int
    created_at: str
    parent: str
    latest: bool
    num_samples: int | None = None


@dataclass(frozen=True)
class VersionScan:
    """What ``BASE/v/`` holds: the versions (oldest first) and how many entries were skipped."""

    versions: list[VersionInfo]
    skipped: int


def scan_versions(asset: Location) -> VersionScan:
    """Read the sidecar of every version under ``BASE/v/``; see :func:`list_versions`."""
    base = asset_base(asset.url)
    name = posixpath.basename(base)
    check_tree(asset.with_url(base), "v")
    versions = asset.with_url(base).join("v")
    fs, vpath = versions.fs, versions.path
    fs.invalidate_cache(vpath)
    try:
        entries = fs.ls(vpath, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        entries = []
    if len(entries) > MAX_VERSIONS:
        raise ValueError(
            f"{redact_url(base)}/v holds {len(entries)} entries, over {MAX_VERSIONS}: not an "
            "h5forge asset's versions (retention keeps a few); list or clean it by hand"
        )
    pointer = read_pointer(asset.with_url(base))
    found: list[tuple[dt.datetime, VersionInfo]] = []
    skipped = 0
    for entry in entries:
        key = posixpath.basename(str(entry.get("name", "")).rstrip("/"))
        info = None
        if _KEY.fullmatch(key) and entry.get("type") == "directory" and not entry.get("islink"):
            # The folder's path is recomputed from the key, never taken from the listing.
            where = versions.join(key, f"{name}.h5").sidecar
            info = _read_version(where, base, key, pointer.sha256 if pointer else "")
        if info is None:
            skipped += 1
            log.warning("%s/v: skipped %r, not a version h5forge wrote", redact_url(base), key)
        else:
            found.append(info)
    return VersionScan([v for _, v in _ordered(found)], skipped)


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
) -> list[str]:
    """Remove all but the newest ``keep_versions`` versions of the asset at ``asset``.

    Never removes the version the pointer names, one younger than ``min_age_s`` seconds, or
    anything :func:`list_versions` does not recognise. Each version goes sidecar first, then
    its preview and its sources map, then its file, so no reader pairs a sidecar with a missing
    file.

    Args:
        now: the time ages are measured at (timezone-aware; default: now, UTC).

    Returns:
        The removed versions' file URLs (redacted), oldest first.

    Raises:
        ValueError: an argument is invalid, or the listing or the pointer is not trusted.
    """
    from h5forge.publish.lineage import SOURCES_SUFFIX
    from h5forge.publish.preview import PREVIEW_SUFFIX  # imports Pillow: only when deleting

    check_retention(keep_versions, min_age_s)
    if now is None:
        now = dt.datetime.now(dt.timezone.utc)
    elif now.tzinfo is None:
        raise ValueError(f"now={now!r} must be timezone-aware (e.g. datetime.now(timezone.utc))")
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
        for path in (file + SIDECAR_SUFFIX, file + PREVIEW_SUFFIX, file + SOURCES_SUFFIX, file):
            # A preview and a sources map are optional; a file already gone is what we wanted.
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(path)
        fs.invalidate_cache(folder)
        if folder_of_versions.is_local and not fs.ls(folder):
            fs.rmdir(folder)
        log.info("retention removed %s (created %s)", v.url, v.created_at)
        removed.append(v.url)
    return removed
