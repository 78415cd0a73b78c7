"""Many assets as one: H5MultiDataset (concatenation, split, subsets, class sets, asset lists,
workers, versions, S3) and MixingSampler (proportions, determinism, without replacement)."""

from __future__ import annotations

import functools
import json
import os
import pickle
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch

from h5forge.demo import write_image_folder
from h5forge.errors import IntegrityError
from h5forge.location import MAX_ASSET_LIST_BYTES, Location
from h5forge.pack.config import PackConfig
from h5forge.pack.writer import pack
from h5forge.preprocess.config import ImageConfig
from h5forge.publish.storage import publish
from h5forge.publish.versions import version_url, write_pointer
from h5forge.read.asset_list import MAX_ASSETS
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.mixing import MixingSampler
from h5forge.read.multi import H5MultiDataset
from tests.fixtures.damage import flip_sample_byte

SIZE = (12, 16)


def _asset(
    out: Path, *, seed: int, classes: tuple[str, ...] = ("a", "b", "c"), per: int = 3
) -> str:
    src = out.parent / f"{out.stem}-src"
    write_image_folder(
        src, classes=classes, per_class=per, splits=("train", "val"), seed=seed, size=SIZE
    )
    config = PackConfig(ImageConfig(resize="resize", size=SIZE))
    return pack(src, out, config=config, workers=1).path


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Three assets with the same classes, of 18, 12 and 24 samples (train and val)."""
    tmp = tmp_path_factory.mktemp("multi")
    return [
        _asset(tmp / "a.h5", seed=1),
        _asset(tmp / "b.h5", seed=2, per=2),
        _asset(tmp / "c.h5", seed=3, per=4),
    ]


def _samples(ds: Any) -> list[tuple[torch.Tensor, int]]:
    return [ds[i] for i in range(len(ds))]


def _same(got: list[tuple[Any, Any]], want: list[tuple[Any, Any]]) -> None:
    assert len(got) == len(want)
    for (gi, gl), (wi, wl) in zip(got, want, strict=True):
        assert torch.equal(gi, wi)
        assert gl == wl


@pytest.mark.parametrize("split", [None, "val"])
def test_concatenation_is_the_assets_in_order(assets: list[str], split: str | None) -> None:
    ds = H5MultiDataset(assets, split=split)
    parts = [H5ImageDataset(a, split=split) for a in assets]
    assert len(ds) == sum(len(p) for p in parts) == (54 if split is None else 27)
    want = [s for p in parts for s in _samples(p)]
    _same(_samples(ds), want)
    assert ds.targets == [label for _, label in want]
    assert ds.classes == ["a", "b", "c"]
    assert ds.class_to_idx == {"a": 0, "b": 1, "c": 2}
    _same([ds[-1]], [want[-1]])
    with pytest.raises(IndexError, match=f"index {len(ds)} out of range"):
        ds[len(ds)]


def test_read_batch_keeps_the_batch_order_across_assets(assets: list[str]) -> None:
    ds = H5MultiDataset(assets)
    order = np.random.default_rng(0).permutation(len(ds))[:20].tolist()
    images, labels = ds.read_batch(order)
    want = [ds[i] for i in order]
    assert torch.equal(images, torch.stack([w[0] for w in want]))
    assert labels.tolist() == [w[1] for w in want]
    _same(ds.__getitems__(order), want)
    empty_images, empty_labels = ds.read_batch([])
    assert empty_images.shape == (0, 3, *SIZE)
    assert empty_labels.shape == (0,)
    clone = pickle.loads(pickle.dumps(ds))
    _same(clone.__getitems__(order), want)


def test_read_batch_with_a_transform_or_an_encoded_asset(tmp_path: Path, assets: list[str]) -> None:
    # Not read in place: each asset's __getitems__ (transformed, or decoded), then collated.
    flipped = H5MultiDataset(assets, transform=functools.partial(torch.flip, dims=[-1]))
    plain = H5MultiDataset(assets)
    order = [50, 2, 20, 2]
    images, labels = flipped.read_batch(order)
    want_images, want_labels = plain.read_batch(order)
    assert torch.equal(images, want_images.flip(-1))
    assert labels.tolist() == want_labels.tolist()
    src = tmp_path / "src"
    write_image_folder(src, classes=("a", "b", "c"), per_class=2, seed=5, size=SIZE)
    encoded = pack(
        src,
        tmp_path / "enc.h5",
        config=PackConfig(ImageConfig(layout="encoded", encoding="png", size=SIZE)),
        workers=1,
    ).path
    mixed = H5MultiDataset([assets[0], encoded])
    images, labels = mixed.read_batch([20, 0, 19])
    want = [mixed[i] for i in (20, 0, 19)]
    assert torch.equal(images, torch.stack([w[0] for w in want]))
    assert labels.tolist() == [w[1] for w in want]
    assert torch.equal(want[1][0], plain[0][0])


def test_an_asset_replaced_after_opening_is_refused(tmp_path: Path, assets: list[str]) -> None:
    path = tmp_path / "x.h5"
    shutil.copyfile(assets[1], path)
    ds = H5MultiDataset([path, assets[0]])
    shutil.copyfile(assets[2], path)  # 24 samples where 12 were
    with pytest.raises(IntegrityError, match=r"x.h5 has 24 samples .* 12 when the dataset was"):
        ds.read_batch([0, 1])


def test_verify_reads_names_the_corrupt_sample_of_its_asset(
    tmp_path: Path, assets: list[str]
) -> None:
    path = tmp_path / "copy.h5"
    shutil.copyfile(assets[1], path)
    with h5py.File(path) as h5:
        names = [n.decode() for n in h5["split_names"][()]]
        val_rows = np.flatnonzero(h5["splits"][()] == names.index("val")).tolist()
    flip_sample_byte(path, val_rows[2])
    ds = H5MultiDataset([assets[0], path], split="val", verify_reads=True)
    first = len(ds.datasets[0])
    ds.read_batch([first + 1, 0, first + 3])  # clean samples of both assets
    with pytest.raises(IntegrityError, match=f"copy.h5: sample {val_rows[2]} "):
        ds.read_batch([0, first + 2])


def test_subsets_by_index_list_and_by_seeded_fraction(assets: list[str]) -> None:
    whole = H5MultiDataset(assets)
    picks = [40, 3, 17, 3]
    _same(_samples(H5MultiDataset(assets, subset=picks)), [whole[i] for i in picks])
    half = H5MultiDataset(assets, subset=0.5, seed=4)
    again = H5MultiDataset(assets, subset=0.5, seed=4)
    other = H5MultiDataset(assets, subset=0.5, seed=5)
    assert len(half) == 27
    chosen = [int(x) for x in half.locate(range(27))[1]]
    assert chosen == [int(x) for x in again.locate(range(27))[1]]
    _same(_samples(half), _samples(again))
    assert half.targets != other.targets or chosen != [int(x) for x in other.locate(range(27))[1]]
    # The indices of each asset partition the subset, in order.
    members = np.concatenate([half.indices_of(a) for a in range(3)])
    assert members.tolist() == list(range(27))
    with pytest.raises(ValueError, match="subset index 54 out of range for 54 samples"):
        H5MultiDataset(assets, subset=[0, 54])
    with pytest.raises(ValueError, match=r"give a fraction in \(0, 1\]"):
        H5MultiDataset(assets, subset=1.5)


def test_class_sets_that_disagree_are_refused_or_remapped(
    tmp_path: Path, assets: list[str]
) -> None:
    odd = _asset(tmp_path / "odd.h5", seed=9, classes=("a", "c", "d"), per=1)
    other = _asset(tmp_path / "other.h5", seed=8, classes=("a", "x"), per=1)
    with pytest.raises(ValueError, match="class 'c' is 2 in .*a.h5 but 1 in .*odd.h5"):
        H5MultiDataset([assets[0], odd])
    with pytest.raises(ValueError, match="class index 1 is 'b' in .*a.h5 but 'x' in .*other.h5"):
        H5MultiDataset([assets[0], other])
    ds = H5MultiDataset([assets[0], odd], remap=True)
    assert ds.classes == ["a", "b", "c", "d"]
    first, second = H5ImageDataset(assets[0]), H5ImageDataset(odd)
    names = [first.classes[x] for x in first.targets] + [second.classes[x] for x in second.targets]
    assert [ds.classes[x] for x in ds.targets] == names
    got = _samples(ds)
    assert [ds.classes[label] for _, label in got] == names
    images, labels = ds.read_batch(list(range(len(ds)))[::-1])  # read in place, remapped
    assert labels.tolist() == ds.targets[::-1]
    assert torch.equal(images, torch.stack([image for image, _ in got[::-1]]))
    assert Counter(names) == Counter({"a": 8, "b": 6, "c": 8, "d": 2})
    # A prefix of the class list agrees: no remap needed, the union is the longer list.
    assert H5MultiDataset([other, assets[0]], remap=True).classes == ["a", "x", "b", "c"]


def _asset_list(path: Path, body: Any) -> str:
    path.write_text(body if isinstance(body, str) else json.dumps(body))
    return str(path)


def test_an_asset_list_names_assets_relative_to_itself(assets: list[str]) -> None:
    folder = Path(assets[0]).parent
    url = _asset_list(
        folder / "assets.json",
        {
            "format": "h5forge-shards",
            "version": 1,
            "assets": [{"url": "a.h5", "weight": 2}, {"url": assets[2], "version": None}],
        },
    )
    ds = H5MultiDataset(url, split="train")
    assert [s.weight for s in ds.sources] == [2.0, 1.0]
    # The asset list's weights are the mixing's default: 9 and 12 train samples weighted 2:1
    # give floor(min(9 / (2/3), 12 / (1/3))) = 13 draws, 8.67 and 4.33 rounded to 9 + 4.
    assert MixingSampler(ds).quota.tolist() == [9, 4]
    _same(_samples(ds), _samples(H5MultiDataset([assets[0], assets[2]], split="train")))


def test_an_entry_that_fails_to_open_is_named_with_its_asset_list(
    tmp_path: Path, assets: list[str]
) -> None:
    pointer = tmp_path / "hostile.latest.json"
    pointer.write_text("[" * 10_000)
    os.mkfifo(tmp_path / "fifo.h5")
    listing = tmp_path / "list.json"
    for entry, kind, words in (
        ("gone.h5", FileNotFoundError, "gone.h5"),
        ({"url": "hostile", "version": "latest"}, ValueError, "nests more than 32"),
        ("fifo.h5", IntegrityError, "not a regular file"),
    ):
        item = entry if isinstance(entry, dict) else {"url": entry}
        body = {"format": "h5forge-shards", "version": 1, "assets": [{"url": assets[0]}, item]}
        url = _asset_list(listing, body)
        with pytest.raises(kind, match=rf"^{re.escape(url)}: assets\[1\] \(.*\): .*{words}"):
            H5MultiDataset(url)
        # A list given in Python names the entry alone.
        with pytest.raises(kind, match=r"^assets\[1\] \("):
            H5MultiDataset([{"url": assets[0]}, {**item, "url": str(tmp_path / item["url"])}])


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ("x" * (MAX_ASSET_LIST_BYTES + 1), "is 4194305 bytes, over 4194304 bytes"),
        ("{not json", "is not JSON"),
        ("[" * 100_000 + "]" * 100_000, "is not JSON"),
        ({"format": "h5forge-pointer", "version": 1, "assets": []}, "not an asset list"),
        ({"format": "h5forge-shards", "version": 2, "assets": []}, "asset list version 2"),
        ({"format": "h5forge-shards", "version": 1, "assets": []}, "1 to 10000 assets, not 0"),
        (
            {"format": "h5forge-shards", "version": 1, "assets": [{"url": "a"}] * (MAX_ASSETS + 1)},
            "not 10001",
        ),
        ({"format": "h5forge-shards", "version": 1, "assets": ["a.h5"]}, r"assets\[0\] must be"),
        (
            {"format": "h5forge-shards", "version": 1, "assets": [{"url": "a", "size": 1}]},
            r"assets\[0\] has unknown keys \['size'\]",
        ),
        ({"format": "h5forge-shards", "version": 1, "assets": [{"url": 7}]}, "url 7 must be"),
        (
            '{"format": "h5forge-shards", "version": 1, "assets": [{"url": "a", "weight": NaN}]}',
            r"weight nan must be a finite number in \(0, 1.7976931348623157e\+308\]",
        ),
        (
            {"format": "h5forge-shards", "version": 1, "assets": [{"url": "a", "weight": -1}]},
            "weight -1 must be",
        ),
    ],
)
def test_a_hostile_asset_list_is_refused_clearly(tmp_path: Path, body: Any, error: str) -> None:
    url = _asset_list(tmp_path / "assets.json", body)
    with pytest.raises(ValueError, match=error) as info:
        H5MultiDataset(url)
    assert "assets.json" in str(info.value)


@pytest.mark.parametrize(
    ("sources", "error"),
    [
        ([], "0 assets given"),
        ([3], "sources\\[0\\] is int"),
        ([("a.h5", 5)], r"sources\[0\]: version 5 must be .latest. or the first 16-64"),
        ([{"version": "latest"}], "has no 'url'"),
    ],
)
def test_a_bad_source_list_is_refused(sources: list[Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        H5MultiDataset(sources)


def test_mixing_follows_the_weights_deterministically(assets: list[str]) -> None:
    ds = H5MultiDataset(assets)  # 18, 12, 24 samples
    mix = MixingSampler(ds, weights=[1, 2, 1], length=4000, seed=3)
    asset_of = np.searchsorted(ds.cumulative_sizes, np.arange(len(ds)), side="right")
    epochs = [mix.schedule(e) for e in range(3)]
    for e, order in enumerate(epochs):
        counts = np.bincount(asset_of[order], minlength=3)
        assert counts.tolist() == [1000, 2000, 1000]  # exact shares over an epoch
        head = np.bincount(asset_of[order[:1000]], minlength=3) / 1000  # and close on a prefix
        assert np.abs(head - [0.25, 0.5, 0.25]).max() < 0.06
        # Without replacement inside an asset until it is exhausted: every window of n_s
        # consecutive draws of asset s (from a cycle start) is a permutation of its samples.
        draws = order[asset_of[order] == 1]
        for k in range((-e * 2000) % 12, 1988, 12):
            assert sorted(draws[k : k + 12].tolist()) == list(range(18, 30))
    assert not np.array_equal(epochs[0], epochs[1])
    assert np.array_equal(
        MixingSampler(ds, weights=[1, 2, 1], length=4000, seed=3).schedule(2), epochs[2]
    )
    assert not np.array_equal(
        MixingSampler(ds, weights=[1, 2, 1], length=4000, seed=4).schedule(0), epochs[0]
    )
    # Iteration advances the epoch; set_epoch chooses it.
    assert list(mix) == epochs[0].tolist()
    assert list(mix) == epochs[1].tolist()
    mix.set_epoch(0)
    assert list(mix) == epochs[0].tolist()


def test_mixing_default_length_repeats_no_sample(assets: list[str]) -> None:
    ds = H5MultiDataset(assets)  # 18, 12, 24; weights 1, 1, 2: min(18/.25, 12/.25, 24/.5) = 48
    mix = MixingSampler(ds, weights=[1, 1, 2])
    assert len(mix) == 48
    order = mix.schedule(0)
    assert len(set(order.tolist())) == 48
    assert mix.quota.tolist() == [12, 12, 24]
    with pytest.raises(ValueError, match=r"weights\[1\]=0 must be a finite number in \(0, "):
        MixingSampler(ds, weights=[1, 0, 1])


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_with_two_workers(assets: list[str], method: str) -> None:
    # Batches mix the assets in a random order; workers read them into their slots.
    ds = H5MultiDataset(assets, subset=list(range(5, 50)))
    mix = MixingSampler(ds, weights=[1, 1, 1], length=30, seed=1)
    loader = ds.loader(
        4, sampler=mix, num_workers=2, multiprocessing_context=method, persistent_workers=True
    )
    for epoch in range(2):
        order = mix.schedule(epoch).tolist()
        got = list(loader)
        assert len(got) == 8
        for k, (images, labels) in enumerate(got):
            want_images, want_labels = ds.read_batch(order[4 * k : 4 * k + 4])
            assert torch.equal(images, want_images)
            assert labels.tolist() == want_labels.tolist()


@pytest.mark.slow
def test_shuffled_loader_and_standard_dataloader_cover_every_sample(assets: list[str]) -> None:
    from torch.utils.data import DataLoader

    ds = H5MultiDataset(assets, split="train")
    images, labels = ds.read_batch(list(range(len(ds))))
    pairs = zip(images, labels.tolist(), strict=True)
    want = Counter((bytes(i.contiguous().numpy()), x) for i, x in pairs)
    for loader in (
        ds.loader(5, shuffle=True, num_workers=2, multiprocessing_context="fork"),
        DataLoader(ds, batch_size=5, num_workers=2, multiprocessing_context="fork"),
    ):
        got: Counter[tuple[bytes, int]] = Counter()
        for batch_images, batch_labels in loader:
            for i, x in zip(batch_images, batch_labels.tolist(), strict=True):
                got[(bytes(i.contiguous().numpy()), x)] += 1
        assert got == want


def _publish(local: str, base: str, options: dict[str, Any] | None = None, parent: str = "") -> str:
    sha = Location.of(local).sha256()
    publish(local, version_url(base, sha), storage_options=options)
    write_pointer(Location(base, options), sha, parent=parent)
    return sha


def test_an_asset_pinned_to_a_version(tmp_path: Path, assets: list[str]) -> None:
    base = str(tmp_path / "pub" / "flowers")
    sha1 = _publish(assets[0], base)
    _publish(assets[1], base, parent=sha1)  # latest is the second file now
    ds = H5MultiDataset([(base, sha1[:16]), {"url": base, "version": "latest"}, assets[2]])
    assert ds.datasets[0].version == sha1
    _same(_samples(ds), [s for a in assets for s in _samples(H5ImageDataset(a))])


def test_an_asset_on_s3(
    assets: list[str], s3_bucket: str, s3_storage_options: dict[str, Any]
) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_storage_options)
    fs.put(assets[1], f"{s3_bucket}/data/b.h5")
    listed = {"format": "h5forge-shards", "version": 1, "assets": [{"url": "b.h5"}]}
    fs.pipe(f"{s3_bucket}/data/assets.json", json.dumps(listed).encode())
    remote = H5MultiDataset(
        [f"s3://{s3_bucket}/data/b.h5", assets[0]], storage_options=s3_storage_options
    )
    local = H5MultiDataset([assets[1], assets[0]])
    _same(_samples(remote), _samples(local))
    order = [20, 3, 11, 0, 29]  # read in place: range requests into the batch's positions
    for got, want in zip(remote.read_batch(order), local.read_batch(order), strict=True):
        assert torch.equal(got, want)
    listed = H5MultiDataset(
        f"s3://{s3_bucket}/data/assets.json", storage_options=s3_storage_options
    )
    assert listed.datasets[0].url == f"s3://{s3_bucket}/data/b.h5"
    _same(_samples(listed), _samples(H5ImageDataset(assets[1])))
