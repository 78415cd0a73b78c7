"""Build and publish a sharded version: new shards for new samples, deletion vectors for the rest.

A sharded version (:mod:`h5forge.publish.manifest`, docs/FORMAT.md "Sharded versions") is
written in two steps, so that a build can verify and smoke-load what it made before anything
reaches the store:

1. :func:`pack_sharded` (local): the catalog's samples that the previous version does not hold
   unchanged are packed into new shards of about ``max_shard_size`` bytes each
   (:func:`h5forge.pack.writer.pack_slice` with ``shard=True``: sealed, verified,
   byte-reproducible, named by their sha256); the previous version's shards are referenced, never
   copied, with the rows of removed and replaced samples added to their deletion vectors. A
   referenced shard whose live fraction would drop below ``compact_below`` is rewritten from the
   source instead (compaction in the same build).
2. :func:`h5forge.publish.shard_release.publish_sharded` (the store): under the asset's lock,
   refused if the pointer moved since the build began, the new shards are uploaded
   concurrently and read back, then the sources map, the manifest, and the pointer last; then
   retention.

On Dask (:mod:`h5forge.scale.shard_parts`) the workers pack the plan's shards
(:func:`plan_sharded`) and upload them
(:func:`h5forge.publish.shard_release.upload_shard`) where they run; the flow stages
the version from their manifest entries (:func:`stage_sharded`, ``in_store``) and publishes it
the same way, checking that those shards are in the store instead of uploading them.

A publish skips uploading a shard only when the parent version (the latest, which retention
always keeps, and which the ``based_on`` check pins) references it; any other shard is uploaded
even when an object of that name exists, because retention may be removing an unreferenced one
at the same moment (docs/versions.md, "Retention of shards").
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.metadata import metadata_sha256
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.discover.catalog import Catalog, Sample
from h5forge.errors import IntegrityError, StoreError
from h5forge.location import Location
from h5forge.pack.checks import check_bad_fraction, check_every_class
from h5forge.pack.config import PackConfig
from h5forge.publish.manifest import (
    DEFAULT_MAX_SHARD_SIZE,
    ShardEntry,
    VersionManifest,
    read_manifest,
    shard_key,
)
from h5forge.publish.versions import (
    KEY_HEX,
    Pointer,
    asset_base,
    check_tree,
)

__all__ = [
    "COMPACT_BELOW",
    "DEFAULT_MAX_SHARD_SIZE",
    "Previous",
    "ShardPlan",
    "StagedVersion",
    "pack_sharded",
    "plan_sharded",
    "read_previous",
    "shard_entry",
    "stage_sharded",
]

log = logging.getLogger(__name__)

#: A referenced shard with fewer live rows than this fraction is rewritten (compaction).
COMPACT_BELOW = 0.5


@dataclass(frozen=True)
class ShardIndex:
    """What an incremental build reads of a previous shard: its index, never its images."""

    paths: tuple[str, ...]
    classes: tuple[str, ...]
    labels: np.ndarray
    splits: np.ndarray
    split_names: tuple[str, ...]


@dataclass(frozen=True)
class Previous:
    """The version a sharded build is based on: its manifest, sha256, sources map, and the
    index of each of its shards."""

    manifest: VersionManifest
    sha256: str
    sources: Mapping[str, str] | None
    shards: tuple[ShardIndex, ...]


def texts(values: Any) -> tuple[str, ...]:
    """An HDF5 string dataset's values as ``str``."""
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values)


def read_previous(asset: Location, pointer: Pointer | None) -> Previous | None:
    """The latest version of ``asset`` when it is sharded (None otherwise), with each of its
    shards' ``/paths``, ``/classes``, ``/labels`` and ``/splits`` (the index, not the images).

    Nothing is reused from a version that is not what its pointer and manifest name: a
    manifest that does not hash to the pointer's sha256, or a shard that is missing or whose
    size or recomputed ``metadata_sha256`` differ from its entry, is logged and the build
    builds in full (None), as a replaced single-file version is
    (:func:`h5forge.publish.lineage.reusable`)."""
    from h5forge.publish.lineage import read_sources

    if pointer is None or pointer.kind != "sharded":
        return None
    where = asset.with_url(pointer.url)
    base = asset_base(asset.url)
    try:
        manifest = read_manifest(where, pointer.sha256)
        shards = tuple(_shard_index(asset, base, manifest, entry) for entry in manifest.shards)
    except (IntegrityError, FileNotFoundError) as e:
        log.warning(
            "the latest version %s is not the one its pointer names (%s); nothing is reused "
            "from it (a full build). Publish that version again, or delete it",
            where,
            e,
        )
        return None
    return Previous(manifest, pointer.sha256, read_sources(where), shards)


