"""Publish stage: upload the verified file, its sidecar and its preview; record the asset.

The upload is a Prefect asset materialisation keyed by the destination URL, so every build of
one destination shows up as one asset with its metadata (counts, sha256, bytes, format version);
for a versioned build, each materialisation is one version with its lineage (parent, source
fingerprint, added/removed/replaced, config hash, flow run).
The preview PNG is rendered locally before publishing (a file that cannot be previewed is not
published) and uploaded beside the asset afterwards
(:func:`h5forge.publish.preview.publish_preview`); when only that upload fails, the error
(:class:`~h5forge.errors.PreviewPublishError`) says the asset itself was published.
"""

from __future__ import annotations

import posixpath
from pathlib import Path
from typing import Any, cast

from prefect import task
from prefect.assets import Asset, AssetProperties, add_asset_metadata, materialize
from prefect.cache_policies import NO_CACHE
from prefect.tasks import MaterializingTask
from prefect.types.names import MAX_ASSET_KEY_LENGTH, RESTRICTED_ASSET_CHARACTERS
from prefect.utilities.hashing import hash_objects

from h5forge.location import Location
from h5forge.pack.reuse import Reuse
from h5forge.publish.history import check_retention
from h5forge.publish.lineage import Basis, build_basis, reuse_previous, write_sources
from h5forge.publish.preview import preview_url, publish_preview, write_preview
from h5forge.publish.release import VersionResult, publish_version
from h5forge.publish.shard_release import ShardedResult, publish_sharded
from h5forge.publish.sharded import StagedVersion
from h5forge.publish.storage import PublishResult, publish
from h5forge.publish.versions import version_url
from h5forge.redact import redact_url
from h5forge.tasks.common import dataset_name, retry_upload, run_name, with_retries

__all__ = [
    "find_reusable",
    "as_published",
    "asset_key",
    "check_source",
    "make_preview",
    "publish_shards_task",
    "publish_task",
    "publish_version_task",
]


def asset_key(dest: str) -> str:
    """The Prefect asset key of a destination: a credential-free URI Prefect accepts.

    Local paths become ``file://`` URIs of the absolute path; of a chained fsspec URL
    (``simplecache::s3://...``) the last, storage-level URL is kept. Characters Prefect does not
    allow in keys (spaces, ``%``, ``#``, ``?`` ...) become ``_``; an over-long key keeps its
    start and ends in a hash of the whole.
    """
    url = dest.split("::")[-1]
    if "://" in url:
        scheme, rest = url.split("://", 1)
        key = redact_url(f"{scheme.lower()}://{rest}")
    else:
        key = "file://" + str(Path(url).expanduser().resolve())
    for char in RESTRICTED_ASSET_CHARACTERS:
        key = key.replace(char, "_")
    if len(key) > MAX_ASSET_KEY_LENGTH:
        digest = hash_objects(key) or ""
        key = key[: MAX_ASSET_KEY_LENGTH - len(digest) - 1] + "-" + digest
    return key


@task(name="preview", task_run_name=run_name("preview"))
def make_preview(path: str, *, out: str, max_pixels: int, n: int = 16) -> str:
    """Render a labelled grid of ``n`` samples of the local file ``path`` as PNG at ``out``,
    reading with the decode bound ``max_pixels`` (the build's ``max_image_pixels``)."""
    return write_preview(path, out, n=n, max_pixels=max_pixels)


def _publish(
    local_file: str,
    dest: Location,
    *,
    preview_png: str,
    overwrite: bool = False,
    metadata: dict[str, Any] | None = None,
) -> PublishResult:
    """Publish ``local_file`` at ``dest`` with its sidecar (``metadata`` added to it) and its
    preview."""
    result = publish(
        local_file,
        dest,
        overwrite=overwrite,
        extra={**(metadata or {}), "preview": posixpath.basename(preview_url(dest.url))},
    )
    preview = publish_preview(preview_png, dest, published=result)
    add_asset_metadata(
        asset_key(dest.url),
        {
            **(metadata or {}),
            "sha256": result.sha256,
            "bytes": result.bytes,
            "sidecar_url": redact_url(result.sidecar_url),
            "preview_url": preview,
        },
    )
    return result


