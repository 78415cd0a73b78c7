"""The form fields of the dask executor: ``executor``, ``dask_address``, parts and staging.

Their texts say what each does on a cluster; :class:`h5forge.flows.config.BuildConfig` checks the
combinations (``executor='dask'`` needs an address; the others apply to dask only).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

__all__ = ["DaskAddress", "Executor", "PartBytes", "PartSize", "Staging"]

Executor = Annotated[
    Literal["local", "dask"],
    Field(
        description="local: preprocess and pack in a process pool on this machine. dask: cut "
        "the dataset into parts, pack each as a Prefect task on an existing Dask cluster "
        "(dask_address), then merge the parts here by copying their stored bytes. A re-run "
        "with the same staging skips the parts that are already done.",
    ),
]
DaskAddress = Annotated[
    str | None,
    Field(
        description="executor dask: the scheduler of a running Dask cluster, tcp://HOST:PORT "
        "or tls://HOST:PORT (start one with `dask scheduler` and `dask worker`). Every worker "
        "needs the same h5forge installed and must see the source at the same path.",
        examples=["tcp://scheduler:8786"],
    ),
]
PartSize = Annotated[
    int,
    Field(
        ge=1,
        le=10_000_000,
        description="executor dask: most images per part (one task each; "
        "with max_shard_size a part is a run of whole shards). Plan at least 4 parts per "
        "worker process so the last ones finish together.",
    ),
]
PartBytes = Annotated[
    int | None,
    Field(
        ge=1,
        description="executor dask: a part also closes once its source files add up "
        "to this many bytes; empty to cut by image count only.",
    ),
]
Staging = Annotated[
    str | None,
    Field(
        description="executor dask: folder for the parts and their sidecars, which every "
        "worker and this flow can write and read. For a cluster of several machines it must "
        "be shared storage (an NFS path mounted on all of them) or a bucket prefix "
        "(s3://bucket/staging/flowers/). Empty: a folder in this machine's h5forge cache, "
        "right only when every worker runs on this machine. Keep it to resume a failed run.",
        examples=["s3://bucket/h5forge-staging/flowers-224/", "/mnt/shared/staging/flowers"],
    ),
]
