"""The form fields of a versioned build: ``versioned`` and its retention (``keep_versions``,
``min_age_s``), checked with :func:`h5forge.publish.history.check_retention`'s rules and
messages, so the form refuses what ``publish_version`` would refuse, before any work."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field

from h5forge.options import parse_bytes
from h5forge.publish.history import DEFAULT_KEEP_VERSIONS, DEFAULT_MIN_AGE_S, check_retention
from h5forge.publish.manifest import DEFAULT_MAX_SHARD_SIZE

__all__ = [
    "DEFAULT_KEEP_VERSIONS",
    "DEFAULT_MAX_SHARD_SIZE",
    "DEFAULT_MIN_AGE_S",
    "SHARDS_OFF",
    "KeepVersions",
    "MaxShardSize",
    "MinAgeS",
    "Versioned",
]


def _keep(value: int) -> int:
    check_retention(value, 0.0)
    return value


#: What turns sharding off (one file per version), besides ``None``.
SHARDS_OFF = "off"


def _shard_size(value: object) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", SHARDS_OFF)):
        return None
    size = parse_bytes(value, "max_shard_size")
    if size < 2**20:
        raise ValueError(f"max_shard_size={value!r} must be at least 1MiB")
    return size


def _min_age(value: float) -> float:
    check_retention(1, value)
    return float(value)


Versioned = Annotated[
    bool,
    Field(
        description="Publish each build as a new immutable version (BASE: the destination "
        "without .h5): a manifest BASE/v/<sha>/NAME.version.json over content-addressed "
        "shards in BASE/shards/ (max_shard_size; empty: one file BASE/v/<sha>/NAME.h5), and "
        "move the pointer BASE.latest.json to it last; readers pin a version. A run whose "
        "source and settings are those of the latest version publishes nothing and ends as "
        "unchanged, before fetching. Off: publish one object at the destination.",
    ),
]
KeepVersions = Annotated[
    int,
    Field(
        json_schema_extra={"minimum": 1},
        description="versioned: how many versions to keep under BASE/v/ (at least 1). After "
        "each publish the oldest beyond this many are deleted, except the one BASE.latest.json "
        "names and any younger than min_age_s.",
    ),
    AfterValidator(_keep),
]
MinAgeS = Annotated[
    float,
    Field(
        json_schema_extra={"minimum": 0},
        description="versioned: seconds a version is kept at least, whatever keep_versions "
        "says, so a reader that resolved it (a training run, a DataLoader mid-epoch) still "
        "finds it. Default 86400 (one day); 0: keep_versions alone decides.",
    ),
    AfterValidator(_min_age),
]
MaxShardSize = Annotated[
    int | None,
    Field(
        description="versioned: publish each version as shards of about this many bytes "
        "(default 64MiB) under BASE/shards/, named by their content and shared by every "
        "version, and a manifest BASE/v/<sha>/NAME.version.json; a new version writes only the "
        "shards of new and changed samples. Empty (or 'off'): each version is one file, "
        "BASE/v/<sha>/NAME.h5. Unversioned builds are always one file.",
    ),
    BeforeValidator(_shard_size),
]
