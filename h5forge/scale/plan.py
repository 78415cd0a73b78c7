"""The plan of a part-parallel pack: contiguous slices of a catalog, each fingerprinted.

A part is a contiguous slice of the catalog's samples (:class:`PartSpec`), cut by count or by
source bytes (:func:`plan_parts`) and named by its position (``part-00003.h5``). Its
fingerprint covers the slice's relative paths, labels and splits and the catalog's classes and
split names, so a part packed from another catalog is never taken for this one's. Packing and
finding done parts: :mod:`h5forge.scale.parts`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass

from h5forge.discover.catalog import Catalog, Sample
from h5forge.errors import EmptyDatasetError
from h5forge.location import Location

__all__ = [
    "PartSpec",
    "plan_parts",
    "refuse_targets",
    "part_catalog",
    "part_location",
    "part_url",
]


@dataclass(frozen=True)
class PartSpec:
    """One part of a plan: samples ``start..stop-1`` of the catalog.

    Attributes:
        index: position in the plan; names the file (``part-00003.h5``).
        start: first sample (inclusive).
        stop: last sample + 1.
        fingerprint: sha256 hex of the slice's relative paths, labels and splits and the
            catalog's classes and split names: a part packed from another catalog never matches.
        source_bytes: total size of the slice's source files (0 when planned by count only).
    """

    index: int
    start: int
    stop: int
    fingerprint: str
    source_bytes: int = 0

    @property
    def name(self) -> str:
        """File name of the part in the staging folder."""
        return f"part-{self.index:05d}.h5"

    @property
    def count(self) -> int:
        """Number of inputs in the slice."""
        return self.stop - self.start


def part_url(staging_url: str, spec: PartSpec) -> str:
    """``staging_url/part-NNNNN.h5`` (a local folder or any fsspec URL)."""
    if not staging_url:
        raise ValueError(
            "staging_url is empty; give a folder every worker can reach "
            "(a shared path, or a bucket prefix such as s3://bucket/staging/)"
        )
    return staging_url.rstrip("/") + "/" + spec.name


def part_location(staging: Location, spec: PartSpec) -> Location:
    """The part file of ``spec`` in ``staging``, on the same store with the same options."""
    return staging.with_url(part_url(staging.url, spec))


def _fingerprint(catalog: Catalog, samples: Sequence[Sample]) -> str:
    h = hashlib.sha256()
    h.update("\0".join(catalog.classes).encode("utf-8", "surrogateescape") + b"\1")
    h.update("\0".join(catalog.splits).encode("utf-8", "surrogateescape") + b"\1")
    for s in samples:
        h.update(f"{s.relpath}\0{s.label}\0{s.split}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def part_catalog(catalog: Catalog, spec: PartSpec) -> Catalog:
    """The slice of ``catalog`` that ``spec`` covers, with the same classes and split names.

    Send this, not the whole catalog, with each remote task of a big dataset: a task then
    carries its own inputs only. :func:`pack_part` accepts either.
    """
    return Catalog(
        root=catalog.root,
        samples=_slice(catalog, spec),
        classes=catalog.classes,
        splits=catalog.splits,
        skipped={},
    )


def _slice(catalog: Catalog, spec: PartSpec) -> tuple[Sample, ...]:
    """``spec``'s samples from the whole catalog, or the catalog's own when it is the slice.

    Raises:
        ValueError: ``spec`` does not fit ``catalog`` (another catalog, or a stale plan).
    """
    n = len(catalog.samples)
    if n == spec.count:  # already sliced (or a one-part plan: the same samples either way)
        samples = catalog.samples
    elif 0 <= spec.start < spec.stop <= n:
        samples = catalog.samples[spec.start : spec.stop]
    else:
        raise ValueError(
            f"part {spec.index} covers samples {spec.start}..{spec.stop - 1}, the "
            f"catalog has {n}; pass the whole catalog or part_catalog(catalog, "
            "spec), or re-plan with plan_parts"
        )
    if _fingerprint(catalog, samples) != spec.fingerprint:
        raise ValueError(
            f"part {spec.index} was planned for another catalog (the fingerprint "
            "of its samples differs); re-plan with plan_parts on this catalog"
        )
    return samples


def refuse_targets(catalog: Catalog) -> None:
    """Refuse a catalog with target columns: parts and their merge carry images, labels and
    paths only (format version 1).

    Raises:
        ValueError: naming the columns and the option to change.
    """
    if catalog.schema:
        names = [c.name for c in catalog.schema]
        raise ValueError(
            f"the catalog of {catalog.root} has target columns {names}; a Dask build "
            "(executor='dask') does not carry target columns yet: build it with "
            "executor='local' (one pack, h5forge.pack.writer.pack)"
        )


def plan_parts(
    catalog: Catalog, *, samples_per_part: int | None = None, bytes_per_part: int | None = None
) -> list[PartSpec]:
    """Cut the catalog's sample list into contiguous parts.

    A part closes when it holds ``samples_per_part`` inputs or when its source files add up
    to at least ``bytes_per_part`` (sizes from ``os.stat`` of the source files, a cheap
    estimate of the work: decoded output size does not depend on it). Give one limit or both.

    Args:
        catalog: from :func:`h5forge.discover.catalog.discover`.
        samples_per_part: most inputs per part, >= 1.
        bytes_per_part: source bytes after which a part closes, >= 1.

    Returns:
        The parts in order; together they cover every sample exactly once.

    Raises:
        ValueError: neither limit given, or one below 1; the catalog has target columns
            (:func:`refuse_targets`).
        EmptyDatasetError: the catalog has no samples.
    """
    refuse_targets(catalog)
    limits = {"samples_per_part": samples_per_part, "bytes_per_part": bytes_per_part}
    for name, value in limits.items():
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name}={value!r} must be an int >= 1 (or None)")
    if samples_per_part is None and bytes_per_part is None:
        raise ValueError(
            "give samples_per_part, bytes_per_part or both: a part closes when "
            "it reaches either limit"
        )
    n = len(catalog.samples)
    if n == 0:
        raise EmptyDatasetError(f"catalog of {catalog.root} has no samples; nothing to part")
    specs: list[PartSpec] = []
    start, size = 0, 0
    for i, sample in enumerate(catalog.samples):
        if bytes_per_part is not None:
            size += os.stat(sample.path).st_size
        full = (samples_per_part is not None and i + 1 - start >= samples_per_part) or (
            bytes_per_part is not None and size >= bytes_per_part
        )
        if full or i + 1 == n:
            specs.append(
                PartSpec(
                    index=len(specs),
                    start=start,
                    stop=i + 1,
                    fingerprint=_fingerprint(catalog, catalog.samples[start : i + 1]),
                    source_bytes=size,
                )
            )
            start, size = i + 1, 0
    return specs
