"""Purge and compact on a sharded version with target columns (boxes, masks, tags, captions,
numbers): the rewritten shards carry every kept row's targets as they were, pixels and all,
and the asset still verifies.

The versions are built by the library from a sample listing with a column of every kind
(:func:`h5forge.publish.sharded.pack_sharded` and :func:`h5forge.publish.shard_release.
publish_sharded`, what ``build_sharded_version`` runs), read back through
:class:`~h5forge.H5ImageDataset` with ``target=`` every column, before and after.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import h5py
import pytest
import torch

from h5forge import H5ImageDataset
from h5forge.discover.catalog import Catalog, discover
from h5forge.location import Location
from h5forge.pack.config import PackConfig
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.manifest import read_manifest, shard_key
from h5forge.publish.rewrite import purge
from h5forge.publish.shard_release import publish_sharded
from h5forge.publish.sharded import pack_sharded, read_previous
from h5forge.publish.versions import read_pointer
from h5forge.verify.sharded import verify_versions
from tests.fixtures.sharded_read import make_sharded_version
from tests.fixtures.targets_data import sample_rows, write_listing_with_columns

SMALL = 2**20  # the smallest shard size
TARGET = ["class", "tags", "caption", "score", "count", "boxes", "mask"]
CONFIGS = {
    # array storage, unfiltered: runs of chunks copied file to file
    "decoded": PackConfig(ImageConfig(resize="resize", size=(224, 224))),
    # blob storage: runs copied behind the head; masks stored as PNG files
    "encoded": PackConfig(ImageConfig(layout="encoded", resize="none", size=None)),
    # filtered chunks: read through HDF5 and checked in hand
    "gzip": PackConfig(ImageConfig(resize="resize", size=(224, 224)), compression="gzip"),
}


def _rows(n: int) -> list[dict[str, object]]:
    """``n`` listing rows with a column of every kind, a class and a split; each caption is
    unique, so its bytes can be looked for in every file of the asset."""
    rows = sample_rows(n, seed=5)
    for i, row in enumerate(rows):
        row["label"] = "xy"[i % 2]
        row["split"] = ("train", "val")[i % 3 == 0]
        row["caption"] = f"takedown-caption-{i:03d}"
    return rows


def _catalog(root: Path, rows: list[dict[str, object]]) -> Catalog:
    w = write_listing_with_columns(root, rows)
    catalog = discover(w.root, listing=w.listing)
    assert {c.kind for c in catalog.schema} == {"multilabel", "text", "number", "boxes", "mask"}
    return catalog


def _publish(catalog: Catalog, asset: Location, work: Path, config: PackConfig) -> str:
    pointer = read_pointer(asset)
    staged = pack_sharded(
        catalog,
        work,
        config=config,
        max_shard_size=SMALL,
        workers=1,
        previous=read_previous(asset, pointer),
        name=Path(asset.path).name,
    )
    return publish_sharded(staged, asset, based_on=pointer.sha256 if pointer else "").sha256


def _plain(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (str(value.dtype), value.tolist())
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _content(base: Path, version: str) -> dict[str, tuple[Any, Any]]:
    """Every live sample of ``version``: source path -> (pixels, every target as plain data)."""
    ds = H5ImageDataset(str(base), version=version[:16], target=TARGET)
    out = {}
    for i in range(len(ds)):
        image, target = ds[i]
        out[ds.source_path(i)] = (image.as_subclass(torch.Tensor).clone(), _plain(target))
    assert len(out) == len(ds)
    return out


def _same(before: dict[str, tuple[Any, Any]], after: dict[str, tuple[Any, Any]]) -> None:
    assert list(after) == list(before)  # the same samples, in the same order
    for path, (image, target) in before.items():
        assert torch.equal(after[path][0], image), path
        assert after[path][1] == target, path


def _holding(store: Path, needle: bytes) -> list[Path]:
    """The files under ``store`` whose bytes hold ``needle``."""
    return [f for f in sorted(store.rglob("*")) if f.is_file() and needle in f.read_bytes()]


@pytest.mark.parametrize("layout", sorted(CONFIGS))
def test_purge_carries_every_other_samples_targets(tmp_path: Path, layout: str) -> None:
    config = CONFIGS[layout]
    rows = _rows(14)
    store = tmp_path / "store"
    base = store / "tagged"
    asset = Location(str(base))
    first = _publish(_catalog(tmp_path / "src", rows), asset, tmp_path / "w1", config)
    # a second version with one more sample: both hold the doomed one
    second = _publish(_catalog(tmp_path / "src", _rows(15)), asset, tmp_path / "w2", config)
    doomed_row = rows[4]
    doomed = str(doomed_row["path"])
    caption = str(doomed_row["caption"]).encode()
    assert _holding(store, caption)  # its caption's bytes are in a shard
    before = {sha: _content(base, sha) for sha in (first, second)}
    assert all(doomed in content for content in before.values())
    assert any(t["boxes"]["boxes"][1] for _, t in before[first].values())  # boxes to carry

    result = purge(asset, [doomed])

    assert result.removed_samples >= 1
    assert dict(result.versions).keys() == {first, second}
    assert not _holding(store, caption)  # its target bytes are in no file of the asset
    assert not _holding(store, doomed.encode())  # nor its path
    for old, new in result.versions:
        want = {p: v for p, v in before[old].items() if p != doomed}
        _same(want, _content(base, new))
        manifest = read_manifest(Location(str(next((base / "v" / new[:16]).glob("*.json")))))
        for entry in manifest.shards:  # every shard still has the version's target columns
            with h5py.File(base / shard_key(entry.sha256), "r") as h5:
                assert sorted(h5["targets"]) == sorted(TARGET[1:])
    assert read_pointer(asset).sha256 == dict(result.versions)[second]  # type: ignore[union-attr]
    reports = verify_versions(asset, [new for _, new in result.versions])  # raises if not
    assert [r.num_samples for r in reports] == [len(before[old]) - 1 for old, _ in result.versions]


def test_compact_carries_the_live_rows_targets(tmp_path: Path) -> None:
    from tests.h5forge.cli.test_cli import _cli

    catalog = _catalog(tmp_path / "src", _rows(12))
    base = tmp_path / "store" / "tagged"
    config = CONFIGS["decoded"]
    # shard 0 has rows 0, 2 and 3 deleted: 3 of 6 live
    make_sharded_version(
        base, catalog, [range(0, 6), range(6, 12)], deleted={0: [0, 2, 3]}, config=config
    )
    old = read_pointer(Location(str(base)))
    assert old is not None
    before = _content(base, old.sha256)
    assert len(before) == 9

    done = _cli("compact", str(base), "--below", "0.9")

    assert done.returncode == 0, done.stderr
    new = read_pointer(Location(str(base)))
    assert new is not None
    assert new.sha256 != old.sha256
    assert new.parent == old.sha256
    _same(before, _content(base, new.sha256))
    manifest = read_manifest(Location(str(base)).with_url(new.url), new.sha256)
    assert [e.samples for e in manifest.shards] == [3, 6]
    assert [e.deleted for e in manifest.shards] == [(), ()]
    with h5py.File(base / shard_key(manifest.shards[0].sha256), "r") as h5:
        assert sorted(h5["targets"]) == sorted(TARGET[1:])
        assert h5["targets/caption/offsets"].shape == (4,)  # only the live rows' values
    assert config.to_json() == manifest.config_json
    verified = _cli("verify", str(base))
    assert verified.returncode == 0, verified.stdout + verified.stderr