def _shard_index(
    asset: Location, base: str, manifest: VersionManifest, entry: ShardEntry
) -> ShardIndex:
    """One shard's index, read after checking the shard is the one ``entry`` names."""
    check_tree(asset.with_url(base), *shard_key(entry.sha256).split("/"))
    url = manifest.shard_url(base, entry)
    with open_h5(asset.with_url(url)) as h5:
        try:
            size, found = h5.id.get_filesize(), metadata_sha256(h5)
        except StoreError:  # a failed store is no damage
            raise
        except H5_DAMAGE as e:
            raise IntegrityError(f"shard {url}: {type(e).__name__}: {e}") from None
        if (size, found) != (entry.bytes, entry.metadata_sha256):
            raise IntegrityError(
                f"shard {entry.sha256[:KEY_HEX]} ({url}) is {size} bytes with metadata "
                f"{found[:KEY_HEX]}, its entry says {entry.bytes} bytes and "
                f"{entry.metadata_sha256[:KEY_HEX]}: it was replaced"
            )
        if int(h5.attrs[fmt.A_NUM_SAMPLES]) != entry.samples:
            raise IntegrityError(
                f"shard {entry.sha256[:KEY_HEX]} has {int(h5.attrs[fmt.A_NUM_SAMPLES])} "
                f"samples, its entry says {entry.samples}"
            )
        return ShardIndex(
            paths=texts(h5[fmt.PATHS][:]),
            classes=texts(h5[fmt.CLASSES][:]),
            labels=np.asarray(h5[fmt.LABELS][:], dtype=np.int64),
            splits=np.asarray(h5[fmt.SPLITS][:], dtype=np.int64),
            split_names=texts(h5[fmt.SPLIT_NAMES][:]),
        )


@dataclass(frozen=True)
class StagedVersion:
    """A sharded version packed locally, not yet published.

    Attributes:
        manifest: the new version's manifest (``created_at`` set at publish).
        new: the local file of each new shard, by sha256.
        parent_shards: the shards the parent version references (never re-uploaded).
        parent: the parent version's manifest sha256 ("" for none).
        quarantined: ``(path, reason)`` of the inputs not packed.
        counts: samples per split and class, as a single-file pack reports them.
        in_store: the new shards already in the store, packed and uploaded (or found listed
            by the parent) where they were packed (a Dask worker): the publish checks they are
            there and uploads nothing for them.
    """

    manifest: VersionManifest
    new: Mapping[str, str]
    parent_shards: frozenset[str]
    parent: str
    quarantined: tuple[tuple[str, str], ...]
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    in_store: frozenset[str] = frozenset()

    @property
    def first_new(self) -> str:
        """A new shard's local file ("" when the version is made of old shards only)."""
        return next(iter(self.new.values()), "")


def _estimate(sample: Sample, config: PackConfig) -> int:
    """About how many bytes ``sample`` takes in a shard."""
    image = config.image
    if config.fixed_size and image.size is not None:
        return image.size[0] * image.size[1] * (3 if image.mode == "RGB" else 1)
    try:
        size = os.stat(sample.path).st_size
    except OSError:
        return 1
    return size if image.layout == "encoded" else size * 8  # decoded, any size: a guess


def plan_shards(
    samples: Sequence[Sample], config: PackConfig, max_shard_size: int
) -> list[list[int]]:
    """Consecutive groups of ``samples`` (indices) of at most about ``max_shard_size`` bytes
    each (a sample larger than that is a shard of its own)."""
    groups: list[list[int]] = []
    size = 0
    for i, sample in enumerate(samples):
        took = _estimate(sample, config)
        if not groups or (size + took > max_shard_size and groups[-1]):
            groups.append([])
            size = 0
        groups[-1].append(i)
        size += took
    return groups


@dataclass(frozen=True)
class ShardPlan:
    """What a sharded build packs, decided before any image is read.

    Attributes:
        kept: the previous version's shards this version references (new deletion vectors).
        fresh: the samples to pack into new shards, in shard order (the catalog's classes and
            split names; no rejected inputs).
        groups: samples per new shard, in order (they add up to ``fresh``'s samples).
    """

    kept: tuple[ShardEntry, ...]
    fresh: Catalog
    groups: tuple[int, ...]


