"""Shard-parallel packing: plan slices of a catalog, pack each to a staging URL, find what is done.

A shard is a contiguous slice of the catalog's samples, packed anywhere (a Dask worker, this
process) into a normal format-v1 file and published to ``STAGING/shard-00003.h5``; its manifest,
written last by :func:`h5forge.publish.storage.publish`, is the commit marker and records the slice,
the quarantined inputs and the configuration hash. :func:`find_done_shards` trusts a shard only
when manifest, size and sha256 all match, so a re-run redoes only the rest;
:func:`h5forge.scale.merge.merge_shards` then copies the stored bytes of all shards into one file.

Labels stay global: every shard carries the whole catalog's classes and split names. The
quarantine limit is global too: shards accept any number of bad inputs and list them; the merge
applies ``max_bad_fraction`` to the total.
"""

from __future__ import annotations

import contextlib
import hashlib
import multiprocessing
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec

from h5forge.discover.catalog import Catalog, Sample
from h5forge.errors import EmptyDatasetError
from h5forge.hashing import sha256_file
from h5forge.pack.writer import _config_json, _filter_kwargs, _pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.manifest import MANIFEST_SUFFIX, read_manifest
from h5forge.publish.storage import publish

__all__ = [
    "SHARD_KIND",
    "ShardResult",
    "ShardSpec",
    "find_done_shards",
    "pack_shard",
    "plan_shards",
    "shard_catalog",
    "shard_config_sha256",
    "shard_url",
]

#: The ``kind`` field of a shard manifest (a published asset's manifest has none).
SHARD_KIND = "h5forge-shard"


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


@dataclass(frozen=True)
class ShardResult:
    """What :func:`pack_shard` published (small: safe to return from a remote task).

    Attributes:
        url: the shard file in the staging folder (redacted); manifest_url: its commit marker.
        quarantined: ``(relative path, reason)`` of the slice's inputs that were not packed.
        seconds: wall time on the worker, preprocessing, verify and upload included.
    """

    index: int
    start: int
    stop: int
    url: str
    manifest_url: str
    num_samples: int
    num_quarantined: int
    quarantined: tuple[tuple[str, str], ...]
    sha256: str
    bytes: int
    seconds: float


def shard_url(staging_url: str, spec: ShardSpec) -> str:
    """``staging_url/shard-NNNNN.h5`` (a local folder or any fsspec URL)."""
    if not staging_url:
        raise ValueError(
            "staging_url is empty; give a folder every worker can reach "
            "(a shared path, or a bucket prefix such as s3://bucket/staging/)"
        )
    return staging_url.rstrip("/") + "/" + spec.name


