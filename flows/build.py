"""Flow ``build-h5-dataset``: fetch → discover → pack → verify → smoke-load → publish.

Everything up to smoke-load happens in a private local work dir; the destination is touched only
by the publish stage, which runs only after the packed file passed a full verify and a
smoke-load through DataLoader workers. A failure anywhere before it fails the run with nothing
published.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

import fsspec
from prefect import flow, get_run_logger
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from flows.credentials import default_cache_dir, load_storage_options
from h5forge.access import url_to_fs
from h5forge.images import ImageConfig
from h5forge.redact import redact_url
from tasks._common import dataset_name
from tasks.discover import discover_samples
from tasks.fetch import fetch_task, source_dir
from tasks.pack import pack_images
from tasks.publish import make_preview, publish_task
from tasks.report import render_report, write_report
from tasks.smoke_load import smoke_load_file
from tasks.verify import verify_file

__all__ = ["BuildConfig", "BuildSummary", "build_dataset", "check_url"]

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# fsspec can read these but not write them.
_READ_ONLY = frozenset({"http", "https", "github", "zip", "tar", "libarchive", "reference"})
# Highest compression_level each codec accepts.
_MAX_LEVEL = {"gzip": 9, "blosc-lz4": 9, "zstd": 22}


def check_url(url: str, *, what: str, writable: bool = False) -> str:
    """Check that ``url`` is a local path or a URL of a protocol fsspec knows, without secrets.

    Raises:
        ValueError: empty, unknown protocol, read-only protocol for a destination, or embedded
            credentials (they belong in a Secret block, not in a parameter Prefect records).
    """
    url = url.strip()
    if not url:
        raise ValueError(f"{what} is empty; give a local path or a URL such as s3://bucket/key")
    if redact_url(url) != url:
        raise ValueError(
            f"{what} {redact_url(url)!r} embeds credentials (user:password@ or a signed token); "
            "store them in a Prefect Secret block and name it in credentials_block"
        )
    if "://" not in url:
        return url
    known = set(fsspec.available_protocols())
    for part in url.split("::"):
        protocol = part.split("://", 1)[0].lower() if "://" in part else part.lower()
        if protocol not in known:
            raise ValueError(
                f"{what} {url!r} uses protocol {protocol!r}, which fsspec does not know; use a "
                f"local path or one of {', '.join(sorted(p for p in known if len(p) <= 6))} ..."
            )
        if writable and protocol in _READ_ONLY:
            raise ValueError(
                f"{what} {url!r}: protocol {protocol!r} is read-only in fsspec; publish to a "
                "local path or a writable store (s3://, gs://, az://, memory://, ...)"
            )
    return url


class BuildConfig(BaseModel):
    """Everything one build needs; Prefect renders it as the run form in the UI."""

    model_config = ConfigDict(extra="forbid")

    source: Annotated[str, Field(
        description="Where the images are: a local folder or archive, or any fsspec URL "
        "(https://host/data.tar.gz, s3://bucket/prefix/). ImageFolder layout: "
        "[split/]class/image.jpg.",
        examples=["https://example.org/flowers.tar.gz", "s3://bucket/datasets/flowers/"],
    )]
    sha256: Annotated[str | None, Field(
        description="sha256 of the source archive (64 hex digits). Pins the content: the "
        "download is checked against it, and re-runs are served from the fetch cache.",
    )] = None
    destination: Annotated[str, Field(
        description="Where to publish the .h5 asset: a local path or a writable fsspec URL "
        "ending in .h5. Its .manifest.json and .preview.png are written beside it.",
        examples=["s3://bucket/assets/flowers-224.h5"],
    )]
    credentials_block: Annotated[str | None, Field(
        description="Name of a Prefect Secret block whose value is a JSON object of fsspec "
        "storage_options (keys, endpoint) for the source and the destination.",
    )] = None
    layout: Annotated[Literal["decoded", "encoded"], Field(
        description="decoded: raw uint8 pixels, nothing to decode at read time (fastest). "
        "encoded: image file bytes (smaller, decoded by the reader).",
    )] = "decoded"
    encoding: Annotated[Literal["original", "jpeg", "png", "webp"], Field(
        description="encoded layout only: keep the original file bytes or re-encode.",
    )] = "original"
    resize: Annotated[Literal["none", "resize", "shorter-side"], Field(
        description="none: keep each image's size; resize: to size x size; shorter-side: "
        "scale the shorter side to size, then centre-crop to size x size.",
    )] = "shorter-side"
    size: Annotated[int, Field(
        ge=8, le=4096, description="Output height and width in pixels.",
    )] = 224
    mode: Annotated[Literal["RGB", "L"], Field(
        description="RGB (3 channels) or L (grayscale, 1 channel).",
    )] = "RGB"
    compression: Annotated[Literal["none", "gzip", "lzf", "blosc-lz4", "zstd"], Field(
        description="HDF5 compression of decoded fixed-size images. Off by default: photos "
        "gain 1.0-1.3x and lose most of the read speed. blosc-lz4/zstd need hdf5plugin.",
    )] = "none"
    compression_level: Annotated[int | None, Field(
        ge=0, le=22, description="Codec level (gzip 0-9, zstd 1-22); empty for the default.",
    )] = None
    workers: Annotated[int | None, Field(
        ge=1, le=1024, description="Preprocessing processes; empty for the CPU count.",
    )] = None
    smoke_workers: Annotated[int, Field(
        ge=0, le=64, description="DataLoader workers for the smoke-load (0: in-process).",
    )] = 2
    smoke_batches: Annotated[int, Field(
        ge=1, le=10_000, description="Batches read per start method (fork, spawn) by the "
        "smoke-load.",
    )] = 4
    max_bad_fraction: Annotated[float, Field(
        ge=0.0, le=1.0, description="Fail when more than this fraction of the images cannot be "
        "decoded (they are quarantined and listed in the report).",
    )] = 0.01
    overwrite: Annotated[bool, Field(
        description="Replace an existing asset at the destination.",
    )] = False

    @field_validator("source")
    @classmethod
    def _source(cls, value: str) -> str:
        return check_url(value, what="source")

    @field_validator("destination")
    @classmethod
    def _destination(cls, value: str) -> str:
        value = check_url(value, what="destination", writable=True)
        if not value.endswith(".h5"):
            raise ValueError(f"destination {value!r} must end in .h5 (e.g. s3://bucket/data.h5)")
        return value

    @field_validator("sha256")
    @classmethod
    def _sha256(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not _SHA256.match(value):
            raise ValueError(f"sha256 {value!r} is not 64 hexadecimal digits")
        return value.lower()

    @field_validator("credentials_block")
    @classmethod
    def _block(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not _BLOCK_NAME.match(value):
            raise ValueError(
                f"credentials_block {value!r} is not a block name (lower-case letters, digits "
                "and dashes); create it with Secret(value={...}).save('my-store-credentials')"
            )
        return value

    @model_validator(mode="after")
    def _image_settings(self) -> BuildConfig:
        level, codec = self.compression_level, self.compression
        if level is not None:
            if codec in ("none", "lzf"):
                raise ValueError(f"compression_level={level} needs a codec that takes a level "
                                 f"(gzip, blosc-lz4, zstd); compression is {codec!r}")
            if level > _MAX_LEVEL[codec]:
                raise ValueError(f"compression_level={level} is out of range for {codec} "
                                 f"(0..{_MAX_LEVEL[codec]})")
        if codec != "none" and (self.layout != "decoded" or self.resize == "none"):
            raise ValueError(f"compression={codec!r} applies to decoded images of one size only "
                             "(layout='decoded' and resize != 'none')")
        self.image_config().validate()
        return self

    def image_config(self) -> ImageConfig:
        """The library's preprocessing configuration for this build."""
        return ImageConfig(
            layout=self.layout,
            encoding=self.encoding,
            mode=self.mode,
            resize=self.resize,
            size=None if self.resize == "none" else (self.size, self.size),
        )


