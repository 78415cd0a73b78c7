"""Verify a sharded version: its manifest, then every shard it names, each once.

A sharded version (docs/FORMAT.md, "Sharded versions") is checked in two parts. The manifest:
read bounded, its bytes hashed to the version's sha256, parsed and checked
(:func:`h5forge.publish.manifest.load_manifest`), and named for this asset. Then each distinct
shard, once however many entries (or versions, :func:`verify_versions`) name it: its file is at
the address its sha256 gives (never a link on a local store), its size is the entry's, it passes
every check of :func:`h5forge.verify.checks.verify` (structure, labels, byte ranges, every
chosen sample's digest) and its bytes hash to its address. Then each entry against its shard:
the rows, the sealed ``metadata_sha256``, the label map onto the version's classes by name (no
live row of a class the version lacks), and the live rows per split.

Every failure is collected, one line each, named by the shard's position and address, so one
:class:`~h5forge.errors.IntegrityError` says what is wrong with which shard.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import load_index
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.publish.manifest import (
    MANIFEST_VERSION,
    NOT_IN_VERSION,
    SHARDS_DIR,
    ShardEntry,
    VersionManifest,
    check_labels,
    load_manifest,
)
from h5forge.publish.versions import (
    KEY_HEX,
    asset_base,
    check_tree,
    check_version_tree,
    version_url,
)
from h5forge.redact import redact_url
from h5forge.verify.checks import verify

__all__ = ["ShardCheck", "VersionReport", "verify_version", "verify_versions"]


@dataclass(frozen=True)
class ShardCheck:
    """One shard of a version, as :func:`verify_version` found it.

    Attributes:
        sha256: its address.
        samples: its rows (as the manifest says).
        live: the rows the version reads.
        checked_samples: rows whose digest was recomputed (0 when it was checked earlier in
            the same call, for another entry or version).
        failures: what failed, one line each (empty: it passed).
    """

    sha256: str
    samples: int
    live: int
    checked_samples: int
    failures: tuple[str, ...] = ()


@dataclass(frozen=True)
class VersionReport:
    """The outcome of a successful :func:`verify_version`.

    Attributes:
        path: the version's manifest.
        sha256: the manifest's full sha256 (the version's).
        num_samples, num_classes: what the version reads.
        bytes: the shards' total size.
        checked_samples: digests recomputed, over every shard.
        shared: shards already checked earlier in the same call (not checked again).
        format_version: the manifest's format version.
        shards: each entry's check, in manifest order.
    """

    path: str
    sha256: str
    num_samples: int
    num_classes: int
    bytes: int
    checked_samples: int
    seconds: float
    format_version: int
    shared: int = 0
    shards: tuple[ShardCheck, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class _Shard:
    """What one shard file holds, read once: its failures, or its index for the entries."""

    failures: tuple[str, ...]
    checked: int
    samples: int = -1
    metadata_sha256: str = ""
    classes: tuple[str, ...] = ()
    labels: np.ndarray | None = None
    split_codes: np.ndarray | None = None
    split_names: tuple[str, ...] = ()


def verify_version(
    asset: Location,
    sha256: str,
    *,
    sample_fraction: float = 1.0,
    seed: int = 0,
    max_pixels: int = DEFAULT_MAX_PIXELS,
    checked: dict[str, Any] | None = None,
) -> VersionReport:
    """Verify the sharded version ``sha256`` (its full sha256 or a prefix of 16+ hex digits) of
    the asset at ``asset`` (``BASE`` or ``BASE.h5``).

    Args:
        sample_fraction, seed, max_pixels: as :func:`h5forge.verify.checks.verify` takes them,
            for each shard.
        checked: the shards already checked in this call (filled in): a shard shared by
            several versions is checked once (:func:`verify_versions`).

    Raises:
        FileNotFoundError: the version has no manifest.
        UnsafePathError: on a local store, a link in the asset's tree (``BASE/v``, the
            version's folder, ``BASE/shards`` or a shard file).
        IntegrityError: the manifest or a shard failed a check; one line per failure, each
            naming its shard (``shard K (16 hex): ...``).
    """
    t0 = time.perf_counter()
    base = asset_base(asset.url)
    url = version_url(base, sha256, "sharded")
    check_version_tree(asset, sha256, "sharded")
    where = asset.with_url(url)
    try:
        manifest, full = load_manifest(where, sha256)
    except IntegrityError as e:
        raise IntegrityError(f"{where} failed verification", [f"manifest: {e}"]) from e
    except ValueError as e:  # malformed: the version is damaged, not a usage error
        raise IntegrityError(f"{where} failed verification", [f"manifest: {e}"]) from e
    fails = []
    if manifest.name != posixpath.basename(base):
        fails.append(
            f"manifest: it names the asset {manifest.name!r:.80}, not "
            f"{posixpath.basename(base)!r}: it was copied from another asset"
        )
    memo: dict[str, _Shard] = checked if checked is not None else {}
    shards, shared = [], 0
    for k, entry in enumerate(manifest.shards):
        if entry.sha256 in memo:
            shared += 1
            shard, fresh = memo[entry.sha256], 0
        else:
            shard = _check_file(asset.with_url(base), entry, sample_fraction, seed, max_pixels)
            memo[entry.sha256] = shard
            fresh = shard.checked
        lines = [*shard.failures, *_check_entry(entry, shard, manifest)]
        fails.extend(f"shard {k} ({entry.sha256[:KEY_HEX]}): {line}" for line in lines)
        shards.append(ShardCheck(entry.sha256, entry.samples, entry.live, fresh, tuple(lines)))
    if fails:
        bad = sum(1 for s in shards if s.failures)
        raise IntegrityError(
            f"{where} failed verification: {bad} of {len(shards)} shards failed", fails
        )
    return VersionReport(
        path=url,
        sha256=full,
        num_samples=manifest.num_samples,
        num_classes=len(manifest.classes),
        bytes=sum(s.bytes for s in manifest.shards),
        checked_samples=sum(s.checked_samples for s in shards),
        seconds=time.perf_counter() - t0,
        format_version=MANIFEST_VERSION,
        shared=shared,
        shards=tuple(shards),
    )


def verify_versions(
    asset: Location,
    versions: Sequence[str],
    *,
    sample_fraction: float = 1.0,
    seed: int = 0,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> list[VersionReport]:
    """:func:`verify_version` of each of ``versions`` (sha256 prefixes) in turn, each shard
    checked once however many of them name it; stops at the first that fails."""
    checked: dict[str, Any] = {}
    return [
        verify_version(
            asset,
            v,
            sample_fraction=sample_fraction,
            seed=seed,
            max_pixels=max_pixels,
            checked=checked,
        )
        for v in versions
    ]


def _check_file(
    base: Location, entry: ShardEntry, fraction: float, seed: int, max_pixels: int
) -> _Shard:
    """Check the shard file ``entry`` names: where it is, its size, every check of verify,
    its bytes' sha256; then read its index for the entries."""
    name = f"{entry.sha256}.h5"
    check_tree(base, SHARDS_DIR, name)  # never a link, on a local store
    where = base.join(SHARDS_DIR, name)
    shown = redact_url(where.url)
    try:
        size = int(where.fs.size(where.path))
    except FileNotFoundError:
        return _Shard((f"missing: {shown} is not there (deleted, or never uploaded)",), 0)
    fails = []
    if size != entry.bytes:
        fails.append(f"{shown} is {size} bytes, its entry says {entry.bytes}")
    try:
        report = verify(where, sample_fraction=fraction, seed=seed, max_pixels=max_pixels)
    except IntegrityError as e:
        return _Shard((*fails, *(e.failures or [str(e).splitlines()[0]])), 0)
    except FileNotFoundError:
        return _Shard((*fails, f"missing: {shown} went away while it was verified"), 0)
    if report.sha256 != entry.sha256:
        fails.append(
            f"its bytes hash to {report.sha256}, not to its address {entry.sha256}: the file "
            "was replaced or damaged"
        )
    try:
        with open_h5(where) as h5:
            idx = load_index(h5, where=shown)
            meta = str(h5.attrs.get(fmt.A_METADATA_SHA256, ""))
    except (IntegrityError, *H5_DAMAGE) as e:  # replaced since verify read it
        return _Shard((*fails, f"its index cannot be read again: {e}"), report.checked_samples)
    return _Shard(
        tuple(fails),
        report.checked_samples,
        samples=idx.header.num_samples,
        metadata_sha256=meta,
        classes=tuple(idx.classes),
        labels=np.asarray(idx.labels),
        split_codes=np.asarray(idx.split_codes),
        split_names=tuple(idx.split_names),
    )


