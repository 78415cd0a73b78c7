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
A worker whose slots are all held (a consumer that keeps many batches) falls back to a fresh
shared-memory tensor per batch, as torch does, so correctness never depends on the consumer.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import weakref
from typing import Any

import numpy as np
import torch

from h5forge.platforms import require_calls
from h5forge.read.ragged import Ragged, unpack

__all__ = [
    "Batch",
    "SlotBatch",
    "InSlot",
    "SlotRef",
    "acquire",
    "make_batch",
    "mapped",
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
        require_calls("loader()'s reusable batch slots", "memfd_create")
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
    pickled the usual way (tensors through shared memory) but for the tensors in the slot's
    extra region (:meth:`Batch.region`), which travel as their place in the slot."""

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


class InSlot:
    """Where a tensor of a batch's targets lies in its slot: byte ``offset`` into the slot's
    data, ``shape`` and numpy ``dtype`` (what a :class:`SlotBatch` pickles instead of the
    tensor); with ``ragged`` (a :class:`~h5forge.read.ragged.Ragged` of those rows), its
    kind, counts and canvas sizes, unpacked on arrival."""

    def __init__(
        self, offset: int, shape: tuple[int, ...], dtype: np.dtype, ragged: tuple[Any, ...] = ()
    ) -> None:
        self.offset, self.shape, self.dtype, self.ragged = offset, shape, dtype, ragged


def _placed(targets: Any, regions: list[tuple[torch.Tensor, InSlot]]) -> Any:
    """``targets`` (a value, or a dict of values) with its slot regions as :class:`InSlot`."""

    def place(value: Any) -> Any:
        if isinstance(value, Ragged):
            where = next((w for t, w in regions if value.rows is t), None)
            if where is None:
                return value
            ragged = (value.kind, value.counts, value.canvas)
            return InSlot(where.offset, where.shape, where.dtype, ragged)
        return next((where for t, where in regions if value is t), value)

    if isinstance(targets, dict):
        return {k: place(v) for k, v in targets.items()}
    return place(targets)


def _unplaced(targets: Any, flat: torch.Tensor) -> Any:
    def view(value: Any) -> Any:
        if not isinstance(value, InSlot):
            return value
        t = _region(flat, value.offset, value.shape, value.dtype)
        if value.ragged:
            kind, counts, canvas = value.ragged
            return unpack(kind, t, counts, canvas)
        return t

    if isinstance(targets, dict):
        return {k: view(v) for k, v in targets.items()}
    return view(targets)


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


def _region(flat: torch.Tensor, at: int, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
    end = at + math.prod(shape) * dtype.itemsize
    return flat[at:end].view(_TORCH[dtype.str[1:]]).view(*shape)


_TORCH = {"u1": torch.uint8, "i4": torch.int32, "f4": torch.float32}


def _free(mapping: mmap.mmap) -> None:
    if not mapping.closed:
        mapping[0] = 0


def mapped(dup: Any, capacity: int, nbytes: int) -> torch.Tensor:
    """A worker's slot (``dup``: its descriptor) as a flat uint8 tensor, until no view is left."""
    fd = dup.detach()
    try:
        mapping = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED)
    finally:
        os.close(fd)
    array = np.frombuffer(mapping, np.uint8, nbytes, _HEADER)
    weakref.finalize(array, _free, mapping)  # torch dropped the buffer: the slot is free
    return torch.frombuffer(array, dtype=torch.uint8)


def _rebuild(
    dup: Any, capacity: int, nbytes: int, layout: tuple[tuple[int, ...], int, int], *targets: Any
) -> list[Any]:
    flat = mapped(dup, capacity, nbytes)
    images, labels = views(flat, layout)
    return [images, _unplaced(targets[0], flat) if targets else labels]


def views(
    flat: torch.Tensor, layout: tuple[tuple[int, ...], int, int]
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(images N x C x H x W channels-last, labels int64)`` over one flat uint8 buffer."""
    shape, label_at, n = layout
    pixels = math.prod(shape)
    images = flat[:pixels].view(*shape).permute(0, 3, 1, 2)
    return images, flat[label_at : label_at + 8 * n].view(torch.int64)


class Batch:
    """The memory of one batch: ``images`` (N x C x H x W, channels-last) and int64 ``labels``
    over one buffer, so a worker hands one buffer over. In a free slot when ``slot`` and one
    is free, else in new shared memory when ``shared`` (a DataLoader worker), else ordinary
    memory. Fill ``images``/``labels`` (and the regions of ``extra`` bytes after them,
    :meth:`region`), then return :meth:`result` (or :meth:`release` on failure)."""

    def __init__(
        self, n: int, hwc: tuple[int, ...], *, slot: bool, shared: bool, extra: int = 0
    ) -> None:
        label_at = -(-n * int(math.prod(hwc)) // 8) * 8  # int64 labels start 8-byte aligned
        self.layout = ((n, *hwc), label_at, n)
        self._extra_at = nbytes = label_at + 8 * n
        nbytes += extra
        self._regions: list[tuple[torch.Tensor, InSlot]] = []
        got = acquire(nbytes) if slot else None
        self.ref = got[1] if got is not None else None
        if got is not None:
            self.flat = torch.from_numpy(got[0])
        elif shared:
            self.flat = shared_tensor(nbytes)
        else:
            self.flat = torch.empty(nbytes, dtype=torch.uint8)
        self.images, self.labels = views(self.flat, self.layout)

    def region(self, offset: int, shape: tuple[int, ...], dtype: np.dtype) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` at byte ``offset`` (8-byte aligned) of the
        ``extra`` bytes, to fill and hand out among the targets (alone, in a dict, or as the
        rows of a :class:`~h5forge.read.ragged.Ragged`): from a slot it travels as its place
        in the slot."""
        at = self._extra_at + offset
        t = _region(self.flat, at, shape, dtype)
        self._regions.append((t, InSlot(at, shape, dtype)))
        return t

    def release(self) -> None:
        """Give the slot back: the batch will not be sent."""
        if self.ref is not None:
            self.ref.release()

    def result(self, targets: Any = _LABELS) -> Any:
        """A :class:`SlotBatch` when in a slot, else the pair ``(images, labels)``; with
        ``targets``, they are the second item instead of the labels."""
        if self.ref is None:
            return self.images, self.labels if targets is _LABELS else targets
        batch = make_batch(self.images, self.labels, self.ref, self.layout, targets)
        if batch.has_targets:  # what pickles: the regions as their place in the slot
            batch.targets = _placed(targets, self._regions)
        return batch
