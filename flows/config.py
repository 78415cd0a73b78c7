"""``BuildConfig``, the one parameter of the build flow (Prefect renders it as the UI form).

Every field is validated up front, before any work: URLs (known fsspec protocols, no embedded
credentials, writable where the flow writes), codec settings, and the executor settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from h5forge.flows.dask_fields import DaskAddress, Executor, PartBytes, PartSize, Staging
from h5forge.flows.pack_fields import pack_default, pack_field
from h5forge.flows.urls import check_dask_address, check_url
from h5forge.flows.version_fields import (
    DEFAULT_KEEP_VERSIONS,
    DEFAULT_MAX_SHARD_SIZE,
    DEFAULT_MIN_AGE_S,
    SHARDS_OFF,
    KeepVersions,
    MaxShardSize,
    MinAgeS,
    Versioned,
)
from h5forge.options import (
    PACK_OPTIONS,
    RENAMED_OPTIONS,
    Compression,
    Encoding,
    Layout,
    Mode,
    ResizePolicy,
    check_size,
    check_sources,
    option,
    renamed_message,
)
from h5forge.pack.config import PackConfig
from h5forge.preflight import check_not_in_source
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.versions import asset_base
from h5forge.redact import redact_url

__all__ = ["DEFAULT_CACHE_DIR", "BuildConfig"]

# The cache folder when the caller names none: XDG's default cache home. The callers in
# deployments/ (the console script, the served deployments) pass ``$XDG_CACHE_HOME/h5forge``.
DEFAULT_CACHE_DIR = "~/.cache/h5forge"

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
_CHOICES = tuple(o.name for o in PACK_OPTIONS if o.kind == "choice")
# Checked after pydantic's type check; size is checked with width, in _pack_settings.
_CHECKED = tuple(
    o.name for o in PACK_OPTIONS if o.kind in ("int", "float", "bool", "path", "columns")
)


class BuildConfig(BaseModel):
    """Everything one build needs; Prefect renders it as the run form in the UI."""

    model_config = ConfigDict(extra="forbid")

    source: Annotated[
        str,
        Field(
            description="Where the images are: a local folder or archive, or any fsspec URL "
            "(https://host/data.tar.gz, s3://bucket/prefix/). ImageFolder layout: "
            "[split/]class/image.jpg; or give listing, coco or masks below for images with "
            "other targets (several labels, boxes, masks, captions).",
            examples=["https://example.org/flowers.tar.gz", "s3://bucket/datasets/flowers/"],
        ),
    ]
    sha256: Annotated[
        str | None,
        Field(
            description="sha256 of the source archive (64 hex digits). Pins the content: the "
            "download is checked against it, and re-runs are served from the fetch cache.",
        ),
    ] = None
    destination: Annotated[
        str,
        Field(
            description="Where to publish the .h5 asset: a local path or a writable fsspec URL "
            "ending in .h5. Its sidecar (.manifest.json) and .preview.png are written beside it.",
            examples=["s3://bucket/assets/flowers-224.h5"],
        ),
    ]
    credentials_block: Annotated[
        str | None,
        Field(
            description="Name of a Prefect Secret block whose value is a JSON object of fsspec "
            "storage_options (keys, endpoint) for the source and the destination.",
        ),
    ] = None
    # The pack options: types, defaults, bounds and texts come from h5forge.options, shared
    # with `h5forge pack` and `h5forge build`; the validators below check them with its rules.
    listing: Annotated[str | None, pack_field("listing")] = pack_default("listing")
    coco: Annotated[str | None, pack_field("coco")] = pack_default("coco")
    coco_masks: Annotated[bool, pack_field("coco_masks")] = pack_default("coco_masks")
    masks: Annotated[str | None, pack_field("masks")] = pack_default("masks")
    columns: Annotated[str | None, pack_field("columns")] = pack_default("columns")
    layout: Annotated[Layout, pack_field("layout")] = pack_default("layout")
    encoding: Annotated[Encoding, pack_field("encoding")] = pack_default("encoding")
    quality: Annotated[int, pack_field("quality")] = pack_default("quality")
    resize: Annotated[ResizePolicy, pack_field("resize")] = pack_default("resize")
    size: Annotated[int, pack_field("size")] = pack_default("size")[0]
    width: Annotated[
        int | None,
        pack_field(
            "size",
            description=(
                "Output width in pixels when it differs from the height (size); empty for square "
                "images."
            ),
        ),
    ] = None
    shorter_side: Annotated[int | None, pack_field("shorter_side")] = pack_default("shorter_side")
    mode: Annotated[Mode, pack_field("mode")] = pack_default("mode")
    max_image_pixels: Annotated[int, pack_field("max_image_pixels")] = pack_default(
        "max_image_pixels"
    )
    compression: Annotated[Compression, pack_field("compression")] = pack_default("compression")
    compression_level: Annotated[int | None, pack_field("compression_level")] = pack_default(
        "compression_level"
    )
    fletcher32: Annotated[bool, pack_field("fletcher32")] = pack_default("fletcher32")
    workers: Annotated[int | None, pack_field("workers")] = pack_default("workers")
    smoke_workers: Annotated[
        int,
        Field(
            ge=0,
            le=64,
            description="DataLoader workers for the smoke-load (0: in-process).",
        ),
    ] = 2
    smoke_batches: Annotated[
        int,
        Field(
            ge=1,
            le=10_000,
            description="Batches read per start method (fork, spawn) by the smoke-load.",
        ),
    ] = 4
    max_bad_fraction: Annotated[float, pack_field("max_bad_fraction")] = pack_default(
        "max_bad_fraction"
    )
    overwrite: Annotated[bool, pack_field("overwrite")] = pack_default("overwrite")
    versioned: Versioned = False
    keep_versions: KeepVersions = DEFAULT_KEEP_VERSIONS
    min_age_s: MinAgeS = DEFAULT_MIN_AGE_S
    max_shard_size: MaxShardSize = DEFAULT_MAX_SHARD_SIZE
    executor: Executor = "local"
    dask_address: DaskAddress = None
    part_size: PartSize = 2000
    part_bytes: PartBytes = None
    staging: Staging = None

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        # Before pydantic's "extra inputs are not permitted", which would not say the new name.
        if isinstance(data, dict):
            old = [name for name in RENAMED_OPTIONS if name in data]
            if old:
                raise ValueError(
                    "; ".join(renamed_message(name, RENAMED_OPTIONS[name]) for name in old)
                )
        return data

    @field_validator(*_CHOICES, mode="before")
    @classmethod
    def _choice(cls, value: Any, info: ValidationInfo) -> Any:
        # Before pydantic's own Literal check, so the message is the one pack and build give.
        assert info.field_name is not None
        return option(info.field_name).check(value)

    @field_validator(*_CHECKED, mode="after")
    @classmethod
    def _checked(cls, value: Any, info: ValidationInfo) -> Any:
        assert info.field_name is not None
        return option(info.field_name).check(value)

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

    @field_validator("dask_address")
    @classmethod
    def _dask_address(cls, value: str | None) -> str | None:
        return check_dask_address(value)

    @field_validator("staging")
    @classmethod
    def _staging(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return check_url(value, what="staging", writable=True)

    @model_validator(mode="after")
    def _executor_settings(self) -> BuildConfig:
        if self.executor == "dask" and self.dask_address is None:
            raise ValueError(
                "executor='dask' needs dask_address, the scheduler of a running Dask cluster "
                "(e.g. tcp://scheduler:8786); start one with `dask scheduler` and "
                "`dask worker tcp://scheduler:8786`, or use executor='local'"
            )
        if self.executor == "local":
            dask_only = [
                name
                for name in ("dask_address", "staging", "part_bytes")
                if getattr(self, name) is not None
            ]
            if dask_only:
                raise ValueError(
                    f"{', '.join(dask_only)} apply to executor='dask' only, and executor is "
                    "'local'; set executor='dask' or leave them empty"
                )
        return self

    @model_validator(mode="after")
    def _sharded_settings(self) -> BuildConfig:
        size = self.max_shard_size
        if size is not None and size != DEFAULT_MAX_SHARD_SIZE and not self.versioned:
            raise ValueError(
                f"max_shard_size={size} shards a version, and versioned is off (an unversioned "
                "build is one file): set versioned=True (CLI: --versioned), or leave "
                "max_shard_size at its default"
            )
        if self.sharded and self.staging is not None:
            raise ValueError(
                f"staging={redact_url(self.staging)!r} holds the parts of a single-file Dask "
                "build; a versioned build is sharded (max_shard_size) and its workers upload "
                "their shards straight to the destination's shards/ folder: leave staging "
                f"empty, or set max_shard_size={SHARDS_OFF!r} (CLI: --max-shard-size "
                f"{SHARDS_OFF}) for one file per version"
            )
        return self

    @property
    def sharded(self) -> bool:
        """Whether this build publishes a sharded version (versioned, ``max_shard_size`` set)."""
        return self.versioned and self.max_shard_size is not None

    @model_validator(mode="after")
    def _outside_the_source(self) -> BuildConfig:
        # Nothing the run writes may be the source or lie inside it, locally or on one bucket:
        # the asset (a versioned one writes its versions under BASE/, beside BASE.h5) and the
        # Dask parts would become part of the source, read back by the next build.
        check_not_in_source(self.source, self.destination)
        if self.versioned:
            base = asset_base(self.destination)
            check_not_in_source(
                self.source,
                base,
                what="versions folder",
                fix=f"a versioned destination {redact_url(self.destination)} keeps its versions "
                f"under {redact_url(base)}/: choose a destination whose path without .h5 lies "
                "outside the source",
            )
        if self.staging:
            check_not_in_source(self.source, self.staging, what="staging")
        return self

    @model_validator(mode="after")
    def _pack_settings(self) -> BuildConfig:
        # Checked also when resize='none' ignores it: a value is valid or not, whatever else
        # is set (as on the command line).
        check_size((self.size, self.width or self.size), self.resize)
        check_sources(self.listing, self.coco, self.masks, self.columns, self.coco_masks)
        if self.executor == "dask":
            local_only = [
                name
                for name in ("listing", "coco", "coco_masks", "masks", "columns", "fletcher32")
                if getattr(self, name)
            ]
            if local_only:
                raise ValueError(
                    f"{', '.join(local_only)} apply to executor='local' only for "
                    "now; drop them or use executor='local'"
                )
        self.pack_config()  # image policy, codec and checksums, with the library's rules
        return self

    def check_cache(self, cache_dir: str) -> None:
        """Refuse a fetch cache folder that is the source or lies inside it.

        The cache holds downloads, extracted archives and the default Dask staging: inside a
        local source folder they would be part of what this build or the next one reads.

        Raises:
            ValueError: naming both and the fix (another ``cache_dir``, ``--cache-dir``).
        """
        check_not_in_source(
            self.source,
            cache_dir,
            what="cache folder",
            fix="pass a cache_dir (--cache-dir) outside it",
        )

    def discover_options(self) -> dict[str, Any]:
        """The source layout for :func:`h5forge.discover.catalog.discover`: listing, coco,
        masks and the listing's columns (parsed)."""
        from h5forge.targets.schema import parse_columns

        columns = None if self.columns in (None, "") else parse_columns(self.columns)
        return {
            "listing": self.listing,
            "coco": self.coco,
            "masks": self.masks,
            "columns": columns,
            "coco_masks": self.coco_masks,
        }

    def pack_config(self) -> PackConfig:
        """The library's pack configuration for this build (every image and codec option).

        Raises:
            OptionError: a value or combination the pack options refuse.
        """
        image = ImageConfig(
            layout=self.layout,
            encoding=self.encoding,
            quality=self.quality,
            mode=self.mode,
            resize=self.resize,
            size=None if self.resize == "none" else (self.size, self.width or self.size),
            shorter_side=self.shorter_side,
            max_image_pixels=self.max_image_pixels,
        )
        return PackConfig(
            image=image,
            compression=self.compression,
            compression_level=self.compression_level,
            fletcher32=self.fletcher32,
        )