def plan_sharded(
    catalog: Catalog,
    *,
    config: PackConfig,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    previous: Previous | None = None,
    unchanged: frozenset[str] = frozenset(),
    compact_below: float = COMPACT_BELOW,
) -> ShardPlan:
    """The shards ``previous`` keeps, and the new shards to pack (see :func:`pack_sharded`).

    Raises:
        ValueError: ``max_shard_size`` < 1 MiB or ``compact_below`` outside [0, 1].
    """
    if isinstance(max_shard_size, bool) or not isinstance(max_shard_size, int):
        raise ValueError(f"max_shard_size={max_shard_size!r} must be a number of bytes")
    if max_shard_size < 2**20:
        raise ValueError(f"max_shard_size={max_shard_size} must be at least 1 MiB (1048576)")
    if not 0.0 <= compact_below <= 1.0:
        raise ValueError(f"compact_below={compact_below!r} must be in [0, 1]")
    kept, taken = _referenced(catalog, config, previous, unchanged, compact_below)
    fresh = [s for s in catalog.samples if s.relpath not in taken]
    plan = plan_shards(fresh, config, max_shard_size)
    ordered = replace(
        catalog, samples=tuple(fresh[i] for group in plan for i in group), rejected=()
    )
    return ShardPlan(tuple(kept), ordered, tuple(len(g) for g in plan))


def pack_sharded(
    catalog: Catalog,
    work: str | os.PathLike[str],
    *,
    config: PackConfig,
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE,
    workers: int | None = None,
    max_bad_fraction: float = 0.01,
    previous: Previous | None = None,
    unchanged: frozenset[str] = frozenset(),
    compact_below: float = COMPACT_BELOW,
    name: str,
    on_shard: Callable[[int, int], None] | None = None,
) -> StagedVersion:
    """Pack ``catalog`` as a sharded version into ``work/shards/`` (see the module's doc).

    Args:
        previous: the version this one is built on (:func:`read_previous`); its shards are
            referenced when ``config`` is the configuration it was packed with.
        unchanged: relative paths whose source files are those ``previous`` packed.
        compact_below: rewrite a referenced shard whose live fraction falls below this.
        name: the asset's name (the last part of its base).
        on_shard: called with ``(shards packed, new shards in all)`` after each new shard.

    Raises:
        ValueError: ``max_shard_size`` < 1 MiB or ``compact_below`` outside [0, 1].
        TooManyBadImagesError, EmptyDatasetError: as :func:`h5forge.pack.writer.pack`.
    """
    from h5forge.pack.reuse import POOL_MIN
    from h5forge.pack.writer import pack_shards_stream

    plan = plan_sharded(
        catalog,
        config=config,
        max_shard_size=max_shard_size,
        previous=previous,
        unchanged=unchanged,
        compact_below=compact_below,
    )
    folder = Path(work) / "shards"
    folder.mkdir(parents=True, exist_ok=True)
    classes = tuple(catalog.classes)
    new: dict[str, str] = {}
    entries: list[ShardEntry] = []
    bad: list[tuple[str, str]] = []
    if on_shard is not None:
        on_shard(0, len(plan.groups))
    results = pack_shards_stream(
        plan.fresh,
        plan.groups,
        lambda k: folder / f"shard-{k:06d}.h5",
        config=config,
        workers=workers,
        # A small change beside shards referenced: threads, not a pool of processes to start.
        few=bool(plan.kept) and len(plan.fresh.samples) < POOL_MIN,
    )
    for k, result in enumerate(results):
        if on_shard is not None:
            on_shard(k + 1, len(plan.groups))
        bad.extend(result.quarantined)
        out = Path(result.path)
        if result.num_samples == 0:
            out.unlink()
            continue
        sha = Location(str(out)).sha256()
        final = folder / f"{sha}.h5"
        os.replace(out, final)
        new[sha] = str(final)
        entries.append(shard_entry(str(final), sha, classes))
    return stage_sharded(
        catalog,
        plan,
        entries,
        bad,
        config=config,
        previous=previous,
        max_bad_fraction=max_bad_fraction,
        name=name,
        new=new,
    )


