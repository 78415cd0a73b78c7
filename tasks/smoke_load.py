"""Smoke-load stage: read the packed file through DataLoader workers under fork and spawn.

Never cached (``NO_CACHE``): a smoke-load is a check to run every time, and its
:class:`~h5forge.location.Location`, whose options may hold credentials, is then hashed into
no cache key.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from h5forge.location import Location
from h5forge.smoke.load import SmokeReport, smoke_load
from h5forge.tasks.common import run_name
from h5forge.tasks.fork import forget_inherited_prefect_services

__all__ = ["smoke_load_file"]


@task(name="smoke-load", task_run_name=run_name("smoke-load"), cache_policy=NO_CACHE)
def smoke_load_file(
    where: Location,
    *,
    workers: int = 2,
    batches: int = 4,
    batch_size: int = 32,
    start_methods: Sequence[str] = ("fork", "spawn"),
    max_pixels: int,
) -> SmokeReport:
    """Run :func:`h5forge.smoke.load.smoke_load` with the decode bound ``max_pixels`` (the
    build's ``max_image_pixels``); an ``IntegrityError`` fails the run."""
    report = smoke_load(
        where,
        workers=workers,
        batches=batches,
        batch_size=batch_size,
        start_methods=tuple(start_methods),
        worker_init_fn=forget_inherited_prefect_services,
        max_pixels=max_pixels,
    )
    get_run_logger().info(
        "smoke-load read %d samples with %d workers: %s img/s",
        report.samples_checked,
        workers,
        {m.start_method: round(m.images_per_second, 1) for m in report.methods},
    )
    return report
