"""Flow ``build-h5-dataset``: fetch → discover → pack → verify → smoke-load → publish.

Everything up to smoke-load happens in a private local work dir; the destination is touched only
by the publish stage, which runs only after the packed file passed a full verify and a
smoke-load through DataLoader workers. A failure anywhere before it fails the run with nothing
published.

Two choices are made once, before the stages run, and the flow body never branches on them:

- **where it publishes** (:func:`_publish_target`): the plain file ``DEST.h5``
  (:class:`_PlainFile`), or, with ``versioned``, a new version of ``DEST`` on top of its latest
  (:class:`_NewVersion`: fingerprints the source first, and stops there when it is unchanged;
  a local pack copies the previous version's unchanged samples);
- **how it packs** (:func:`_pack_stage`): a local worker pool (:func:`_pack_locally`), or, with
  ``executor="dask"``, parts packed as tasks on a Dask cluster and merged into the work dir
  (:func:`_pack_on_dask`, :mod:`h5forge.flows.dask_stage`). The parts are deleted once the
  asset is published, and kept after a failure so that a re-run packs only the missing ones.
  A sharded version (``max_shard_size``) packs its new shards locally or, with
  ``executor="dask"``, on the workers, which upload them to the store themselves (no merge, no
  shard's bytes through the flow's machine): :func:`_pack_shards`,
  :mod:`h5forge.flows.sharded_stage`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from prefect import get_run_logger
from prefect.runtime import flow_run

from h5forge.discover.catalog import Catalog
from h5forge.fetch.sources import FetchResult
from h5forge.flows.config import DEFAULT_CACHE_DIR, BuildConfig
from h5forge.flows.credentials import load_storage_options
from h5forge.flows.entry import entry_flow
from h5forge.flows.sharded_stage import ShardedPacked, pack_here, pack_on_workers
from h5forge.flows.summary import BuildSummary, unchanged_summary
from h5forge.flows.urls import check_url
from h5forge.location import Location
from h5forge.pack.reuse import Reuse
from h5forge.pack.writer import PackResult
from h5forge.preflight import check_destination
from h5forge.publish.lineage import Basis
from h5forge.publish.preview import PREVIEW_SUFFIX, preview_url
from h5forge.publish.storage import PublishResult
from h5forge.redact import redact_url
from h5forge.tasks.common import dataset_name
from h5forge.tasks.discover import discover_samples
from h5forge.tasks.fetch import fetch_task, source_dir
from h5forge.tasks.pack import pack_images
from h5forge.tasks.parts import PartStats, executor_section
from h5forge.tasks.publish import (
    as_published,
    asset_key,
    check_source,
    find_reusable,
    make_preview,
    publish_shards_task,
    publish_task,
    publish_version_task,
)
from h5forge.tasks.report import render_report, write_report
from h5forge.tasks.smoke_load import smoke_load_file
from h5forge.tasks.verify import verify_file
from h5forge.workdir import remove_dead_runs, work_dir

if TYPE_CHECKING:
    from h5forge.flows.dask_stage import DaskPacked

__all__ = ["DEFAULT_CACHE_DIR", "BuildConfig", "BuildSummary", "build_dataset", "check_url"]


@contextmanager
def _stage(seconds: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(time.perf_counter() - start, 3)


@dataclass(frozen=True)
class _PlainFile:
    """Publish to the plain file ``DEST.h5`` (written over only with ``overwrite``)."""

    config: BuildConfig
    dest: Location
    lineage: None = None

    def already_published(self, seconds: dict[str, float]) -> BuildSummary | None:
        """Never: a plain file is built whenever asked."""
        return None

    def shard_counts(self) -> dict[str, int]:
        """What the summary says of shards: nothing (one file)."""
        return {}

    def reusable(self, work: Path) -> Reuse | None:
        """Nothing: a plain file has no previous version to copy samples from."""
        return None

    def publish(
        self, packing: _Packed, *, png: str, metadata: dict[str, Any], about: str
    ) -> tuple[PublishResult, str]:
        """The published file and its version key ("": a plain file has none)."""
        published = publish_task(self.config.destination, description=about)(
            packing.packed.path,
            self.dest,
            preview_png=png,
            overwrite=self.config.overwrite,
            metadata=metadata,
        )
        return published, ""

    def preview(self, published: PublishResult) -> str:
        return redact_url(preview_url(self.config.destination))


@dataclass(frozen=True)
class _NewVersion:
    """Publish a new version of ``DEST`` on top of ``basis`` (its latest, fingerprinted)."""

    config: BuildConfig
    dest: Location
    basis: Basis
    lineage: dict[str, str] | None  # None when the source is unchanged: nothing to build

    def shard_counts(self) -> dict[str, int]:
        """What the summary says of shards: nothing (one file per version)."""
        return {}

    def already_published(self, seconds: dict[str, float]) -> BuildSummary | None:
        """The latest version's summary when it is built from this source and configuration."""
        if not self.basis.unchanged:
            return None
        get_run_logger().info(
            "unchanged: %s is built from this source", redact_url(self.basis.latest_url)
        )
        return unchanged_summary(self.config, self.basis, seconds)

    def reusable(self, work: Path) -> Reuse | None:
        """Incremental: the previous version's samples whose source file is unchanged."""
        return find_reusable(self.basis, into=str(work), asset=self.dest)

    def publish(
        self, packing: _Packed, *, png: str, metadata: dict[str, Any], about: str
    ) -> tuple[PublishResult, str]:
        """The version's file (what the report shows) and its version key."""
        assert self.lineage is not None
        basis = self.basis
        released = publish_version_task(self.config.destination, description=about)(
            packing.packed.path,
            self.dest,
            preview_png=png,
            sources=dict(basis.fingerprint.files) if basis.fingerprint else None,
            metadata={**metadata, **basis.sidecar_fields(self.lineage)},
            keep_versions=self.config.keep_versions,
            min_age_s=self.config.min_age_s,
            based_on=basis.latest_sha256,  # refused if another build published since
        )
        return as_published(released), released.version

    def preview(self, published: PublishResult) -> str:
        return published.url + PREVIEW_SUFFIX