class BuildSummary(BaseModel):
    """What a build published (URLs redacted)."""

    destination: str
    manifest_url: str
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
        description="the slowest start method's smoke-load rate, worker start-up excluded")
    smoke_per_method: dict[str, float] = Field(
        description="smoke-load images/s per multiprocessing start method")
    seconds: dict[str, float] = Field(description="wall time of each stage, in run order")


@contextmanager
def _stage(seconds: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        seconds[name] = round(time.perf_counter() - start, 3)


def _refuse_existing(dest: str, storage_options: dict[str, Any]) -> None:
    # Checked before any work, so a forgotten --overwrite costs seconds, not a whole build.
    fs, path = url_to_fs(dest, storage_options)
    if fs.exists(path):
        raise FileExistsError(
            f"{redact_url(dest)} already exists; set overwrite=True to replace it"
        )


_WORK_PREFIX = "h5forge-build-"
_DEAD_AFTER_S = 5.0  # a live run locks its work dir microseconds after creating it


@contextmanager
def _work_dir() -> Iterator[Path]:
    """This run's private scratch folder in TMPDIR, locked (flock) while the run lives.

    A killed run cannot delete its folder, which holds the packed file (as large as the
    dataset); each build first removes the ``h5forge-build-*`` folders of dead runs: those
    whose lock it can take (the kernel drops a dead process's locks).
    """
    import fcntl

    root = Path(tempfile.gettempdir())
    for old in root.glob(f"{_WORK_PREFIX}*"):
        try:
            if old.stat().st_uid != os.getuid() or time.time() - old.stat().st_mtime < \
                    _DEAD_AFTER_S:
                continue
            fd = os.open(old, os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile, or not ours to look at
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            shutil.rmtree(old)  # its run is dead
        except BlockingIOError:
            pass  # a live run holds it
        finally:
            os.close(fd)
    with tempfile.TemporaryDirectory(prefix=_WORK_PREFIX) as tmp:
        fd = os.open(tmp, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield Path(tmp)
        finally:
            os.close(fd)


@flow(name="build-h5-dataset")
def build_dataset(config: BuildConfig, cache_dir: str | None = None) -> BuildSummary:
    """Build, verify, smoke-load and publish one HDF5 image asset.

    Args:
        config: what to build and where to publish it.
        cache_dir: local folder for fetched sources and the fetch cache; default
            ``$XDG_CACHE_HOME/h5forge`` (``~/.cache/h5forge``).

    Returns:
        Where the asset, its manifest and its preview are, with counts, digest and timings.
    """
    logger = get_run_logger()
    options = load_storage_options(config.credentials_block)
    if not config.overwrite:
        _refuse_existing(config.destination, options)
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    dataset = dataset_name(config.destination)
    seconds: dict[str, float] = {}
    with _work_dir() as work:
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
            discover_samples(fetched.root)
        with _stage(seconds, "pack"):
            packed = pack_images(
                fetched.root,
                out=str(work / dataset),
                dataset=dataset,
                image=config.image_config(),
                compression=config.compression,
                compression_level=config.compression_level,
                workers=config.workers,
                max_bad_fraction=config.max_bad_fraction,
                source_url=fetched.source_url,
                source_sha256=fetched.sha256,
            )
        with _stage(seconds, "verify"):
            verified = verify_file(packed.path, sample_fraction=1.0)
        with _stage(seconds, "smoke-load"):
            smoke = smoke_load_file(
                packed.path, workers=config.smoke_workers, batches=config.smoke_batches
            )
        with _stage(seconds, "preview"):
            png = make_preview(packed.path, out=str(work / "preview.png"))
        with _stage(seconds, "publish"):
            published = publish_task(config.destination, description=f"h5forge asset {dataset}")(
                packed.path,
                config.destination,
                preview_png=png,
                overwrite=config.overwrite,
                metadata={
                    "num_samples": packed.num_samples,
                    "num_classes": packed.num_classes,
                    "num_quarantined": packed.num_quarantined,
                    "counts": packed.counts,
                    "format_version": verified.format_version,
                    "source": fetched.source_url,
                },
                storage_options=options,
            )
    markdown = render_report(
        dataset=dataset,
        source=fetched.source_url,
        pack=packed,
        smoke=smoke,
        published=published,
        format_version=verified.format_version,
        stage_seconds=seconds,
    )
    write_report(markdown, dataset=dataset, preview=published.preview_url)
    logger.info("published %s (%d samples, sha256 %s)", published.url, packed.num_samples,
                published.sha256)
    return BuildSummary(
        destination=published.url,
        manifest_url=published.manifest_url,
        preview_url=published.preview_url,
        asset_key=published.asset_key,
        num_samples=packed.num_samples,
        num_classes=packed.num_classes,
        num_quarantined=packed.num_quarantined,
        counts=packed.counts,
        sha256=published.sha256,
        bytes=published.bytes,
        format_version=verified.format_version,
        smoke_images_per_second=round(smoke.images_per_second, 1),
        smoke_per_method=smoke.per_method,
        seconds=seconds,
    )