def _check_entry(entry: ShardEntry, shard: _Shard, manifest: VersionManifest) -> list[str]:
    """What the entry says about its shard that the shard does not bear out."""
    if shard.labels is None or shard.split_codes is None:
        return []  # the file failed: nothing to compare with
    fails = []
    if shard.metadata_sha256 != entry.metadata_sha256:
        fails.append(
            f"its sealed metadata_sha256 is {shard.metadata_sha256}, its entry says "
            f"{entry.metadata_sha256}"
        )
    try:
        check_labels(entry, shard.classes, manifest.classes)
    except IntegrityError as e:
        fails.append(str(e))
    if shard.samples != entry.samples:
        fails.append(f"it holds {shard.samples} rows, its entry says {entry.samples}")
        return fails  # the deletion vector and the counts refer to other rows
    live = entry.live_rows()
    labels = shard.labels[live]
    for k, mapped in enumerate(entry.labels):
        if mapped != NOT_IN_VERSION or k >= len(shard.classes):
            continue
        rows = live[labels == k]
        if len(rows):
            fails.append(
                f"{len(rows)} live rows (the first: row {int(rows[0])}) are of the class "
                f"{shard.classes[k]!r:.80}, which the version does not have (label -1): "
                "delete them in the deletion vector, or add the class"
            )
    counts = np.bincount(shard.split_codes[live], minlength=len(shard.split_names))
    found = {n: int(c) for n, c in zip(shard.split_names, counts, strict=False) if c and n != ""}
    said = {n: c for n, c in entry.splits.items() if c}
    if found != said:
        fails.append(f"its live rows per split are {found}, its entry says {said}")
    return fails
