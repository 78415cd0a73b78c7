"""Hand whole batches from DataLoader workers to the main process without fresh shared memory.

A tensor a worker returns reaches the main process through shared memory. torch allocates a
new shared-memory file for every batch (``default_collate`` does it too), and the first touch
of each page of a new shared-memory file is a page fault that allocates and zeroes it: for a
64 x 224 x 224 x 3 batch that costs ~6 ms per batch on the machine of benchmarks/RESULTS.md,
four times the ``preadv`` that fills it. So :meth:`h5forge.H5ImageDataset.loader` workers
read each batch into one of a few **slots** they keep and reuse — ``memfd`` files whose pages
were faulted in once — and send the slot's descriptor; the main process maps it and wraps it
as tensors with ``torch.frombuffer``, copying nothing.

A slot is reused only after the main process let go of the batch: the first byte of each slot
is a busy flag, set by the worker when it fills the slot and cleared by a ``weakref.finalize``
on the buffer the tensors were made from. torch keeps that buffer alive as long as any tensor
or view of the batch lives, so the flag clears only when no tensor can see the slot any more.
A worker whose slots are all still held (a consumer that keeps many batches) falls back to a
fresh shared-memory tensor per batch, as torch would do, so correctness never depends on the
consumer.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import weakref
from typing import Any

import numpy as np
import torch

__all__ = [
    "Batch",
    "SlotBatch",
    "SlotRef",
    "acquire",
    "check_one_size",
    "collate",
    "collect",
    "make_batch",
    "send_batch",
    "shared_tensor",
    "views",
]

_HEADER = 64  # busy flag, then padding: the pixels start cache-line aligned
_MAX_SLOTS = 6  # per worker: prefetch_factor (2) results in flight, one filling, the consumer's two


def shared_tensor(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of ``nbytes`` in new shared memory (what torch's collate allocates)."""
    storage = torch.UntypedStorage._new_shared(nbytes)
    return torch.empty(0, dtype=torch.uint8).set_(storage)


class _Slot:
    def __init__(self, capacity: int) -> None:
        self.fd = os.memfd_create("h5forge-batch", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, capacity)
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self.map = mmap.mmap(self.fd, capacity, flags=flags)
        except BaseException:
            os.close(self.fd)
            raise
        self.capacity = capacity

    @property
    def busy(self) -> bool:
        return self.map[0] != 0


