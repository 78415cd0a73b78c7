"""The version manifest of a sharded version: its shards, deletion vectors and class maps.

A sharded version of the asset ``BASE`` is one small JSON document over immutable,
content-addressed shard files shared by every version that uses them::

    BASE/shards/<sha256>.h5                   a shard: a sealed h5forge file (FORMAT.md),
                                              named by the sha256 of its bytes
    BASE/v/<16 hex>/NAME.version.json         the version manifest, keyed by its own sha256
    BASE.latest.json                          the pointer (format version 2), written last

The version's samples are the shards' rows in manifest order, each shard's rows in file order,
less the rows its deletion vector names. Each shard's labels are numbered by its own
``/classes``; the manifest maps them to the version's ``classes`` (``labels[k]`` is the
version's index of the shard's class ``k``), so a class that appears later never forces an old
shard to be rewritten.

A manifest is untrusted input like any file (docs/FORMAT.md, "Sharded versions"): its size is
bounded (:data:`MAX_MANIFEST_BYTES`), every count is bounded and checked against the others,
every shard's address is recomputed from its sha256 (a manifest can only name shards of its
own asset), and a shard's bytes are checked against its entry before they are used.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from h5forge.location import MAX_MANIFEST_BYTES, Location

__all__ = [
    "DEFAULT_MAX_SHARD_SIZE",
    "MANIFEST_FORMAT",
    "MANIFEST_SUFFIX",
    "MAX_MANIFEST_BYTES",
    "MAX_SHARDS",
    "NOT_IN_VERSION",
    "SHARDS_DIR",
    "ShardEntry",
    "VersionManifest",
    "check_manifest",
    "load_manifest",
    "manifest_bytes",
    "manifest_key",
    "parse_manifest",
    "read_manifest",
    "shard_key",
]

MANIFEST_FORMAT = "h5forge-version"
MANIFEST_VERSION = 1
MANIFEST_SUFFIX = ".version.json"
SHARDS_DIR = "shards"
#: The default size of a shard, for versioned builds (docs/versions.md says why).
DEFAULT_MAX_SHARD_SIZE = 64 * 2**20
#: The most shards one version lists.
MAX_SHARDS = 200_000
#: The most samples one shard, and one version, may hold.
MAX_SAMPLES = 2**40
#: The most classes and splits one version names.
MAX_CLASSES = 1_000_000
MAX_SPLITS = 1024
_SHA256 = re.compile(r"[0-9a-f]{64}")
_KEY_HEX = 16
#: ``labels[k]`` of a shard class the version does not have: no live row may carry it.
NOT_IN_VERSION = -1
_RUN_FIELDS = ("created_at", "h5forge_version", "source_url", "source_sha256")


def shard_key(sha256: str) -> str:
    """``shards/<sha256>.h5``: where the shard with this sha256 lives under the base.

    Raises:
        ValueError: ``sha256`` is not 64 lower-case hex digits (a key never leaves ``shards/``).
    """
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise ValueError(f"shard sha256 {sha256!r:.80} must be 64 lower-case hex digits")
    return f"{SHARDS_DIR}/{sha256}.h5"


def manifest_key(name: str, sha256: str) -> str:
    """``v/<16 hex>/NAME.version.json``: where the manifest with this sha256 lives."""
    if not isinstance(sha256, str) or not re.fullmatch(r"[0-9a-f]{16,64}", sha256):
        raise ValueError(f"sha256 {sha256!r:.80} must be 16-64 lower-case hex digits")
    return f"v/{sha256[:_KEY_HEX]}/{name}{MANIFEST_SUFFIX}"


@dataclass(frozen=True)
class ShardEntry:
    """One shard as a version uses it.

    Attributes:
        sha256: the shard file's sha256 (its address).
        bytes: the shard file's size.
        metadata_sha256: the digest of its index and attributes (checked at a local open).
        samples: rows in the shard.
        deleted: the rows this version excludes, sorted, unique (the deletion vector).
        labels: the version's class index of each of the shard's classes (its ``/classes``).
        splits: live (not deleted) samples of each split name, as the shard's ``/split_names``
            say; a shard without splits has ``{}``.
    """

    sha256: str
    bytes: int
    metadata_sha256: str
    samples: int
    deleted: tuple[int, ...] = ()
    labels: tuple[int, ...] = ()
    splits: Mapping[str, int] = field(default_factory=dict)

    @property
    def live(self) -> int:
        """Rows this version reads."""
        return self.samples - len(self.deleted)

    def live_rows(self) -> np.ndarray:
        """The rows this version reads, in file order."""
        keep = np.ones(self.samples, dtype=bool)
        keep[np.asarray(self.deleted, dtype=np.int64)] = False
        return np.flatnonzero(keep)

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "bytes": self.bytes,
            "metadata_sha256": self.metadata_sha256,
            "samples": self.samples,
            "deleted": list(self.deleted),
            "labels": list(self.labels),
            "splits": dict(sorted(self.splits.items())),
        }


@dataclass(frozen=True)
class VersionManifest:
    """A sharded version: what its manifest says, checked.

    Attributes:
        name: the asset's name (the last part of ``BASE``).
        classes: the version's class names; every label refers to them.
        shards: the shards in read order.
        config_json, config_sha256: the pack configuration every shard was packed with.
        source_url, source_sha256, source_fingerprint: where the samples came from.
        created_at, h5forge_version: when and by what the version was made (kept here, not in
            the shards, so that a shard's bytes depend only on its samples and configuration).
        parent: the sha256 of the manifest of the version it was built on ("" for none).
        lineage: the build's lineage fields (as a single-file version's attributes).
    """

    name: str
    classes: tuple[str, ...]
    shards: tuple[ShardEntry, ...]
    config_json: str = ""
    config_sha256: str = ""
    source_url: str = ""
    source_sha256: str = ""
    source_fingerprint: str = ""
    created_at: str = ""
    h5forge_version: str = ""
    parent: str = ""
    lineage: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_samples(self) -> int:
        """Samples the version reads (live rows of every shard)."""
        return sum(s.live for s in self.shards)

    def split_count(self, split: str | None) -> int:
        """Samples of ``split`` (all for None)."""
        if split is None:
            return self.num_samples
        return sum(int(s.splits.get(split, 0)) for s in self.shards)

    @property
    def split_names(self) -> tuple[str, ...]:
        """Every split some shard has, in order of first appearance."""
        seen: dict[str, None] = {}
        for s in self.shards:
            for name in s.splits:
                seen.setdefault(name, None)
        return tuple(seen)

    def shard_url(self, asset_base: str, entry: ShardEntry) -> str:
        """The URL of ``entry``'s file under ``asset_base``, recomputed from its sha256."""
        return f"{asset_base.rstrip('/')}/{shard_key(entry.sha256)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "name": self.name,
            "classes": list(self.classes),
            "num_samples": self.num_samples,
            "config_json": self.config_json,
            "config_sha256": self.config_sha256,
            "source_url": self.source_url,
            "source_sha256": self.source_sha256,
            "source_fingerprint": self.source_fingerprint,
            "created_at": self.created_at,
            "h5forge_version": self.h5forge_version,
            "parent": self.parent,
            "lineage": dict(sorted(self.lineage.items())),
            "shards": [s.to_json() for s in self.shards],
        }


