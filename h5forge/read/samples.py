"""The images of file rows: read by byte range (or through HDF5 when filtered), checked, decoded.

Decoded fixed-size samples land in one buffer per batch, one ``pread`` per run of touching
samples locally, few coalesced range requests remotely (:mod:`h5forge.asset.coalesce`);
samples of varying size get a buffer each; encoded ones are decoded lazily, as the caller
iterates. With ``verify_reads`` every sample's sha256 is checked against ``/digests`` as it is
read (:meth:`h5forge.read.state.ProcessState.check`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, cast

import numpy as np
import torch

from h5forge.errors import IntegrityError
from h5forge.read.batches import Batch
from h5forge.read.stacked import batch_images
from h5forge.read.state import ProcessState

__all__ = ["Extra", "fill", "read_batch", "read_images", "read_with_targets"]

#: More byte ranges to read in the same call as the images, and a buffer each (the target
#: columns' values, :meth:`h5forge.read.targets.TargetReads.wanted`): remotely, ranges
#: that lie close together are fetched with one request.
Extra = tuple[list[tuple[int, int]], list[memoryview]]
_NO_EXTRA: Extra = ([], [])
_ROUND = 256 << 10  # the target regions of a batch take a multiple of this


def fill(st: ProcessState, rows: list[int], view: memoryview, extra: Extra = _NO_EXTRA) -> None:
    """Read the fixed-size samples of ``rows``, in order, into the contiguous bytes ``view``
    (and ``extra``'s ranges into its buffers).

    One ``read_into`` for the whole batch: ranges that touch are read with one call.
    """
    idx = st.index
    assert st.reader is not None
    assert idx.image_shape is not None
    size = int(math.prod(idx.image_shape))
    bufs = [view[k * size : (k + 1) * size] for k in range(len(rows))]
    st.reader.read_into(idx.byte_ranges[rows].tolist() + extra[0], bufs + extra[1])
    st.check(bufs, rows)


def read_batch(
    st: ProcessState,
    rows: list[int],
    *,
    slot: bool,
    shared: bool,
    labels: np.ndarray | None = None,
) -> Any:
    """The fixed-size, unfiltered samples of ``rows`` as one :class:`h5forge.read.batches.Batch`
    (pixels and labels in one buffer: one allocation, and one hand-over, per batch); returns
    its :meth:`~h5forge.read.batches.Batch.result`. With target columns (``st.targets``),
    their values are read in the same call, raw masks, boxes and label lists straight into
    regions of the batch's memory, and the batch's second item is the targets
    (:meth:`h5forge.read.targets.Selection.from_columns`). ``labels``: the rows' labels to
    hand out instead of the file's (a shard's, in its version's numbering)."""
    idx = st.index
    labels = idx.labels[rows] if labels is None else labels
    assert idx.image_shape is not None
    n, (h, w) = len(rows), idx.image_shape[:2]
    plan = {} if st.targets is None else st.targets.regions(rows, (h, w))
    sizes = {
        name: -(-int(math.prod(shape)) * dt.itemsize // 8) * 8 for name, (shape, dt) in plan.items()
    }
    # Rounded up: boxes vary in size from batch to batch, and a slot too small by a few bytes
    # would be made anew (faulting in all its pages) instead of reused.
    spare = -(-sum(sizes.values()) // _ROUND) * _ROUND
    batch = Batch(n, idx.image_shape, slot=slot, shared=shared, extra=spare)
    try:
        extra: Extra = _NO_EXTRA
        bufs: dict[str, list[memoryview]] = {}
        # Masks, boxes and label lists are read straight into the batch's memory.
        regions, at = {}, 0
        for name, (shape, dt) in plan.items():
            regions[name] = batch.region(at, shape, dt)
            at += sizes[name]
        if st.targets is not None:
            into = {name: t.numpy() for name, t in regions.items()}
            extra, bufs = st.targets.wanted(rows, into=into)
        fill(st, rows, memoryview(batch.flat.numpy()).cast("B"), extra)  # type: ignore[arg-type]
        batch.labels.numpy()[:] = labels
        if st.targets is None and not st.selection.as_dict:
            return batch.result()
        cols = {} if st.targets is None else st.targets.batch(rows, bufs, regions)
        targets = st.selection.from_columns(labels, cols, [(h, w)] * n, in_worker=shared)
    except BaseException:
        batch.release()
        raise
    return batch.result(targets)


def _targets(
    st: ProcessState, rows: list[int], bufs: dict[str, list[memoryview]], labels: list[int]
) -> list[Any]:
    """Each row's target (:meth:`h5forge.read.targets.Selection.target`) from its label and
    its columns' filled buffers."""
    if st.targets is None:
        return [st.selection.target(y, {}, (0, 0)) for y in labels]
    values = st.targets.values(rows, bufs)
    hw = st.targets.image_hw[rows].tolist()
    return [
        st.selection.target(y, v, (h, w)) for y, v, (h, w) in zip(labels, values, hw, strict=True)
    ]


def read_with_targets(
    st: ProcessState, rows: list[int], *, max_pixels: int, labels: np.ndarray | None = None
) -> tuple[Iterable[Any], list[Any]]:
    """The images of ``rows`` (:func:`read_images`, as :meth:`Selection.image
    <h5forge.read.targets.Selection.image>` hands them out) and their targets, the target
    columns read in the same call as the images; ``labels`` as for :func:`read_batch`."""
    extra, bufs = (_NO_EXTRA, {}) if st.targets is None else st.targets.wanted(rows)
    images = read_images(st, rows, max_pixels=max_pixels, extra=extra)
    found = st.index.labels[rows] if labels is None else labels
    targets = _targets(st, rows, bufs, found.tolist())
    return (st.selection.image(image) for image in images), targets


def read_images(
    st: ProcessState, rows: list[int], *, max_pixels: int, extra: Extra = _NO_EXTRA
) -> Iterable[Any]:
    """The images of ``rows`` as uint8 C x H x W tensors (views of H x W x C pixels);
    ``extra``'s ranges are read into its buffers before this returns.

    Encoded images are decoded lazily, as the caller iterates: each is transformed (and
    usually shrunk) before the next is decoded, instead of a batch of full-size images
    living at once (64 x 560 KB at 500x375, well past the CPU caches).
    """
    idx = st.index
    if idx.header.storage == "array" and not idx.filtered:
        assert idx.image_shape is not None
        # The whole batch lands in one array.
        batch = np.empty((len(rows), *idx.image_shape), np.uint8)
        fill(st, rows, batch.data.cast("B"), extra)
        return batch_images(batch)  # default_collate stacks them in a reused slot
    arrays = _read_arrays(st, rows, max_pixels=max_pixels, extra=extra)
    return (torch.from_numpy(a).permute(2, 0, 1) for a in arrays)


def _read_arrays(
    st: ProcessState, rows: list[int], *, max_pixels: int, extra: Extra
) -> Iterable[np.ndarray]:
    idx = st.index
    if idx.filtered:
        if extra[0]:
            assert st.reader is not None, "a file with target columns has a range reader"
            st.reader.read_into(*extra)
        arrays = []
        for r in rows:
            try:
                arrays.append(np.ascontiguousarray(st.images[r]))
            except OSError as e:  # fletcher32 mismatch, or the codec rejects the chunk
                if st.opened.failure is not None:  # no: the store failed the read
                    raise st.opened.failure from e
                raise IntegrityError(
                    f"{st.url}: sample {r} cannot be read ({e}): its chunk fails its "
                    "checksum (fletcher32) or does not decompress; the file is corrupt — "
                    "re-fetch it or run `h5forge verify`"
                ) from e
        st.check([a.data for a in arrays], rows)
        return arrays
    assert st.reader is not None
    ranges = idx.byte_ranges[rows].tolist()
    raw = [bytearray(n) for _, n in ranges]
    bufs = [memoryview(b) for b in raw]
    st.reader.read_into(ranges + extra[0], bufs + extra[1])
    st.check(bufs, rows)
    assert idx.shapes is not None
    if idx.header.layout == "decoded":
        return [
            np.frombuffer(b, np.uint8).reshape(tuple(idx.shapes[r]))
            for b, r in zip(raw, rows, strict=True)
        ]
    from h5forge.preprocess.images import Encoding, decode_stored

    return (
        decode_stored(
            memoryview(b),
            tuple(int(x) for x in idx.shapes[r]),
            layout="encoded",
            encoding=cast(Encoding, idx.header.encoding),
            mode=idx.header.mode,
            max_pixels=max_pixels,
        )
        for b, r in zip(raw, rows, strict=True)
    )
