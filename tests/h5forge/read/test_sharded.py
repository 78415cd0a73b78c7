"""Reading a sharded version (docs/FORMAT.md, "Sharded versions") as one dataset.

Every test compares against one file packed from the same catalog, per source path: a sharded
version reads the same (path, label, pixels), through real DataLoader workers (fork and spawn),
``read_batch``, ``loader()``, the Sampler and H5MultiDataset; deletion vectors, ``split=`` and
label maps (a class that appears in a later shard) hold; a tampered shard or manifest is refused
naming it; opening reads the manifest alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from h5forge.demo import write_image_folder
from h5forge.discover.catalog import Catalog, discover
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.pack.writer import pack
from h5forge.publish.manifest import manifest_bytes, manifest_key, parse_manifest
from h5forge.publish.versions import write_pointer
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.mixing import MixingSampler
from h5forge.read.multi import H5MultiDataset
from h5forge.read.sampler import Sampler
from tests.fixtures.sharded_read import DECODED, make_sharded_version

CLASSES = ("a", "b", "c", "d")


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Catalog, str]:
    """48 photos of 4 classes in train/val, and one file packed from them (the reference)."""
    root = tmp_path_factory.mktemp("sharded_src")
    write_image_folder(
        root, classes=CLASSES, per_class=6, splits=("train", "val"), seed=5, size=(30, 40)
    )
    catalog = discover(root)
    one = tmp_path_factory.mktemp("one") / "one.h5"
    pack(root, one, config=DECODED, workers=1)
    return catalog, str(one)


def _by_class(catalog: Catalog, *names: str) -> list[int]:
    keep = {catalog.classes.index(n) for n in names}
    return [i for i, s in enumerate(catalog.samples) if s.label in keep]


def _slices(catalog: Catalog) -> list[list[int]]:
    """Four shards; the first knows classes a, b only, so c and d appear in later shards."""
    first = _by_class(catalog, "a", "b")
    rest = [i for i in range(len(catalog.samples)) if i not in set(first)]
    return [first[:10], first[10:], rest[::2], rest[1::2]]


@pytest.fixture(scope="module")
def sharded(tmp_path_factory: pytest.TempPathFactory, source: tuple[Catalog, str]) -> str:
    base = tmp_path_factory.mktemp("pub") / "flowers"
    make_sharded_version(base, source[0], _slices(source[0]))
    return str(base)


def _content(ds: Any, **loader: Any) -> dict[str, tuple[str, bytes]]:
    """path -> (class name, pixels) of every sample, read through ``loader()`` in index order."""
    out: list[tuple[str, bytes]] = []
    for images, labels in ds.loader(5, **loader):
        for image, label in zip(images, labels.tolist(), strict=True):
            out.append((ds.classes[label], image.contiguous().numpy().tobytes()))
    return dict(zip(ds.sources, out, strict=True))


def _items(ds: Any, **kwargs: Any) -> dict[str, tuple[str, bytes]]:
    """The same read item by item through a plain DataLoader (``__getitems__``)."""
    dl = torch.utils.data.DataLoader(ds, batch_size=7, **kwargs)
    out = [
        (ds.classes[y], x.numpy().tobytes())
        for images, labels in dl
        for x, y in zip(images, labels.tolist(), strict=True)
    ]
    return dict(zip(ds.sources, out, strict=True))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_sharded_version_reads_as_the_file_packed_from_the_same_catalog(
    source: tuple[Catalog, str], sharded: str, context: str
) -> None:
    ds = H5ImageDataset(sharded)
    assert isinstance(ds, H5ImageDataset)
    assert ds.url.endswith(".version.json")
    assert len(ds.version) == 64
    assert ds.classes == list(CLASSES)
    truth = _content(H5ImageDataset(source[1]))
    workers = {"num_workers": 2, "multiprocessing_context": context}
    assert _content(ds, **workers) == truth
    assert _items(ds, **workers) == truth
    # The order is the manifest's: shards in order, each shard's rows in file order.
    first = H5ImageDataset(source[1]).sources
    slices = _slices(source[0])
    assert ds.sources[:10] == [source[0].samples[i].relpath for i in slices[0]]
    assert sorted(ds.sources) == sorted(first)


def test_pickles_as_its_url_version_and_options(sharded: str) -> None:
    ds = H5ImageDataset(sharded, split="train")
    ds[0]
    assert set(ds.__getstate__()) == {"url", "version", "storage_options", "options", "_remote"}
    again = pickle.loads(pickle.dumps(ds))
    assert len(again) == len(ds)
    assert again.classes == ds.classes
    assert again.sources == ds.sources


def test_read_batch_spans_shards_in_one_buffer(source: tuple[Catalog, str], sharded: str) -> None:
    ds, one = H5ImageDataset(sharded), H5ImageDataset(source[1])
    where = {p: i for i, p in enumerate(one.sources)}
    picks = [0, 47, 11, 30, 5, 22]  # four shards, out of order
    images, labels = ds.read_batch(picks)
    ref_images, ref_labels = one.read_batch([where[ds.source_path(i)] for i in picks])
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images, ref_images)
    assert torch.equal(labels, ref_labels)
    assert ds.targets == [ds.class_to_idx[p.split("/")[1]] for p in ds.sources]


def test_deletion_vectors_exclude_rows(
    tmp_path: Path, source: tuple[Catalog, str], sharded: str
) -> None:
    catalog = source[0]
    slices = _slices(catalog)
    base = tmp_path / "flowers"
    make_sharded_version(base, catalog, slices, deleted={0: [1, 2], 3: [0]})
    ds = H5ImageDataset(base)
    full = H5ImageDataset(sharded).sources
    gone = {full[1], full[2], full[len(full) - len(slices[3])]}
    assert len(ds) == len(full) - 3
    assert ds.sources == [p for p in full if p not in gone]
    truth = _content(H5ImageDataset(source[1]))
    assert _content(ds, num_workers=2) == {p: v for p, v in truth.items() if p not in gone}


def test_split_counts_come_from_the_manifest(source: tuple[Catalog, str], sharded: str) -> None:
    for split in ("train", "val"):
        ds, one = H5ImageDataset(sharded, split=split), H5ImageDataset(source[1], split=split)
        assert len(ds) == len(one) == 24
        assert _content(ds) == _content(one)
    with pytest.raises(ValueError, match="split 'test' is not in"):
        H5ImageDataset(sharded, split="test")


def test_labels_are_in_the_version_numbering(tmp_path: Path, source: tuple[Catalog, str]) -> None:
    """The version names its classes in another order than any shard: labels follow it."""
    base = tmp_path / "flowers"
    order = ("d", "c", "b", "a")
    make_sharded_version(base, source[0], _slices(source[0]), classes=order)
    ds = H5ImageDataset(base)
    assert ds.classes == list(order)
    names = [ds.classes[y] for y in ds.targets]
    assert names == [p.split("/")[1] for p in ds.sources]
    images, labels = ds.read_batch(range(len(ds)))
    assert [ds.classes[y] for y in labels.tolist()] == names


def _rewrite(base: Path, change: Any) -> str:
    """A new version whose manifest is the latest one changed by ``change`` (pointer moved)."""
    [old] = list(base.glob("v/*/*.version.json"))
    manifest = change(parse_manifest(old.read_bytes(), shown="m"))
    data = manifest_bytes(manifest)
    sha = hashlib.sha256(data).hexdigest()
    where = base / manifest_key(base.name, sha)
    where.parent.mkdir(parents=True)
    where.write_bytes(data)
    write_pointer(Location(str(base)), sha, kind="sharded")
    return sha


def _copy(sharded: str, tmp_path: Path) -> Path:
    base = tmp_path / "flowers"
    shutil.copytree(sharded, base)
    shutil.copy(f"{sharded}.latest.json", f"{base}.latest.json")
    return base


def test_a_shard_swapped_for_another_valid_shard_is_refused(sharded: str, tmp_path: Path) -> None:
    base = _copy(sharded, tmp_path)
    ds = H5ImageDataset(base)
    shards = ds._shards().manifest.shards
    victim = shards[2].sha256
    shutil.copyfile(base / "shards" / f"{shards[3].sha256}.h5", base / "shards" / f"{victim}.h5")
    assert ds[0][1] == 0  # shard 0 is fine
    with pytest.raises(IntegrityError, match=victim):
        ds[int(ds._shards().starts[2])]


def test_manifest_labels_that_do_not_map_by_name_are_refused(sharded: str, tmp_path: Path) -> None:
    base = _copy(sharded, tmp_path)

    def swap(m: Any) -> Any:
        first = dataclasses.replace(m.shards[0], labels=m.shards[0].labels[::-1])
        return dataclasses.replace(m, shards=(first, *m.shards[1:]))

    _rewrite(base, swap)
    ds = H5ImageDataset(base)  # opening reads the manifest alone
    with pytest.raises(IntegrityError, match=f"shard 0 .*{ds._shards().manifest.shards[0].sha256}"):
        ds[0]


def test_split_counts_that_the_shard_contradicts_are_refused(sharded: str, tmp_path: Path) -> None:
    base = _copy(sharded, tmp_path)

    def lie(m: Any) -> Any:
        s = m.shards[1]
        wrong = dataclasses.replace(s, splits={"train": s.live, "val": 0})
        return dataclasses.replace(m, shards=(m.shards[0], wrong, *m.shards[2:]))

    _rewrite(base, lie)
    ds = H5ImageDataset(base, split="train")
    ds[0]
    with pytest.raises(IntegrityError, match="shard 1 .*live samples of split 'train'"):
        ds[int(ds._shards().starts[1])]


def test_a_manifest_changed_after_publishing_is_refused(sharded: str, tmp_path: Path) -> None:
    base = _copy(sharded, tmp_path)
    [manifest] = list(base.glob("v/*/*.version.json"))
    body = json.loads(manifest.read_bytes())
    body["classes"] = ["a", "b", "c", "e"]
    manifest.write_bytes(json.dumps(body).encode())
    with pytest.raises(IntegrityError, match="hashes to"):
        H5ImageDataset(base)


def test_opening_reads_no_shard(sharded: str, tmp_path: Path) -> None:
    base = _copy(sharded, tmp_path)
    ds = H5ImageDataset(base)
    shards = ds._shards().manifest.shards
    for s in shards[1:]:
        os.unlink(base / "shards" / f"{s.sha256}.h5")
    ds = H5ImageDataset(base, split="val")
    assert len(ds) == 24
    assert ds.classes == list(CLASSES)
    ds = H5ImageDataset(base)
    assert len(ds) == 48
    ds[0]
    with pytest.raises(FileNotFoundError, match=shards[2].sha256):
        ds[int(ds._shards().starts[2])]


def test_sampler_is_exact_across_ranks_and_resumes(sharded: str) -> None:
    ds = H5ImageDataset(sharded)
    seen = [
        list(Sampler(ds, shuffle=True, seed=3, rank=r, world_size=3, exact=True)) for r in range(3)
    ]
    assert sorted(sum(seen, [])) == list(range(len(ds)))
    whole = [labels for _, labels in ds.loader(6, shuffle=True, seed=1)]
    loader = ds.loader(6, shuffle=True, seed=1)
    it = iter(loader)
    head = [next(it)[1] for _ in range(3)]
    state = loader.state_dict()
    again = ds.loader(6, shuffle=True, seed=1)
    again.load_state_dict(state)
    tail = [labels for _, labels in again]
    assert torch.equal(torch.cat(head + tail), torch.cat(whole))


def test_multi_dataset_over_a_sharded_and_a_single_file_asset(
    source: tuple[Catalog, str], sharded: str
) -> None:
    multi = H5MultiDataset([sharded, source[1]], split="val")
    assert len(multi) == 48
    assert multi.classes == list(CLASSES)
    images, labels = multi.read_batch([0, 30, 23, 24])
    a, b = H5ImageDataset(sharded, split="val"), H5ImageDataset(source[1], split="val")
    ref = [a[0], b[6], a[23], b[0]]
    for k, (x, y) in enumerate(ref):
        assert torch.equal(images[k], x)
        assert labels[k] == y
    counts = np.bincount(np.asarray(multi.targets), minlength=4)
    assert counts.tolist() == [12, 12, 12, 12]
    batches = list(multi.loader(8, num_workers=2))
    assert sum(len(y) for _, y in batches) == 48
    mix = MixingSampler(multi, weights=[3, 1], length=40, seed=2)
    drawn = list(mix)
    assert sum(i < 24 for i in drawn) == 30  # the sharded asset's share of the weights
    labels = torch.cat([y for _, y in multi.loader(8, sampler=drawn, num_workers=2)])
    assert labels.tolist() == [multi.targets[i] for i in drawn]


def test_provenance_comes_from_the_manifest(sharded: str) -> None:
    ds = H5ImageDataset(sharded)
    p = ds.provenance
    assert p["url"] == ds.url
    assert p["sha256"] == ds.version
    assert p["created_at"] == "2026-12-04T00:00:00Z"
    assert p["h5forge_version"] == "test"
    assert p["config"]["image"]["size"] == [24, 32]
    assert p["shards"] == 4
    assert p["lineage"] == {}


def test_a_version_prefix_names_the_sharded_version(sharded: str) -> None:
    sha = H5ImageDataset(sharded).version
    assert H5ImageDataset(sharded, version=sha[:20]).version == sha
    with pytest.raises(FileNotFoundError, match="no version"):
        H5ImageDataset(sharded, version=sha[:16] + ("0" if sha[16] != "0" else "1"))


def test_a_sharded_version_over_s3(
    sharded: str, source: tuple[Catalog, str], s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    fs.put(sharded, f"{s3_bucket}/pub/flowers", recursive=True)
    fs.put(f"{sharded}.latest.json", f"{s3_bucket}/pub/flowers.latest.json")
    ds = H5ImageDataset(f"s3://{s3_bucket}/pub/flowers", storage_options=s3_storage_options)
    assert ds.url.startswith("s3://")
    assert len(ds) == 48
    truth = _content(H5ImageDataset(source[1]))
    assert _content(ds, num_workers=2, multiprocessing_context="fork") == truth


@pytest.fixture(scope="module")
def with_columns(tmp_path_factory: pytest.TempPathFactory) -> tuple[Catalog, str, str]:
    """12 samples with number and text columns: (catalog, one file, sharded base)."""
    from h5forge.pack.writer import pack_slice
    from tests.fixtures.targets_data import sample_rows, write_listing_with_columns

    rows = [
        {k: r[k] for k in ("path", "score", "count", "caption")} | {"label": "xy"[i % 2]}
        for i, r in enumerate(sample_rows(12, seed=2))
    ]
    w = write_listing_with_columns(tmp_path_factory.mktemp("cols"), rows, mask_columns=())
    catalog = discover(w.root, listing=w.listing)
    one = tmp_path_factory.mktemp("cols_one") / "one.h5"
    pack_slice(catalog, one, config=DECODED, workers=1)
    base = tmp_path_factory.mktemp("cols_pub") / "tagged"
    make_sharded_version(base, catalog, [range(0, 5), range(5, 12)])
    return catalog, str(one), str(base)


def _plain(target: Any) -> Any:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in target.items()}


def test_target_columns_read_as_from_one_file(with_columns: tuple[Catalog, str, str]) -> None:
    _, one_url, base = with_columns
    target = ["class", "score", "count", "caption"]
    ds, one = H5ImageDataset(base, target=target), H5ImageDataset(one_url, target=target)
    assert ds.schema == one.schema
    where = {p: i for i, p in enumerate(one.sources)}
    for i, path in enumerate(ds.sources):
        (x, y), (rx, ry) = ds[i], one[where[path]]
        assert torch.equal(x, rx)
        assert _plain(y) == _plain(ry)
    for picks in ([0, 1, 2], [0, 11, 6, 3]):  # one shard (in place), two shards (by item)
        images, targets = ds.read_batch(picks)
        ref_images, ref_targets = one.read_batch([where[ds.source_path(i)] for i in picks])
        assert torch.equal(images, ref_images)
        assert _plain(targets) == _plain(ref_targets)


def test_shards_with_other_target_columns_are_refused(
    tmp_path: Path, with_columns: tuple[Catalog, str, str]
) -> None:
    from tests.fixtures.sharded_read import pack_shard, shard_entry

    catalog, _, sharded_base = with_columns
    base = _copy(sharded_base, tmp_path)
    bare = dataclasses.replace(
        catalog,
        schema=(),
        samples=tuple(dataclasses.replace(s, targets=()) for s in catalog.samples),
    )
    out = pack_shard(bare, range(5, 12), tmp_path / "bare.h5", DECODED)
    entry = shard_entry(out, catalog.classes)
    shutil.copyfile(out, base / "shards" / f"{entry.sha256}.h5")
    _rewrite(base, lambda m: dataclasses.replace(m, shards=(m.shards[0], entry)))
    assert len(H5ImageDataset(base)[6]) == 2  # target="class" reads every shard
    ds = H5ImageDataset(base, target="score")
    ds[0]
    with pytest.raises(IntegrityError, match="shard 1 .*target columns differ"):
        ds[6]
