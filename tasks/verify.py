"""Verify stage: full check of the packed file before publishing, sampled re-check after.

A failed check emits the Prefect event :data:`VERIFY_FAILED` (``h5forge.verify.failed``) before
the task fails with the :class:`~h5forge.errors.IntegrityError`: its resource is the asset's
key (:func:`h5forge.tasks.publish.asset_key`: credential-free, a local path as its absolute
``file://`` URI, the key Prefect's asset events use), its payload the failures (at most
:data:`MAX_EVENT_FAILURES` lines of at most :data:`MAX_EVENT_LINE` characters, each redacted).
An automation (:mod:`h5forge.deployments.automations`) pauses the nightly build on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.events import emit_event

from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.publish import sidecar as sidecars
from h5forge.publish.versions import read_pointer
from h5forge.redact import redact_text, redact_url
from h5forge.tasks.common import run_name, with_retries
from h5forge.tasks.publish import asset_key
from h5forge.verify.checks import VerifyReport, verify
from h5forge.verify.sharded import VersionReport, verify_version

__all__ = [
    "resolve_asset",
    "MAX_EVENT_FAILURES",
    "MAX_EVENT_LINE",
    "VERIFY_FAILED",
    "check_sidecar",
    "emit_verify_failed",
    "load_sidecar",
    "verify_file",
    "verify_sharded",
]

VERIFY_FAILED = "h5forge.verify.failed"
# Bounds on an event's payload: a file with a million bad samples must not make a huge event.
MAX_EVENT_FAILURES = 50
MAX_EVENT_LINE = 500


def emit_verify_failed(asset: str, error: IntegrityError, *, check: str) -> None:
    """Emit :data:`VERIFY_FAILED` for ``asset`` (any path or URL; its key is the resource)."""
    lines = error.failures or [str(error)]
    emit_event(
        event=VERIFY_FAILED,
        resource={
            "prefect.resource.id": asset_key(asset),
            "prefect.resource.name": redact_url(asset),
        },
        payload={
            "check": check,
            "failures": [redact_text(line)[:MAX_EVENT_LINE] for line in lines[:MAX_EVENT_FAILURES]],
            "num_failures": len(lines),
        },
    )


@task(name="verify", task_run_name=run_name("verify"), cache_policy=NO_CACHE)
def verify_file(
    where: Location,
    *,
    sample_fraction: float = 1.0,
    asset: str | None = None,
    max_pixels: int,
) -> VerifyReport:
    """Verify structure, counts, byte ranges, digests and the sha256 of the file at ``where``.

    Args:
        where: the file to verify.
        sample_fraction: fraction of per-sample digests re-checked.
        max_pixels: the decode bound (``max_pixels=`` of :func:`h5forge.verify.checks.verify`):
            a build passes the ``max_image_pixels`` it packed with, never one from the file.
        asset: the asset the file is (to be) published as, the resource of the failure event;
            default the file itself.

    Returns:
        The library's report, its path redacted (it becomes a Prefect result).

    Raises:
        IntegrityError: one line per failing check; the run fails and nothing is published.
            :data:`VERIFY_FAILED` is emitted first.
    """
    try:
        report = verify(where, sample_fraction=sample_fraction, max_pixels=max_pixels)
    except IntegrityError as e:
        emit_verify_failed(asset or where.url, e, check="verify")
        raise
    get_run_logger().info(
        "verified %s: %d samples (%d digests checked), sha256 %s",
        where,
        report.num_samples,
        report.checked_samples,
        report.sha256,
    )
    return dataclasses.replace(report, path=redact_url(report.path))


@task(name="verify-version", task_run_name=run_name("verify-version"), cache_policy=NO_CACHE)
def verify_sharded(
    asset: Location,
    manifest_url: str,
    *,
    sample_fraction: float = 1.0,
    name: str | None = None,
    max_pixels: int,
) -> VersionReport:
    """Verify the sharded version whose manifest is at ``manifest_url`` (as
    :func:`resolve_asset` returned it): the manifest, then every shard once
    (:func:`h5forge.verify.sharded.verify_version`).

    Args:
        asset: the asset (its base, with its storage options).
        name: the asset as the flow was given it, the resource of the failure event.

    Raises:
        IntegrityError: one line per failing check, each naming its shard;
            :data:`VERIFY_FAILED` is emitted first.
    """
    # BASE/v/<16 hex>/NAME.version.json: the key is the version's sha256 prefix, and the
    # manifest must hash to it (verify_version recomputes the address from it).
    key = manifest_url.split("?", 1)[0].rsplit("/", 2)[-2]
    try:
        report = verify_version(asset, key, sample_fraction=sample_fraction, max_pixels=max_pixels)
    except IntegrityError as e:
        emit_verify_failed(name or asset.url, e, check="verify")
        raise
    get_run_logger().info(
        "verified %s: %d samples in %d shards (%d digests checked), version %s",
        redact_url(report.path),
        report.num_samples,
        len(report.shards),
        report.checked_samples,
        report.sha256,
    )
    return dataclasses.replace(report, path=redact_url(report.path))


@task(
    name="read-sidecar",
    task_run_name=run_name("read-sidecar"),
    cache_policy=NO_CACHE,
    **with_retries(3),
)
def load_sidecar(where: Location) -> dict[str, Any]:
    """The ``.manifest.json`` beside the file at ``where``
    (:func:`h5forge.publish.sidecar.read_sidecar`)."""
    return sidecars.read_sidecar(where)


@task(name="check-sidecar", task_run_name=run_name("check-sidecar"))
def check_sidecar(
    url: str, *, sidecar: dict[str, Any], report: VerifyReport, asset: str | None = None
) -> None:
    """:func:`h5forge.publish.sidecar.check_sidecar` of what verify found (``report``);
    ``asset`` names the asset in the failure event (default ``url``).

    Raises:
        IntegrityError: size, sha256, counts or format version differ (all differences listed).
            :data:`VERIFY_FAILED` is emitted first.
    """
    try:
        sidecars.check_verified(url, sidecar, report)
    except IntegrityError as e:
        emit_verify_failed(asset or url, e, check="sidecar")
        raise


@task(
    name="resolve-asset",
    task_run_name=run_name("resolve-asset"),
    cache_policy=NO_CACHE,
    **with_retries(2),
)
def resolve_asset(where: Location) -> str:
    """The URL of the file to verify: ``where``'s own, or, when no file is there and the asset
    has a ``NAME.latest.json`` pointer (a versioned build), the version that pointer names (a
    sharded version's manifest, for :func:`verify_sharded`)."""
    if where.fs.isfile(where.path):
        return where.url
    pointer = read_pointer(where)
    return where.url if pointer is None else pointer.url
