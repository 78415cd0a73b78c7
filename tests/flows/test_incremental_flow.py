"""A versioned build-h5-dataset of single-file versions (``max_shard_size="off"``) after each
kind of source change, on a local folder and on loopback S3 (a growing bucket prefix,
published to the same bucket): every version equals a full build of the new source sample for
sample, and records what changed since its parent."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec
import h5py
import numpy as np
import pytest

from h5forge.asset import format as fmt
from h5forge.demo import write_image_folder
from h5forge.flows.build import BuildConfig, build_dataset
from h5forge.location import Location
from h5forge.pack.writer import pack
from h5forge.publish.versions import read_pointer
from tests.h5forge.pack.test_incremental import CHANGES

pytestmark = pytest.mark.slow


def _contents(root: Path) -> dict[str, str]:
    """relpath -> sha256 of the bytes: what changed, judged independently of the fingerprint."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _expected(old: dict[str, str], new: dict[str, str]) -> dict[str, int]:
    both = old.keys() & new.keys()
    return {
        "added": len(new.keys() - old.keys()),
        "removed": len(old.keys() - new.keys()),
        "replaced": sum(old[k] != new[k] for k in both),
    }


def _same_samples(got: str, want: str) -> None:
    """Every dataset of the published version equals the full build's (digests included), and
    so do the stored bytes of every sample; only where they sit in the file may differ (the
    version's root attributes carry its lineage)."""
    with h5py.File(got, "r") as a, h5py.File(want, "r") as b:
        names: list[str] = []
        b.visit(names.append)
        seen: list[str] = []
        a.visit(seen.append)
        assert sorted(seen) == sorted(names)
        for name in names:
            if isinstance(b[name], h5py.Dataset) and name != fmt.BYTE_RANGES:
                np.testing.assert_array_equal(a[name][()], b[name][()], err_msg=name)
        ours, theirs = a[fmt.BYTE_RANGES][()].tolist(), b[fmt.BYTE_RANGES][()].tolist()
    assert [n for _, n in ours] == [n for _, n in theirs]
    with open(got, "rb") as f, open(want, "rb") as g:
        for (at, n), (bt, _) in zip(ours, theirs, strict=True):
            f.seek(at)
            g.seek(bt)
            assert f.read(n) == g.read(n)


