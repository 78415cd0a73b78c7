"""Discover stage: list the samples of a fetched dataset and fail fast when there are none."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from h5forge.discover.catalog import Catalog, discover
from h5forge.discover.columns import ColumnSpec
from h5forge.discover.report import describe
from h5forge.errors import EmptyDatasetError
from h5forge.tasks.common import run_name

__all__ = ["discover_samples"]


# Not cached: the catalog is a listing of the folder as it is now, and it is handed to the pack
# stage in memory (one entry per sample), never persisted.
@task(name="discover", task_run_name=run_name("discover"), cache_policy=NO_CACHE)
def discover_samples(
    root: str,
    *,
    listing: str | None = None,
    coco: str | None = None,
    masks: str | None = None,
    coco_masks: bool = False,
    columns: ColumnSpec | None = None,
) -> Catalog:
    """Catalog ``root`` (see :func:`h5forge.discover.catalog.discover`: an ImageFolder, or the
    layout ``listing``, ``coco`` or ``masks`` names); the pack stage packs this catalog
    instead of listing the folder again.

    Raises:
        EmptyDatasetError: the source holds no image at all.
    """
    cat = discover(
        root, listing=listing, coco=coco, masks=masks, columns=columns, coco_masks=coco_masks
    )
    if not cat.samples:
        raise EmptyDatasetError(
            f"{root} holds no images (skipped: {dict(cat.skipped) or 'nothing'}); expected "
            "class folders of image files, optionally under train/val/test split folders"
        )
    get_run_logger().info(
        "found %d samples in %d classes, splits %s; %s",
        len(cat.samples),
        len(cat.classes),
        list(cat.splits) or "none",
        describe(cat),
    )
    return cat
