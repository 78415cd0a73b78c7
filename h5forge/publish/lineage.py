"""What a versioned build compares before it fetches, and what it records about its parent.

Before fetching, :func:`build_basis` takes the source's fingerprint
(:func:`h5forge.fetch.fingerprint.source_fingerprint`) and reads the asset's latest version's
sidecar. When both the fingerprint digest and the pack configuration's sha256 equal what that
sidecar records (``source_fingerprint``, ``config_sha256``), the build has nothing to do.
Otherwise the new version records them, its ``parent``, the ``changes`` of the source since
the parent (from the parent's ``NAME.h5.sources.json``, the per-file map) and the flow run.

The pointer, the sidecar and the sources map are untrusted input: the version they name is
recomputed from the asset's base (:func:`h5forge.publish.versions.read_pointer`), and the map
is size-bounded and type-checked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from h5forge.asset import format as fmt
from h5forge.fetch.fingerprint import SourceFingerprint, source_fingerprint
from h5forge.files import create_exclusive
from h5forge.location import MAX_LINEAGE_BYTES, Location
from h5forge.pack.reuse import Reuse, unchanged_paths
from h5forge.publish.sidecar import load_sidecar
from h5forge.publish.versions import read_pointer

__all__ = [
    "reuse_previous",
    "sharded_fields",
    "SOURCES_SUFFIX",
    "Basis",
    "build_basis",
    "count_changes",
    "read_sources",
    "sources_url",
    "write_sources",
]

log = logging.getLogger(__name__)

SOURCES_SUFFIX = ".sources.json"
SOURCES_FORMAT = "h5forge-sources"


@dataclass(frozen=True)
class Basis:
    """What a versioned build is based on.

    Attributes:
        fingerprint: the source's, None when it has no cheap one (then the build builds).
        config_sha256: :meth:`h5forge.pack.config.PackConfig.sha256` of this build.
        latest_url: the latest version's file URL ("" when the asset has no version).
        latest_sha256: its sha256 ("" when none).
        latest: its sidecar ({} when none).
    """

    fingerprint: SourceFingerprint | None
    config_sha256: str
    latest_url: str
    latest_sha256: str
    latest: Mapping[str, Any]

    @property
    def unchanged(self) -> bool:
        """The latest version was built from this very source and configuration."""
        return (
            self.fingerprint is not None
            and bool(self.latest_sha256)
            and self.latest.get("source_fingerprint") == self.fingerprint.digest
            and self.latest.get("config_sha256") == self.config_sha256
        )

    def sidecar_fields(self, lineage: Mapping[str, str]) -> dict[str, Any]:
        """The new version's sidecar fields: what the next build compares, and ``lineage``
        (from :meth:`lineage`) with its ``changes`` as an object."""
        fields: dict[str, Any] = {
            "source_fingerprint": lineage[fmt.A_SOURCE_FINGERPRINT],
            "config_sha256": self.config_sha256,
            "flow_run_id": lineage[fmt.A_FLOW_RUN_ID],
        }
        if fmt.A_CHANGES_JSON in lineage:
            fields["changes"] = json.loads(lineage[fmt.A_CHANGES_JSON])
        return fields

    def lineage(self, flow_run_id: str = "", *, asset: Location) -> dict[str, str]:
        """The new version's lineage, as root attributes (:func:`check_lineage` keys).

        ``changes_json`` is there when both this source's and the parent's per-file maps are
        known (the parent's is read from the store of ``asset``, the asset being built).
        """
        found = {
            fmt.A_PARENT_SHA256: self.latest_sha256,
            fmt.A_SOURCE_FINGERPRINT: self.fingerprint.digest if self.fingerprint else "",
            fmt.A_FLOW_RUN_ID: flow_run_id,
        }
        if self.fingerprint is not None and self.latest_url:
            old = read_sources(asset.with_url(self.latest_url))
            if old is not None:
                changes = count_changes(old, self.fingerprint.files)
                found[fmt.A_CHANGES_JSON] = json.dumps(changes, sort_keys=True)
        return found


def build_basis(
    source: Location,
    asset: Location,
    *,
    config_sha256: str,
    sha256: str | None = None,
) -> Basis:
    """Fingerprint ``source`` and read the latest version of ``asset`` (``BASE`` or ``BASE.h5``).

    Raises:
        ValueError: the pointer or the latest version's sidecar is not h5forge's, or the
            sidecar's sha256 is not the one the pointer names.
        FileNotFoundError: nothing exists at ``source``.
    """
    fingerprint = source_fingerprint(source, sha256=sha256)
    pointer = read_pointer(asset)
    latest: dict[str, Any] = {}
    if pointer is not None and pointer.kind == "sharded":
        latest = sharded_fields(asset.with_url(pointer.url), pointer.sha256)
    elif pointer is not None:
        target = asset.with_url(pointer.url).sidecar
        latest = load_sidecar(target) or {}
        if latest and latest["sha256"] != pointer.sha256:
            raise ValueError(
                f"{target} records sha256 {latest['sha256']}, but the pointer "
                f"names {pointer.sha256}: not the version's own sidecar; publish again"
            )
    return Basis(
        fingerprint=fingerprint,
        config_sha256=config_sha256,
        latest_url=pointer.url if pointer is not None and latest else "",
        latest_sha256=pointer.sha256 if pointer is not None and latest else "",
        latest=latest,
    )


def sharded_fields(manifest: Location, sha256: str) -> dict[str, Any]:
    """What a sidecar says of a single-file version, from a sharded version's manifest (its
    sha256 checked): what the next build compares, and what an unchanged run reports."""
    from h5forge.publish.manifest import read_manifest

    m = read_manifest(manifest, sha256)
    return {
        "sha256": sha256,
        "bytes": sum(e.bytes for e in m.shards),
        "source_fingerprint": m.source_fingerprint,
        "config_sha256": m.config_sha256,
        "num_samples": m.num_samples,
        "num_classes": len(m.classes),
        "shards": len(m.shards),
    }


def sources_url(version_file: str) -> str:
    """``NAME.h5.sources.json`` beside the version's file."""
    return version_file + SOURCES_SUFFIX


