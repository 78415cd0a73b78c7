"""Flow ``build-h5-dataset``: fetch → discover → pack → verify → smoke-load → publish.

Everything up to smoke-load happens in a private local work dir; the destination is touched only
by the publish stage, which runs only after the packed file passed a full verify and a
smoke-load through DataLoader workers. A failure anywhere before it fails the run with nothing
published.

With ``executor="dask"`` the pack stage cuts the dataset into parts, packs the ones not done
yet as tasks on a Dask cluster (:mod:`h5forge.flows.dask_stage`) and merges them into the work dir;
verify, smoke-load and publish then run unchanged. The parts are deleted once the asset is
published, and kept after a failure so that a re-run packs only the missing ones.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prefect import get_run_logger
from prefect.runtime import flow_run

from h5forge.flows.config import BuildConfig
from h5forge.flows.credentials import load_storage_options
from h5forge.flows.entry import entry_flow
from h5forge.flows.summary import BuildSummary, unchanged_summary
from h5forge.flows.urls import check_url
from h5forge.pack.writer import PackResult
from h5forge.preflight import check_destination
from h5forge.publish.lineage import Basis
from h5forge.publish.preview import PREVIEW_SUFFIX, preview_url
from h5forge.redact import redact_url
from h5forge.tasks.common import dataset_name
from h5forge.tasks.discover import discover_samples
from h5forge.tasks.fetch import fetch_task, source_dir
from h5forge.tasks.pack import pack_images
from h5forge.tasks.parts import executor_section
from h5forge.tasks.publish import (
    as_published,
    asset_key,
    check_source,
    find_reusable,
    make_preview,
    publish_task,
    publish_version_task,
)
from h5forge.tasks.report import render_report, write_report
from h5forge.tasks.smoke_load import smoke_load_file
from h5forge.tasks.verify import verify_file
from h5forge.workdir import work_dir

__all__ = ["DEFAULT_CACHE_DIR", "BuildConfig", "BuildSummary", "build_dataset", "check_url"]

# The cache folder when the caller names none: XDG's default cache home. The callers in
# deployments/ (the console script, the served deployments) pass ``$XDG_CACHE_HOME/h5forge``.
DEFAULT_CACHE_DIR = "~/.cache/h5forge"


@contextmanager
def _stage(seconds: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(time.perf_counter() - start, 3)


@entry_flow(name="build-h5-dataset")
def build_dataset(config: BuildConfig, cache_dir: str | None = None) -> BuildSummary:
    """Build, verify, smoke-load and publish one HDF5 image asset.

    Args:
        config: what to build and where to publish it.
        cache_dir: local folder for fetched sources and the fetch cache; default
            :data:`DEFAULT_CACHE_DIR`.

    Called from a script, it must be under ``if __name__ == "__main__":`` (it starts worker
    processes); with no ``PREFECT_API_URL`` it runs a temporary Prefect server for the call
    (:mod:`h5forge.flows.entry`).

    Returns:
        Where the asset, its sidecar and its preview are, with counts, digest and timings.

    Raises:
        MainReimportError: called at a script's module level, where spawned children rerun it.
    """
    logger = get_run_logger()
    options = load_storage_options(config.credentials_block)
    # Before any work, so a forgotten overwrite, a read-only or full destination, or one
    # inside the source costs a second, not a whole build.
    check_destination(
        config.destination,
        source=config.source,
        overwrite=config.overwrite or config.versioned,  # a version never writes over one
        storage_options=options,
    )
    cache = Path(cache_dir or DEFAULT_CACHE_DIR).expanduser()
    dataset = dataset_name(config.destination)
    seconds: dict[str, float] = {}
    basis: Basis | None = None
    lineage: dict[str, str] | None = None
    if config.versioned:
        with _stage(seconds, "fingerprint"):
            basis = check_source(
                config.source,
                config.destination,
                config_sha256=config.pack_config().sha256(),
                sha256=config.sha256,
                storage_options=options,
            )
        if basis.unchanged:
            logger.info("unchanged: %s is built from this source", redact_url(basis.latest_url))
            return unchanged_summary(config, basis, seconds)
        lineage = basis.lineage(str(flow_run.id or ""), storage_options=options)
    with work_dir() as work:
        with _stage(seconds, "fetch"):
            pinned = source_dir(cache, config.source, config.sha256)
            dest = pinned if pinned is not None else work / "source"
            fetched = fetch_task(cache, dest)(
                config.source,
                dest=str(dest),
                sha256=config.sha256,
                download_cache=str(cache / "downloads"),
                storage_options=options,
            )
        with _stage(seconds, "discover"):
            catalog = discover_samples(fetched.root, **config.discover_options())
        # Incremental: the previous version's samples whose source file is unchanged.
        reuse = None
        if basis is not None and config.executor == "local":
            reuse = find_reusable(basis, into=str(work), storage_options=options)
        on_dask = None
        if config.executor == "dask":
            from h5forge.flows.dask_stage import pack_on_dask

            on_dask = pack_on_dask(
                config,
                root=catalog,  # what discover found: not listed again
                out=str(work / dataset),
                dataset=dataset,
                cache=cache,
                storage_options=options,
                source_url=fetched.source_url,
                source_sha256=fetched.sha256,
                seconds=seconds,
            )
            packed: PackResult = on_dask.packed
        else:
            with _stage(seconds, "pack"):
                packed = pack_images(
                    catalog,  # what discover found (config.listing included): not listed again
                    out=str(work / dataset),
                    dataset=dataset,
                    config=config.pack_config(),
                    workers=config.workers,
                    max_bad_fraction=config.max_bad_fraction,
                    source_url=fetched.source_url,
                    source_sha256=fetched.sha256,
                    lineage=lineage,
                    reuse=reuse,
                )
        with _stage(seconds, "verify"):
            verified = verify_file(packed.path, sample_fraction=1.0, asset=config.destination)
        with _stage(seconds, "smoke-load"):
            smoke = smoke_load_file(
                packed.path, workers=config.smoke_workers, batches=config.smoke_batches
            )
        with _stage(seconds, "preview"):
            png = make_preview(packed.path, out=str(work / "preview.png"))
        metadata = {
            "num_samples": packed.num_samples,
            "num_classes": packed.num_classes,
            "num_quarantined": packed.num_quarantined,
            "counts": packed.counts,
            "format_version": verified.format_version,
            "source": fetched.source_url,
        }
        about = f"h5forge asset {dataset}"
        with _stage(seconds, "publish"):
            if basis is None:
                published = publish_task(config.destination, description=about)(
                    packed.path,
                    config.destination,
                    preview_png=png,
                    overwrite=config.overwrite,
                    metadata=metadata,
                    storage_options=options,
                )
                version = ""
            else:
                assert lineage is not None
                released = publish_version_task(config.destination, description=about)(
                    packed.path,
                    config.destination,
                    preview_png=png,
                    sources=dict(basis.fingerprint.files) if basis.fingerprint else None,
                    metadata={**metadata, **basis.sidecar_fields(lineage)},
                    storage_options=options,
                    keep_versions=config.keep_versions,
                    min_age_s=config.min_age_s,
                    based_on=basis.latest_sha256,  # refused if another build published since
                )
                version = released.version
                published = as_published(released)  # the report shows the version
        if on_dask is not None:  # published: the parts are no longer needed to resume
            on_dask.remove_parts()
    parts = on_dask.stats if on_dask is not None else None
    preview = (
        redact_url(preview_url(config.destination))
        if basis is None
        else published.url + PREVIEW_SUFFIX
    )
    markdown = render_report(
        dataset=dataset,
        source=fetched.source_url,
        pack=packed,
        smoke=smoke,
        published=published,
        preview=preview,
        format_version=verified.format_version,
        stage_seconds=seconds,
    ) + executor_section(workers=config.workers, parts=parts, seconds=seconds)
    write_report(markdown, dataset=dataset, preview=preview)
    logger.info(
        "published %s (%d samples, sha256 %s)", published.url, packed.num_samples, published.sha256
    )
    return BuildSummary(
        destination=published.url,
        sidecar_url=published.sidecar_url,
        preview_url=preview,
        asset_key=asset_key(config.destination),
        num_samples=packed.num_samples,
        num_classes=packed.num_classes,
        num_quarantined=packed.num_quarantined,
        counts=packed.counts,
        sha256=published.sha256,
        bytes=published.bytes,
        format_version=verified.format_version,
        smoke_images_per_second=round(smoke.images_per_second, 1),
        smoke_per_method={m.start_method: round(m.images_per_second, 1) for m in smoke.methods},
        seconds=seconds,
        executor=config.executor,
        parts=parts,
        unchanged=False,
        version=version,
        reused=packed.reused,
    )
