"""Samples collated into a batch: in a worker's slot when they allow it, else torch's way.

:func:`send_batch` is the loader's ``collate_fn`` (a :class:`~h5forge.read.batches.SlotBatch`
leaves the worker as its slot); :func:`collate` batches samples that were read one by one
(transforms, files of varying size), through :func:`collect` into a slot where it can.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from h5forge.read.batches import Batch, SlotBatch

__all__ = ["check_one_size", "collate", "collect", "send_batch"]


def collect(items: list[tuple[Any, Any]]) -> Any:
    """Samples as one :class:`Batch` (inside a DataLoader worker) when they are uint8
    C x H x W tensors of one shape with integer labels (what a resize/crop transform yields);
    None for anything else, which the caller collates the usual way. Each image is copied
    once, into the batch's buffer."""
    if not items:
        return None
    first = items[0][0]
    if not (isinstance(first, torch.Tensor) and first.dtype == torch.uint8 and first.dim() == 3):
        return None
    shape = first.shape
    for image, label in items:
        if (
            not isinstance(image, torch.Tensor)
            or image.dtype != torch.uint8
            or image.shape != shape
            or isinstance(label, bool)
            or not isinstance(label, int)
        ):
            return None
    c, h, w = shape
    batch = Batch(len(items), (h, w, c), slot=True, shared=True)
    pixels = batch.images.permute(0, 2, 3, 1)  # N x H x W x C, the buffer's memory order
    for k, (image, _) in enumerate(items):
        pixels[k].copy_(image.permute(1, 2, 0))
    batch.labels.copy_(torch.tensor([label for _, label in items], dtype=torch.int64))
    return batch.result()


def send_batch(batch: Any) -> Any:
    """The loader's collate function: a :class:`SlotBatch` leaves the worker as its slot. A
    batch made here (a dataset's ``read_batch``, or :func:`collate`) is tensors already, but
    for numpy arrays at its top (a tuple, a dict), which become tensors; its lists (a batch's
    boxes dicts, text) are left as they are, where torch's ``default_convert`` would copy
    every dict of them (64 a batch: most of a boxes batch's cost in one process)."""
    if isinstance(batch, SlotBatch):
        return batch
    return _arrays_as_tensors(batch)


def _arrays_as_tensors(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype != object:
        return torch.as_tensor(value)
    if isinstance(value, tuple):
        return tuple(_arrays_as_tensors(v) for v in value)
    if isinstance(value, dict):
        return {k: _arrays_as_tensors(v) for k, v in value.items()}
    return value


def collate(items: list[tuple[Any, Any]], *, slot: bool, url: str) -> Any:
    """Samples (already transformed) as one batch: a :class:`Batch` in a slot when ``slot`` and
    :func:`collect` takes them, else torch's ``default_collate``, which needs one image size.

    Raises:
        ValueError: the images differ in size, with a message that says what to do.
    """
    batch = collect(items) if slot else None
    if batch is not None:
        return batch
    from torch.utils.data import default_collate

    check_one_size([image for image, _ in items], url=url)
    return default_collate(items)


def check_one_size(images: list[Any], *, url: str) -> None:
    """Refuse a batch whose image tensors differ in size (they cannot be stacked).

    Raises:
        ValueError: saying what to do.
    """
    shapes = {tuple(image.shape) for image in images if isinstance(image, torch.Tensor)}
    if len(shapes) > 1:
        a, b = sorted(shapes)[:2]
        raise ValueError(
            f"{url}: the images of one batch differ in size ({' x '.join(map(str, a))} and "
            f"{' x '.join(map(str, b))}), so they cannot be stacked; give H5ImageDataset a "
            "transform that resizes or crops to one size, or pack with a resize policy"
        )
