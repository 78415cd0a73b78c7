"""Preprocess + pack stage: decode, normalise and write the sealed ``.h5`` to a local work dir.

Reports progress as a Prefect progress artifact while the process pool runs, and records every
quarantined input (path and reason) as a table artifact — also when too many were quarantined
and the pack fails, since that is when the list matters most.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import cast
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import (
    create_progress_artifact,
    create_table_artifact,
    update_progress_artifact,
)
from prefect.cache_policies import NO_CACHE

from h5forge.discover.catalog import Catalog
from h5forge.errors import TooManyBadImagesError
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse
from h5forge.pack.writer import PackResult, pack
from h5forge.publish.sharded import Previous, StagedVersion, pack_sharded
from h5forge.tasks.common import run_name

__all__ = ["artifact_key", "pack_images", "pack_shards", "quarantine_table"]

# Progress updates are API calls; one per second at most keeps a fast pack from being slowed
# down by its own progress bar.
_PROGRESS_INTERVAL_S = 1.0


def artifact_key(kind: str, dataset: str) -> str:
    """An artifact key (lower-case letters, digits, dashes) such as ``quarantine-demo-h5``."""
    slug = "".join(c if c.isalnum() else "-" for c in dataset.lower()).strip("-")
    return "-".join(p for p in f"{kind}-{slug}".split("-") if p)[:100]


def quarantine_table(quarantined: Sequence[tuple[str, str]], *, key: str) -> None:
    """Publish the quarantine list as a table artifact (a one-row note when it is empty)."""
    rows = [{"path": p, "reason": r} for p, r in quarantined] or [
        {"path": "(none)", "reason": "every input was packed"}
    ]
    create_table_artifact(
        rows, key=key, description=f"{len(quarantined)} input(s) quarantined (not packed)"
    )


class _Progress:
    """Throttled ``on_progress`` callback feeding one progress artifact."""

    def __init__(self, artifact_id: UUID) -> None:
        self._id = artifact_id
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < _PROGRESS_INTERVAL_S:
            return
        self._last = now
        update_progress_artifact(self._id, 100.0 * done / max(total, 1))


# NO_CACHE: a run packs into its own work folder, and hashing a large catalog to key a cache
# that can never hit would cost time on every run.
@task(name="pack", task_run_name=run_name("pack"), cache_policy=NO_CACHE)
def pack_images(
    src: str | Catalog,
    *,
    out: str,
    dataset: str,
    config: PackConfig,
    listing: str | None = None,
    workers: int | None = None,
    max_bad_fraction: float = 0.01,
    source_url: str = "",
    source_sha256: str = "",
    lineage: dict[str, str] | None = None,
    reuse: Reuse | None = None,
) -> PackResult:
    """Preprocess and pack ``src`` (a folder, or the catalog the discover task returned) into
    the local file ``out`` (see :func:`h5forge.pack.writer.pack`).

    ``dataset`` names the artifacts (the destination's file name, so runs of one dataset share
    artifact keys and the UI shows their history). ``reuse``: the previous version's samples
    whose source is unchanged are copied from it instead of being decoded again.
    """
    progress_id = cast(
        UUID,
        create_progress_artifact(
            0.0, key=artifact_key("pack-progress", dataset), description=f"preprocessing {dataset}"
        ),
    )
    on_progress: Callable[[int, int], None] = _Progress(progress_id)
    table_key = artifact_key("quarantine", dataset)
    try:
        result = pack(
            src,
            out,
            config=config,
            listing=listing,
            workers=workers,
            max_bad_fraction=max_bad_fraction,
            source_url=source_url,
            source_sha256=source_sha256,
            lineage=lineage,
            reuse=reuse,
            on_progress=on_progress,
            overwrite=True,  # ``out`` is in this run's private work dir
        )
    except TooManyBadImagesError as e:
        quarantine_table(e.quarantined, key=table_key)
        raise
    update_progress_artifact(progress_id, 100.0)
    quarantine_table(result.quarantined, key=table_key)
    get_run_logger().info(
        "packed %d samples (%d reused, %d quarantined) into %s, %.1f MB in %.1f s",
        result.num_samples,
        result.reused,
        result.num_quarantined,
        out,
        result.bytes / 1e6,
        result.seconds,
    )
    return result


@task(name="pack-shards", task_run_name=run_name("pack-shards"), cache_policy=NO_CACHE)
def pack_shards(
    catalog: Catalog,
    *,
    work: str,
    dataset: str,
    name: str,
    config: PackConfig,
    max_shard_size: int,
    workers: int | None = None,
    max_bad_fraction: float = 0.01,
    previous: Previous | None = None,
    unchanged: frozenset[str] = frozenset(),
) -> StagedVersion:
    """Pack the samples the previous version lacks into new shards under ``work``
    (:func:`h5forge.publish.sharded.pack_sharded`); progress counts shards."""
    progress_id = cast(
        UUID,
        create_progress_artifact(
            0.0, key=artifact_key("pack-progress", dataset), description=f"shards of {dataset}"
        ),
    )
    table_key = artifact_key("quarantine", dataset)
    try:
        staged = pack_sharded(
            catalog,
            work,
            config=config,
            max_shard_size=max_shard_size,
            workers=workers,
            max_bad_fraction=max_bad_fraction,
            previous=previous,
            unchanged=unchanged,
            name=name,
            on_shard=_Progress(progress_id),
        )
    except TooManyBadImagesError as e:
        quarantine_table(e.quarantined, key=table_key)
        raise
    quarantine_table(staged.quarantined, key=table_key)
    get_run_logger().info(
        "shards: %d packed, %d referenced from the previous version",
        len(staged.new),
        len(staged.manifest.shards) - len(staged.new),
    )
    return staged
