"""The target columns one process reads: their small index, checked at open, and each sample's
value read by byte range beside its image.

A file someone else wrote is untrusted: its layout is checked at open, with its index
(:mod:`h5forge.asset.target_layout`), and each value read is checked as it is decoded (class
indices, finite boxes, UTF-8), and with ``verify_reads`` against its column's ``digests``: a
damaged file is an :class:`~h5forge.errors.IntegrityError` naming the column and the sample,
never a wrong target.

Small columns stay in memory: a boxes, multilabel, text or number column whose ``values`` hold
at most :data:`RESIDENT_BYTES` is read whole at open (one read), and its samples are then
sliced from memory, costing no read at all (a box list is ~100 bytes: a read each would cost
more than its bytes). Masks, and larger columns, are read by range with their images.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np

from h5forge.asset.open import H5_DAMAGE
from h5forge.errors import IntegrityError
from h5forge.read.target_checks import VALUES, bad_row, damaged
from h5forge.targets.columns import Columns
from h5forge.targets.schema import Column
from h5forge.targets.store import GROUP, decode_value

__all__ = ["RESIDENT_BYTES", "TargetReads"]

#: A column whose values are at most this large is held in memory by each reading process.
RESIDENT_BYTES = 8 << 20


class TargetReads:
    """The columns ``columns`` of an open file, ready to be read by byte range.

    The file's layout was checked when its index was loaded
    (:func:`h5forge.asset.target_layout.check_target_layout`: the datasets, offsets, ranges
    inside the file, the bounds, masks of their image's size), so here only the small index
    of each column is kept: its byte ranges, mask shapes, and ``digests`` for
    ``verify_reads``.

    Args:
        h5: the open file (only read here; nothing is kept open).
        columns: the columns to read (from the file's schema).
        image_hw: ``(N, 2)`` (H, W) of each stored image (a box's canvas).
        want_digests: load each column's ``digests`` for ``verify_reads``.
        where: the file, for messages.

    Raises:
        IntegrityError: HDF5 cannot read a column's index.
    """

    def __init__(
        self,
        h5: h5py.File,
        columns: Sequence[Column],
        *,
        image_hw: np.ndarray,
        want_digests: bool,
        where: str,
    ) -> None:
        self.where = where
        self.columns = tuple(columns)
        self.image_hw = image_hw
        self.ranges: dict[str, np.ndarray] = {}
        self.shapes: dict[str, np.ndarray] = {}
        self.digests: dict[str, np.ndarray] = {}
        self.resident: dict[str, tuple[memoryview, int]] = {}  # values' bytes, file offset
        self.clean: set[str] = set()  # columns held in memory whose every row was checked
        try:
            cols = Columns(h5, self.columns)
            for c in self.columns:
                at = f"{GROUP}/{c.name}"
                ranges = self.ranges[c.name] = cols.ranges(c.name).astype(np.int64)
                if c.kind == "mask":
                    self.shapes[c.name] = cols.shapes[c.name].astype(np.int64)
                values = h5[f"{at}/values"]
                counts = ranges[:, 1]
                if c.kind != "mask" and values.nbytes <= RESIDENT_BYTES and counts.any():
                    base = int(ranges[counts > 0, 0].min())
                    whole = np.ascontiguousarray(values[()])
                    blob = whole.reshape(-1).view(np.uint8)
                    self.resident[c.name] = (blob.data, base)
                    if bad_row(c, whole) is None:  # then no batch of it checks again
                        self.clean.add(c.name)
                if want_digests:
                    self.digests[c.name] = h5[f"{at}/digests"][()]
        except H5_DAMAGE as e:
            raise damaged(where, f"/{GROUP} cannot be read ({type(e).__name__}: {e})") from e

    def wanted(
        self, rows: Sequence[int], into: dict[str, np.ndarray] | None = None
    ) -> tuple[tuple[list[tuple[int, int]], list[memoryview]], dict[str, list[memoryview]]]:
        """The byte ranges of ``rows`` to read, in every column not held in memory, with a
        buffer each, to read in the same call as their images (so remote requests coalesce):
        ``((ranges, buffers), {column: a buffer per row})`` (those of the columns in memory
        already filled). ``into``: columns read straight into these arrays (:meth:`regions`);
        a column in memory gathered into one has no per-row buffers unless they are to be
        checked against digests."""
        ranges: list[tuple[int, int]] = []
        to_fill: list[memoryview] = []
        bufs: dict[str, list[memoryview]] = {}
        for c in self.columns:
            spans = self.ranges[c.name][list(rows)]
            target = None if into is None else into.get(c.name)
            held = self.resident.get(c.name)
            if held is not None:  # sliced from memory
                blob, base = held
                if target is not None:  # one gather of every row (a box, a label index)
                    # the layout check made every range whole rows from the values' start
                    unit = target.dtype.itemsize * math.prod(target.shape[1:])
                    held_rows = np.frombuffer(blob, target.dtype).reshape(-1, *target.shape[1:])
                    starts, counts = (spans[:, 0] - base) // unit, spans[:, 1] // unit
                    ends = np.cumsum(counts)
                    at = np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(
                        ends - counts - starts, counts
                    )
                    np.take(held_rows, at, axis=0, out=target)
                    if c.name not in self.digests:
                        continue
                bufs[c.name] = [blob[a - base : a - base + n] for a, n in spans.tolist()]
                continue
            mine = [(int(a), int(n)) for a, n in spans.tolist()]
            if target is None:
                mbufs = [memoryview(bytearray(n)) for _, n in mine]
            elif c.kind == "mask":
                mbufs = [memoryview(m).cast("B") for m in target]
            else:  # the rows of every sample back to back
                whole, at, mbufs = target.reshape(-1).view(np.uint8).data, 0, []
                for _, n in mine:
                    mbufs.append(whole[at : at + n])
                    at += n
            bufs[c.name] = mbufs
            for r, m in zip(mine, mbufs, strict=True):
                if r[1]:
                    ranges.append(r)
                    to_fill.append(m)
        return (ranges, to_fill), bufs

    def regions(self, rows: Sequence[int], hw: tuple[int, int]) -> dict[str, tuple[Any, ...]]:
        """``name -> (shape, dtype)`` of the columns whose values a batch can hold in one
        array, filled by the read itself: raw masks ``(B, H, W) uint8``, the rows of every
        sample's boxes ``(sum M, 6) float32`` and multilabel indices ``(sum k,) int32``."""
        out: dict[str, tuple[Any, ...]] = {}
        for c in self.columns:
            if c.kind == "mask" and c.encoding == "raw":
                out[c.name] = ((len(rows), *hw), np.dtype(np.uint8))
            elif c.kind in ("boxes", "multilabel"):
                dtype = np.dtype(VALUES[c.kind])
                total = int(self.ranges[c.name][list(rows), 1].sum()) // dtype.itemsize
                out[c.name] = ((total // 6, 6) if c.kind == "boxes" else (total,), dtype)
        return out

    def _checked(self, c: Column, rows: Sequence[int], bufs: Sequence[memoryview]) -> None:
        digests = self.digests.get(c.name)
        if digests is None:
            return
        for r, buf in zip(rows, bufs, strict=True):
            got = hashlib.sha256(buf)
            if got.digest() != bytes(digests[r]):
                raise IntegrityError(
                    f"{self.where}: /{GROUP}/{c.name}[{r}] read back with sha256 "
                    f"{got.hexdigest()}, the file records {bytes(digests[r]).hex()}; the file "
                    "is corrupt — re-fetch it or run `h5forge verify`"
                )

    def values(
        self, rows: Sequence[int], bufs: dict[str, list[memoryview]]
    ) -> list[dict[str, Any]]:
        """Each row's values (numpy or Python, :func:`h5forge.targets.store.decode_value`),
        from every buffer :meth:`wanted` gave, filled.

        Raises:
            IntegrityError: a value does not decode, breaks its column's rules, or (with
                ``verify_reads``) differs from its digest.
        """
        out: list[dict[str, Any]] = [{} for _ in rows]
        for c in self.columns:
            mine = bufs[c.name]
            self._checked(c, rows, mine)
            for j, (r, buf) in enumerate(zip(rows, mine, strict=True)):
                out[j][c.name] = self._decode(c, r, buf)
        return out

    def batch(
        self, rows: Sequence[int], bufs: dict[str, list[memoryview]], regions: dict[str, Any]
    ) -> dict[str, Any]:
        """The values of ``rows`` column by column, checked as in :meth:`values`: the columns
        of ``regions`` (:meth:`regions`, tensors already filled by the read) as those, boxes
        and multilabel as ``(rows, counts)`` (rows per sample); number ``(B,)``; other masks
        and text a list."""
        out: dict[str, Any] = {}
        for c in self.columns:
            mine = bufs.get(c.name)
            if mine is not None:
                self._checked(c, rows, mine)
            if c.kind in ("multilabel", "boxes"):
                flat = regions[c.name]
                row = 24 if c.kind == "boxes" else 4
                counts = (self.ranges[c.name][list(rows), 1] // row).tolist()
                bad = None if c.name in self.clean else bad_row(c, flat.numpy())
                if bad is not None:
                    j = int(np.searchsorted(np.cumsum(counts), bad, side="right"))
                    self._refuse(c, rows[j], flat.numpy()[bad])
                out[c.name] = (flat, counts)
            elif c.name in regions:
                out[c.name] = regions[c.name]
            elif c.kind == "number":
                assert mine is not None
                out[c.name] = np.frombuffer(bytearray(b"".join(mine)), np.dtype(c.dtype))
            else:
                assert mine is not None
                out[c.name] = [self._decode(c, r, b) for r, b in zip(rows, mine, strict=True)]
        return out

    def _decode(self, c: Column, r: int, buf: memoryview) -> Any:
        shape = self.shapes[c.name][r] if c.kind == "mask" else None
        try:
            value = decode_value(c, buf, shape)
        except (ValueError, TypeError) as e:  # UnicodeDecodeError and a bad PNG are ValueErrors
            raise damaged(self.where, f"/{GROUP}/{c.name}[{r}] does not decode ({e})") from e
        bad = None if c.name in self.clean else bad_row(c, value)
        if bad is not None:
            self._refuse(c, r, value[bad])
        return value

    def _refuse(self, c: Column, r: int, row: Any) -> None:
        what = (
            f"holds class index {int(row)}, outside 0..{len(c.classes) - 1}"
            if c.kind == "multilabel"
            else f"holds the box {row.tolist()}, not a valid box"
        )
        raise damaged(self.where, f"/{GROUP}/{c.name}[{r}] {what}")
