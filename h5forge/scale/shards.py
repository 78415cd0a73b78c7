"""Shard-parallel packing: pack each planned shard to a staging URL, find those already done.

A shard (:class:`h5forge.scale.plan.ShardSpec`) is packed anywhere (a Dask worker, this
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
import multiprocessing
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h5forge.discover.catalog import Catalog
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack_slice
from h5forge.publish.manifest import read_manifest
from h5forge.publish.storage import publish
from h5forge.scale.plan import ShardSpec, refuse_targets, shard_catalog, shard_url

__all__ = ["SHARD_KIND", "ShardResult", "find_done_shards", "pack_shard", "remove_shards"]

#: The ``kind`` field of a shard manifest (a published asset's manifest has none).
SHARD_KIND = "h5forge-shard"


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


def pack_shard(
    catalog: Catalog,
    spec: ShardSpec,
    staging_url: str,
    *,
    config: PackConfig | None = None,
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
        config: as for :func:`h5forge.pack.writer.pack` (default :class:`PackConfig()`);
            every shard of one build must use the same.
        processes: preprocessing processes inside this task (``workers`` of ``pack``; named
            apart because ``Client.submit`` claims ``workers``). Default 1: on a Dask cluster
            the parallelism is one task per worker process.
        storage_options: for the staging URL; never recorded.
        tmp_dir: local scratch folder for the shard before upload; default the system's.

    Raises:
        ValueError: ``spec`` does not fit the catalog, it has target columns, or an invalid
            option.
        ChecksumError: the upload read back differently (the bad object is deleted).
    """
    t0 = time.perf_counter()
    refuse_targets(catalog)
    sub = shard_catalog(catalog, spec)  # ValueError before any work when spec does not fit
    if processes != 1 and multiprocessing.current_process().daemon:
        raise ValueError(
            f"processes={processes!r} needs child processes, and this is a daemonic process "
            "(a Dask worker by default) that may not start any; use processes=1 and more "
            "workers, or start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False"
        )
    config = PackConfig() if config is None else config
    dest = shard_url(staging_url, spec)
    with tempfile.TemporaryDirectory(prefix="h5forge-shard-", dir=tmp_dir) as tmp:
        packed = pack_slice(sub, Path(tmp) / spec.name, config=config, workers=processes)
        # Drop the old commit marker first: publish() skips a destination whose manifest
        # matches the new file, and a re-pack is usually byte-identical to a damaged shard
        # (same second in created_at) whose manifest still describes the good bytes.
        sidecar = Location.of(dest, storage_options).sidecar
        with contextlib.suppress(FileNotFoundError):
            sidecar.fs.rm_file(sidecar.path)
        extra = {
            "kind": SHARD_KIND,
            "index": spec.index,
            "start": spec.start,
            "stop": spec.stop,
            "fingerprint": spec.fingerprint,
            "config_sha256": config.sha256(),
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
    config: PackConfig | None = None,
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
        config: the pack configuration of this build (default :class:`PackConfig()`).
        storage_options: for the staging URL.
    """
    config_sha = (PackConfig() if config is None else config).sha256()
    options = dict(storage_options or {})
    done: set[int] = set()
    for spec in specs:
        shard = Location.of(shard_url(staging_url, spec), options)
        try:
            manifest = read_manifest(shard)
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
        fs, path = shard.fs, shard.path
        fs.invalidate_cache(path)
        try:
            if fs.size(path) != manifest["bytes"] or shard.sha256() != manifest["sha256"]:
                continue
        except FileNotFoundError:
            continue
        done.add(spec.index)
    return done


def remove_shards(
    staging: str, specs: Sequence[ShardSpec], *, storage_options: dict[str, Any] | None = None
) -> int:
    """Delete the plan's shards from ``staging`` (once the merged asset is published).

    Each manifest goes before its file, so no reader pairs a manifest with a missing file.
    Returns the number of files deleted.
    """
    removed = 0
    for spec in specs:
        shard = Location.of(shard_url(staging, spec), storage_options)
        for each in (shard.sidecar, shard):
            with contextlib.suppress(FileNotFoundError):
                each.fs.rm_file(each.path)
                removed += 1
    return removed
