"""Parts of a sharded version packed and uploaded where they run (the Dask path, without Dask):
the parts of a plan, run in any order, publish a version equal shard for shard to the local
writer's; a part never uploads what the parent lists; the publish refuses a shard that left
the store after its upload."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import discover
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.publish.manifest import shard_key
from h5forge.publish.shard_release import build_sharded_version, publish_sharded
from h5forge.publish.sharded import plan_sharded, read_previous, stage_sharded
from h5forge.publish.versions import asset_base, read_pointer
from h5forge.scale.shard_parts import (
    PartShards,
    cut_shard_parts,
    pack_part_shards,
    part_samples,
)
from tests.h5forge.publish.test_sharded_build import SMALL, full_rows, version_rows


@pytest.fixture
def source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    write_image_folder(src, classes=("cat", "dog"), per_class=15, size=(60, 80))
    return src


def _asset(kind: str, tmp_path: Path, request: pytest.FixtureRequest, name: str) -> Location:
    if kind == "file":
        return Location(str(tmp_path / "store" / f"{name}.h5"))
    bucket = request.getfixturevalue("s3_bucket")
    options = request.getfixturevalue("s3_storage_options")
    return Location(f"s3://{bucket}/{name}.h5", options)


def _build_by_parts(
    source: Path, asset: Location, *, samples_per_part: int = 12, reverse: bool = True
) -> tuple[Any, list[PartShards]]:
    """What the Dask stage does, each part run here: plan, parts (last first), stage, publish."""
    config = PackConfig()
    pointer = read_pointer(asset)
    previous = read_previous(asset, pointer)
    catalog = discover(source)
    unchanged = frozenset(s.relpath for s in catalog.samples) if previous else frozenset()
    plan = plan_sharded(
        catalog, config=config, max_shard_size=SMALL, previous=previous, unchanged=unchanged
    )
    parts = cut_shard_parts(plan, samples_per_part=samples_per_part)
    parent = frozenset(e.sha256 for e in previous.manifest.shards) if previous else frozenset()
    done = {
        p.index: pack_part_shards(
            part_samples(plan.fresh, p), p, asset, config=config, parent_shards=parent
        )
        for p in (reversed(parts) if reverse else parts)
    }
    ordered = [done[p.index] for p in parts]
    staged = stage_sharded(
        catalog,
        plan,
        [e for r in ordered for e in r.entries],
        [q for r in ordered for q in r.quarantined],
        config=config,
        previous=previous,
        max_bad_fraction=0.01,
        name="photos",
        in_store=frozenset(e.sha256 for r in ordered for e in r.entries),
    )
    assert not staged.new  # no local shard: nothing for the publish to upload
    result = publish_sharded(staged, asset, based_on=pointer.sha256 if pointer is not None else "")
    return result, ordered


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_parts_publish_the_local_writers_version(
    source: Path, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    local = _asset(kind, tmp_path, request, "local")
    build_sharded_version(source, local, max_shard_size=SMALL, workers=1)
    want, want_manifest = version_rows(local)

    asset = _asset(kind, tmp_path, request, "parts")
    result, parts = _build_by_parts(source, asset)
    got, manifest = version_rows(asset)
    assert got == want == full_rows(source, tmp_path)
    # The same plan, the same bytes: the same shards, in plan order (parts ran last first).
    assert [e.sha256 for e in manifest.shards] == [e.sha256 for e in want_manifest.shards]
    assert [len(p.entries) for p in parts] == [2, 2, 1]
    assert (result.shards, result.shards_new, result.shards_reused) == (5, 5, 0)
    assert (
        result.bytes_new
        == sum(e.bytes for e in manifest.shards)
        == sum(p.bytes_uploaded for p in parts)
    )

    # One file added: one new shard, the rest referenced and never uploaded again.
    write_image_folder(tmp_path / "more", classes=("cat",), per_class=1, size=(60, 80), seed=9)
    added = next((tmp_path / "more" / "cat").iterdir())
    shutil.copyfile(added, source / "cat" / "zz-added.jpg")
    second, parts = _build_by_parts(source, asset)
    got, manifest = version_rows(asset)
    assert got == full_rows(source, tmp_path)
    assert manifest.parent == result.sha256
    assert (second.shards, second.shards_new, second.shards_reused) == (6, 1, 5)
    assert [len(p.uploaded) for p in parts] == [1]


def test_a_part_skips_only_what_the_parent_lists_and_the_store_holds(
    source: Path, tmp_path: Path
) -> None:
    asset = Location(str(tmp_path / "store" / "photos.h5"))
    config = PackConfig()
    plan = plan_sharded(discover(source), config=config, max_shard_size=SMALL)
    part = cut_shard_parts(plan, samples_per_part=12)[0]
    samples = part_samples(plan.fresh, part)
    first = pack_part_shards(samples, part, asset, config=config)
    shas = [e.sha256 for e in first.entries]
    assert list(first.uploaded) == shas
    again = pack_part_shards(samples, part, asset, config=config)  # a re-run: same addresses
    assert [e.sha256 for e in again.entries] == shas
    assert list(again.uploaded) == shas  # not listed by a parent: uploaded again
    listed = pack_part_shards(samples, part, asset, config=config, parent_shards=shas)
    assert listed.uploaded == ()
    assert listed.bytes_uploaded == 0
    home = Path(asset_base(asset.url))
    (home / shard_key(shas[0])).unlink()  # listed but gone: uploaded
    gone = pack_part_shards(samples, part, asset, config=config, parent_shards=shas)
    assert list(gone.uploaded) == shas[:1]


def test_the_publish_refuses_a_shard_that_left_the_store(source: Path, tmp_path: Path) -> None:
    asset = Location(str(tmp_path / "store" / "photos.h5"))
    config = PackConfig()
    catalog = discover(source)
    plan = plan_sharded(catalog, config=config, max_shard_size=SMALL)
    parts = cut_shard_parts(plan, samples_per_part=12)
    done = [pack_part_shards(part_samples(plan.fresh, p), p, asset, config=config) for p in parts]
    entries = [e for r in done for e in r.entries]
    staged = stage_sharded(
        catalog,
        plan,
        entries,
        [],
        config=config,
        previous=None,
        max_bad_fraction=0.01,
        name="photos",
        in_store=frozenset(e.sha256 for e in entries),
    )
    (Path(asset_base(asset.url)) / shard_key(entries[3].sha256)).unlink()
    with pytest.raises(FileNotFoundError, match=f"shard {entries[3].sha256[:16]} of this build"):
        publish_sharded(staged, asset, based_on="")
    assert read_pointer(asset) is None


def test_parts_are_runs_of_whole_shards(source: Path) -> None:
    plan = plan_sharded(discover(source), config=PackConfig(), max_shard_size=SMALL)
    assert plan.groups == (6, 6, 6, 6, 6)
    for size, want in [(1, [1] * 5), (7, [2, 2, 1]), (12, [2, 2, 1]), (100, [5])]:
        parts = cut_shard_parts(plan, samples_per_part=size)
        assert [len(p.groups) for p in parts] == want, size
        assert [p.first for p in parts] == [sum(want[:i]) for i in range(len(want))]
        assert [p.start for p in parts] == [6 * p.first for p in parts]
        assert parts[-1].stop == 30
    by_bytes = cut_shard_parts(plan, samples_per_part=100, bytes_per_part=1)
    assert len(by_bytes) == 5
    with pytest.raises(ValueError, match="samples_per_part=0 must be an int >= 1"):
        cut_shard_parts(plan, samples_per_part=0)