def stage_sharded(
    catalog: Catalog,
    plan: ShardPlan,
    entries: Sequence[ShardEntry],
    quarantined: Sequence[tuple[str, str]],
    *,
    config: PackConfig,
    previous: Previous | None,
    max_bad_fraction: float,
    name: str,
    new: Mapping[str, str] | None = None,
    in_store: frozenset[str] = frozenset(),
) -> StagedVersion:
    """The version ``plan`` makes once its new shards are packed: ``entries`` (in ``plan``'s
    order, empty shards left out), the inputs they ``quarantined``, and where they are (the
    local files ``new``, by sha256, or ``in_store`` already).

    Raises:
        TooManyBadImagesError, EmptyDatasetError: as :func:`h5forge.pack.writer.pack`.
    """
    classes = tuple(catalog.classes)
    stray = in_store - {e.sha256 for e in entries}
    if stray:
        raise ValueError(
            f"in_store names shards that are not among the new entries: "
            f"{sorted(s[:KEY_HEX] for s in stray)[:5]}; pass the entries' own sha256"
        )
    bad = [*catalog.rejected, *quarantined]
    check_bad_fraction(len(catalog.samples) + len(catalog.rejected), bad, max_bad_fraction)
    packed = {s.relpath for s in catalog.samples} - {p for p, _ in bad}
    live = tuple(s for s in catalog.samples if s.relpath in packed)
    check_every_class({s.label for s in live}, classes, name)
    manifest = VersionManifest(
        name=name,
        classes=classes,
        shards=(*plan.kept, *entries),
        config_json=config.to_json(),
        config_sha256=config.sha256(),
        parent=previous.sha256 if previous is not None else "",
    )
    counts = replace(catalog, samples=live).counts()
    return StagedVersion(
        manifest=manifest,
        new=dict(new or {}),
        parent_shards=frozenset(e.sha256 for e in previous.manifest.shards)
        if previous
        else frozenset(),
        parent=previous.sha256 if previous is not None else "",
        quarantined=tuple(bad),
        counts=counts,
        in_store=in_store,
    )


def _referenced(
    catalog: Catalog,
    config: PackConfig,
    previous: Previous | None,
    unchanged: frozenset[str],
    compact_below: float,
) -> tuple[list[ShardEntry], set[str]]:
    """The previous version's shards this version keeps (new deletion vectors, labels mapped
    onto the catalog's classes) and the relative paths they hold live.

    A previous row stays live when its path's source file is unchanged and its class and split
    are the catalog's (a listing may relabel an unchanged file). Target columns are not compared:
    a catalog with any is packed in full.
    """
    if (
        previous is None
        or not unchanged
        or catalog.schema
        or previous.manifest.config_sha256 != config.sha256()
    ):
        return [], set()
    wanted = {s.relpath: s for s in catalog.samples if s.relpath in unchanged}
    index = {c: i for i, c in enumerate(catalog.classes)}
    kept: list[ShardEntry] = []
    taken: set[str] = set()
    for entry, shard in zip(previous.manifest.shards, previous.shards, strict=True):
        was = set(entry.deleted)
        live = []
        for r, path in enumerate(shard.paths):
            sample = wanted.get(path)
            if (
                sample is None
                or r in was
                or path in taken
                or catalog.classes[sample.label] != shard.classes[int(shard.labels[r])]
                or sample.split != shard.split_names[int(shard.splits[r])]
            ):
                continue
            live.append(r)
        if not live or len(live) < compact_below * entry.samples:
            continue  # nothing left, or rewritten from the source with the new samples
        rows = set(live)
        counts: dict[str, int] = {}
        for r in live:
            split = shard.split_names[int(shard.splits[r])]
            if split:
                counts[split] = counts.get(split, 0) + 1
        kept.append(
            replace(
                entry,
                deleted=tuple(r for r in range(entry.samples) if r not in rows),
                labels=tuple(index.get(c, -1) for c in shard.classes),
                splits=counts,
            )
        )
        taken.update(shard.paths[r] for r in live)
    return kept, taken


def shard_entry(local: str, sha: str, classes: Sequence[str]) -> ShardEntry:
    """The manifest entry of a shard just packed with ``classes``."""
    with open_h5(Location(local)) as h5:
        names = [n.decode() if isinstance(n, bytes) else n for n in h5[fmt.SPLIT_NAMES][:]]
        splits = np.bincount(np.asarray(h5[fmt.SPLITS][:], dtype=np.int64), minlength=len(names))
        return ShardEntry(
            sha256=sha,
            bytes=os.path.getsize(local),
            metadata_sha256=str(h5.attrs[fmt.A_METADATA_SHA256]),
            samples=int(h5.attrs[fmt.A_NUM_SAMPLES]),
            labels=tuple(range(len(classes))),
            splits={n: int(c) for n, c in zip(names, splits.tolist(), strict=True) if n and c},
        )