class _Place:
    """Where the source and the asset live: a local folder, or a bucket on loopback S3."""

    def __init__(self, kind: str, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.kind, self.tmp = kind, tmp
        self.options: dict[str, Any] = {}
        self.block: str | None = None
        if kind == "file":
            self.source, self.dest = str(tmp / "src"), str(tmp / "pub" / "set.h5")
            return
        from prefect.blocks.system import Secret

        bucket = request.getfixturevalue("s3_bucket")
        self.options = request.getfixturevalue("s3_storage_options")
        self.block = "h5forge-test-incremental"
        Secret(value=self.options).save(self.block, overwrite=True)
        self.source, self.dest = f"s3://{bucket}/incoming", f"s3://{bucket}/assets/set.h5"

    def sync(self, local: Path) -> None:
        """Make the bucket prefix hold what ``local`` holds (objects of equal bytes keep
        their ETag, so only what changed looks changed)."""
        if self.kind == "file":
            return
        fs, prefix = fsspec.core.url_to_fs(self.source, **self.options)
        fs.invalidate_cache()
        want = {p.relative_to(local).as_posix(): p for p in local.rglob("*") if p.is_file()}
        have = {k[len(prefix) + 1 :] for k in fs.find(prefix)}
        for rel in have - want.keys():
            fs.rm_file(f"{prefix}/{rel}")
        for rel, path in want.items():
            fs.put_file(str(path), f"{prefix}/{rel}")
        fs.invalidate_cache()

    def local_copy(self, url: str, name: str) -> str:
        if self.kind == "file":
            return url
        fs, path = fsspec.core.url_to_fs(url, **self.options)
        out = str(self.tmp / name)
        fs.get_file(path, out)
        return out

    def sidecar(self, url: str) -> dict[str, Any]:
        with fsspec.open(url + ".manifest.json", **self.options) as f:
            return dict(json.load(f))


def _config_change(root: Path, tmp: Path) -> None:
    """Not a source change: the build's size changes below (a full rebuild)."""


STEPS: list[tuple[str, Callable[[Path, Path], None]]] = [
    *CHANGES.items(),
    ("config", _config_change),
]


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_each_change_is_built_incrementally_and_equals_a_full_build(
    prefect_harness: str, tmp_path: Path, request: pytest.FixtureRequest, kind: str
) -> None:
    place = _Place(kind, tmp_path, request)
    local = tmp_path / "src"
    write_image_folder(
        local, classes=("cat", "dog", "eel"), per_class=3, splits=("train", "val"), seed=7
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
        size=32,
        max_shard_size="off",  # one file per version (sharded: tests/flows/test_sharded_flow.py)
    )
    state = build_dataset(config, cache_dir=str(tmp_path / "cache"), return_state=True)
    assert state.is_completed(), state.message
    parent = state.result()
    for step, change in STEPS:
        before = _contents(local)
        change(local, tmp_path / f"extra-{step}")
        place.sync(local)
        after = _contents(local)
        if step == "config":
            config = config.model_copy(update={"size": 24})
        state = build_dataset(config, cache_dir=str(tmp_path / "cache"), return_state=True)
        assert state.is_completed(), f"{step}: {state.message}"
        built = state.result()
        assert not built.unchanged, step
        full = pack(local, tmp_path / f"full-{step}.h5", config=config.pack_config(), workers=1)
        _same_samples(place.local_copy(built.destination, f"{step}.h5"), full.path)
        assert built.num_samples == full.num_samples, step
        sidecar = place.sidecar(built.destination)
        assert sidecar["parent"] == parent.sha256, step
        assert sidecar["changes"] == _expected(before, after), step
        unchanged = sum(before[k] == after[k] for k in before.keys() & after.keys())
        assert built.reused == (0 if step == "config" else unchanged), step
        pointer = read_pointer(Location(place.dest, place.options))
        assert pointer is not None
        assert pointer.sha256 == built.sha256, step
        parent = built


def test_a_previous_version_replaced_by_another_asset_is_never_reused(
    prefect_harness: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    local, other = tmp_path / "src", tmp_path / "other"
    for root, seed in ((local, 7), (other, 8)):
        write_image_folder(
            root, classes=("cat", "dog", "eel"), per_class=3, splits=("train", "val"), seed=seed
        )
    dest = str(tmp_path / "pub" / "set.h5")
    config = BuildConfig(  # one file (sharded: tests/h5forge/publish/test_sharded_build.py)
        source=str(local),
        destination=dest,
        versioned=True,
        min_age_s=0,
        smoke_workers=0,
        size=32,
        max_shard_size="off",
    )
    first = build_dataset(config, cache_dir=str(tmp_path / "cache"))
    pointer = read_pointer(Location(dest))
    assert pointer is not None
    assert pointer.sha256 == first.sha256
    # Another valid asset (other pixels, the same names) put in place of the version's file:
    # every path is "unchanged" by the sources map, and the file passes pack's own checks.
    swapped = pack(other, tmp_path / "other.h5", config=config.pack_config(), workers=1)
    Path(pointer.url).write_bytes(Path(swapped.path).read_bytes())
    CHANGES["add"](local, tmp_path / "extra")
    built = build_dataset(config, cache_dir=str(tmp_path / "cache"))
    assert built.reused == 0
    assert "it was replaced; nothing is reused from it" in caplog.text
    full = pack(local, tmp_path / "full.h5", config=config.pack_config(), workers=1)
    _same_samples(built.destination, full.path)
