"""The Dask path of a sharded version: parts of the shard plan, packed and uploaded where they run.

A sharded build plans its new shards once (:func:`h5forge.publish.sharded.plan_sharded`: the
groups of consecutive samples, one per shard). :func:`cut_shard_parts` cuts that plan into
parts, runs of whole groups of up to ``samples_per_part`` images (or ``bytes_per_part`` source
bytes), and :func:`pack_part_shards`, run on a Dask worker, packs one part's groups into
shards (:func:`h5forge.pack.writer.pack_shards_stream`: each sealed and verified), hashes each
and uploads it to ``BASE/shards/<sha256>.h5`` (read back) straight from the worker, deleting
its local copy before the next shard is sealed. The task returns only the shards' manifest
entries and the quarantined inputs: no shard's bytes travel to the flow, and nothing merges
them. The flow puts the entries in plan order (:func:`h5forge.publish.sharded.stage_sharded`),
so the version reads in the same order whichever part finished first.

Shards are content-addressed and byte-reproducible, so a part packed again (a retried task, a
re-run after a failure) uploads the same bytes to the same address. An upload is skipped only
when the parent version lists that address and the object is there (the rule of
:func:`h5forge.publish.sharded.publish_sharded`).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path

from h5forge.discover.catalog import Catalog
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.publish.manifest import ShardEntry, shard_key
from h5forge.publish.shard_release import upload_shard
from h5forge.publish.sharded import ShardPlan, shard_entry
from h5forge.publish.versions import asset_base, check_tree

__all__ = ["PartShards", "ShardPart", "cut_shard_parts", "pack_part_shards", "part_samples"]


@dataclass(frozen=True)
class ShardPart:
    """A run of consecutive shards of a plan: samples ``start..start+sum(groups)-1`` of its
    ``fresh`` catalog, ``groups[k]`` samples in shard ``first + k``."""

    index: int
    first: int
    start: int
    groups: tuple[int, ...]

    @property
    def stop(self) -> int:
        """The part's last sample + 1."""
        return self.start + sum(self.groups)

    @property
    def name(self) -> str:
        """How task runs and logs name the part."""
        return f"part-{self.index:05d}"


def cut_shard_parts(
    plan: ShardPlan, *, samples_per_part: int, bytes_per_part: int | None = None
) -> list[ShardPart]:
    """Cut ``plan``'s new shards into parts of whole shards: a part closes once it holds
    ``samples_per_part`` samples or its source files add up to ``bytes_per_part`` (a shard is
    never split, so a part may hold more).

    Raises:
        ValueError: a limit below 1.
    """
    for name, value in (("samples_per_part", samples_per_part), ("bytes_per_part", bytes_per_part)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name}={value!r} must be an int >= 1")
    samples = plan.fresh.samples
    parts: list[ShardPart] = []
    first = start = count = size = 0
    for k, n in enumerate(plan.groups):
        count += n
        if bytes_per_part is not None:
            size += sum(os.stat(s.path).st_size for s in samples[start + count - n : start + count])
        if (
            count >= samples_per_part
            or (bytes_per_part is not None and size >= bytes_per_part)
            or (k + 1 == len(plan.groups))
        ):
            parts.append(ShardPart(len(parts), first, start, plan.groups[first : k + 1]))
            first, start, count, size = k + 1, start + count, 0, 0
    return parts


def part_samples(fresh: Catalog, part: ShardPart) -> Catalog:
    """The samples of ``part`` (what its task carries), with the catalog's classes and split
    names: every shard of a version is packed against the same class list."""
    return replace(fresh, samples=fresh.samples[part.start : part.stop], rejected=(), skipped={})


@dataclass(frozen=True)
class PartShards:
    """What :func:`pack_part_shards` did (small: the return value of a remote task).

    Attributes:
        entries: the manifest entry of each non-empty shard, in order.
        uploaded: the shards uploaded (the others were listed by the parent and present).
        quarantined: ``(relative path, reason)`` of the part's inputs not packed.
        bytes_uploaded: their bytes; seconds: wall time on the worker.
    """

    index: int
    entries: tuple[ShardEntry, ...]
    uploaded: tuple[str, ...]
    quarantined: tuple[tuple[str, str], ...]
    bytes_uploaded: int
    seconds: float


def pack_part_shards(
    catalog: Catalog,
    part: ShardPart,
    asset: Location,
    *,
    config: PackConfig,
    parent_shards: Collection[str] = (),
    processes: int | None = 1,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> PartShards:
    """Pack ``part`` into shards and upload each to the asset's ``shards/`` folder (see the
    module's doc); its local file is deleted once uploaded, so the scratch folder holds one
    shard at a time.

    Args:
        catalog: :func:`part_samples` of the plan's ``fresh`` catalog.
        asset: the versioned destination (``DEST.h5``), with the store's options.
        config: the build's pack configuration (the plan's).
        parent_shards: the shards the parent version lists: one of them already in the store
            is not uploaded again.
        processes: preprocessing processes (1 on a Dask worker: the workers are the
            parallelism).
        tmp_dir: local scratch folder; default the system's.

    Raises:
        ValueError: ``catalog`` is not the part's samples.
        ChecksumError: an upload read back differently (the object is deleted).
    """
    from h5forge.pack.writer import pack_shards_stream

    t0 = time.perf_counter()
    if len(catalog.samples) != part.stop - part.start:
        raise ValueError(
            f"{part.name} has {part.stop - part.start} samples, the catalog given "
            f"{len(catalog.samples)}: pass part_samples(fresh, part)"
        )
    home = asset.with_url(asset_base(asset.url))
    check_tree(home, "shards")
    listed = frozenset(parent_shards)
    entries: list[ShardEntry] = []
    uploaded: list[str] = []
    bad: list[tuple[str, str]] = []
    sent = 0
    with tempfile.TemporaryDirectory(prefix="h5forge-shards-", dir=tmp_dir) as tmp:
        results = pack_shards_stream(
            catalog,
            part.groups,
            lambda k: Path(tmp) / f"shard-{part.first + k:06d}.h5",
            config=config,
            workers=processes,
        )
        home.join("shards").fs.makedirs(home.join("shards").path, exist_ok=True)
        for result in results:
            bad.extend(result.quarantined)
            local = result.path
            if result.num_samples:
                sha = Location(local).sha256()
                entry = shard_entry(local, sha, catalog.classes)
                entries.append(entry)
                if not (sha in listed and _present(home, sha, entry.bytes)):
                    sent += upload_shard(home, sha, local)
                    uploaded.append(sha)
            os.unlink(local)
    return PartShards(
        index=part.index,
        entries=tuple(entries),
        uploaded=tuple(uploaded),
        quarantined=tuple(bad),
        bytes_uploaded=sent,
        seconds=time.perf_counter() - t0,
    )


def _present(home: Location, sha: str, size: int) -> bool:
    target = home.join(*shard_key(sha).split("/"))
    try:
        return bool(target.fs.size(target.path) == size)
    except FileNotFoundError:
        return False