@dataclass(frozen=True)
class _ShardedVersion(_NewVersion):
    """Publish a new sharded version of ``DEST`` on top of ``basis``: only the shards of new and
    changed samples are packed and uploaded (:mod:`h5forge.publish.sharded`)."""

    counts: dict[str, int] = field(default_factory=dict)  # filled in by publish

    def publish(
        self, packing: _Packed, *, png: str, metadata: dict[str, Any], about: str
    ) -> tuple[PublishResult, str]:
        """The version's manifest (what the report shows) and its version key."""
        assert self.lineage is not None
        assert isinstance(packing, ShardedPacked)
        basis = self.basis
        released = publish_shards_task(self.config.destination, description=about)(
            packing.staged,
            self.dest,
            preview_png=png,
            sources=dict(basis.fingerprint.files) if basis.fingerprint else None,
            metadata={**metadata, **basis.sidecar_fields(self.lineage)},
            lineage=self.lineage,
            keep_versions=self.config.keep_versions,
            min_age_s=self.config.min_age_s,
            based_on=basis.latest_sha256,  # refused if another build published since
        )
        self.counts.update(
            shards=released.shards,
            shards_new=released.shards_new,
            shards_reused=released.shards_reused,
        )
        published = PublishResult(
            url=released.url,
            sidecar_url=released.url,  # the manifest is the version's record
            sha256=released.sha256,
            bytes=released.bytes_new + released.bytes_reused,
            unchanged=False,
        )
        return published, released.version

    def preview(self, published: PublishResult) -> str:
        return published.url + PREVIEW_SUFFIX

    def shard_counts(self) -> dict[str, int]:
        """The shards the version lists, packed by this build and reused (after publish)."""
        return dict(self.counts)


_Target = _PlainFile | _NewVersion