def count_changes(old: Mapping[str, str], new: Mapping[str, str]) -> dict[str, int]:
    """``{added, removed, replaced}``: files of ``new`` not in ``old``, the reverse, and
    files in both whose token differs."""
    both = old.keys() & new.keys()
    return {
        "added": len(new.keys() - old.keys()),
        "removed": len(old.keys() - new.keys()),
        "replaced": sum(1 for k in both if old[k] != new[k]),
    }


def write_sources(version_file: Location, files: Mapping[str, str]) -> bool:
    """Write the per-file map beside ``version_file``; False (nothing written) when it would be
    over :data:`h5forge.location.MAX_LINEAGE_BYTES`."""
    body = {"format": SOURCES_FORMAT, "format_version": 1, "files": dict(files)}
    data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    if len(data) > MAX_LINEAGE_BYTES:
        log.info("sources map of %d bytes is over %d: not written", len(data), MAX_LINEAGE_BYTES)
        return False
    version_file.with_url(sources_url(version_file.url)).put(data=data)
    return True


def read_sources(version_file: Location) -> dict[str, str] | None:
    """The per-file map beside ``version_file``; None when it has none.

    Raises:
        ValueError: it is over :data:`h5forge.location.MAX_LINEAGE_BYTES`, not JSON, or not a
            map of strings.
    """
    target = version_file.with_url(sources_url(version_file.url))
    shown = str(target)
    try:
        body = target.read_json(limit=MAX_LINEAGE_BYTES, what="lineage")
    except FileNotFoundError:
        return None
    files = body.get("files") if isinstance(body, dict) else None
    if (
        not isinstance(body, dict)
        or body.get("format") != SOURCES_FORMAT
        or not isinstance(files, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ):
        raise ValueError(f"{shown} is not an h5forge sources map (format {SOURCES_FORMAT!r})")
    return files


def reuse_previous(basis: Basis, into: str, *, asset: Location) -> Reuse | None:
    """What this build may take from the latest version of ``asset`` (the asset being built):
    its local file and the unchanged paths.

    None (a full build) when the asset has no version yet, the source has no per-file
    fingerprint, the latest version was packed with another configuration, or it has no
    sources map, or its file is not the one the pointer names (its full sha256 is checked
    before anything is reused; a replaced file is logged and the build builds in full). A
    remote latest version is downloaded to ``into`` (a folder of this run);
    :func:`h5forge.pack.writer.pack` checks it as untrusted before taking a byte from it.
    """
    if not basis.latest_url or basis.fingerprint is None or not basis.fingerprint.files:
        return None
    if basis.latest.get("config_sha256") != basis.config_sha256:
        return None
    latest = asset.with_url(basis.latest_url)
    previous = read_sources(latest)
    unchanged = unchanged_paths(previous or {}, basis.fingerprint.files)
    if not unchanged:
        return None
    if latest.is_local:
        local = latest.path
    else:
        local = f"{into.rstrip('/')}/previous.h5"
        try:  # ranged reads bounded in time, the listed size exactly
            latest.download(create_exclusive(local))
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(local)
            raise
    # Its bytes are taken as they are: they must be the version the pointer names, not another
    # valid asset put under its name (pack checks the file's structure, not which file it is).
    found = Location(local).sha256()
    if found != basis.latest_sha256:
        log.warning(
            "%s has sha256 %s, not %s, the version its pointer names: it was replaced; "
            "nothing is reused from it (a full build). Publish that version again, or delete it",
            latest,
            found,
            basis.latest_sha256,
        )
        return None
    return Reuse(local, frozenset(unchanged))
