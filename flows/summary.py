"""What the ``build-h5-dataset`` flow returns: :class:`BuildSummary`."""

from __future__ import annotations

from pydantic import BaseModel, Field

from h5forge.flows.config import BuildConfig
from h5forge.publish.lineage import Basis
from h5forge.publish.preview import preview_url
from h5forge.publish.sidecar import sidecar_url
from h5forge.publish.versions import KEY_HEX
from h5forge.redact import redact_url
from h5forge.tasks.parts import PartStats
from h5forge.tasks.publish import asset_key

__all__ = ["BuildSummary", "unchanged_summary"]


class BuildSummary(BaseModel):
    """What a build published (URLs redacted)."""

    destination: str
    sidecar_url: str
    preview_url: str
    asset_key: str
    num_samples: int
    num_classes: int
    num_quarantined: int
    counts: dict[str, dict[str, int]]
    sha256: str
    bytes: int
    format_version: int
    smoke_images_per_second: float = Field(
        description="the slowest start method's smoke-load rate, worker start-up excluded"
    )
    smoke_per_method: dict[str, float] = Field(
        description="smoke-load images/s per multiprocessing start method"
    )
    seconds: dict[str, float] = Field(description="wall time of each stage, in run order")
    executor: str = Field(
        "local",
        description="local (process pool) or dask (parts packed "
        "on a Dask cluster, merged in the flow's process)",
    )
    parts: PartStats | None = Field(
        None,
        description="executor dask: the part plan, the "
        "parts this run packed and those it found done",
    )
    unchanged: bool = Field(
        default=False,
        description="versioned: the latest version was built from this source and "
        "configuration; nothing was fetched or published",
    )
    version: str = Field(
        default="", description="versioned: the version's key (16 hex of its sha256)"
    )
    reused: int = Field(
        default=0,
        description="versioned: samples reused from the previous version (source unchanged): "
        "referenced in its shards, or copied from its file",
    )
    shards: int = Field(default=0, description="sharded version: the shards it lists")
    shards_new: int = Field(
        default=0, description="sharded version: shards this build packed and uploaded"
    )
    shards_reused: int = Field(
        default=0, description="sharded version: shards referenced from the previous version"
    )


def unchanged_summary(config: BuildConfig, basis: Basis, seconds: dict[str, float]) -> BuildSummary:
    """The summary of a run that found its source and configuration already published."""
    latest = basis.latest
    return BuildSummary(
        destination=redact_url(basis.latest_url),
        sidecar_url=redact_url(sidecar_url(basis.latest_url)),
        preview_url=redact_url(preview_url(basis.latest_url)),
        asset_key=asset_key(config.destination),
        num_samples=latest.get("num_samples", 0),
        num_classes=latest.get("num_classes", 0),
        num_quarantined=latest.get("num_quarantined", 0),
        counts=latest.get("counts", {}),
        sha256=basis.latest_sha256,
        bytes=latest["bytes"],
        format_version=latest.get("format_version", 0),
        smoke_images_per_second=0.0,
        smoke_per_method={},
        seconds=seconds,
        executor=config.executor,
        parts=None,
        unchanged=True,
        version=basis.latest_sha256[:KEY_HEX],
    )