def _publish_target(
    config: BuildConfig, source: Location, dest: Location, seconds: dict[str, float]
) -> _Target:
    """Where this build publishes (``dest``: the destination, with the build's storage
    options), chosen once; a version fingerprints ``source`` here."""
    if not config.versioned:
        return _PlainFile(config, dest)
    with _stage(seconds, "fingerprint"):
        basis = check_source(
            source,
            dest,
            config_sha256=config.pack_config().sha256(),
            sha256=config.sha256,
        )
    kind = _ShardedVersion if config.sharded else _NewVersion
    if basis.unchanged:
        return kind(config, dest, basis, lineage=None)
    lineage = basis.lineage(str(flow_run.id or ""), asset=dest)
    return kind(config, dest, basis, lineage)


@dataclass(frozen=True)
class _LocalPacked:
    """A local pack's outcome, shaped as :class:`~h5forge.flows.dask_stage.DaskPacked`."""

    packed: PackResult
    stats: PartStats | None = None

    def remove_parts(self) -> None:
        """Nothing to remove: a local pack writes no parts."""


@dataclass(frozen=True)
class _PackInputs:
    """What the pack stage starts from: discover's catalog (``config.listing`` included:
    never listed again), the fetched source, and where the packed file goes."""

    catalog: Catalog
    fetched: FetchResult
    work: Path
    dataset: str
    cache: Path
    dest: Location  # the store's options, for a remote staging folder

    @property
    def out(self) -> str:
        return str(self.work / self.dataset)


def _pack_locally(
    config: BuildConfig,
    inputs: _PackInputs,
    target: _Target,
    seconds: dict[str, float],
) -> _LocalPacked:
    """The pack stage on this machine's worker pool, copying what the target lets it reuse."""
    reuse = target.reusable(inputs.work)
    with _stage(seconds, "pack"):
        return _LocalPacked(
            pack_images(
                inputs.catalog,
                out=inputs.out,
                dataset=inputs.dataset,
                config=config.pack_config(),
                workers=config.workers,
                max_bad_fraction=config.max_bad_fraction,
                source_url=inputs.fetched.source_url,
                source_sha256=inputs.fetched.sha256,
                lineage=target.lineage,
                reuse=reuse,
            )
        )


def _pack_on_dask(
    config: BuildConfig,
    inputs: _PackInputs,
    target: _Target,
    seconds: dict[str, float],
) -> DaskPacked:
    """The pack stage as part tasks on the Dask cluster, merged into the work dir (it
    records its own ``pack`` and ``merge`` times)."""
    from h5forge.flows.dask_stage import default_staging, pack_on_dask

    staging = config.staging or default_staging(inputs.cache, config)
    return pack_on_dask(
        config,
        root=inputs.catalog,
        out=inputs.out,
        dataset=inputs.dataset,
        staging=inputs.dest.with_url(staging),
        source_url=inputs.fetched.source_url,
        source_sha256=inputs.fetched.sha256,
        seconds=seconds,
    )


def _pack_shards(
    config: BuildConfig,
    inputs: _PackInputs,
    target: _Target,
    seconds: dict[str, float],
) -> ShardedPacked:
    """The pack stage of a sharded version, on this machine or (``executor="dask"``) on the
    Dask workers, which upload their shards themselves (:mod:`h5forge.flows.sharded_stage`)."""
    assert isinstance(target, _ShardedVersion)
    pack = pack_on_workers if config.executor == "dask" else pack_here
    with _stage(seconds, "pack"):
        return pack(
            config,
            catalog=inputs.catalog,
            work=inputs.work,
            dest=target.dest,
            basis=target.basis,
            dataset=inputs.dataset,
        )


_Packed: TypeAlias = "_LocalPacked | DaskPacked | ShardedPacked"
_PackStage = Callable[[BuildConfig, _PackInputs, _Target, dict[str, float]], _Packed]


