"""Discover stage: list the samples of a fetched dataset and fail fast when there are none."""

from __future__ import annotations

import time
from collections import Counter

from prefect import get_run_logger, task
from pydantic import BaseModel, ConfigDict

from h5forge.discover.catalog import discover
from h5forge.errors import EmptyDatasetError
from tasks.common import run_name

__all__ = ["CatalogSummary", "discover_samples"]


class CatalogSummary(BaseModel):
    """What the source holds, by count (the sample list itself stays on disk)."""

    model_config = ConfigDict(frozen=True)

    root: str
    num_samples: int
    classes: tuple[str, ...]
    splits: tuple[str, ...]
    per_split: dict[str, int]
    skipped: dict[str, int]
    seconds: float


@task(name="discover", task_run_name=run_name("discover"))
def discover_samples(root: str, *, manifest: str | None = None) -> CatalogSummary:
    """Catalog ``root`` (see :func:`h5forge.discover.catalog.discover`).

    Raises:
        EmptyDatasetError: the source holds no image at all.
    """
    start = time.perf_counter()
    cat = discover(root, manifest=manifest)
    if not cat.samples:
        raise EmptyDatasetError(
            f"{root} holds no images (skipped: {dict(cat.skipped) or 'nothing'}); expected "
            "class folders of image files, optionally under train/val/test split folders"
        )
    per_split = Counter(s.split for s in cat.samples)
    summary = CatalogSummary(
        root=str(root),
        num_samples=len(cat.samples),
        classes=tuple(cat.classes),
        splits=tuple(cat.splits),
        per_split=dict(sorted(per_split.items())),
        skipped=dict(cat.skipped),
        seconds=time.perf_counter() - start,
    )
    get_run_logger().info(
        "found %d samples in %d classes, splits %s",
        summary.num_samples,
        len(summary.classes),
        list(summary.splits) or "none",
    )
    return summary
