"""H5ImageDataset in real DataLoader worker processes under fork, spawn and forkserver."""

from __future__ import annotations

import functools
import operator
import pickle
from collections import Counter

import h5py
import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler

from h5forge.pack.writer import PackResult
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.options import ReadOptions
from tests.fixtures.loaders import Indexed, TopLeft, as_list


def _truth(path: str) -> tuple[list[str], list[int]]:
    with h5py.File(path) as h5:
        return h5["paths"].asstr()[()].tolist(), h5["labels"][()].tolist()


@pytest.mark.parametrize(
    ("method", "which"),
    [
        ("fork", "packed_decoded"),
        ("spawn", "packed_decoded"),
        ("forkserver", "packed_decoded"),
        ("fork", "packed_encoded"),
        ("spawn", "packed_encoded"),
    ],
)
def test_dataloader_workers_read_every_sample_once(
    method: str, which: str, request: pytest.FixtureRequest
) -> None:
    result: PackResult = request.getfixturevalue(which)
    _, labels = _truth(result.path)
    ds = H5ImageDataset(result.path)
    ds[0]  # the parent has the file open before workers start
    loader = DataLoader(
        Indexed(ds),
        batch_size=4,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=method,
        persistent_workers=True,
        collate_fn=as_list,
    )
    for _epoch in range(2):
        seen = Counter()
        for batch in loader:
            for i, image, label in batch:
                seen[i] += 1
                assert label == labels[i]
                assert image.dtype == torch.uint8
                assert image.shape[0] == 3
        assert seen == Counter(range(len(ds)))


def test_batched_reads_with_getitems(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    loader = DataLoader(
        ds,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="fork",
        persistent_workers=True,
        generator=torch.Generator().manual_seed(0),
    )
    _, labels = _truth(packed_decoded.path)
    total = 0
    for _epoch in range(2):
        for images, targets in loader:
            assert images.dtype == torch.uint8
            assert tuple(images.shape[1:]) == (3, 32, 48)
            assert all(0 <= t < 3 for t in targets.tolist())
            total += len(targets)
    assert total == 2 * len(labels)
    items = ds.__getitems__([5, 1, 5, -1])
    for (a, la), i in zip(items, [5, 1, 5, len(ds) - 1], strict=True):
        b, lb = ds[i]
        assert la == lb == labels[i]
        assert bool((a == b).all())


def test_pickled_and_spawned_copies_read_the_same_samples(packed_decoded: PackResult) -> None:
    # Every reading option travels with the dataset: a copy unpickled here and one in a
    # spawned worker (a fresh interpreter: nothing inherited) read exactly what the original
    # reads, split, transform and target_transform included.
    ds = H5ImageDataset(
        packed_decoded.path,
        split="train",
        transform=TopLeft(8),
        target_transform=functools.partial(operator.add, 100),
        verify_reads=True,
        max_pixels=32 * 48,
    )
    want = [ds[i] for i in range(len(ds))]
    assert 0 < len(want) < packed_decoded.num_samples  # the split selected some
    clone = pickle.loads(pickle.dumps(ds))
    assert clone.classes == ds.classes
    loader = DataLoader(
        Indexed(clone), batch_size=4, num_workers=1, multiprocessing_context="spawn",
        collate_fn=as_list,
    )  # fmt: skip
    for got in ([(i, *clone[i]) for i in range(len(clone))], [x for b in loader for x in b]):
        assert [i for i, _, _ in got] == list(range(len(want)))
        for (_, image, label), (want_image, want_label) in zip(got, want, strict=True):
            assert label == want_label >= 100
            assert image.shape == (3, 8, 8)
            assert bool((image == want_image).all())


def test_options_as_one_value_read_as_the_keywords(packed_decoded: PackResult) -> None:
    by_keywords = H5ImageDataset(packed_decoded.path, split="val", target_transform=str)
    by_value = H5ImageDataset(
        packed_decoded.path, options=ReadOptions(split="val", target_transform=str)
    )
    assert by_value.options == by_keywords.options
    assert [by_value[i][1] for i in range(len(by_value))] == [
        by_keywords[i][1] for i in range(len(by_keywords))
    ]
    with pytest.raises(
        ValueError, match=r"options= was given with split='val', verify_reads=True as well"
    ):
        H5ImageDataset(packed_decoded.path, split="val", verify_reads=True, options=ReadOptions())


def test_transforms_set_after_construction_apply_and_travel(packed_decoded: PackResult) -> None:
    # torchvision's idiom: a dataset's transform set afterwards is used, and pickled with it.
    ds = H5ImageDataset(packed_decoded.path)
    ds.transform = TopLeft(4)
    ds.target_transform = functools.partial(operator.add, 100)
    assert ds.options.transform is ds.transform
    for copy in (ds, pickle.loads(pickle.dumps(ds))):
        image, label = copy[0]
        assert image.shape == (3, 4, 4)
        assert label >= 100


def test_transforms_apply_after_decoding(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(
        packed_decoded.path, transform=lambda t: t.float() / 255, target_transform=lambda y: y + 100
    )
    image, label = ds[0]
    assert image.dtype == torch.float32
    assert float(image.max()) <= 1.0
    assert label >= 100


def test_unknown_split_lists_the_known_ones(packed_decoded: PackResult) -> None:
    with pytest.raises(ValueError, match=r"split 'test' is not in .*\['train', 'val'\]"):
        H5ImageDataset(packed_decoded.path, split="test")


def test_distributed_sampler_partitions_the_dataset(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    seen: list[int] = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        seen += list(sampler)
        loader = DataLoader(ds, batch_size=5, sampler=sampler)
        assert sum(len(t) for _, t in loader) == len(list(sampler))
    assert set(seen) == set(range(len(ds)))


def test_index_out_of_range(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    with pytest.raises(IndexError, match="out of range"):
        ds[len(ds)]