def manifest_bytes(manifest: VersionManifest) -> bytes:
    """The manifest's canonical bytes (sorted keys, compact): what its sha256 names.

    Raises:
        ValueError: they would be over :data:`MAX_MANIFEST_BYTES` (no reader would take them).
    """
    data = (json.dumps(manifest.to_json(), sort_keys=True, separators=(",", ":")) + "\n").encode()
    if len(data) > MAX_MANIFEST_BYTES:
        raise ValueError(
            f"the version manifest would be {len(data)} bytes, over {MAX_MANIFEST_BYTES}: "
            "compact the asset (`h5forge compact BASE`) or use larger shards"
        )
    return data


def read_manifest(where: Location, sha256: str = "") -> VersionManifest:
    """The manifest at ``where``, checked; with ``sha256`` (or a prefix of it), its bytes must
    hash to it.

    Raises:
        FileNotFoundError: no manifest there.
        ValueError: over the bound, not JSON, of another format, malformed or inconsistent
            (the message names the manifest and the field).
        IntegrityError: its bytes do not hash to ``sha256``.
    """
    return load_manifest(where, sha256)[0]


def load_manifest(where: Location, sha256: str = "") -> tuple[VersionManifest, str]:
    """:func:`read_manifest`, and the full sha256 of the manifest's bytes (the version's)."""
    data = where.read_bytes(limit=MAX_MANIFEST_BYTES, what="version manifest")
    return check_manifest(data, sha256, shown=str(where)), hashlib.sha256(data).hexdigest()


