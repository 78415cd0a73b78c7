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
2. :func:`publish_sharded` (the store): under the asset's lock, refused if the pointer moved
   since the build began, the new shards are uploaded concurrently and read back, then the
   sources map, the manifest, and the pointer last; then retention.

On Dask (:mod:`h5forge.scale.shard_parts`) the workers pack the plan's shards
(:func:`plan_sharded`) and upload them (:func:`upload_shard`) where they run; the flow stages
the version from their manifest entries (:func:`stage_sharded`, ``in_store``) and publishes it
the same way, checking that those shards are in the store instead of uploading them.

A publish skips uploading a shard only when the parent version (the latest, which retention
always keeps, and which the ``based_on`` check pins) references it; any other shard is uploaded
even when an object of that name exists, because retention may be removing an unreferenced one
at the same moment (docs/versions.md, "Retention of shards").
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import posixpath
import shutil
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.open import open_h5
from h5forge.discover.catalog import Catalog, Sample
from h5forge.errors import BusyError, IntegrityError
from h5forge.location import Location
from h5forge.pack.checks import check_bad_fraction, check_every_class
from h5forge.pack.config import PackConfig
from h5forge.publish.manifest import (
    ShardEntry,
    VersionManifest,
    manifest_bytes,
    read_manifest,
    shard_key,
)
from h5forge.publish.versions import (
    KEY_HEX,
    Pointer,
    asset_base,
    check_tree,
    pointer_url,
    read_pointer,
    version_url,
    write_pointer,
)
from h5forge.redact import redact_url

__all__ = [
    "COMPACT_BELOW",
    "DEFAULT_MAX_SHARD_SIZE",
    "Previous",
    "ShardPlan",
    "ShardedResult",
    "StagedVersion",
    "build_sharded_version",
    "pack_sharded",
    "plan_sharded",
    "publish_sharded",
    "read_previous",
    "shard_entry",
    "stage_sharded",
    "upload_shard",
]

log = logging.getLogger(__name__)

#: The default size of a shard (see docs/versions.md for why).
DEFAULT_MAX_SHARD_SIZE = 64 * 2**20
#: A referenced shard with fewer live rows than this fraction is rewritten (compaction).
COMPACT_BELOW = 0.5
_UPLOADS = 8  # concurrent shard uploads


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


def _texts(values: Any) -> tuple[str, ...]:
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in values)


def read_previous(asset: Location, pointer: Pointer | None) -> Previous | None:
    """The latest version of ``asset`` when it is sharded (None otherwise), with each of its
    shards' ``/paths``, ``/classes``, ``/labels`` and ``/splits`` (the index, not the images)."""
    from h5forge.publish.lineage import read_sources

    if pointer is None or pointer.kind != "sharded":
        return None
    where = asset.with_url(pointer.url)
    manifest = read_manifest(where, pointer.sha256)
    base = asset_base(asset.url)
    shards = []
    for entry in manifest.shards:
        check_tree(asset.with_url(base), *shard_key(entry.sha256).split("/"))
        with open_h5(asset.with_url(manifest.shard_url(base, entry))) as h5:
            found = int(h5.attrs[fmt.A_NUM_SAMPLES])
            if found != entry.samples:
                raise IntegrityError(
                    f"shard {entry.sha256[:KEY_HEX]} of {where} has {found} samples, its "
                    f"manifest says {entry.samples}: the asset is damaged; publish it in full "
                    "under a new name"
                )
            shards.append(
                ShardIndex(
                    paths=_texts(h5[fmt.PATHS][:]),
                    classes=_texts(h5[fmt.CLASSES][:]),
                    labels=np.asarray(h5[fmt.LABELS][:], dtype=np.int64),
                    splits=np.asarray(h5[fmt.SPLITS][:], dtype=np.int64),
                    split_names=_texts(h5[fmt.SPLIT_NAMES][:]),
                )
            )
    return Previous(manifest, pointer.sha256, read_sources(where), tuple(shards))


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
    from h5forge.publish.lineage import write_sources
    from h5forge.publish.release import asset_lock

    check_retention(keep_versions, min_age_s)
    given = dict(fields or {})
    base = asset_base(asset.url)
    home = asset.with_url(base)
    read_pointer(asset)  # checks the URL and the pointer first
    with asset_lock(asset):
        pointer = read_pointer(asset)
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
            write_pointer(asset, sha, parent=latest, kind="sharded")
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

    Raises:
        ChecksumError: the stored copy is not the local bytes (it is deleted).
    """
    from h5forge.publish.storage import read_back

    check_tree(home, *shard_key(sha).split("/"))
    target = home.join(*shard_key(sha).split("/"))
    size = os.path.getsize(local)
    target.put(local=local)
    read_back(target, sha, size)
    return size


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
        listed = folder.fs.ls(folder.path, detail=True)
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
    previous = read_previous(asset, pointer)
    if (
        previous is not None
        and fingerprint is not None
        and previous.manifest.source_fingerprint == fingerprint.digest
        and previous.manifest.config_sha256 == config.sha256()
    ):
        return None
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
