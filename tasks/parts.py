"""Part stages of a Dask build: plan (finding finished parts), pack one part, merge, clean up.

``pack_part_task`` is what runs on the Dask workers: a thin task over
:func:`h5forge.scale.parts.pack_part` with retries, returning the small
:class:`h5forge.scale.parts.PartResult` (never arrays). A sharded version's parts run as
``pack_part_shards_task`` (:func:`h5forge.scale.shard_parts.pack_part_shards`: shards uploaded from
the worker, manifest entries returned; no merge). The others run in the flow's process.
Caching is off for all of them: whether a part is done is decided by its sidecar in the
staging folder (:func:`h5forge.scale.parts.find_done_parts`), not by Prefect's cache. That
also keeps the staging :class:`~h5forge.location.Location` they take, whose options may hold
credentials, out of any cache key (``NO_CACHE`` hashes no input).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefect import get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field

from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import TooManyBadImagesError
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult
from h5forge.scale.merge import merge_parts
from h5forge.scale.parts import PartResult, find_done_parts, pack_part
from h5forge.scale.parts import remove_parts as remove_part_files
from h5forge.scale.plan import PartSpec, plan_parts
from h5forge.scale.shard_parts import PartShards, ShardPart, pack_part_shards
from h5forge.tasks.common import (
    retry_upload,
    run_name,
    with_retries,
)
from h5forge.tasks.pack import artifact_key, quarantine_table

__all__ = [
    "PartPlan",
    "PartStats",
    "executor_section",
    "merge_task",
    "pack_part_shards_task",
    "pack_part_task",
    "plan_part_build",
    "remove_parts",
]


@dataclass(frozen=True)
class PartPlan:
    """The catalog cut into parts, and which parts the staging folder already holds intact.

    It stays in the flow's process (the catalog lists every sample); each remote task gets
    only its own slice.
    """

    catalog: Catalog
    specs: tuple[PartSpec, ...]
    done: frozenset[int]

    @property
    def todo(self) -> list[PartSpec]:
        """The parts this run must pack."""
        return [s for s in self.specs if s.index not in self.done]


class PartStats(BaseModel):
    """How a Dask build went (URLs redacted)."""

    model_config = ConfigDict(frozen=True)

    address: str = Field(description="the Dask scheduler the parts ran on")
    staging: str = Field(
        description="where the parts and their sidecars were published (a sharded version: "
        "the shards folder the parts uploaded to)"
    )
    total: int = Field(description="parts in the plan")
    packed: tuple[int, ...] = Field(description="parts packed by this run")
    skipped: tuple[int, ...] = Field(description="parts found done in staging and reused")
    samples_per_part: int
    bytes_per_part: int | None = None


@task(
    name="plan-parts",
    task_run_name=run_name("plan-parts"),
    cache_policy=NO_CACHE,
    **with_retries(2),
)
def plan_part_build(
    src: str | Catalog,
    *,
    staging: Location,
    samples_per_part: int,
    bytes_per_part: int | None,
    config: PackConfig,
    listing: str | None = None,
) -> PartPlan:
    """Cut ``src`` into parts, and find those already done in ``staging``.

    ``src`` is the catalog the discover task returned (or a folder, catalogued here with
    ``listing``, a CSV/JSONL sample listing, as for a local pack). A part counts as done
    when its sidecar matches the plan and ``config`` and its file has the sidecar's size and
    sha256 (each finished part is read once to check).
    """
    catalog = src if isinstance(src, Catalog) else discover(src, listing=listing)
    specs = plan_parts(catalog, samples_per_part=samples_per_part, bytes_per_part=bytes_per_part)
    done = find_done_parts(staging, specs, config=config)
    get_run_logger().info(
        "%d parts of up to %d images; %d already done in %s, %d to pack",
        len(specs),
        samples_per_part,
        len(done),
        staging,
        len(specs) - len(done),
    )
    return PartPlan(catalog=catalog, specs=tuple(specs), done=frozenset(done))


def _part_run_name() -> str:
    params = runtime.task_run.parameters
    spec = params.get("spec")
    where = f" {spec.name}" if isinstance(spec, PartSpec) else ""
    return f"pack-part[{params.get('dataset', '')}{where}]"


@task(
    name="pack-part",
    task_run_name=_part_run_name,
    cache_policy=NO_CACHE,
    **with_retries(2, retry_upload),
)
def pack_part_task(
    catalog: Catalog,
    spec: PartSpec,
    staging: Location,
    *,
    dataset: str,
    config: PackConfig,
) -> PartResult:
    """Pack one part on a worker and publish it, sidecar last (see
    :func:`h5forge.scale.parts.pack_part`). One process per task: the cluster's worker processes
    are the parallelism. ``dataset`` names the task run."""
    result = pack_part(catalog, spec, staging, config=config, processes=1)
    get_run_logger().info(
        "%s: %d images (%d quarantined), %.1f MB in %.1f s",
        spec.name,
        result.num_samples,
        result.num_quarantined,
        result.bytes / 1e6,
        result.seconds,
    )
    return result


def _shards_run_name() -> str:
    params = runtime.task_run.parameters
    part = params.get("part")
    where = f" {part.name}" if isinstance(part, ShardPart) else ""
    return f"pack-part-shards[{params.get('dataset', '')}{where}]"


@task(
    name="pack-part-shards",
    task_run_name=_shards_run_name,
    cache_policy=NO_CACHE,
    **with_retries(2, retry_upload),
)
def pack_part_shards_task(
    catalog: Catalog,
    part: ShardPart,
    asset: Location,
    *,
    dataset: str,
    config: PackConfig,
    parent_shards: frozenset[str],
) -> PartShards:
    """Pack one part of a sharded plan into shards on a worker and upload each to the asset
    (see :func:`h5forge.scale.shard_parts.pack_part_shards`). ``dataset`` names the task run."""
    result = pack_part_shards(catalog, part, asset, config=config, parent_shards=parent_shards)
    get_run_logger().info(
        "%s: %d shards (%d uploaded, %.1f MB), %d quarantined, in %.1f s",
        part.name,
        len(result.entries),
        len(result.uploaded),
        result.bytes_uploaded / 1e6,
        len(result.quarantined),
        result.seconds,
    )
    return result


@task(name="merge", task_run_name=run_name("merge"), cache_policy=NO_CACHE)
def merge_task(
    parts: Sequence[Location],
    *,
    out: str,
    dataset: str,
    max_bad_fraction: float,
    max_pixels: int,
    source_url: str = "",
    source_sha256: str = "",
    tmp_dir: str | None = None,
) -> PackResult:
    """Merge the parts into the local file ``out`` (see :func:`h5forge.scale.merge.merge_parts`).

    ``max_pixels`` is the build's ``max_image_pixels``, the bound the merged file is verified
    with before it is sealed.

    The quarantine table artifact lists every input no part could pack, as a local pack's
    does, also when too many were quarantined and the merge fails.
    """
    table_key = artifact_key("quarantine", dataset)
    try:
        result = merge_parts(
            parts,
            out,
            max_bad_fraction=max_bad_fraction,
            source_url=source_url,
            source_sha256=source_sha256,
            overwrite=True,
            tmp_dir=tmp_dir,
            max_pixels=max_pixels,
        )
    except TooManyBadImagesError as e:
        quarantine_table(e.quarantined, key=table_key)
        raise
    quarantine_table(result.quarantined, key=table_key)
    get_run_logger().info(
        "merged %d parts: %d samples (%d quarantined), %.1f MB in %.1f s",
        len(parts),
        result.num_samples,
        result.num_quarantined,
        result.bytes / 1e6,
        result.seconds,
    )
    return result


@task(
    name="remove-parts",
    task_run_name=run_name("remove-parts"),
    cache_policy=NO_CACHE,
    **with_retries(2),
)
def remove_parts(staging: Location, specs: Sequence[PartSpec]) -> int:
    """:func:`h5forge.scale.parts.remove_parts`, once the merged asset is published."""
    return remove_part_files(staging, specs)


def executor_section(
    *, workers: int | None, parts: PartStats | None, seconds: dict[str, float]
) -> str:
    """The report's markdown section on where the images were packed (``parts``: None for
    the local executor)."""
    if parts is None:
        pool = f"{workers} processes" if workers else "one process per CPU"
        return f"\n## Executor\n\nlocal: a process pool on the flow's machine ({pool}).\n"
    packed, skipped = len(parts.packed), len(parts.skipped)
    limits = f"up to {parts.samples_per_part} images" + (
        f" or {parts.bytes_per_part:,} source bytes" if parts.bytes_per_part else ""
    )
    listed = ", ".join(str(i) for i in parts.skipped[:50]) + (" …" if skipped > 50 else "")
    lines = [
        "",
        "## Executor",
        "",
        f"dask: `{parts.address}`, staging `{parts.staging}`.",
        "",
        f"- **parts**: {parts.total} of {limits}; **packed by this run**: {packed}; "
        f"**skipped** (found done in staging, sidecar and sha256 checked): {skipped}"
        + (f" ({listed})" if skipped else ""),
        f"- **part stage**: {seconds.get('pack', 0.0):,.2f} s on the cluster; "
        + (
            f"**merge**: {seconds['merge']:,.2f} s here (stored bytes copied, each "
            "sample's digest checked)"
            if "merge" in seconds
            else "**no merge**: each part uploaded its own shards to the store"
        ),
        "",
    ]
    return "\n".join(lines)
