"""Flow ``verify-h5-asset``: re-check a published asset against its sidecar (e.g. nightly).

The sidecar is the publisher's commit marker: it records the file's size, sha256, counts and
format version. This flow recomputes them from the stored bytes (the whole file is hashed;
``sample_fraction`` of the per-sample digests are re-checked) and fails on any difference.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from prefect import flow, get_run_logger
from pydantic import Field

from h5forge.flows.build import check_url
from h5forge.flows.credentials import load_storage_options
from h5forge.location import Location
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.publish.named import is_manifest
from h5forge.tasks.verify import (
    check_sidecar,
    load_sidecar,
    resolve_asset,
    verify_file,
    verify_sharded,
)

__all__ = ["verify_asset"]

_REPUBLISHED_TRIES = 3


@flow(name="verify-h5-asset")
def verify_asset(
    url: str,
    credentials_block: str | None = None,
    sample_fraction: Annotated[float, Field(gt=0.0, le=1.0)] = 0.05,
    max_pixels: Annotated[int, Field(ge=1)] = DEFAULT_MAX_PIXELS,
) -> dict[str, Any]:
    """Verify the asset at ``url`` against its ``.manifest.json``; a sharded version, its
    manifest and every shard (:func:`h5forge.verify.sharded.verify_version`).

    Args:
        url: local path or fsspec URL of a published ``.h5`` asset; for a versioned asset
            (``versioned=True`` builds), the version ``NAME.latest.json`` names is verified.
        credentials_block: name of a Prefect Secret block holding fsspec storage_options.
        sample_fraction: fraction of per-sample digests to re-check, in (0, 1]; the file's
            sha256, size, structure and seal are always checked in full.
        max_pixels: most pixels one encoded sample may decode to: the ``max_image_pixels``
            the asset was built with where that was raised (never taken from the file).

    Returns:
        The verified facts: url, sha256, bytes, counts, samples checked, seconds.

    Raises:
        IntegrityError: the file differs from its sidecar or fails verification.
    """
    check_url(url, what="url")
    # The one place the credentials meet the URL; the tasks take the Location (never cached).
    asset = Location(url, load_storage_options(credentials_block))
    file = asset.with_url(resolve_asset(asset))  # a versioned asset: its latest version
    if is_manifest(file.url):  # sharded: the manifest, then every shard (no sidecar)
        return dataclasses.asdict(
            verify_sharded(
                asset,
                file.url,
                sample_fraction=sample_fraction,
                name=url,
                max_pixels=max_pixels,
            )
        )
    sidecar = load_sidecar(file)
    for _ in range(_REPUBLISHED_TRIES):
        report = verify_file(
            file, sample_fraction=sample_fraction, asset=url, max_pixels=max_pixels
        )
        latest = load_sidecar(file)
        if latest == sidecar:
            break
        # Republished while it was verified: the file may be the new one, the sidecar in hand
        # the old one. Verify again against the new sidecar instead of reporting a mismatch.
        sidecar = latest
    check_sidecar(file.url, sidecar=sidecar, report=report, asset=url)
    get_run_logger().info("%s matches its sidecar (sha256 %s)", file, report.sha256)
    return dataclasses.asdict(report)
