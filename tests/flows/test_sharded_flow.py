"""A sharded versioned build-h5-dataset (``max_shard_size``) after each kind of source change,
on a local folder and on loopback S3: every version reads sample for sample as a full build
of the new source, writes only the shards of what changed, and the Prefect asset records its
shards."""

from __future__ import annotations

from pathlib import Path

import pytest

from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.location import Location
from h5forge.publish.manifest import DEFAULT_MAX_SHARD_SIZE
from h5forge.publish.versions import read_pointer
from tests.flows.test_incremental_flow import _Place
from tests.h5forge.pack.test_incremental import CHANGES
from tests.h5forge.publish.test_sharded_build import full_rows, version_rows

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_each_change_publishes_a_sharded_version_equal_to_a_full_build(
    prefect_harness: str, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    from h5forge.demo import write_image_folder

    place = _Place(kind, tmp_path, request)
    local = tmp_path / "src"
    write_image_folder(
        local, classes=("cat", "dog", "eel"), per_class=8, splits=("train", "val"), seed=7
    )
    place.sync(local)
    config = BuildConfig(
        source=place.source,
        destination=place.dest,
        credentials_block=place.block,
        versioned=True,
        min_age_s=0,
        keep_versions=2,
        smoke_workers=0,
        size=224,
        max_shard_size="1MiB",  # 6 samples a shard
        workers=1,
    )
    asset = Location(place.dest, place.options)
    first = build_dataset(config, cache_dir=str(tmp_path / "cache"))
    assert first.version
    assert not first.unchanged
    rows, manifest = version_rows(asset)
    assert rows == full_rows(local, tmp_path)
    shards = len(manifest.shards)
    assert shards == 8  # 48 samples
    assert (first.shards, first.shards_new, first.shards_reused) == (8, 8, 0)
    again = build_dataset(config, cache_dir=str(tmp_path / "cache"))
    assert again.unchanged
    assert again.sha256 == first.sha256
    parent = first
    for step, change in CHANGES.items():
        change(local, tmp_path / f"extra-{step}")
        place.sync(local)
        built = build_dataset(config, cache_dir=str(tmp_path / "cache"))
        assert not built.unchanged, step
        rows, manifest = version_rows(asset)
        assert rows == full_rows(local, tmp_path), step
        assert manifest.parent == parent.sha256, step
        pointer = read_pointer(asset)
        assert pointer is not None
        assert (pointer.sha256, pointer.kind) == (built.sha256, "sharded"), step
        assert built.num_samples == manifest.num_samples == len(rows), step
        assert built.shards == len(manifest.shards) == built.shards_new + built.shards_reused
        assert built.shards_reused > 0, step
        parent = built


def test_versioned_builds_are_sharded_by_default_and_unversioned_ones_are_one_file() -> None:
    plain = BuildConfig(source="/tmp/x", destination="/tmp/y.h5")
    assert not plain.sharded  # an unversioned DEST.h5 is one file, whatever max_shard_size says
    versioned = BuildConfig(source="/tmp/x", destination="/tmp/y.h5", versioned=True)
    assert versioned.sharded
    assert versioned.max_shard_size == DEFAULT_MAX_SHARD_SIZE == 64 * 2**20
    for off in ("off", "OFF", "", None):
        one_file = BuildConfig(
            source="/tmp/x", destination="/tmp/y.h5", versioned=True, max_shard_size=off
        )
        assert one_file.max_shard_size is None
        assert not one_file.sharded
    with pytest.raises(ValueError, match="set versioned=True"):
        BuildConfig(source="/tmp/x", destination="/tmp/y.h5", max_shard_size="32MiB")
    with pytest.raises(ValueError, match="at least 1MiB"):
        BuildConfig(source="/tmp/x", destination="/tmp/y.h5", versioned=True, max_shard_size=10)
    with pytest.raises(ValueError, match="is not a size"):
        BuildConfig(source="/tmp/x", destination="/tmp/y.h5", versioned=True, max_shard_size="6 4")
    assert (
        BuildConfig(
            source="/tmp/x", destination="/tmp/y.h5", versioned=True, max_shard_size="16MiB"
        ).max_shard_size
        == 16 * 2**20
    )
    dask = {"executor": "dask", "dask_address": "tcp://127.0.0.1:1", "staging": "/tmp/parts"}
    with pytest.raises(ValueError, match="--max-shard-size off"):
        BuildConfig(**dask, source="/tmp/x", destination="/tmp/y.h5", versioned=True)
    assert not BuildConfig(
        **dask, source="/tmp/x", destination="/tmp/y.h5", versioned=True, max_shard_size="off"
    ).sharded


def test_a_single_file_asset_is_sharded_once_and_its_versions_record_their_shards(
    prefect_harness: str, tmp_path: Path
) -> None:
    from h5forge.demo import write_image_folder
    from h5forge.publish.sharded import texts
    from h5forge.tasks.publish import asset_key
    from tests.flows.test_versioned_retention import _events

    src, dest = tmp_path / "src", str(tmp_path / "pub" / "set.h5")
    write_image_folder(src, classes=("ant", "bee"), per_class=9, seed=5)
    plain = BuildConfig(  # one file per version, as every version was before issue 29
        source=str(src),
        destination=dest,
        versioned=True,
        min_age_s=0,
        smoke_workers=0,
        size=224,
        max_shard_size="off",
    )
    single = build_dataset(plain, cache_dir=str(tmp_path / "cache"))  # today's layout
    sharded = plain.model_copy(update={"max_shard_size": 2**20})
    again = build_dataset(sharded, cache_dir=str(tmp_path / "cache"))
    assert again.unchanged  # the same source and pixels: a no-op stays a no-op
    assert again.sha256 == single.sha256
    (src / "ant" / sorted(p.name for p in (src / "ant").iterdir())[0]).unlink()
    first = build_dataset(sharded, cache_dir=str(tmp_path / "cache"))  # re-shards, once
    assert not first.unchanged
    assert first.reused == 0
    asset = Location(dest)
    rows, manifest = version_rows(asset)
    assert manifest.parent == single.sha256
    assert rows == full_rows(src, tmp_path)
    assert len(manifest.shards) == 3  # 17 samples, 6 a shard
    import h5py

    with h5py.File(single.destination, "r") as h5:  # the single-file version is still there
        assert len(set(texts(h5["paths"][:])) - set(rows)) == 1  # the removed one
    (src / "bee" / sorted(p.name for p in (src / "bee").iterdir())[0]).unlink()
    second = build_dataset(sharded, cache_dir=str(tmp_path / "cache"))
    events = {e.payload["version"]: e.payload for e in _events(asset_key(dest), 3)}
    one, two = events[first.version], events[second.version]
    assert (one["shards"], one["shards_new"], one["shards_reused"]) == (3, 3, 0)
    assert (two["shards"], two["shards_new"], two["shards_reused"]) == (3, 0, 3)
    assert two["bytes_new"] == 0
    assert two["bytes_reused"] == one["bytes_new"] > 0
    assert two["parent_sha256"] == first.sha256
    assert two["removed"] == 1
