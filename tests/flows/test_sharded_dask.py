"""A sharded versioned build-h5-dataset with ``executor="dask"`` on a real two-process
``LocalCluster``: the workers pack and upload the shards, nothing merges them, the flow's process
writes no shard, and every version reads sample for sample as the local sharded build's (and as
a full single-file pack of the same source), also after a file is added."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.location import Location
from h5forge.publish.versions import read_pointer
from tests.fixtures.prefect import flow_run_artifacts, flow_run_task_runs
from tests.flows.test_dask_build import Cluster, cluster  # noqa: F401 - the module's cluster
from tests.h5forge.pack.test_incremental import CHANGES
from tests.h5forge.publish.test_sharded_build import full_rows, version_rows

pytestmark = pytest.mark.slow

#: Files this process writes or renames into place while :data:`_WATCH` is on: a shard sealed
#: here (its commit renames ``*.partial`` to ``*.h5``) or copied here shows up as an event.
_WRITES: list[tuple[str, str]] = []
_WATCH = [False]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not _WATCH[0]:
        return
    if event == "open" and isinstance(args[0], str) and isinstance(args[1], str):
        if ".h5" in args[0] and any(m in args[1] for m in "wax+"):
            _WRITES.append((event, args[0]))
    elif event in ("os.rename", "shutil.copyfile") and ".h5" in str(args[1]):
        _WRITES.append((event, str(args[1])))


sys.addaudithook(_audit)  # a hook stays for the process: _WATCH turns it on per build


def _watched(config: BuildConfig, cache: Path) -> tuple[Any, Any, list[tuple[str, str]]]:
    """Build; the summary, the flow run id, and the .h5 writes this process made."""
    _WRITES.clear()
    _WATCH[0] = True
    try:
        state = build_dataset(config, cache_dir=str(cache), return_state=True)
    finally:
        _WATCH[0] = False
    assert state.is_completed(), state.message
    return state.result(), state.state_details.flow_run_id, list(_WRITES)


def test_a_sharded_dask_build_reads_as_the_local_one_with_no_merge(
    cluster: Cluster,  # noqa: F811
    tmp_path: Path,
) -> None:
    src = tmp_path / "src"
    write_image_folder(
        src, classes=("cat", "dog", "eel"), per_class=8, splits=("train", "val"), seed=7
    )
    common: dict[str, Any] = {
        "source": str(src),
        "versioned": True,
        "min_age_s": 0,
        "smoke_workers": 0,
        "smoke_batches": 1,
        "size": 224,
        "max_shard_size": "1MiB",  # 6 samples a shard: 8 shards
    }
    local_asset = Location(str(tmp_path / "local" / "photos.h5"))
    local = BuildConfig(destination=local_asset.url, workers=1, **common)
    asset = Location(str(tmp_path / "dask" / "photos.h5"))
    config = BuildConfig(
        destination=asset.url,
        executor="dask",
        dask_address=cluster.address,
        part_size=12,  # 2 shards a part: 4 parts
        **common,
    )
    cache = tmp_path / "cache"

    _, _, local_writes = _watched(local, cache)
    assert any(event == "os.rename" for event, _ in local_writes)  # the hook sees shards sealed

    first, run_id, writes = _watched(config, cache)
    assert writes == []  # the flow's process wrote no shard: the workers did
    names = [t.name for t in flow_run_task_runs(run_id)]
    assert sorted(n for n in names if n.startswith("pack-part-shards[")) == [
        f"pack-part-shards[photos.h5 part-{i:05d}]" for i in range(4)
    ]
    assert not [n for n in names if n.startswith(("merge", "pack-shards", "pack-part["))]
    assert "merge" not in first.seconds
    assert first.executor == "dask"
    assert first.parts is not None
    assert (first.parts.total, first.parts.packed) == (4, (0, 1, 2, 3))
    report = next(a for a in flow_run_artifacts(run_id) if a.key == "build-report-photos-h5")
    assert "**no merge**" in report.data

    rows, manifest = version_rows(asset)
    want, local_manifest = version_rows(local_asset)
    assert rows == want == full_rows(src, tmp_path)
    # The same plan gives the same shards, in plan order, whichever part finished first.
    assert [e.sha256 for e in manifest.shards] == [e.sha256 for e in local_manifest.shards]
    assert first.num_samples == 48

    again, _, writes = _watched(config, cache)
    assert again.unchanged
    assert again.sha256 == first.sha256

    CHANGES["add"](src, tmp_path / "extra")  # two files added
    second, _, writes = _watched(config, cache)
    assert writes == []
    rows2, manifest2 = version_rows(asset)
    assert rows2 == full_rows(src, tmp_path)
    assert manifest2.parent == first.sha256
    old = {e.sha256 for e in manifest.shards}
    assert [e.sha256 for e in manifest2.shards[: len(old)]] == [e.sha256 for e in manifest.shards]
    assert sum(e.live for e in manifest2.shards if e.sha256 not in old) == 2
    pointer = read_pointer(asset)
    assert pointer is not None
    assert (pointer.sha256, pointer.kind) == (second.sha256, "sharded")
    assert second.reused == 48


def test_sharded_dask_settings() -> None:
    common: dict[str, Any] = {
        "source": "/tmp/x",
        "destination": "/tmp/y.h5",
        "versioned": True,
        "max_shard_size": "64MiB",
        "executor": "dask",
        "dask_address": "tcp://127.0.0.1:8786",
    }
    assert BuildConfig(**common).max_shard_size == 64 * 2**20
    with pytest.raises(ValueError, match="leave staging empty"):
        BuildConfig(**common, staging="/tmp/staging")