class _Pool:
    """The slots of one worker process."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slots: list[_Slot] = []


_pool: _Pool | None = None


def acquire(nbytes: int) -> tuple[np.ndarray, SlotRef] | None:
    """A free slot of at least ``nbytes`` as a writable uint8 array, marked busy; None when
    slots are not available here (no ``memfd``) or all are held by the consumer."""
    global _pool
    if not hasattr(os, "memfd_create"):
        return None
    if _pool is None or _pool.pid != os.getpid():
        _pool = _Pool()
    need = _HEADER + nbytes
    slot = next((s for s in _pool.slots if not s.busy and s.capacity >= need), None)
    if slot is None:
        if len(_pool.slots) >= _MAX_SLOTS:
            idle = next((s for s in _pool.slots if not s.busy), None)
            if idle is None:
                return None
            _pool.slots.remove(idle)  # too small for this batch: make room for a bigger one
            with contextlib.suppress(BufferError):  # still referenced here: the GC unmaps it
                idle.map.close()
            os.close(idle.fd)
        try:
            slot = _Slot(need)
        except OSError:
            return None
        _pool.slots.append(slot)
    slot.map[0] = 1
    array = np.frombuffer(slot.map, np.uint8, nbytes, _HEADER)
    return array, SlotRef(slot, nbytes)


class SlotRef:
    """Which slot a batch is in (pickled as the slot's descriptor)."""

    def __init__(self, slot: _Slot, nbytes: int) -> None:
        self.fd, self.capacity, self.nbytes = slot.fd, slot.capacity, nbytes
        self._map = slot.map

    def release(self) -> None:
        """Give the slot back without sending it (the batch failed)."""
        self._map[0] = 0


class SlotBatch(tuple):
    """``(images, labels)`` living in a slot: pickles as the slot, unpickles as
    ``[images, labels]`` over the slot's memory (what torch's ``default_convert`` makes of a
    pair). With ``targets`` (``has_targets``), the second item is those instead of the labels,
    pickled the usual way (tensors through shared memory)."""

    ref: SlotRef
    layout: tuple[tuple[int, ...], int, int]  # (N, H, W, C), label offset, label count
    has_targets: bool = False
    targets: Any = None

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing.reduction import DupFd

        fd = DupFd(self.ref.fd)
        return _rebuild, (fd, self.ref.capacity, self.ref.nbytes, self.layout, *self._targets())

    def _targets(self) -> tuple[Any, ...]:
        return (self.targets,) if self.has_targets else ()


_LABELS: Any = object()  # Batch.result's default: the labels are the batch's second item


def make_batch(
    images: torch.Tensor,
    labels: torch.Tensor,
    ref: SlotRef,
    layout: tuple[tuple[int, ...], int, int],
    targets: Any = _LABELS,
) -> SlotBatch:
    has_targets = targets is not _LABELS
    batch = SlotBatch((images, targets if has_targets else labels))
    batch.ref, batch.layout = ref, layout
    batch.has_targets, batch.targets = has_targets, targets if has_targets else None
    return batch


def _free(mapping: mmap.mmap) -> None:
    if not mapping.closed:
        mapping[0] = 0


def _rebuild(
    dup: Any, capacity: int, nbytes: int, layout: tuple[tuple[int, ...], int, int], *targets: Any
) -> list[Any]:
    fd = dup.detach()
    try:
        mapping = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    array = np.frombuffer(mapping, np.uint8, nbytes, _HEADER)
    # Runs when torch drops the buffer: no tensor of this batch is left, the slot is free.
    weakref.finalize(array, _free, mapping)
    images, labels = views(torch.frombuffer(array, dtype=torch.uint8), layout)
    return [images, targets[0] if targets else labels]


def views(
    flat: torch.Tensor, layout: tuple[tuple[int, ...], int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images N x C x H x W channels-last, labels int64)`` over one flat uint8 buffer."""
    shape, label_at, n = layout
    pixels = int(np.prod(shape))
    images = flat[:pixels].view(*shape).permute(0, 3, 1, 2)
    return images, flat[label_at : label_at + 8 * n].view(torch.int64)


class Batch:
    """The memory of one batch: ``images`` (N x C x H x W, channels-last) and int64 ``labels``
    over one buffer, so a worker hands one buffer over. In a free slot when ``slot`` and one
    is free, else in new shared memory when ``shared`` (a DataLoader worker), else ordinary
    memory. Fill ``images``/``labels``, then return :meth:`result` (or :meth:`release` on
    failure)."""

    def __init__(self, n: int, hwc: tuple[int, ...], *, slot: bool, shared: bool) -> None:
        label_at = -(-n * int(np.prod(hwc)) // 8) * 8  # int64 labels start 8-byte aligned
        self.layout = ((n, *hwc), label_at, n)
        nbytes = label_at + 8 * n
        got = acquire(nbytes) if slot else None
        self.ref = got[1] if got is not None else None
        if got is not None:
            self.flat = torch.from_numpy(got[0])
        elif shared:
            self.flat = shared_tensor(nbytes)
        else:
            self.flat = torch.empty(nbytes, dtype=torch.uint8)
        self.images, self.labels = views(self.flat, self.layout)

    def release(self) -> None:
        """Give the slot back: the batch will not be sent."""
        if self.ref is not None:
            self.ref.release()

    def result(self, targets: Any = _LABELS) -> Any:
        """A :class:`SlotBatch` when in a slot, else the pair ``(images, labels)``; with
        ``targets``, they are the second item instead of the labels."""
        if self.ref is None:
            return self.images, self.labels if targets is _LABELS else targets
        return make_batch(self.images, self.labels, self.ref, self.layout, targets)


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
    """The loader's collate function: a :class:`SlotBatch` leaves the worker as its slot;
    anything else goes through torch's ``default_convert`` as usual."""
    if isinstance(batch, SlotBatch):
        return batch
    from torch.utils.data import default_convert

    return default_convert(batch)


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
