"""The pack stage of a Dask build: plan parts, pack the missing ones on the cluster, merge.

:func:`h5forge.flows.build.build_dataset` calls :func:`pack_on_dask` when ``config.executor`` is
``"dask"``. The part tasks go to prefect-dask's ``DaskTaskRunner`` connected to the configured
scheduler: they run on the cluster's workers, report to the same Prefect API, and show up as
task runs of the build's flow run. Planning and the merge run in the flow's process; the merged
file then goes through verify, smoke-load and publish exactly as a local pack does.

A sharded version (``max_shard_size``) takes :func:`pack_shards_on_dask` instead: the part
tasks upload their shards to the asset's store themselves and return manifest entries, and
there is no merge: the flow's machine handles the manifest, never the shards' bytes (but the
one shard it downloads for the verify and smoke-load stages).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.futures import PrefectFuture, as_completed

from h5forge.discover.catalog import Catalog
from h5forge.errors import TooManyBadImagesError
from h5forge.flows.config import BuildConfig
from h5forge.location import Location
from h5forge.pack.writer import PackResult
from h5forge.publish.sharded import Previous, StagedVersion, plan_sharded, stage_sharded
from h5forge.publish.versions import asset_base
from h5forge.redact import redact_url
from h5forge.scale.parts import PartResult
from h5forge.scale.plan import PartSpec, part_catalog, part_location
from h5forge.scale.shard_parts import PartShards, cut_shard_parts, part_samples
from h5forge.tasks.common import dataset_name
from h5forge.tasks.pack import artifact_key, quarantine_table
from h5forge.tasks.parts import (
    PartPlan,
    PartStats,
    merge_task,
    pack_part_shards_task,
    pack_part_task,
    plan_part_build,
    remove_parts,
)

__all__ = ["DaskPacked", "default_staging", "pack_on_dask", "pack_shards_on_dask"]


@dataclass(frozen=True)
class DaskPacked:
    """The merged file (in the work dir) and how the parts went."""

    packed: PackResult
    stats: PartStats
    staging: Location
    specs: tuple[PartSpec, ...]

    def remove_parts(self) -> None:
        """Delete the parts from staging; call once the merged asset is published."""
        remove_parts(self.staging, self.specs)


def default_staging(cache: Path, config: BuildConfig) -> str:
    """A staging folder in the local cache, one per destination and source.

    Named after both, so builds of other datasets never share part names, and a re-run of
    the same build finds the parts its failed predecessor left.
    """
    key = hashlib.sha256(
        "\0".join([config.destination, config.source, config.sha256 or ""]).encode()
    ).hexdigest()[:12]
    return str(cache / "staging" / f"{dataset_name(config.destination)}-{key}")


def pack_on_dask(
    config: BuildConfig,
    *,
    root: str | Catalog,
    out: str,
    dataset: str,
    staging: Location,
    source_url: str,
    source_sha256: str,
    seconds: dict[str, float],
) -> DaskPacked:
    """Plan → pack the parts not done yet on the cluster → merge them into ``out``.

    ``root`` is the catalog the discover task returned, or the fetched folder (catalogued
    again, with ``config.listing``). ``staging`` is ``config.staging`` (or
    :func:`default_staging`) with the Secret block's storage options. Records the ``pack``
    (plan and part tasks) and ``merge`` stage times in ``seconds``.
    The options go to the workers only when staging is remote: a local or shared-disk staging
    needs none, and every copy sent is one more place a secret travels (pickled into each
    task, held by the scheduler).
    """
    assert config.dask_address is not None, "BuildConfig requires it for executor='dask'"
    staging = _for_workers(staging)
    pack_config = config.pack_config()
    start = time.perf_counter()
    plan = plan_part_build(
        root,
        staging=staging,
        samples_per_part=config.part_size,
        bytes_per_part=config.part_bytes,
        config=pack_config,
        listing=config.listing,
    )
    _run_on_cluster(config, plan, staging=staging, dataset=dataset)
    seconds["pack"] = round(time.perf_counter() - start, 3)
    start = time.perf_counter()
    merged = merge_task(
        [part_location(staging, s) for s in plan.specs],
        out=out,
        dataset=dataset,
        max_bad_fraction=config.max_bad_fraction,
        max_pixels=config.max_image_pixels,
        source_url=source_url,
        source_sha256=source_sha256,
        tmp_dir=str(Path(out).parent),
    )
    seconds["merge"] = round(time.perf_counter() - start, 3)
    stats = PartStats(
        address=config.dask_address,
        staging=str(staging),
        total=len(plan.specs),
        packed=tuple(s.index for s in plan.todo),
        skipped=tuple(sorted(plan.done)),
        samples_per_part=config.part_size,
        bytes_per_part=config.part_bytes,
    )
    return DaskPacked(packed=merged, stats=stats, staging=staging, specs=plan.specs)


def _for_workers(where: Location) -> Location:
    """``where`` (staging, or a sharded version's asset) as it goes to the tasks: without
    options when it is on a local or shared disk, which needs none (every copy sent is one
    more place a secret travels)."""
    return Location(where.url) if where.options and where.is_local else where


def _run_on_cluster(
    config: BuildConfig,
    plan: PartPlan,
    *,
    staging: Location,
    dataset: str,
) -> list[PartResult]:
    """Pack ``plan.todo`` as tasks on the Dask cluster; wait for all, then fail if any did.

    Waiting for every part before failing keeps the work of the others: they are committed
    (sidecar written), and the re-run packs only the failed ones.
    """
    logger = get_run_logger()
    todo, total = plan.todo, len(plan.specs)
    pack_config = config.pack_config()  # passed whole: every option reaches the workers
    progress = cast(
        UUID,
        create_progress_artifact(
            100.0 * (total - len(todo)) / total,
            key=artifact_key("pack-progress", dataset),
            description=f"parts of {dataset} packed",
        ),
    )
    if not todo:
        logger.info("all %d parts are already done in %s", total, staging)
        return []
    logger.info(
        "packing %d of %d parts on the Dask cluster at %s", len(todo), total, config.dask_address
    )
    jobs = {
        spec.index: {
            "catalog": part_catalog(plan.catalog, spec),
            "spec": spec,
            "staging": staging,  # pickled as URL and options
            "dataset": dataset,
            "config": pack_config,
        }
        for spec in todo
    }
    finished = [total - len(todo)]

    def done(index: int) -> None:
        finished[0] += 1
        update_progress_artifact(progress, 100.0 * finished[0] / total)

    outcomes = _on_cluster(config, pack_part_task, jobs, done)
    return [cast(PartResult, outcomes[s.index]) for s in todo]


def pack_shards_on_dask(
    config: BuildConfig,
    *,
    catalog: Catalog,
    asset: Location,
    dataset: str,
    name: str,
    previous: Previous | None,
    unchanged: frozenset[str],
) -> tuple[StagedVersion, PartStats]:
    """The new shards of a sharded version, packed and uploaded by the Dask workers.

    The plan (:func:`~h5forge.publish.sharded.plan_sharded`) is cut into parts of whole shards
    (``config.part_size`` images, ``config.part_bytes`` source bytes); each part task packs its
    shards and uploads them to ``asset``'s ``shards/`` folder from the worker
    (:func:`h5forge.scale.shard_parts.pack_part_shards`) and returns their manifest entries. Nothing
    is merged: the staged version lists the referenced shards, then the new ones in plan
    order, all already in the store (``in_store``). Progress counts shards.

    A re-run after a failure packs every part again: a shard's address is known only once it
    is packed. Its bytes are the same (reproducible shards), so the upload rewrites the same
    object; shards uploaded by a failed run and never published stay unreferenced in the store.
    """
    assert config.dask_address is not None, "BuildConfig requires it for executor='dask'"
    assert config.max_shard_size is not None
    pack_config = config.pack_config()
    plan = plan_sharded(
        catalog,
        config=pack_config,
        max_shard_size=config.max_shard_size,
        previous=previous,
        unchanged=unchanged,
    )
    parts = (
        cut_shard_parts(plan, samples_per_part=config.part_size, bytes_per_part=config.part_bytes)
        if plan.groups
        else []
    )
    total = len(plan.groups)
    progress = cast(
        UUID,
        create_progress_artifact(
            0.0 if total else 100.0,
            key=artifact_key("pack-progress", dataset),
            description=f"shards of {dataset}",
        ),
    )
    get_run_logger().info(
        "packing %d new shards in %d parts on the Dask cluster at %s; %d shards referenced",
        total,
        len(parts),
        config.dask_address,
        len(plan.kept),
    )
    parent = frozenset(e.sha256 for e in previous.manifest.shards) if previous else frozenset()
    to_workers = _for_workers(asset)
    jobs = {
        part.index: {
            "catalog": part_samples(plan.fresh, part),
            "part": part,
            "asset": to_workers,
            "dataset": dataset,
            "config": pack_config,
            "parent_shards": parent,
        }
        for part in parts
    }
    finished = [0]

    def done(index: int) -> None:
        finished[0] += len(parts[index].groups)
        update_progress_artifact(progress, 100.0 * finished[0] / total)

    results = _on_cluster(config, pack_part_shards_task, jobs, done) if parts else {}
    # Plan order, not completion order: the version reads in the order the plan made.
    ordered = [cast(PartShards, results[p.index]) for p in parts]
    quarantined = [q for r in ordered for q in r.quarantined]
    table_key = artifact_key("quarantine", dataset)
    try:
        staged = stage_sharded(
            catalog,
            plan,
            [e for r in ordered for e in r.entries],
            quarantined,
            config=pack_config,
            previous=previous,
            max_bad_fraction=config.max_bad_fraction,
            name=name,
            in_store=frozenset(e.sha256 for r in ordered for e in r.entries),
        )
    except TooManyBadImagesError as e:
        quarantine_table(e.quarantined, key=table_key)
        raise
    quarantine_table(staged.quarantined, key=table_key)
    stats = PartStats(
        address=config.dask_address,
        staging=redact_url(asset_base(asset.url) + "/shards"),
        total=len(parts),
        packed=tuple(p.index for p in parts),
        skipped=(),
        samples_per_part=config.part_size,
        bytes_per_part=config.part_bytes,
    )
    return staged, stats


def _on_cluster(
    config: BuildConfig,
    task: Any,
    jobs: dict[int, dict[str, Any]],
    on_done: Callable[[int], None],
) -> dict[int, Any]:
    """Run ``task`` with each of ``jobs``' parameters on the Dask cluster (``on_done`` with
    the job's key as each one ends); wait for all, then fail if any did, with the first
    failed job's error (every failure is logged). Waiting keeps the others' work."""
    from prefect_dask import DaskTaskRunner  # distributed is slow to import; only Dask builds

    logger = get_run_logger()
    outcomes: dict[int, Any] = {}
    failed: dict[int, BaseException] = {}
    with DaskTaskRunner(address=config.dask_address) as runner:
        try:
            runner.client  # noqa: B018 - connect now, to fail with a clear message
        except OSError as e:
            raise ConnectionError(
                f"cannot reach the Dask scheduler at {config.dask_address} ({e}); is "
                "`dask scheduler` running there, and is its port open from this machine?"
            ) from e
        futures = {runner.submit(task, parameters=params): i for i, params in jobs.items()}
        for future in as_completed(list(futures)):
            index = futures[future]
            outcome = _outcome(future)
            if isinstance(outcome, BaseException):
                failed[index] = outcome
            else:
                outcomes[index] = outcome
            on_done(index)
    if failed:
        for i, error in sorted(failed.items()):
            logger.error("part %d failed: %s: %s", i, type(error).__name__, error)
        raise failed[min(failed)]
    return outcomes


def _outcome(future: PrefectFuture[Any]) -> Any:
    try:
        return future.result()
    except Exception as e:  # noqa: BLE001 - a failed part or a lost worker: re-raised above
        return e
