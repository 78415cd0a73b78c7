"""The standard DataLoader(ds, batch_size=...) path: default_collate stacks a batch's images in
a worker's reused slot (h5forge.read.stacked), and anything else the way torch does."""

from __future__ import annotations

import copy
import io
import pickle
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, default_collate

from h5forge.pack.writer import PackResult
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.stacked import BatchImage


def _expected(ds: H5ImageDataset, order: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """What torch's own stack of the samples ``ds[i]`` (plain tensors) makes."""
    items = [ds[i] for i in order]
    assert all(type(image) is torch.Tensor for image, _ in items)
    return torch.stack([image for image, _ in items]), torch.tensor([y for _, y in items])


@pytest.mark.parametrize("method", ["fork", "spawn", None])
def test_standard_loader_batches_equal_torchs_stack(
    packed_decoded: PackResult, method: str | None
) -> None:
    """Every batch is the contiguous N x C x H x W tensor torch's stack makes; dropped as
    they arrive, batches keep coming from the workers' slots (not torch's shared memory):
    the main process frees each slot when it lets go of the batch. Without workers (None),
    torch stacks them."""
    ds = H5ImageDataset(packed_decoded.path)
    workers = {} if method is None else {"num_workers": 2, "multiprocessing_context": method}
    loader = DataLoader(ds, batch_size=2, persistent_workers=method is not None, **workers)
    for _epoch in range(2):
        for k, (images, labels) in enumerate(loader):
            want_images, want_labels = _expected(ds, [2 * k, 2 * k + 1])
            assert type(images) is torch.Tensor
            assert images.is_contiguous()
            assert torch.equal(images, want_images)
            assert torch.equal(labels, want_labels)
            assert not images.is_shared(), f"batch {k} was stacked into new shared memory"


def test_batches_kept_by_the_consumer_fall_back_to_torchs_stack(
    packed_decoded: PackResult,
) -> None:
    """A consumer that keeps every batch holds all of a worker's slots: the next batches are
    stacked into new shared memory, as torch does, and every kept batch stays intact."""
    ds = H5ImageDataset(packed_decoded.path)
    loader = DataLoader(ds, batch_size=2, num_workers=2, multiprocessing_context="fork")
    kept = list(loader)
    assert len(kept) == 18
    for k, (images, labels) in enumerate(kept):
        want_images, want_labels = _expected(ds, [2 * k, 2 * k + 1])
        assert torch.equal(images, want_images)
        assert torch.equal(labels, want_labels)
    shared = [images.is_shared() for images, _ in kept]
    assert shared == [False] * 12 + [True] * 6  # 6 slots a worker


def _first_half(batch: list[Any]) -> Any:
    return default_collate(batch[: len(batch) // 2])


def _scaled(batch: list[Any]) -> Any:
    images, labels = default_collate(batch)
    return images.float() / 255, labels


def _unsent(batch: list[Any]) -> Any:
    images, labels = default_collate(batch)
    return images.clone(), labels, type(images).__name__


def _as_is(batch: list[Any]) -> Any:
    return batch


@pytest.mark.parametrize("wrapper", [_first_half, _scaled, _unsent, _as_is])
def test_collate_wrappers_get_torchs_results(packed_decoded: PackResult, wrapper: Any) -> None:
    """A collate_fn around default_collate (part of the batch, arithmetic on the result, a
    copy of it; or no collate at all) gets what it would get from torch's collate."""
    ds = H5ImageDataset(packed_decoded.path)
    loader = DataLoader(
        ds, batch_size=2, num_workers=2, multiprocessing_context="fork", collate_fn=wrapper
    )
    kinds = set()
    for k, got in enumerate(loader):  # 9 batches a worker, more than its slots
        order = [2 * k, 2 * k + 1]
        want_images, want_labels = _expected(ds, order)
        if wrapper is _first_half:
            want_images, want_labels = want_images[:1], want_labels[:1]
        if wrapper is _as_is:
            assert [type(image) for image, _ in got] == [torch.Tensor] * 2
            assert torch.equal(torch.stack([image for image, _ in got]), want_images)
            assert [y for _, y in got] == want_labels.tolist()
            continue
        if wrapper is _scaled:
            want_images = want_images.float() / 255
        if wrapper is _unsent:
            kinds.add(got[2])
        assert torch.equal(got[0], want_images)
        assert torch.equal(got[1], want_labels)
    if wrapper is _unsent:  # each copied, never sent: its slot is free again for the next
        assert kinds == {"SlotImages"}


def test_samples_copy_pickle_and_save_as_plain_tensors(packed_decoded: PackResult) -> None:
    """The images ``__getitems__`` returns are tensors to every operation; copied, pickled or
    saved (torch.load's default weights_only included) they are plain tensors, and ds[i] is
    one already."""
    ds = H5ImageDataset(packed_decoded.path)
    image, label = ds.__getitems__([3, 4])[1]
    assert isinstance(image, BatchImage)
    assert type(image + 0) is torch.Tensor
    assert type(image.float()) is torch.Tensor
    buf = io.BytesIO()
    torch.save(image, buf)
    buf.seek(0)
    for other in (pickle.loads(pickle.dumps(image)), copy.deepcopy(image), torch.load(buf)):
        assert type(other) is torch.Tensor
        assert torch.equal(other, image)
    plain, same_label = ds[4]
    assert type(plain) is torch.Tensor
    assert torch.equal(plain, image)
    assert same_label == label
    assert repr(image) == repr(plain)
