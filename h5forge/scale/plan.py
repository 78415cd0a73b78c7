"""The plan of a shard-parallel pack: contiguous slices of a catalog, each fingerprinted.

A shard is a contiguous slice of the catalog's samples (:class:`ShardSpec`), cut by count or by
source bytes (:func:`plan_shards`) and named by its position (``shard-00003.h5``). Its
fingerprint covers the slice's relative paths, labels and splits and the catalog's classes and
split names, so a shard packed from another catalog is never taken for this one's. Packing and
finding done shards: :mod:`h5forge.scale.shards`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from h5forge.discover.catalog import Catalog, Sample
from h5forge.errors import EmptyDatasetError

__all__ = [
    "ShardSpec",
    "plan_shards",
    "refuse_targets",
    "shard_catalog",
    "shard_url",
]


@dataclass(frozen=True)
class ShardSpec:
    """One shard of a plan: samples ``start..stop-1`` of the catalog.

    Attributes:
        index: position in the plan; names the file (``shard-00003.h5``).
        start: first sample (inclusive).
        stop: last sample + 1.
        fingerprint: sha256 hex of the slice's relative paths, labels and splits and the
            catalog's classes and split names: a shard packed from another catalog never matches.
        source_bytes: total size of the slice's source files (0 when planned by count only).
    """

    index: int
    start: int
    stop: int
    fingerprint: str
    source_bytes: int = 0

    @property
    def name(self) -> str:
        """File name of the shard in the staging folder."""
        return f"shard-{self.index:05d}.h5"

    @property
    def count(self) -> int:
        """Number of inputs in the slice."""
        return self.stop - self.start


def shard_url(staging_url: str, spec: ShardSpec) -> str:
    """``staging_url/shard-NNNNN.h5`` (a local folder or any fsspec URL)."""
    if not staging_url:
        raise ValueError(
            "staging_url is empty; give a folder every worker can reach "
            "(a shared path, or a bucket prefix such as s3://bucket/staging/)"
        )
    return staging_url.rstrip("/") + "/" + spec.name


def _fingerprint(catalog: Catalog, samples: Sequence[Sample]) -> str:
    h = hashlib.sha256()
    h.update("\0".join(catalog.classes).encode("utf-8", "surrogateescape") + b"\1")
    h.update("\0".join(catalog.splits).encode("utf-8", "surrogateescape") + b"\1")
    for s in samples:
        h.update(f"{s.relpath}\0{s.label}\0{s.split}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def shard_catalog(catalog: Catalog, spec: ShardSpec) -> Catalog:
    """The slice of ``catalog`` that ``spec`` covers, with the same classes and split names.

    Send this, not the whole catalog, with each remote task of a big dataset: a task then
    carries its own inputs only. :func:`pack_shard` accepts either.
    """
    return Catalog(
        root=catalog.root,
        samples=_slice(catalog, spec),
        classes=catalog.classes,
        splits=catalog.splits,
        skipped={},
    )


def _slice(catalog: Catalog, spec: ShardSpec) -> tuple[Sample, ...]:
    """``spec``'s samples from the whole catalog, or the catalog's own when it is the slice.

    Raises:
        ValueError: ``spec`` does not fit ``catalog`` (another catalog, or a stale plan).
    """
    n = len(catalog.samples)
    if n == spec.count:  # already sliced (or a one-shard plan: the same samples either way)
        samples = catalog.samples
    elif 0 <= spec.start < spec.stop <= n:
        samples = catalog.samples[spec.start : spec.stop]
    else:
        raise ValueError(
            f"shard {spec.index} covers samples {spec.start}..{spec.stop - 1}, the "
            f"catalog has {n}; pass the whole catalog or shard_catalog(catalog, "
            "spec), or re-plan with plan_shards"
        )
    if _fingerprint(catalog, samples) != spec.fingerprint:
        raise ValueError(
            f"shard {spec.index} was planned for another catalog (the fingerprint "
            "of its samples differs); re-plan with plan_shards on this catalog"
        )
    return samples


def refuse_targets(catalog: Catalog) -> None:
    """Refuse a catalog with target columns: shards and their merge carry images, labels and
    paths only (format version 1).

    Raises:
        ValueError: naming the columns and the option to change.
    """
    if catalog.schema:
        names = [c.name for c in catalog.schema]
        raise ValueError(
            f"the catalog of {catalog.root} has target columns {names}; a sharded build "
            "(executor='dask') does not carry target columns yet: build it with "
            "executor='local' (one pack, h5forge.pack.writer.pack)"
        )


def plan_shards(
    catalog: Catalog, *, samples_per_shard: int | None = None, bytes_per_shard: int | None = None
) -> list[ShardSpec]:
    """Cut the catalog's sample list into contiguous shards.

    A shard closes when it holds ``samples_per_shard`` inputs or when its source files add up
    to at least ``bytes_per_shard`` (sizes from ``os.stat`` of the source files, a cheap
    estimate of the work: decoded output size does not depend on it). Give one limit or both.

    Args:
        catalog: from :func:`h5forge.discover.catalog.discover`.
        samples_per_shard: most inputs per shard, >= 1.
        bytes_per_shard: source bytes after which a shard closes, >= 1.

    Returns:
        The shards in order; together they cover every sample exactly once.

    Raises:
        ValueError: neither limit given, or one below 1; the catalog has target columns
            (:func:`refuse_targets`).
        EmptyDatasetError: the catalog has no samples.
    """
    refuse_targets(catalog)
    limits = {"samples_per_shard": samples_per_shard, "bytes_per_shard": bytes_per_shard}
    for name, value in limits.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name}={value!r} must be an int >= 1 (or None)")
    if samples_per_shard is None and bytes_per_shard is None:
        raise ValueError(
            "give samples_per_shard, bytes_per_shard or both: a shard closes when "
            "it reaches either limit"
        )
    n = len(catalog.samples)
    if n == 0:
        raise EmptyDatasetError(f"catalog of {catalog.root} has no samples; nothing to shard")
    specs: list[ShardSpec] = []
    start, size = 0, 0
    for i, sample in enumerate(catalog.samples):
        if bytes_per_shard is not None:
            size += os.stat(sample.path).st_size
        full = (samples_per_shard is not None and i + 1 - start >= samples_per_shard) or (
            bytes_per_shard is not None and size >= bytes_per_shard
        )
        if full or i + 1 == n:
            specs.append(
                ShardSpec(
                    index=len(specs),
                    start=start,
                    stop=i + 1,
                    fingerprint=_fingerprint(catalog, catalog.samples[start : i + 1]),
                    source_bytes=size,
                )
            )
            start, size = i + 1, 0
    return specs
