"""H5ImageDataset.read_batch / loader(): whole batches, in real DataLoader worker processes."""

from __future__ import annotations

import gc
import os
import shutil
from collections import Counter
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from typing import Any

import h5py
import pytest
import torch
from torch.utils.data import DistributedSampler

from h5forge.errors import IntegrityError
from h5forge.pack.writer import PackResult
from h5forge.read import batches as _batches
from h5forge.read.dataset import H5ImageDataset
from tests.fixtures.damage import flip_sample_byte
from tests.fixtures.loaders import TopLeft


def _labels(path: str) -> list[int]:
    with h5py.File(path) as h5:
        return h5["labels"][()].tolist()


def _expected(ds: H5ImageDataset, indices: list[int]) -> torch.Tensor:
    return torch.stack([ds[i][0] for i in indices])


def test_read_batch_equals_the_samples(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    indices = [7, 0, 7, -1, 3]
    images, labels = ds.read_batch(indices)
    assert images.dtype == torch.uint8
    assert images.shape == (5, 3, 32, 48)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(images, _expected(ds, indices))
    truth = _labels(packed_decoded.path)
    assert labels.dtype == torch.int64
    assert labels.tolist() == [truth[i] for i in (7, 0, 7, len(ds) - 1, 3)]
    with pytest.raises(IndexError, match="out of range"):
        ds.read_batch([0, len(ds)])


def test_read_batch_falls_back_to_collate_for_encoded_and_transforms(
    packed_encoded: PackResult, packed_decoded: PackResult
) -> None:
    crop = H5ImageDataset(packed_encoded.path, transform=lambda t: t[:, :8, :8])
    images, labels = crop.read_batch([1, 2])  # decoded from JPEG/PNG, then collated
    assert images.shape == (2, 3, 8, 8)
    assert images.is_contiguous()
    assert torch.equal(images[1], H5ImageDataset(packed_encoded.path)[2][0][:, :8, :8])
    flipped = H5ImageDataset(
        packed_decoded.path, transform=lambda t: t.flip(-1), target_transform=lambda y: y + 10
    )
    plain = H5ImageDataset(packed_decoded.path)
    images, labels = flipped.read_batch([4, 5])
    assert torch.equal(images, _expected(plain, [4, 5]).flip(-1))
    assert labels.tolist() == [plain[4][1] + 10, plain[5][1] + 10]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_reads_every_sample_once_per_epoch(packed_decoded: PackResult, method: str) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    truth = _labels(packed_decoded.path)
    loader = ds.loader(
        5,
        shuffle=True,
        num_workers=2,
        multiprocessing_context=method,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(1),
    )
    reference = _expected(ds, list(range(len(ds))))
    orders = []
    for _epoch in range(3):
        seen: Counter[int] = Counter()
        order = []
        for images, labels in loader:
            assert images.shape[1:] == (3, 32, 48)
            # Which samples these are: match each image against the reference pixels.
            for image, label in zip(images, labels.tolist(), strict=True):
                hits = [i for i in range(len(ds)) if torch.equal(reference[i], image)]
                assert hits, "an image that is not in the file"
                i = next(i for i in hits if truth[i] == label)
                seen[i] += 1
                order.append(i)
        assert seen == Counter(range(len(ds)))
        orders.append(order)
    assert orders[0] != orders[1]  # shuffled anew each epoch


def test_batches_kept_by_the_consumer_are_never_overwritten(packed_decoded: PackResult) -> None:
    # More batches held than a worker has slots: held ones must keep their pixels, the worker
    # must fall back to fresh memory instead of reusing a slot still in use.
    ds = H5ImageDataset(packed_decoded.path)
    n = len(ds)
    loader = ds.loader(1, num_workers=1, multiprocessing_context="fork")
    held = []
    for images, labels in loader:
        held.append((images, labels, images[0, :, 1:3]))  # a view, too
    assert len(held) == n > 2 * _batches._MAX_SLOTS
    for i, (images, labels, view) in enumerate(held):
        assert torch.equal(images[0], ds[i][0]), i
        assert torch.equal(view, ds[i][0][:, 1:3]), i
        assert labels.tolist() == [ds[i][1]]


def test_slot_is_reused_only_after_every_view_is_gone(packed_decoded: PackResult) -> None:
    got = _batches.acquire(1000)
    assert got is not None
    array, ref = got
    del got
    array[:] = 7
    layout = ((1, 10, 10, 3), 304, 1)
    images, labels = _batches.views(torch.from_numpy(array), layout)
    batch = _batches.make_batch(images, labels, ref, layout)
    # The hand-over a worker does: pickled as the slot (its descriptor), rebuilt elsewhere.
    received = ForkingPickler.loads(bytes(ForkingPickler.dumps(batch)))
    del batch, images, labels, array
    rebuilt_images = received[0]
    keep = rebuilt_images[0, 0]
    del received, rebuilt_images
    gc.collect()
    assert ref._map[0] == 1  # a view of the batch is alive: the slot stays busy
    again = _batches.acquire(1000)
    assert again is not None
    assert again[1].fd != ref.fd  # so the worker takes another one
    again[1].release()
    assert int(keep[0, 0]) == 7
    del keep
    gc.collect()
    assert ref._map[0] == 0  # the last view is gone: free again
    third = _batches.acquire(1000)
    assert third is not None
    third[1].release()


def test_loader_with_distributed_sampler_partitions(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(ds, num_replicas=2, rank=rank, shuffle=True, seed=3)
        for _images, labels in ds.loader(
            4, sampler=sampler, num_workers=1, multiprocessing_context="fork"
        ):
            seen.append(len(labels))
    assert sum(seen) == len(ds) + (len(ds) % 2)  # DistributedSampler pads to equal shares


def test_loader_arguments_are_checked(packed_decoded: PackResult) -> None:
    ds = H5ImageDataset(packed_decoded.path)
    assert [len(y) for _, y in ds.loader(8, drop_last=True)] == [8] * (len(ds) // 8)
    with pytest.raises(ValueError, match="batch_size=0 must be an int >= 1"):
        ds.loader(0)
    with pytest.raises(ValueError, match="either shuffle=True or a sampler"):
        ds.loader(4, shuffle=True, sampler=range(len(ds)))
    with pytest.raises(ValueError, match="loader\\(\\) sets collate_fn itself"):
        ds.loader(4, collate_fn=lambda b: b)


def test_loader_with_verify_reads_names_a_corrupt_sample(
    packed_decoded: PackResult, tmp_path: Path
) -> None:
    path = tmp_path / "copy.h5"
    shutil.copyfile(packed_decoded.path, path)
    flip_sample_byte(path, 6)
    ds = H5ImageDataset(path, verify_reads=True)
    loader: Any = ds.loader(4, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(IntegrityError, match="sample 6"):
        for _ in loader:
            pass
    assert os.path.exists(path)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_with_a_transform_collects_into_slots(
    packed_encoded: PackResult, method: str
) -> None:
    # Encoded images of mixed sizes, cropped to one size by the transform: the workers stack
    # them into a slot themselves; the batch equals the per-sample reads.
    ds = H5ImageDataset(packed_encoded.path, transform=TopLeft(8))
    batches = list(ds.loader(5, num_workers=2, multiprocessing_context=method))
    assert sum(len(labels) for _, labels in batches) == len(ds)
    for b, (images, labels) in enumerate(batches):
        want = list(range(5 * b, min(5 * b + 5, len(ds))))
        assert images.shape == (len(want), 3, 8, 8)
        assert torch.equal(images, torch.stack([ds[i][0] for i in want]))
        assert labels.tolist() == [ds[i][1] for i in want]
    # Not one shape: a clear error naming the sizes and the fix (in a worker and without).
    mixed = H5ImageDataset(packed_encoded.path)
    with pytest.raises(
        ValueError,
        match=r"differ in size \(3 x \d+ x \d+ and 3 x \d+ x \d+\)"
        r".*transform that resizes or crops",
    ):
        mixed.read_batch(list(range(len(mixed))))
    with pytest.raises(ValueError, match="differ in size"):
        list(mixed.loader(36, num_workers=1, multiprocessing_context="fork"))


def test_loader_orders_by_the_sampler_by_default(packed_decoded: PackResult) -> None:
    from h5forge.read.order import epoch_order
    from h5forge.read.sampler import Sampler

    ds = H5ImageDataset(packed_decoded.path)
    loader = ds.loader(5, shuffle=True, seed=4)
    assert isinstance(loader.order, Sampler)
    want = epoch_order(len(ds), seed=4, epoch=0).tolist()
    batches = list(loader)
    assert len(batches) == -(-len(ds) // 5)
    for k, (images, _ys) in enumerate(batches):
        assert torch.equal(images, ds.read_batch(want[5 * k : 5 * k + 5])[0])
    second = [y for _, ys in loader for y in ys.tolist()]  # epoch 1 by itself
    assert second == [ds[i][1] for i in epoch_order(len(ds), seed=4, epoch=1).tolist()]
    in_order = [y for _, ys in ds.loader(7) for y in ys.tolist()]
    assert in_order == _labels(packed_decoded.path)
    # A seeded generator draws the seed: the same generator seed gives the same order.
    a, b = (
        [
            y
            for _, ys in ds.loader(5, shuffle=True, generator=torch.Generator().manual_seed(9))
            for y in ys.tolist()
        ]
        for _ in range(2)
    )
    assert a == b
    with pytest.raises(ValueError, match="seed= is the default Sampler's"):
        ds.loader(4, sampler=range(len(ds)), seed=1)


@pytest.mark.parametrize(
    ("batch", "geometry"), [(64, (16, 4)), (8, (2, 4)), (10, (3, 4)), (3, (1, 3)), (1, (1, 1))]
)
def test_a_batch_of_blocks_is_one_window(batch: int, geometry: tuple[int, int]) -> None:
    from h5forge.read.loader import block_geometry

    assert block_geometry(batch) == geometry
    size, window = geometry
    assert size * window >= batch > (size - 1) * window


def test_shuffle_names_the_order_and_a_local_file_shuffles_uniformly(
    packed_decoded: PackResult, caplog: pytest.LogCaptureFixture
) -> None:
    from h5forge.read.order import epoch_order

    ds = H5ImageDataset(packed_decoded.path)
    n = len(ds)
    with caplog.at_level("INFO", logger="h5forge.read.loader"):
        local = ds.loader(8, shuffle=True, seed=2)
    assert not [r for r in caplog.records if r.name == "h5forge.read.loader"]  # remote only
    assert (local.order.shuffle, local.order.block_size) == (True, None)
    assert local.order_summary == "a uniform shuffle (shuffle=True on a local file)"
    assert [len(y) for _, y in local] == [8, 8, 8, 8, n - 32]
    blocks = ds.loader(8, shuffle="blocks", seed=2)
    assert (blocks.order.block_size, blocks.order.window) == (2, 4)
    got = [y for _, ys in blocks for y in ys.tolist()]
    want = epoch_order(n, seed=2, epoch=0, block_size=2, window=4).tolist()
    assert got == [ds[i][1] for i in want]
    assert blocks.order_summary.startswith("blocks of 2 samples, 4 per window: ")
    assert blocks.order_summary.endswith(
        "(shuffle='blocks'); shuffle='uniform' for a uniform order"
    )
    uniform = ds.loader(8, shuffle="uniform", seed=2)
    uniform.load_state_dict(local.state_dict())  # one order, two names: the state moves
    got = [y for _, ys in uniform for y in ys.tolist()]
    assert got == [ds[i][1] for i in epoch_order(n, seed=2, epoch=1).tolist()]
    assert ds.loader(8).order_summary == "in order (no shuffle)"
    assert ds.loader(8, sampler=range(n)).order_summary == "the given sampler (range)"
    for bad in ("Blocks", 1, None):
        with pytest.raises(ValueError, match=rf"shuffle={bad!r} is not an order: give True"):
            ds.loader(8, shuffle=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="either shuffle='blocks' or a sampler"):
        ds.loader(8, shuffle="blocks", sampler=range(n))