def publish_task(dest: str, *, description: str = "") -> MaterializingTask[..., PublishResult]:
    """The publish task for the URL ``dest``: a materialisation of the asset keyed by
    :func:`asset_key`.

    Call it as ``publish_task(dest)(local_file, Location(dest, options), preview_png=..., ...)``;
    the preview is at :func:`h5forge.publish.preview.preview_url` of ``dest``. Never cached
    (:data:`~prefect.cache_policies.NO_CACHE`): its inputs hold the destination's storage
    options, which no cache key may be computed from.
    """
    asset = Asset(
        key=asset_key(dest),
        properties=AssetProperties(
            name=dataset_name(dest),
            description=description[:2500] or None,
        ),
    )
    return materialize(
        asset,
        by="h5forge",
        name="publish",
        task_run_name=run_name("publish"),
        cache_policy=NO_CACHE,
        **with_retries(3, retry_upload),
    )(_publish)


@task(
    name="fingerprint",
    task_run_name=run_name("fingerprint"),
    cache_policy=NO_CACHE,
    **with_retries(3),
)
def check_source(
    source: Location,
    asset: Location,
    *,
    config_sha256: str,
    sha256: str | None = None,
) -> Basis:
    """The source's fingerprint and the asset's latest version (:func:`build_basis`).

    Never cached: its answer is what the store holds now, and its inputs hold storage options.
    """
    return build_basis(source, asset, config_sha256=config_sha256, sha256=sha256)


@task(name="find-reusable", task_run_name=run_name("find-reusable"), cache_policy=NO_CACHE)
def find_reusable(basis: Basis, *, into: str, asset: Location) -> Reuse | None:
    """The latest version's samples this build may copy (:func:`reuse_previous`)."""
    return reuse_previous(basis, into, asset=asset)


