"""``BuildConfig``, the one parameter of the build flow (Prefect renders it as the UI form).

Every field is validated up front, before any work: URLs (known fsspec protocols, no embedded
credentials, writable where the flow writes), codec settings, and the executor settings.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import fsspec
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from h5forge.options import (
    PACK_OPTIONS,
    SIZE_MAX,
    SIZE_MIN,
    Compression,
    Encoding,
    Layout,
    Mode,
    ResizePolicy,
    check_compression,
    check_size,
    option,
)
from h5forge.preprocess.config import ImageConfig
from h5forge.redact import redact_url

__all__ = ["BuildConfig", "check_url"]

_SHA256 = re.compile(r"^[0-9a-fA-F]{64}$")
_BLOCK_NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
# A Dask scheduler address: tcp:// or tls://, a host name, IPv4 or [IPv6] address, and a port.
_DASK_ADDRESS = re.compile(
    r"^(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):(\d{1,5})$"
)
# fsspec can read these but not write them.
_READ_ONLY = frozenset({"http", "https", "github", "zip", "tar", "libarchive", "reference"})
_CHOICES = tuple(o.name for o in PACK_OPTIONS if o.kind == "choice")
# Checked after pydantic's type check; size is checked with width, in _image_settings.
_CHECKED = tuple(o.name for o in PACK_OPTIONS if o.kind in ("int", "float", "bool", "path"))


def _default(name: str) -> Any:
    return option(name).default


def _form(name: str, *, description: str | None = None) -> Any:
    """The pydantic ``Field`` of a pack option: its description, and its bounds in the JSON
    schema (the UI form and the server enforce them; the validators give the message)."""
    o = option(name)
    low, high = (SIZE_MIN, SIZE_MAX) if o.kind == "size" else (o.low, o.high)
    bounds = {k: v for k, v in (("minimum", low), ("maximum", high)) if v is not None}

    def schema(prop: dict[str, Any]) -> None:
        # Where pydantic's ge/le would put them: on the number, also inside ``int | None``.
        for branch in prop.get("anyOf", [prop]):
            if branch.get("type") in ("integer", "number"):
                branch.update(bounds)

    return Field(
        description=description or o.description, json_schema_extra=schema if bounds else None
    )


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

    source: Annotated[
        str,
        Field(
            description="Where the images are: a local folder or archive, or any fsspec URL "
            "(https://host/data.tar.gz, s3://bucket/prefix/). ImageFolder layout: "
            "[split/]class/image.jpg.",
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
            "ending in .h5. Its .manifest.json and .preview.png are written beside it.",
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
    manifest: Annotated[str | None, _form("manifest")] = _default("manifest")
    layout: Annotated[Layout, _form("layout")] = _default("layout")
    encoding: Annotated[Encoding, _form("encoding")] = _default("encoding")
    quality: Annotated[int, _form("quality")] = _default("quality")
    resize: Annotated[ResizePolicy, _form("resize")] = _default("resize")
    size: Annotated[int, _form("size")] = _default("size")[0]
    width: Annotated[
        int | None,
        _form(
            "size",
            description=(
                "Output width in pixels when it differs from the height (size); empty for square "
                "images."
            ),
        ),
    ] = None
    shorter_side: Annotated[int | None, _form("shorter_side")] = _default("shorter_side")
    mode: Annotated[Mode, _form("mode")] = _default("mode")
    max_image_pixels: Annotated[int, _form("max_image_pixels")] = _default("max_image_pixels")
    compression: Annotated[Compression, _form("compression")] = _default("compression")
    compression_level: Annotated[int | None, _form("compression_level")] = _default(
        "compression_level"
    )
    fletcher32: Annotated[bool, _form("fletcher32")] = _default("fletcher32")
    workers: Annotated[int | None, _form("workers")] = _default("workers")
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
    max_bad_fraction: Annotated[float, _form("max_bad_fraction")] = _default("max_bad_fraction")
    overwrite: Annotated[bool, _form("overwrite")] = _default("overwrite")
    executor: Annotated[
        Literal["local", "dask"],
        Field(
            description="local: preprocess and pack in a process pool on this machine. dask: cut "
            "the dataset into shards, pack each as a Prefect task on an existing Dask cluster "
            "(dask_address), then merge the shards here by copying their stored bytes. A re-run "
            "with the same staging skips the shards that are already done.",
        ),
    ] = "local"
    dask_address: Annotated[
        str | None,
        Field(
            description="executor dask: the scheduler of a running Dask cluster, tcp://HOST:PORT "
            "or tls://HOST:PORT (start one with `dask scheduler` and `dask worker`). Every worker "
            "needs the same h5forge installed and must see the source at the same path.",
            examples=["tcp://scheduler:8786"],
        ),
    ] = None
    shard_size: Annotated[
        int,
        Field(
            ge=1,
            le=10_000_000,
            description="executor dask: most images per shard (one task "
            "each). Plan at least 4 shards per worker process so the last ones finish together.",
        ),
    ] = 2000
    shard_bytes: Annotated[
        int | None,
        Field(
            ge=1,
            description="executor dask: a shard also closes once its source files add up "
            "to this many bytes; empty to cut by image count only.",
        ),
    ] = None
    staging: Annotated[
        str | None,
        Field(
            description="executor dask: folder for the shards and their manifests, which every "
            "worker and this flow can write and read. For a cluster of several machines it must "
            "be shared storage (an NFS path mounted on all of them) or a bucket prefix "
            "(s3://bucket/staging/flowers/). Empty: a folder in this machine's h5forge cache, "
            "right only when every worker runs on this machine. Keep it to resume a failed run.",
            examples=["s3://bucket/h5forge-staging/flowers-224/", "/mnt/shared/staging/flowers"],
        ),
    ] = None

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
        if value is None or not value.strip():
            return None
        value = value.strip()
        match = _DASK_ADDRESS.match(value)
        if not match or not 1 <= int(match.group(3)) <= 65535:
            raise ValueError(
                f"dask_address {value!r} is not a Dask scheduler address: expected "
                "tcp://HOST:PORT or tls://HOST:PORT with a port 1..65535, e.g. "
                "tcp://scheduler:8786 (what `dask scheduler` prints)"
            )
        return value

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
                for name in ("dask_address", "staging", "shard_bytes")
                if getattr(self, name) is not None
            ]
            if dask_only:
                raise ValueError(
                    f"{', '.join(dask_only)} apply to executor='dask' only, and executor is "
                    "'local'; set executor='dask' or leave them empty"
                )
        return self

    @model_validator(mode="after")
    def _image_settings(self) -> BuildConfig:
        # Checked also when resize='none' ignores it: a value is valid or not, whatever else
        # is set (as on the command line).
        check_size((self.size, self.width or self.size), self.resize)
        check_compression(
            self.compression,
            self.compression_level,
            fixed_size_decoded=self.layout == "decoded" and self.resize != "none",
        )
        if self.executor == "dask":
            local_only = [name for name in ("manifest", "fletcher32") if getattr(self, name)]
            if local_only:
                raise ValueError(
                    f"{', '.join(local_only)} apply to executor='local' only for "
                    "now; drop them or use executor='local'"
                )
        self.image_config().validate()
        return self

    def image_config(self) -> ImageConfig:
        """The library's preprocessing configuration for this build (every image option)."""
        return ImageConfig(
            layout=self.layout,
            encoding=self.encoding,
            quality=self.quality,
            mode=self.mode,
            resize=self.resize,
            size=None if self.resize == "none" else (self.size, self.width or self.size),
            shorter_side=self.shorter_side,
            max_image_pixels=self.max_image_pixels,
        )
