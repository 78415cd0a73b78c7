"""Publish a file as a new immutable version of an asset, then move its pointer, then prune.

:func:`publish_version` is :func:`h5forge.publish.storage.publish` to the version's own key
(``BASE/v/<16 hex of sha256>/NAME.h5``, never over an existing object), then
:func:`h5forge.publish.versions.write_pointer` (last: the commit marker for "latest"), then
:func:`h5forge.publish.history.apply_retention`. A reader that resolved the pointer before the
publish keeps reading its version; nothing it reads is rewritten.

An asset published by the flat layout (``s3://b/NAME.h5`` and its sidecar) is left alone: its
versions go to ``s3://b/NAME/v/...`` and the pointer to ``s3://b/NAME.latest.json`` beside it.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from h5forge.asset import format as fmt
from h5forge.asset.metadata import metadata_sha256
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.errors import BusyError, IntegrityError
from h5forge.location import Location
from h5forge.publish.history import apply_retention, check_retention
from h5forge.publish.sidecar import sidecar_url
from h5forge.publish.storage import publish
from h5forge.publish.versions import (
    KEY_HEX,
    asset_lock,
    check_version_tree,
    guard_pointer,
    pointer_url,
    read_pointer,
    version_url,
    write_pointer,
)
from h5forge.redact import redact_url

__all__ = ["VersionResult", "publish_version"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VersionResult:
    """What :func:`publish_version` did. URLs are redacted.

    Attributes:
        url: the version's file, ``BASE/v/<version>/NAME.h5``.
        sidecar_url: its sidecar.
        pointer_url: the asset's pointer, ``BASE.latest.json``.
        sha256: the file's full sha256 (hex), verified at the destination.
        version: the version's key, the first 16 hex digits of ``sha256``.
        bytes: the file's size.
        parent: the sha256 of the version it replaced as latest ("" for the first).
        unchanged: this version was already published; no object of it was written.
        removed: the versions retention removed (their file URLs, oldest first).
    """

    url: str
    sidecar_url: str
    pointer_url: str
    sha256: str
    version: str
    bytes: int
    parent: str
    unchanged: bool
    removed: tuple[str, ...]


def publish_version(
    local_file: str | os.PathLike[str],
    asset: Location,
    *,
    extra: Mapping[str, Any] | None = None,
    keep_versions: int = 5,
    min_age_s: float = 0.0,
    sha256: str | None = None,
    based_on: str | None = None,
    beside: Callable[[Location], None] | None = None,
) -> VersionResult:
    """Publish ``local_file`` as the latest version of the asset at ``asset``.

    The version's key is derived from the file's sha256. When a version with this sha256 is
    already published (its sidecar says so), nothing of it is written and the pointer is
    only moved to it if it names another version. Otherwise the file is published under its
    key with its sidecar (recording ``parent``, the previous latest's sha256), and the
    pointer is written last. Retention then runs (also when unchanged).

    Args:
        local_file: the finished, sealed file.
        asset: the asset, ``BASE`` or ``BASE.h5`` (its storage options are never recorded).
        extra: more sidecar fields, as for :func:`h5forge.publish.storage.publish`;
            ``parent`` and ``published_at`` are set here and may not be given.
        keep_versions: versions retention keeps (>= 1; the latest is always kept).
        min_age_s: versions younger than this are never removed (a reader may still be on one).
        sha256: ``local_file``'s sha256 when the caller has just computed it (to name the
            version's folder before publishing into it); the file is not hashed again, and the
            copy at the destination is checked against it.
        based_on: the sha256 of the latest version when the build began ("" for none). When
            given, the publish refuses if the pointer has moved to another version since:
            another build published meanwhile (on a local store the check and the publish are
            one step under the asset's lock; on an object store a race remains, which the
            deployment's concurrency limit closes).
        beside: called with the version's file (its location), before the file, unless that
            version is already published: writes what goes beside it (its preview, its sources
            map).

    Raises:
        FileExistsError: the version's key holds different content (the object is left alone).
        ValueError: an argument is invalid, or the pointer is not an h5forge pointer.
        BusyError: ``based_on`` is given and the pointer names another version.
        ChecksumError: the copy at the destination is not the bytes hashed (the file changed
            while it was published, or ``sha256`` is not its digest); the copy is deleted.
        FileNotFoundError: ``local_file`` does not exist.
    """
    local = os.fspath(local_file)
    check_retention(keep_versions, min_age_s)
    if not os.path.isfile(local):
        raise FileNotFoundError(f"local_file {local!r} does not exist or is not a file")
    fields = dict(extra or {})
    reserved = sorted({"parent", "published_at", fmt.A_METADATA_SHA256} & fields.keys())
    if reserved:
        raise ValueError(
            f"extra sets {reserved}, which publish_version records itself (the previous latest "
            "version's sha256, the time of the publish, the file's metadata digest); remove them"
        )
    url = asset.url
    read_pointer(asset)  # checks the URL and the pointer first
    # One local hash names the version and checks its copy: publish() gets it, not recomputes it.
    sha = sha256 if sha256 is not None else Location.of(local).sha256()
    target = version_url(url, sha)
    with asset_lock(asset):
        guard = guard_pointer(asset)  # on S3, the pointer moves only if it is still this one
        pointer = guard.pointer
        if based_on is not None and pointer is not None and sha != pointer.sha256 != based_on:
            raise BusyError(
                f"{redact_url(pointer_url(url))} moved to version {pointer.sha256[:KEY_HEX]} "
                "while this build ran (it was based on "
                f"{based_on[:KEY_HEX] or 'no version'}): another build published meanwhile, and "
                "this one's lineage would be wrong; nothing was published, run it again to "
                "build on the new latest"
            )
        if pointer is None:
            parent = ""
        elif pointer.sha256 == sha:  # latest already names these bytes (its file may be gone)
            parent = pointer.parent
        else:
            parent = pointer.sha256
        version = asset.with_url(target)
        check_version_tree(asset, sha)
        if beside is not None and _unpublished(version):
            beside(version)
        published = publish(
            local,
            version,
            overwrite=False,  # a version's key is never written over
            # created_at has whole seconds; this orders versions published within one.
            extra={**fields, **_metadata(local), "parent": parent, "published_at": _now_us()},
            sha256=sha,
        )
        if pointer is None or pointer.sha256 != sha:
            write_pointer(asset, sha, parent=parent, guard=guard)
            log.info("%s now names version %s", redact_url(pointer_url(url)), sha[:KEY_HEX])
        removed = apply_retention(asset, keep_versions=keep_versions, min_age_s=min_age_s)
    return VersionResult(
        url=published.url,
        sidecar_url=redact_url(sidecar_url(target)),
        pointer_url=redact_url(pointer_url(url)),
        sha256=sha,
        version=sha[:KEY_HEX],
        bytes=published.bytes,
        parent=parent,
        unchanged=published.unchanged,
        removed=tuple(removed),
    )


def _unpublished(version: Location) -> bool:
    """The version at ``version`` has no sidecar yet (what goes beside it may still be written)."""
    sidecar = version.sidecar
    sidecar.fs.invalidate_cache(sidecar.path)
    return not sidecar.ask("whether it exists", "exists", sidecar.path)


def _metadata(local: str) -> dict[str, str]:
    """``{"metadata_sha256": ...}``: the digest of the file's index and attributes, recomputed,
    which a reader compares at open (:func:`h5forge.read.version.check_version_file`); ``{}``
    for a file that is not an h5forge asset."""
    try:
        with open_h5(Location(local)) as h5:
            if fmt.A_METADATA_SHA256 not in h5.attrs:
                return {}
            return {fmt.A_METADATA_SHA256: metadata_sha256(h5)}
    except (OSError, IntegrityError, *H5_DAMAGE):
        return {}


def _now_us() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