def _pack_stage(config: BuildConfig) -> _PackStage:
    """How this build packs, chosen once from ``config.executor`` and ``max_shard_size``."""
    if config.sharded:
        return _pack_shards
    return _pack_on_dask if config.executor == "dask" else _pack_locally


def _fetch(config: BuildConfig, source: Location, cache: Path, work: Path) -> FetchResult:
    """The source, fetched into the cache (a pinned ``sha256``) or the work dir."""
    pinned = source_dir(cache, config.source, config.sha256)
    dest = pinned if pinned is not None else work / "source"
    return fetch_task(cache, dest)(
        source,
        dest=str(dest),
        sha256=config.sha256,
        download_cache=str(cache / "downloads"),
    )


@entry_flow(name="build-h5-dataset")
def build_dataset(config: BuildConfig, cache_dir: str | None = None) -> BuildSummary:
    """Build, verify, smoke-load and publish one HDF5 image asset.

    Args:
        config: what to build and where to publish it.
        cache_dir: local folder for fetched sources and the fetch cache (never inside a local
            source); default :data:`DEFAULT_CACHE_DIR`.

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
    # Source and destination with the block's storage options (one set for both): Locations,
    # passed whole to the stages; the options never become a parameter of their own.
    source, dest = Location(config.source, options), Location(config.destination, options)
    # A killed run's work folder goes first, also when this run is refused or finds its
    # version already published (then it never opens a work folder of its own).
    with contextlib.suppress(OSError):
        remove_dead_runs()
    # Before any work, so a forgotten overwrite, a read-only or full destination, or one
    # inside the source costs a second, not a whole build.
    check_destination(
        dest,
        source=config.source,
        overwrite=config.overwrite or config.versioned,  # a version never writes over one
    )
    cache = Path(cache_dir or DEFAULT_CACHE_DIR).expanduser()
    config.check_cache(str(cache))
    dataset = dataset_name(config.destination)
    seconds: dict[str, float] = {}
    target = _publish_target(config, source, dest, seconds)
    done = target.already_published(seconds)
    if done is not None:
        return done
    pack = _pack_stage(config)
    with work_dir() as work:
        with _stage(seconds, "fetch"):
            fetched = _fetch(config, source, cache, work)
        with _stage(seconds, "discover"):
            catalog = discover_samples(fetched.root, **config.discover_options())
        inputs = _PackInputs(catalog, fetched, work, dataset, cache, dest)
        packing = pack(config, inputs, target, seconds)
        packed = packing.packed
        with _stage(seconds, "verify"):
            verified = verify_file(
                Location(packed.path),
                sample_fraction=1.0,
                asset=config.destination,
                max_pixels=config.max_image_pixels,
            )
        with _stage(seconds, "smoke-load"):
            smoke = smoke_load_file(
                Location(packed.path),
                workers=config.smoke_workers,
                batches=config.smoke_batches,
                max_pixels=config.max_image_pixels,
            )
        with _stage(seconds, "preview"):
            png = make_preview(
                packed.path, out=str(work / "preview.png"), max_pixels=config.max_image_pixels
            )
        metadata = {
            "num_samples": packed.num_samples,
            "num_classes": packed.num_classes,
            "num_quarantined": packed.num_quarantined,
            "counts": packed.counts,
            "format_version": verified.format_version,
            "source": fetched.source_url,
        }
        with _stage(seconds, "publish"):
            published, version = target.publish(
                packing, png=png, metadata=metadata, about=f"h5forge asset {dataset}"
            )
        packing.remove_parts()  # published: the parts are no longer needed to resume
    preview = target.preview(published)
    markdown = render_report(
        dataset=dataset,
        source=fetched.source_url,
        pack=packed,
        smoke=smoke,
        published=published,
        preview=preview,
        format_version=verified.format_version,
        stage_seconds=seconds,
    ) + executor_section(workers=config.workers, parts=packing.stats, seconds=seconds)
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
        parts=packing.stats,
        unchanged=False,
        version=version,
        reused=packed.reused,
        **target.shard_counts(),
    )
