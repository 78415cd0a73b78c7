"""The standard ``DataLoader(ds, batch_size=64)``: a batch's images stacked into a reused slot.

torch's ``default_collate`` stacks a batch's images, inside a DataLoader worker, into new
shared memory, and the first touch of each page of it is a fault that zero-fills it: most of
what a batch costs in a worker (about 10 of 15 ms a 64 x 3 x 224 x 224 batch on the machine of
benchmarks/RESULTS.md, for any dataset). The images :meth:`H5ImageDataset.__getitems__
<h5forge.H5ImageDataset.__getitems__>` returns for a decoded file are :class:`BatchImage`:
tensors like any other to every operation (``__torch_function__`` is disabled, so what an
operation returns is a plain ``torch.Tensor``) that know their place in the batch they were
read in. ``default_collate`` looks the type up in ``default_collate_fn_map``, the extension
point torch documents for it, and calls :func:`stack_images`: when its list is the whole batch
read, in order, inside a worker, the images are copied once, into one of the worker's
reusable slots (:mod:`h5forge.read.batches`), as the contiguous N x C x H x W uint8 tensor
torch's stack makes, and leave the worker as the slot (:class:`SlotImages`, a plain tensor over
the slot in the main process). Any other list (part of a batch, reordered, other tensors, no
worker, no free slot) is stacked by torch's own tensor collate, into plain tensors.
"""

from __future__ import annotations

import copy
import weakref
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np
import torch

from h5forge.read.batches import SlotRef, acquire, mapped

__all__ = ["BatchImage", "SlotImages", "batch_images", "plain", "stack_images"]


class _Plain(torch.Tensor):
    """A tensor subclass that copies, pickles and saves as the plain tensor it is (its
    attributes say where it lies in this process and mean nothing elsewhere)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

    def __deepcopy__(self, memo: dict[int, Any]) -> torch.Tensor:
        return copy.deepcopy(self.as_subclass(torch.Tensor), memo)

    def __repr__(self, **kwargs: Any) -> str:  # type: ignore[override]
        return self.as_subclass(torch.Tensor).__repr__(**kwargs)


class BatchImage(_Plain):
    """A C x H x W uint8 image of a batch read by ``__getitems__`` (see the module docstring);
    a plain tensor to every operation."""

    _h5forge_read: tuple[np.ndarray, int]  # the N x H x W x C pixels read, and which one


class SlotImages(_Plain):
    """A worker's stacked batch in one of its slots; sent by ``multiprocessing`` (as the
    DataLoader sends a batch) as the slot, it arrives as a plain tensor over the slot's memory.
    The slot is free again once the receiver drops every view of it, or, if it is never sent,
    once no tensor here uses it."""

    _h5forge_slot: _Sending


class _Sending:
    """A slot's reference and whether the batch in it was pickled to be sent."""

    def __init__(self, ref: SlotRef) -> None:
        self.ref, self.sent = ref, False

    def unsent(self) -> None:
        if not self.sent:
            self.ref.release()


def batch_images(pixels: np.ndarray) -> list[BatchImage]:
    """The images of a batch's N x H x W x C uint8 ``pixels``, as C x H x W views."""
    out: list[BatchImage] = []
    for k, view in enumerate(torch.from_numpy(pixels).permute(0, 3, 1, 2).unbind(0)):
        image = view.as_subclass(BatchImage)
        image._h5forge_read = (pixels, k)
        out.append(image)
    return out


def plain(value: Any) -> Any:
    """``value`` as a plain tensor if it is a :class:`BatchImage` (what ``ds[i]`` returns)."""
    return value.as_subclass(torch.Tensor) if isinstance(value, BatchImage) else value


def _whole(batch: list[Any]) -> np.ndarray | None:
    """The pixels read whose every image ``batch`` is, in order; else None."""
    first = getattr(batch[0], "_h5forge_read", None)
    if first is None or len(batch) != len(first[0]):
        return None
    pixels = first[0]
    for k, image in enumerate(batch):
        got = getattr(image, "_h5forge_read", None)
        if got is None or got[0] is not pixels or got[1] != k:
            return None
    return pixels


def stack_images(batch: list[Any], *, collate_fn_map: Any = None) -> torch.Tensor:
    """``default_collate`` of a list of :class:`BatchImage` (see the module docstring)."""
    from torch.utils.data import get_worker_info
    from torch.utils.data._utils.collate import collate_tensor_fn

    pixels = _whole(batch) if get_worker_info() is not None else None
    got = None if pixels is None else acquire(pixels.nbytes)
    if pixels is None or got is None:
        return collate_tensor_fn([plain(t) for t in batch], collate_fn_map=collate_fn_map)
    array, ref = got
    sending = _Sending(ref)
    weakref.finalize(array, sending.unsent)  # when no tensor here uses the slot's memory
    n, h, w, c = pixels.shape
    out = torch.from_numpy(array).view(n, c, h, w)
    out.copy_(torch.from_numpy(pixels).permute(0, 3, 1, 2))
    stacked = out.as_subclass(SlotImages)
    stacked._h5forge_slot = sending
    return stacked


def _reduce(images: SlotImages) -> tuple[Any, ...]:
    from multiprocessing.reduction import DupFd

    sending = images._h5forge_slot
    sending.sent = True  # from now on the receiver frees the slot
    ref = sending.ref
    return _rebuild, (DupFd(ref.fd), ref.capacity, ref.nbytes, tuple(images.shape))


def _rebuild(dup: Any, capacity: int, nbytes: int, shape: tuple[int, ...]) -> torch.Tensor:
    return mapped(dup, capacity, nbytes).view(*shape)


def _register() -> None:
    """Route lists of :class:`BatchImage` to :func:`stack_images` in ``default_collate``, and
    send :class:`SlotImages` as their slot; without the former (another torch), torch's tensor
    collate stacks them, as any tensors."""
    from torch.multiprocessing.reductions import reduce_tensor

    ForkingPickler.register(SlotImages, _reduce)
    # torch's own reduction of the plain tensor (shared memory), without the attributes
    ForkingPickler.register(BatchImage, lambda t: reduce_tensor(t.as_subclass(torch.Tensor)))
    try:
        from torch.utils.data._utils.collate import default_collate_fn_map
    except ImportError:  # pragma: no cover - torch moved it
        return
    default_collate_fn_map[BatchImage] = stack_images


_register()
