"""Verify stage: full check of the packed file before publishing, sampled re-check after."""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from pydantic import BaseModel, ConfigDict

from h5forge.publish.storage import check_manifest as check_file_manifest
from h5forge.publish.storage import read_manifest
from h5forge.redact import redact_url
from h5forge.verify.checks import verify
from tasks.common import (
    run_name,
    with_retries,
)

__all__ = ["VerifySummary", "check_manifest", "load_manifest", "verify_file"]


class VerifySummary(BaseModel):
    """A passed verification."""

    model_config = ConfigDict(frozen=True)

    path: str
    num_samples: int
    num_classes: int
    bytes: int
    sha256: str
    checked_samples: int
    format_version: int
    seconds: float


@task(name="verify", task_run_name=run_name("verify"))
def verify_file(
    path: str, *, sample_fraction: float = 1.0, storage_options: dict[str, Any] | None = None
) -> VerifySummary:
    """Verify structure, counts, byte ranges, digests and the sha256 of ``path``.

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
    return VerifySummary(
        path=redact_url(report.path),
        num_samples=report.num_samples,
        num_classes=report.num_classes,
        bytes=report.bytes,
        sha256=report.sha256,
        checked_samples=report.checked_samples,
        format_version=report.format_version,
        seconds=report.seconds,
    )


@task(
    name="read-manifest",
    task_run_name=run_name("read-manifest"),
    **with_retries(3),
)
def load_manifest(url: str, *, storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """The ``.manifest.json`` beside ``url`` (see :func:`h5forge.publish.storage.read_manifest`)."""
    return read_manifest(url, storage_options=storage_options)


@task(name="check-manifest", task_run_name=run_name("check-manifest"))
def check_manifest(url: str, *, manifest: dict[str, Any], report: VerifySummary) -> None:
    """Compare what the file is (``report``) with what its published manifest promises
    (see :func:`h5forge.publish.storage.check_manifest`).

    Raises:
        IntegrityError: size, sha256, counts or format version differ (all differences listed).
    """
    check_file_manifest(
        url,
        manifest,
        sha256=report.sha256,
        bytes=report.bytes,
        num_samples=report.num_samples,
        num_classes=report.num_classes,
        format_version=report.format_version,
    )