def shard_config_sha256(
    *,
    image: ImageConfig | None = None,
    compression: str | None = None,
    compression_level: int | None = None,
    fletcher32: bool = False,
) -> str:
    """The ``config_sha256`` a shard packed with these options carries (and its manifest)."""
    image = image or ImageConfig()
    image.validate()
    _filter_kwargs(compression, compression_level, fletcher32)  # validates the options
    return hashlib.sha256(
        _config_json(image, compression, compression_level, fletcher32).encode()
    ).hexdigest()


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
    """``spec``'s samples from the whole catalog, or the catalog itself when it is the slice."""
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
        ValueError: neither limit given, or one below 1.
        EmptyDatasetError: the catalog has no samples.
    """
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


def pack_shard(
    catalog: Catalog,
    spec: ShardSpec,
    staging_url: str,
    *,
    image: ImageConfig | None = None,
    compression: str | None = None,
    compression_level: int | None = None,
    fletcher32: bool = False,
    processes: int | None = 1,
    storage_options: Mapping[str, Any] | None = None,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> ShardResult:
    """Pack one shard locally, publish it to ``staging_url``, and write its manifest last.

    The shard is a sealed format-v1 file of the slice with the whole catalog's classes and
    split names. Bad inputs are quarantined and listed, never fatal: the merge applies
    ``max_bad_fraction`` to the whole dataset.

    Args:
        catalog: the whole catalog, or the shard's slice (:func:`shard_catalog`), which is
            what a remote task should carry.
        spec: the slice, from :func:`plan_shards`.
        staging_url: folder (local path or fsspec URL) every worker and the merge can reach.
        image, compression, compression_level, fletcher32: as for :func:`h5forge.pack.writer.pack`;
            every shard of one build must use the same.
        processes: preprocessing processes inside this task (``workers`` of ``pack``; named
            apart because ``Client.submit`` claims ``workers``). Default 1: on a Dask cluster
            the parallelism is one task per worker process.
        storage_options: for the staging URL; never recorded.
        tmp_dir: local scratch folder for the shard before upload; default the system's.

    Raises:
        ValueError: ``spec`` does not fit the catalog, or an invalid option.
        ChecksumError: the upload read back differently (the bad object is deleted).
    """
    t0 = time.perf_counter()
    samples = _slice(catalog, spec)
    if processes != 1 and multiprocessing.current_process().daemon:
        raise ValueError(
            f"processes={processes!r} needs child processes, and this is a daemonic process "
            "(a Dask worker by default) that may not start any; use processes=1 and more "
            "workers, or start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False"
        )
    image = image or ImageConfig()
    config_sha = shard_config_sha256(
        image=image,
        compression=compression,
        compression_level=compression_level,
        fletcher32=fletcher32,
    )
    dest = shard_url(staging_url, spec)
    sub = Catalog(
        root=catalog.root,
        samples=samples,
        classes=catalog.classes,
        splits=catalog.splits,
        skipped={},
    )
    with tempfile.TemporaryDirectory(prefix="h5forge-shard-", dir=tmp_dir) as tmp:
        packed = _pack(
            sub,
            Path(tmp) / spec.name,
            image=image,
            compression=compression,
            compression_level=compression_level,
            fletcher32=fletcher32,
            workers=processes,
            max_bad_fraction=1.0,
            manifest=None,
            source_url="",
            source_sha256="",
            progress=False,
            on_progress=None,
            overwrite=True,
            every_class=False,
        )
        # Drop the old commit marker first: publish() skips a destination whose manifest
        # matches the new file, and a re-pack is usually byte-identical to a damaged shard
        # (same second in created_at) whose manifest still describes the good bytes.
        fs, path = fsspec.core.url_to_fs(dest, **dict(storage_options or {}))
        with contextlib.suppress(FileNotFoundError):
            fs.rm_file(path + MANIFEST_SUFFIX)
        extra = {
            "kind": SHARD_KIND,
            "index": spec.index,
            "start": spec.start,
            "stop": spec.stop,
            "fingerprint": spec.fingerprint,
            "config_sha256": config_sha,
            "num_samples": packed.num_samples,
            "num_quarantined": packed.num_quarantined,
            "quarantined": [list(q) for q in packed.quarantined],
            "counts": packed.counts,
        }
        published = publish(
            packed.path, dest, storage_options=storage_options, overwrite=True, extra=extra
        )
    return ShardResult(
        index=spec.index,
        start=spec.start,
        stop=spec.stop,
        url=published.url,
        manifest_url=published.manifest_url,
        num_samples=packed.num_samples,
        num_quarantined=packed.num_quarantined,
        quarantined=packed.quarantined,
        sha256=published.sha256,
        bytes=published.bytes,
        seconds=time.perf_counter() - t0,
    )


def find_done_shards(
    staging_url: str,
    specs: Sequence[ShardSpec],
    *,
    image: ImageConfig | None = None,
    compression: str | None = None,
    compression_level: int | None = None,
    fletcher32: bool = False,
    storage_options: Mapping[str, Any] | None = None,
) -> set[int]:
    """The indices of the shards in ``specs`` that are already published and intact.

    A shard counts as done only when its manifest exists, names the same slice (index, start,
    stop, fingerprint) and configuration hash, and the file next to it has the manifest's size
    and sha256 (read in full: a flipped byte makes the shard count as not done). Anything else
    (no manifest, a stale or unreadable one, a missing or damaged file) is simply not done.

    Args:
        staging_url: the folder the shards were published to.
        specs: the plan.
        image, compression, compression_level, fletcher32: the options of this build.
        storage_options: for the staging URL.
    """
    config_sha = shard_config_sha256(
        image=image,
        compression=compression,
        compression_level=compression_level,
        fletcher32=fletcher32,
    )
    options = dict(storage_options or {})
    done: set[int] = set()
    for spec in specs:
        url = shard_url(staging_url, spec)
        try:
            manifest = read_manifest(url, storage_options=options)
        except (FileNotFoundError, ValueError):  # none yet, or torn on a store without renames
            continue
        wanted = {
            "kind": SHARD_KIND,
            "index": spec.index,
            "start": spec.start,
            "stop": spec.stop,
            "fingerprint": spec.fingerprint,
            "config_sha256": config_sha,
        }
        if any(manifest.get(k) != v for k, v in wanted.items()):
            continue
        fs, path = fsspec.core.url_to_fs(url, **options)
        fs.invalidate_cache(path)
        try:
            if (
                fs.size(path) != manifest["bytes"]
                or sha256_file(url, storage_options=options) != manifest["sha256"]
            ):
                continue
        except FileNotFoundError:
            continue
        done.add(spec.index)
    return done
