"""Part-parallel packing: pack each planned part to a staging URL, find those already done.

A part (:class:`h5forge.scale.plan.PartSpec`) is packed anywhere (a Dask worker, this
process) into a normal format-v1 file and published to ``STAGING/part-00003.h5``; its sidecar,
written last by :func:`h5forge.publish.storage.publish`, is the commit marker and records the slice,
the quarantined inputs and the configuration hash. :func:`find_done_parts` trusts a part only
when sidecar, size and sha256 all match, so a re-run redoes only the rest;
:func:`h5forge.scale.merge.merge_parts` then copies the stored bytes of all parts into one file.

A staging folder left by an older h5forge, which called the parts shards (``shard-00003.h5``,
sidecar ``"kind": "h5forge-shard"``), is refused by :func:`find_done_parts`, naming the files and
the fix, rather than resumed: those files are never read, and a run that silently packed
everything again beside them would leave them behind.

Labels stay global: every part carries the whole catalog's classes and split names. The
quarantine limit is global too: parts accept any number of bad inputs and list them; the merge
applies ``max_bad_fraction`` to the total.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from h5forge.discover.catalog import Catalog
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack_slice
from h5forge.publish.sidecar import read_sidecar
from h5forge.publish.storage import publish
from h5forge.scale.plan import PartSpec, part_catalog, part_location, refuse_targets

__all__ = ["PART_KIND", "PartResult", "find_done_parts", "pack_part", "remove_parts"]

#: The ``kind`` field of a part's sidecar (a published asset's sidecar has none).
PART_KIND = "h5forge-part"
#: What an older h5forge named the parts in staging (then called shards): refused, not resumed.
_OLD_PART_NAMES = "shard-[0-9][0-9][0-9][0-9][0-9].h5"


@dataclass(frozen=True)
class PartResult:
    """What :func:`pack_part` published (small: safe to return from a remote task).

    Attributes:
        url: the part file in the staging folder (redacted); sidecar_url: its commit marker.
        quarantined: ``(relative path, reason)`` of the slice's inputs that were not packed.
        seconds: wall time on the worker, preprocessing, verify and upload included.
    """

    index: int
    start: int
    stop: int
    url: str
    sidecar_url: str
    num_samples: int
    num_quarantined: int
    quarantined: tuple[tuple[str, str], ...]
    sha256: str
    bytes: int
    seconds: float


def pack_part(
    catalog: Catalog,
    spec: PartSpec,
    staging: str | os.PathLike[str] | Location,
    *,
    config: PackConfig | None = None,
    processes: int | None = 1,
    tmp_dir: str | os.PathLike[str] | None = None,
) -> PartResult:
    """Pack one part locally, publish it to ``staging``, and write its sidecar last.

    The part is a sealed format-v1 file of the slice with the whole catalog's classes and
    split names. Bad inputs are quarantined and listed, never fatal: the merge applies
    ``max_bad_fraction`` to the whole dataset.

    Args:
        catalog: the whole catalog, or the part's slice (:func:`part_catalog`), which is
            what a remote task should carry.
        spec: the slice, from :func:`plan_parts`.
        staging: folder every worker and the merge can reach: a local path, or a
            :class:`~h5forge.location.Location` (a remote store's carries its storage
            options, which are never recorded).
        config: as for :func:`h5forge.pack.writer.pack` (default :class:`PackConfig()`);
            every part of one build must use the same.
        processes: preprocessing processes inside this task (``workers`` of ``pack``; named
            apart because ``Client.submit`` claims ``workers``). Default 1: on a Dask cluster
            the parallelism is one task per worker process.
        tmp_dir: local scratch folder for the part before upload; default the system's.

    Raises:
        ValueError: ``spec`` does not fit the catalog, it has target columns, or an invalid
            option.
        ChecksumError: the upload read back differently (the bad object is deleted).
    """
    t0 = time.perf_counter()
    refuse_targets(catalog)
    sub = part_catalog(catalog, spec)  # ValueError before any work when spec does not fit
    if processes != 1 and multiprocessing.current_process().daemon:
        raise ValueError(
            f"processes={processes!r} needs child processes, and this is a daemonic process "
            "(a Dask worker by default) that may not start any; use processes=1 and more "
            "workers, or start the workers with DASK_DISTRIBUTED__WORKER__DAEMON=False"
        )
    config = PackConfig() if config is None else config
    dest = part_location(Location.of(staging), spec)
    with tempfile.TemporaryDirectory(prefix="h5forge-part-", dir=tmp_dir) as tmp:
        packed = pack_slice(sub, Path(tmp) / spec.name, config=config, workers=processes)
        # Drop the old commit marker first: publish() skips a destination whose sidecar
        # matches the new file, and a re-pack is usually byte-identical to a damaged part
        # (same second in created_at) whose sidecar still describes the good bytes.
        sidecar = dest.sidecar
        with contextlib.suppress(FileNotFoundError):
            sidecar.fs.rm_file(sidecar.path)
        extra = {
            "kind": PART_KIND,
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
        published = publish(packed.path, dest, overwrite=True, extra=extra)
    return PartResult(
        index=spec.index,
        start=spec.start,
        stop=spec.stop,
        url=published.url,
        sidecar_url=published.sidecar_url,
        num_samples=packed.num_samples,
        num_quarantined=packed.num_quarantined,
        quarantined=packed.quarantined,
        sha256=published.sha256,
        bytes=published.bytes,
        seconds=time.perf_counter() - t0,
    )


def find_done_parts(
    staging: str | os.PathLike[str] | Location,
    specs: Sequence[PartSpec],
    *,
    config: PackConfig | None = None,
) -> set[int]:
    """The indices of the parts in ``specs`` that are already published and intact.

    A part counts as done only when its sidecar exists, names the same slice (index, start,
    stop, fingerprint) and configuration hash, and the file next to it has the sidecar's size
    and sha256 (read in full: a flipped byte makes the part count as not done). Anything else
    (no sidecar, a stale or unreadable one, a missing or damaged file) is simply not done.

    Args:
        staging: the folder the parts were published to (a local path or a
            :class:`~h5forge.location.Location`).
        specs: the plan.
        config: the pack configuration of this build (default :class:`PackConfig()`).

    Raises:
        ValueError: ``staging`` holds parts an older h5forge wrote (``shard-NNNNN.h5``).
    """
    config_sha = (PackConfig() if config is None else config).sha256()
    where = Location.of(staging)
    _refuse_old_parts(where)
    done: set[int] = set()
    for spec in specs:
        part = part_location(where, spec)
        try:
            sidecar = read_sidecar(part)
        except (FileNotFoundError, ValueError):  # none yet, or torn on a store without renames
            continue
        wanted = {
            "kind": PART_KIND,
            "index": spec.index,
            "start": spec.start,
            "stop": spec.stop,
            "fingerprint": spec.fingerprint,
            "config_sha256": config_sha,
        }
        if any(sidecar.get(k) != v for k, v in wanted.items()):
            continue
        fs, path = part.fs, part.path
        fs.invalidate_cache(path)
        try:
            if (
                part.ask("its size", "size", path) != sidecar["bytes"]
                or part.sha256() != sidecar["sha256"]
            ):
                continue
        except FileNotFoundError:
            continue
        done.add(spec.index)
    return done


def _refuse_old_parts(staging: Location) -> None:
    fs, path = staging.fs, staging.path
    old = sorted(fs.glob(path.rstrip("/") + "/" + _OLD_PART_NAMES))
    if old:
        first = str(staging).rstrip("/") + "/" + old[0].rsplit("/", 1)[-1]
        raise ValueError(
            f"staging {staging} holds {len(old)} part file(s) written by an "
            f"older h5forge, named shard-NNNNN.h5 (first: {first}); this h5forge names them "
            "part-NNNNN.h5 and does not resume the old ones. Finish that build with the "
            "h5forge that started it, or delete those files (or give another staging) and "
            "run again, which packs every part anew"
        )


def remove_parts(staging: str | os.PathLike[str] | Location, specs: Sequence[PartSpec]) -> int:
    """Delete the plan's parts from ``staging`` (a local path or a
    :class:`~h5forge.location.Location`), once the merged asset is published.

    Each sidecar goes before its file, so no reader pairs a sidecar with a missing file.
    Returns the number of files deleted.
    """
    removed = 0
    where = Location.of(staging)
    for spec in specs:
        part = part_location(where, spec)
        for each in (part.sidecar, part):
            with contextlib.suppress(FileNotFoundError):
                each.fs.rm_file(each.path)
                removed += 1
    return removed
