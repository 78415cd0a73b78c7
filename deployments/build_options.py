"""The arguments and options of ``h5forge build`` and ``demo`` besides the pack options
(those are :data:`h5forge.options.PACK_OPTIONS`): each one's type, default and help, declared
once, so that ``--help`` explains every one of them to someone who has never run a build.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

__all__ = [
    "CacheDir",
    "CredentialsBlock",
    "DaskAddress",
    "Debug",
    "DemoDest",
    "Dest",
    "Executor",
    "ExecutorChoice",
    "KeepVersions",
    "MinAgeS",
    "Sha256",
    "MaxShardSize",
    "PartBytes",
    "PartSize",
    "SmokeBatches",
    "SmokeWorkers",
    "Source",
    "Staging",
    "Versioned",
]


class Executor(str, Enum):
    """Where ``build`` packs: this machine's process pool, or parts on a Dask cluster."""

    local = "local"
    dask = "dask"


Source = Annotated[
    str,
    typer.Argument(
        help="the images: a local folder (class folders: class/image.jpg or "
        "split/class/image.jpg) or archive (.tar.gz, .zip ...), or a URL fsspec reads, e.g. "
        "https://host/data.tar.gz or s3://bucket/prefix/",
        show_default=False,
    ),
]

Dest = Annotated[
    str,
    typer.Argument(
        help="where to publish the asset: a path or URL ending in .h5, e.g. "
        "out/flowers.h5 or s3://bucket/flowers.h5; DEST.manifest.json and "
        "DEST.preview.png go beside it (with --versioned, see there)",
        show_default=False,
    ),
]

Sha256 = Annotated[
    str | None,
    typer.Option(
        help="the sha256 (64 hex digits) the source archive must have; a download that "
        "differs fails, and a pinned archive is fetched once and cached "
        "(default: not checked)",
    ),
]

CredentialsBlock = Annotated[
    str | None,
    typer.Option(
        help="name of a Prefect Secret block whose value is JSON fsspec storage_options "
        '(e.g. {"key": ..., "secret": ..., "client_kwargs": {"endpoint_url": ...}}) for '
        "SOURCE and DEST (default: none, the environment's own credentials)",
    ),
]

SmokeWorkers = Annotated[
    int,
    typer.Option(
        help="DataLoader worker processes of the smoke-load, which reads the new asset "
        "back as training will (0: read in this process)",
    ),
]

SmokeBatches = Annotated[
    int, typer.Option(help="batches the smoke-load reads per start method (fork, spawn)")
]

ExecutorChoice = Annotated[
    Executor,
    typer.Option(
        help="where the images are packed: local, a process pool on this machine; dask, "
        "parts packed on a Dask cluster (--dask-address), merged here",
    ),
]

DaskAddress = Annotated[
    str | None,
    typer.Option(
        help="with --executor dask: the scheduler's address, e.g. tcp://scheduler:8786 "
        "(what `dask scheduler` prints); default: none, required with dask",
    ),
]

PartSize = Annotated[
    int, typer.Option(help="with --executor dask: images per part (one task on a worker)")
]

PartBytes = Annotated[
    int | None,
    typer.Option(
        help="with --executor dask: also close a part once its source files reach this "
        "many bytes, e.g. 67108864 (64 MiB) (default: no byte limit)",
    ),
]

Staging = Annotated[
    str | None,
    typer.Option(
        help="with --executor dask: the folder every worker reaches (a shared path or a "
        "bucket URL) where parts are written (default: a folder in the fetch cache, "
        "which only workers on this machine reach)",
    ),
]

CacheDir = Annotated[
    Path | None,
    typer.Option(
        help="where fetched sources are kept between builds (default: "
        "$XDG_CACHE_HOME/h5forge, else ~/.cache/h5forge)",
    ),
]

MaxShardSize = Annotated[
    str | None,
    typer.Option(
        metavar="SIZE",
        help="with --versioned: publish each version as content-addressed shards of about "
        "SIZE shared by every version, and a manifest; a new version writes only the shards "
        "of new and changed samples (default: 64MiB; 'off': each version is one file)",
    ),
]

Versioned = Annotated[
    bool,
    typer.Option(
        help="publish a new immutable version of the asset DEST names (BASE is DEST without "
        ".h5): a manifest BASE/v/<sha>/NAME.version.json over shards in BASE/shards/ (see "
        "--max-shard-size), and move BASE.latest.json to it; nothing when source and "
        "settings are unchanged; only the shards of what changed otherwise. Read it back as "
        "DEST or BASE (verify, inspect, H5ImageDataset), with --version to pick one",
    ),
]

KeepVersions = Annotated[
    int,
    typer.Option(
        help="with --versioned: versions kept (>= 1); older ones are deleted once they "
        "are also older than --min-age-s",
    ),
]

MinAgeS = Annotated[
    float,
    typer.Option(
        help="with --versioned: seconds a version is kept at least, whatever "
        "--keep-versions says (86400 = one day), so readers that pinned it can finish",
    ),
]

Debug = Annotated[
    bool,
    typer.Option(help="on an unexpected error, show its Python traceback, not one line"),
]

DemoDest = Annotated[
    Path,
    typer.Argument(
        help="where to publish the demo asset (.h5); the generated source archive goes "
        "beside it, in NAME-source/",
    ),
]
