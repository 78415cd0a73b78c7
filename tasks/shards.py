"""Shard stages of a Dask build: plan (finding finished shards), pack one shard, merge, clean up.

``pack_shard_task`` is what runs on the Dask workers: a thin task over
:func:`h5forge.scale.shards.pack_shard` with retries, returning the small
:class:`h5forge.scale.shards.ShardResult` (never arrays). The others run in the flow's process.
Caching is off for all of them: whether a shard is done is decided by its manifest in the
staging folder (:func:`h5forge.scale.shards.find_done_shards`), not by Prefect's cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from prefect import get_run_logger, runtime, task
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, ConfigDict, Field

from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import TooManyBadImagesError
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import PackResult
from h5forge.redact import redact_url
from h5forge.scale.merge import merge_shards
from h5forge.scale.plan import ShardSpec, plan_shards
from h5forge.scale.shards import ShardResult, find_done_shards, pack_shard
from h5forge.scale.shards import remove_shards as remove_shard_files
from h5forge.tasks.common import (
    retry_upload,
    run_name,
    with_retries,
)
from h5forge.tasks.pack import artifact_key, quarantine_table

__all__ = [
    "ShardPlan",
    "ShardStats",
    "executor_section",
    "merge_task",
    "pack_shard_task",
    "plan_shard_build",
    "remove_shards",
]


@dataclass(frozen=True)
class ShardPlan:
    """The catalog cut into shards, and which shards the staging folder already holds intact.

    It stays in the flow's process (the catalog lists every sample); each remote task gets
    only its own slice.
    """

    catalog: Catalog
    specs: tuple[ShardSpec, ...]
    done: frozenset[int]

    @property
    def todo(self) -> list[ShardSpec]:
        """The shards this run must pack."""
        return [s for s in self.specs if s.index not in self.done]


class ShardStats(BaseModel):
    """How a Dask build went (URLs redacted)."""

    model_config = ConfigDict(frozen=True)

    address: str = Field(description="the Dask scheduler the shards ran on")
    staging: str = Field(description="where the shards and their manifests were published")
    total: int = Field(description="shards in the plan")
    packed: tuple[int, ...] = Field(description="shards packed by this run")
    skipped: tuple[int, ...] = Field(description="shards found done in staging and reused")
    samples_per_shard: int
    bytes_per_shard: int | None = None


@task(
    name="plan-shards",
    task_run_name=run_name("plan-shards"),
    cache_policy=NO_CACHE,
    **with_retries(2),
)
def plan_shard_build(
    src: str | Catalog,
    *,
    staging: str,
    samples_per_shard: int,
    bytes_per_shard: int | None,
    config: PackConfig,
    manifest: str | None = None,
    storage_options: dict[str, Any] | None = None,
) -> ShardPlan:
    """Cut ``src`` into shards, and find those already done in ``staging``.

    ``src`` is the catalog the discover task returned (or a folder, catalogued here with
    ``manifest``, a CSV/JSONL list of the images, as for a local pack). A shard counts as done
    when its manifest matches the plan and ``config`` and its file has the manifest's size and
    sha256 (each finished shard is read once to check).
    """
    catalog = src if isinstance(src, Catalog) else discover(src, manifest=manifest)
    specs = plan_shards(
        catalog, samples_per_shard=samples_per_shard, bytes_per_shard=bytes_per_shard
    )
    done = find_done_shards(
        staging,
        specs,
        config=config,
        storage_options=storage_options,
    )
    get_run_logger().info(
        "%d shards of up to %d images; %d already done in %s, %d to pack",
        len(specs),
        samples_per_shard,
        len(done),
        redact_url(staging),
        len(specs) - len(done),
    )
    return ShardPlan(catalog=catalog, specs=tuple(specs), done=frozenset(done))


def _shard_run_name() -> str:
    params = runtime.task_run.parameters
    spec = params.get("spec")
    where = f" {spec.name}" if isinstance(spec, ShardSpec) else ""
    return f"pack-shard[{params.get('dataset', '')}{where}]"


@task(
    name="pack-shard",
    task_run_name=_shard_run_name,
    cache_policy=NO_CACHE,
    **with_retries(2, retry_upload),
)
def pack_shard_task(
    catalog: Catalog,
    spec: ShardSpec,
    staging_url: str,
    *,
    dataset: str,
    config: PackConfig,
    storage_options: dict[str, Any] | None = None,
) -> ShardResult:
    """Pack one shard on a worker and publish it, manifest last (see
    :func:`h5forge.scale.shards.pack_shard`). One process per task: the cluster's worker processes
    are the parallelism. ``dataset`` names the task run."""
    result = pack_shard(
        catalog,
        spec,
        staging_url,
        config=config,
        processes=1,
        storage_options=storage_options,
    )
    get_run_logger().info(
        "%s: %d images (%d quarantined), %.1f MB in %.1f s",
        spec.name,
        result.num_samples,
        result.num_quarantined,
        result.bytes / 1e6,
        result.seconds,
    )
    return result


@task(name="merge", task_run_name=run_name("merge"), cache_policy=NO_CACHE)
def merge_task(
    urls: Sequence[str],
    *,
    out: str,
    dataset: str,
    max_bad_fraction: float,
    source_url: str = "",
    source_sha256: str = "",
    storage_options: dict[str, Any] | None = None,
    tmp_dir: str | None = None,
) -> PackResult:
    """Merge the shards into the local file ``out`` (see :func:`h5forge.scale.merge.merge_shards`).

    The quarantine table artifact lists every input no shard could pack, as a local pack's
    does, also when too many were quarantined and the merge fails.
    """
    table_key = artifact_key("quarantine", dataset)
    try:
        result = merge_shards(
            urls,
            out,
            max_bad_fraction=max_bad_fraction,
            source_url=source_url,
            source_sha256=source_sha256,
            storage_options=storage_options,
            overwrite=True,
            tmp_dir=tmp_dir,
        )
    except TooManyBadImagesError as e:
        quarantine_table(e.quarantined, key=table_key)
        raise
    quarantine_table(result.quarantined, key=table_key)
    get_run_logger().info(
        "merged %d shards: %d samples (%d quarantined), %.1f MB in %.1f s",
        len(urls),
        result.num_samples,
        result.num_quarantined,
        result.bytes / 1e6,
        result.seconds,
    )
    return result


@task(
    name="remove-shards",
    task_run_name=run_name("remove-shards"),
    cache_policy=NO_CACHE,
    **with_retries(2),
)
def remove_shards(
    staging: str, specs: Sequence[ShardSpec], *, storage_options: dict[str, Any] | None = None
) -> int:
    """:func:`h5forge.scale.shards.remove_shards`, once the merged asset is published."""
    return remove_shard_files(staging, specs, storage_options=storage_options)


def executor_section(
    *, workers: int | None, shards: ShardStats | None, seconds: dict[str, float]
) -> str:
    """The report's markdown section on where the images were packed (``shards``: None for
    the local executor)."""
    if shards is None:
        pool = f"{workers} processes" if workers else "one process per CPU"
        return f"\n## Executor\n\nlocal: a process pool on the flow's machine ({pool}).\n"
    packed, skipped = len(shards.packed), len(shards.skipped)
    limits = f"up to {shards.samples_per_shard} images" + (
        f" or {shards.bytes_per_shard:,} source bytes" if shards.bytes_per_shard else ""
    )
    listed = ", ".join(str(i) for i in shards.skipped[:50]) + (" …" if skipped > 50 else "")
    lines = [
        "",
        "## Executor",
        "",
        f"dask: `{shards.address}`, staging `{shards.staging}`.",
        "",
        f"- **shards**: {shards.total} of {limits}; **packed by this run**: {packed}; "
        f"**skipped** (found done in staging, manifest and sha256 checked): {skipped}"
        + (f" ({listed})" if skipped else ""),
        f"- **shard stage**: {seconds.get('pack', 0.0):,.2f} s on the cluster; "
        f"**merge**: {seconds.get('merge', 0.0):,.2f} s here (stored bytes copied, each "
        "sample's digest checked)",
        "",
    ]
    return "\n".join(lines)
