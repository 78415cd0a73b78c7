"""The pack stage of a Dask build: plan parts, pack the missing ones on the cluster, merge.

:func:`h5forge.flows.build.build_dataset` calls :func:`pack_on_dask` when ``config.executor`` is
``"dask"``. The part tasks go to prefect-dask's ``DaskTaskRunner`` connected to the configured
scheduler: they run on the cluster's workers, report to the same Prefect API, and show up as
task runs of the build's flow run. Planning and the merge run in the flow's process; the merged
file then goes through verify, smoke-load and publish exactly as a local pack does.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast
from uuid import UUID

from prefect import get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.futures import PrefectFuture, as_completed

from h5forge.discover.catalog import Catalog
from h5forge.flows.config import BuildConfig
from h5forge.location import Location
from h5forge.pack.writer import PackResult
from h5forge.scale.parts import PartResult
from h5forge.scale.plan import PartSpec, part_catalog, part_location
from h5forge.tasks.common import dataset_name
from h5forge.tasks.pack import artifact_key
from h5forge.tasks.parts import (
    PartPlan,
    PartStats,
    merge_task,
    pack_part_task,
    plan_part_build,
    remove_parts,
)

__all__ = ["DaskPacked", "default_staging", "pack_on_dask"]


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


def _for_workers(staging: Location) -> Location:
    """``staging`` as it goes to the tasks: without options when it is on a local or shared
    disk, which needs none (every copy sent is one more place a secret travels)."""
    return Location(staging.url) if staging.options and staging.is_local else staging


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
    from prefect_dask import DaskTaskRunner  # distributed is slow to import; only Dask builds

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
    outcomes: dict[int, PartResult | BaseException] = {}
    with DaskTaskRunner(address=config.dask_address) as runner:
        try:
            runner.client  # noqa: B018 - connect now, to fail with a clear message
        except OSError as e:
            raise ConnectionError(
                f"cannot reach the Dask scheduler at {config.dask_address} ({e}); is "
                "`dask scheduler` running there, and is its port open from this machine?"
            ) from e
        futures: dict[PrefectFuture[PartResult], PartSpec] = {}
        for spec in todo:
            future = runner.submit(
                pack_part_task,
                parameters={
                    "catalog": part_catalog(plan.catalog, spec),
                    "spec": spec,
                    "staging": staging,  # pickled as URL and options
                    "dataset": dataset,
                    "config": pack_config,
                },
            )
            futures[future] = spec
        for future in as_completed(list(futures)):
            outcomes[futures[future].index] = _outcome(future)
            done = total - len(todo) + len(outcomes)
            update_progress_artifact(progress, 100.0 * done / total)
    failed = {i: o for i, o in outcomes.items() if isinstance(o, BaseException)}
    if failed:
        for i, error in sorted(failed.items()):
            logger.error("part %d failed: %s: %s", i, type(error).__name__, error)
        raise failed[min(failed)]
    return [cast(PartResult, outcomes[s.index]) for s in todo]


def _outcome(future: PrefectFuture[PartResult]) -> PartResult | BaseException:
    try:
        return future.result()
    except Exception as e:  # noqa: BLE001 - a failed part or a lost worker: re-raised above
        return e