def _publish_version(
    local_file: str,
    dest: Location,
    *,
    preview_png: str,
    sources: dict[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
    keep_versions: int = 5,
    min_age_s: float = 0.0,
    based_on: str | None = None,
) -> VersionResult:
    """Publish ``local_file`` as a new version of the asset ``dest`` (its preview and its
    per-file map first, in the version's folder, unless that version already exists; then the
    file, its sidecar and the pointer, last; then retention, as ``keep_versions`` and
    ``min_age_s`` say). With ``based_on`` (the latest version's sha256 when the build began,
    "" for none) it refuses when another build has moved the pointer since.

    The materialisation records the version and its lineage: ``version``, ``sha256``,
    ``parent_sha256``, ``source_fingerprint``, ``config_sha256``, ``flow_run_id`` and, when the
    parent's per-file map was known, ``added``, ``removed`` and ``replaced``.
    """
    check_retention(keep_versions, min_age_s)  # before any upload
    # The one local hash: it names the version and checks its copy.
    sha = Location.of(local_file).sha256()
    target = version_url(dest.url, sha)

    def beside(file: Location) -> None:  # in the version's folder, before its file
        file.with_url(preview_url(file.url)).put(local=preview_png)
        if sources is not None:
            write_sources(file, sources)

    result = publish_version(
        local_file,
        dest,
        extra={**(metadata or {}), "preview": posixpath.basename(preview_url(target))},
        keep_versions=keep_versions,
        min_age_s=min_age_s,
        sha256=sha,
        based_on=based_on,
        beside=beside,
    )
    changes = (metadata or {}).get("changes") or {}
    add_asset_metadata(
        asset_key(dest.url),
        {
            **(metadata or {}),
            **{k: changes[k] for k in ("added", "removed", "replaced") if k in changes},
            "parent_sha256": result.parent,
            "sha256": result.sha256,
            "version": result.version,
            "removed_versions": list(result.removed),
            "bytes": result.bytes,
            "sidecar_url": result.sidecar_url,
            "preview_url": redact_url(preview_url(target)),
        },
    )
    return result


def publish_version_task(
    dest: str, *, description: str = ""
) -> MaterializingTask[..., VersionResult]:
    """The versioned publish task for the URL ``dest``: the same asset as :func:`publish_task`'s.

    Call it as ``publish_version_task(dest)(local_file, Location(dest, options),
    preview_png=..., sources=...)``. Never cached, as :func:`publish_task`.
    """
    return cast(
        "MaterializingTask[..., VersionResult]", _materializing(dest, description)(_publish_version)
    )


def _materializing(dest: str, description: str) -> Any:
    """The decorator that makes a publish function a task materialising the asset ``dest``:
    never cached (its answer is what the store holds now), retried on upload errors."""
    asset = Asset(
        key=asset_key(dest),
        properties=AssetProperties(name=dataset_name(dest), description=description[:2500] or None),
    )
    return materialize(
        asset,
        by="h5forge",
        name="publish",
        task_run_name=run_name("publish"),
        cache_policy=NO_CACHE,
        **with_retries(3, retry_upload),
    )


def as_published(result: VersionResult) -> PublishResult:
    """The version's own file as a :class:`PublishResult` (what the build report shows)."""
    return PublishResult(
        url=result.url,
        sidecar_url=result.sidecar_url,
        sha256=result.sha256,
        bytes=result.bytes,
        unchanged=result.unchanged,
    )


def _publish_shards(
    staged: StagedVersion,
    dest: Location,
    *,
    preview_png: str,
    sources: dict[str, str] | None = None,
    metadata: dict[str, Any] | None = None,
    lineage: dict[str, str] | None = None,
    keep_versions: int = 5,
    min_age_s: float = 0.0,
    based_on: str | None = None,
) -> ShardedResult:
    """Publish ``staged`` as a new sharded version of the asset ``dest``
    (:func:`h5forge.publish.sharded.publish_sharded`: new shards, sources map, manifest,
    pointer last, retention), then its preview beside the manifest.

    The materialisation records the version, its lineage and its shards: ``shards``,
    ``shards_new``, ``shards_reused``, ``bytes_new``, ``bytes_reused``.
    """
    check_retention(keep_versions, min_age_s)  # before any upload
    meta = dict(metadata or {})
    result = publish_sharded(
        staged,
        dest,
        fields={
            "source_url": str(meta.get("source", "")),
            "source_fingerprint": str(meta.get("source_fingerprint", "")),
            "lineage": dict(lineage or {}),
        },
        sources=sources,
        based_on=based_on,
        keep_versions=keep_versions,
        min_age_s=min_age_s,
    )
    manifest = dest.with_url(version_url(dest.url, result.sha256, "sharded"))
    manifest.with_url(preview_url(manifest.url)).put(local=preview_png)
    changes = meta.get("changes") or {}
    add_asset_metadata(
        asset_key(dest.url),
        {
            **meta,
            **{k: changes[k] for k in ("added", "removed", "replaced") if k in changes},
            "parent_sha256": result.parent,
            "sha256": result.sha256,
            "version": result.version,
            "removed_versions": list(result.removed),
            "shards": result.shards,
            "shards_new": result.shards_new,
            "shards_reused": result.shards_reused,
            "bytes_new": result.bytes_new,
            "bytes_reused": result.bytes_reused,
            "preview_url": redact_url(preview_url(manifest.url)),
        },
    )
    return result


def publish_shards_task(
    dest: str, *, description: str = ""
) -> MaterializingTask[..., ShardedResult]:
    """The sharded publish task for the URL ``dest`` (the same asset as
    :func:`publish_version_task`'s). Never cached."""
    return cast(
        "MaterializingTask[..., ShardedResult]", _materializing(dest, description)(_publish_shards)
    )