def check_manifest(data: bytes, sha256: str, *, shown: str) -> VersionManifest:
    """A manifest's bytes (read from ``shown``), checked: they hash to ``sha256`` (or a prefix
    of it; "" for any), and parse (:func:`parse_manifest`).

    Raises:
        IntegrityError: the bytes do not hash to ``sha256``.
        ValueError: as :func:`parse_manifest`.
    """
    from h5forge.errors import IntegrityError

    found = hashlib.sha256(data).hexdigest()
    if sha256 and not found.startswith(sha256):
        raise IntegrityError(
            f"{shown}: the version manifest hashes to {found}, not to the version "
            f"{sha256}: it was replaced or damaged; publish the version again"
        )
    return parse_manifest(data, shown=shown)


def parse_manifest(data: bytes, *, shown: str) -> VersionManifest:
    """A manifest's bytes, checked (see :func:`read_manifest`)."""
    from h5forge.documents import parse_json

    body = parse_json(data, what="version manifest", name=shown)
    if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"{shown} is not an h5forge version manifest (format {MANIFEST_FORMAT!r})")
    if body.get("format_version") != MANIFEST_VERSION:
        raise ValueError(
            f"{shown} has version manifest format {body.get('format_version')!r:.40}; this "
            f"h5forge reads version {MANIFEST_VERSION}: upgrade h5forge"
        )

    def bad(what: str) -> ValueError:
        return ValueError(f"{shown}: {what}; the manifest is malformed, publish the version again")

    def text(key: str, default: str = "") -> str:
        value = body.get(key, default)
        if not isinstance(value, str) or len(value) > 2**20:
            raise bad(f"{key} must be a string")
        return value

    classes = body.get("classes")
    if (
        not isinstance(classes, list)
        or len(classes) > MAX_CLASSES
        or not all(isinstance(c, str) for c in classes)
        or len(set(classes)) != len(classes)
    ):
        raise bad("classes must be a list of distinct strings")
    raw = body.get("shards")
    if not isinstance(raw, list) or len(raw) > MAX_SHARDS:
        raise bad(f"shards must be a list of at most {MAX_SHARDS} entries")
    shards = tuple(_entry(item, k, len(classes), bad) for k, item in enumerate(raw))
    lineage = body.get("lineage", {})
    if not isinstance(lineage, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in lineage.items()
    ):
        raise bad("lineage must map strings to strings")
    manifest = VersionManifest(
        name=text("name"),
        classes=tuple(classes),
        shards=shards,
        config_json=text("config_json"),
        config_sha256=text("config_sha256"),
        source_url=text("source_url"),
        source_sha256=text("source_sha256"),
        source_fingerprint=text("source_fingerprint"),
        created_at=text("created_at"),
        h5forge_version=text("h5forge_version"),
        parent=text("parent"),
        lineage=lineage,
    )
    if manifest.parent and not _SHA256.fullmatch(manifest.parent):
        raise bad(f"parent {manifest.parent!r:.80} is not a sha256")
    if not isinstance(body.get("num_samples"), int) or body["num_samples"] != manifest.num_samples:
        raise bad(
            f"num_samples {body.get('num_samples')!r:.40} is not the shards' live rows "
            f"({manifest.num_samples})"
        )
    if posixpath.basename(manifest.name) != manifest.name or not manifest.name:
        raise bad(f"name {manifest.name!r:.80} is not a file name")
    return manifest


