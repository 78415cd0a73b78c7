"""Verify stage: full check of the packed file before publishing, sampled re-check after."""

from __future__ import annotations

import dataclasses
from typing import Any

from prefect import get_run_logger, task

from h5forge.publish import manifest as manifests
from h5forge.redact import redact_url
from h5forge.verify.checks import VerifyReport, verify
from tasks.common import run_name, with_retries

__all__ = ["check_manifest", "load_manifest", "verify_file"]


@task(name="verify", task_run_name=run_name("verify"))
def verify_file(
    path: str, *, sample_fraction: float = 1.0, storage_options: dict[str, Any] | None = None
) -> VerifyReport:
    """Verify structure, counts, byte ranges, digests and the sha256 of ``path``.

    Returns:
        The library's report, its path redacted (it becomes a Prefect result).

    Raises:
        IntegrityError: one line per failing check; the run fails and nothing is published.
    """
    report = verify(path, sample_fraction=sample_fraction, storage_options=storage_options)
    get_run_logger().info(
        "verified %s: %d samples (%d digests checked), sha256 %s",
        redact_url(path),
        report.num_samples,
        report.checked_samples,
        report.sha256,
    )
    return dataclasses.replace(report, path=redact_url(report.path))


@task(
    name="read-manifest",
    task_run_name=run_name("read-manifest"),
    **with_retries(3),
)
def load_manifest(url: str, *, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``.manifest.json`` beside ``url`` (:func:`h5forge.publish.manifest.read_manifest`)."""
    return manifests.read_manifest(url, storage_options=storage_options)


@task(name="check-manifest", task_run_name=run_name("check-manifest"))
def check_manifest(url: str, *, manifest: dict[str, Any], report: VerifyReport) -> None:
    """:func:`h5forge.publish.manifest.check_manifest` of what verify found (``report``).

    Raises:
        IntegrityError: size, sha256, counts or format version differ (all differences listed).
    """
    manifests.check_verified(url, manifest, report)