def _entry(item: object, k: int, num_classes: int, bad: Any) -> ShardEntry:
    where = f"shards[{k}]"
    if not isinstance(item, dict):
        raise bad(f"{where} is not an object")

    def count(key: str, most: int) -> int:
        value = item.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
            raise bad(f"{where}.{key} must be an int in [0, {most}]")
        return value

    sha, meta = item.get("sha256"), item.get("metadata_sha256")
    if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
        raise bad(f"{where}.sha256 is not 64 lower-case hex digits")
    if not isinstance(meta, str) or not _SHA256.fullmatch(meta):
        raise bad(f"{where}.metadata_sha256 is not 64 lower-case hex digits")
    size = count("bytes", 2**50)
    samples = count("samples", MAX_SAMPLES)
    deleted = _int_list(item.get("deleted"), samples, f"{where}.deleted", bad)
    if any(b <= a for a, b in zip(deleted, deleted[1:], strict=False)):
        raise bad(f"{where}.deleted must be sorted and unique")
    labels = _int_list(
        item.get("labels"), num_classes, f"{where}.labels", bad, most=MAX_CLASSES, least=-1
    )
    splits = item.get("splits", {})
    live = samples - len(deleted)
    if (
        not isinstance(splits, dict)
        or len(splits) > MAX_SPLITS
        or not all(
            isinstance(n, str) and not isinstance(c, bool) and isinstance(c, int) and c >= 0
            for n, c in splits.items()
        )
        or sum(splits.values()) > live
    ):
        raise bad(f"{where}.splits must map split names to live counts (at most {live} in all)")
    return ShardEntry(
        sha256=sha,
        bytes=size,
        metadata_sha256=meta,
        samples=samples,
        deleted=tuple(deleted),
        labels=tuple(labels),
        splits=dict(splits),
    )


def _int_list(
    value: object, bound: int, where: str, bad: Any, *, most: int = -1, least: int = 0
) -> list[int]:
    """A list of ints in ``[least, bound)``, at most ``most`` long (``bound`` when -1)."""
    most = bound if most < 0 else most
    if not isinstance(value, list) or len(value) > most:
        raise bad(f"{where} must be a list of at most {most} ints")
    if not all(type(v) is int and least <= v < bound for v in value):
        raise bad(f"{where} must hold ints in [{least}, {bound})")
    return value


def run_fields() -> tuple[str, ...]:
    """The root attributes a shard leaves empty; the manifest records them (FORMAT.md)."""
    return _RUN_FIELDS


def check_labels(entry: ShardEntry, shard_classes: Sequence[str], classes: Sequence[str]) -> None:
    """``entry.labels`` maps ``shard_classes`` (the shard's ``/classes``) onto ``classes`` by
    name; :data:`NOT_IN_VERSION` (-1) only for a class the version does not have.

    Raises:
        IntegrityError: a shard class maps to a class of another name, to -1 while the version
            has it, or the counts differ.
    """
    from h5forge.errors import IntegrityError

    if len(entry.labels) != len(shard_classes) or any(
        (name in classes) if v == NOT_IN_VERSION else classes[v] != name
        for v, name in zip(entry.labels, shard_classes, strict=False)
    ):
        raise IntegrityError(
            f"shard {entry.sha256[:_KEY_HEX]} has classes {list(shard_classes)[:5]!r:.200}, "
            f"which its manifest entry does not map by name onto the version's classes: the "
            "manifest is damaged; publish the version again"
        )
