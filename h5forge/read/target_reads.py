"""The target columns one process reads: their small index, checked at open, and each sample's
value read by byte range beside its image.

A file someone else wrote is untrusted, so :class:`TargetReads` checks, before any sample is
read, what :class:`h5forge.targets.columns.Columns` relies on: datasets of the declared shapes
and dtypes, ``values`` contiguous and unfiltered (one byte range per sample), offsets from 0
to ``len(values)`` without going back, every range inside the file and within the column's
bounds, masks of their image's size. Each value read is checked again as it is decoded (class
indices, finite boxes, UTF-8), and with ``verify_reads`` against its column's ``digests``: a
damaged file is an :class:`~h5forge.errors.IntegrityError` naming the column and the sample,
never a wrong target.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np

from h5forge.asset.open import H5_DAMAGE
from h5forge.errors import IntegrityError
from h5forge.targets.columns import Columns
from h5forge.targets.schema import MAX_BOXES, MAX_TEXT_BYTES, Column
from h5forge.targets.store import GROUP, decode_value

__all__ = ["TargetReads"]

_VALUES = {"multilabel": "int32", "boxes": "float32", "mask": "uint8", "text": "uint8"}


def _damaged(where: str, what: str) -> IntegrityError:
    return IntegrityError(
        f"{where}: {what}; the file is damaged or not written by h5forge — re-fetch or re-pack it"
    )


class TargetReads:
    """The columns ``columns`` of an open file, ready to be read by byte range.

    Args:
        h5: the open file (only read here; nothing is kept open).
        columns: the columns to read (from the file's schema).
        num_samples: the file's sample count.
        file_size: its size in bytes.
        image_hw: ``(N, 2)`` (H, W) of each stored image (a mask must be of its size).
        want_digests: load each column's ``digests`` for ``verify_reads``.
        where: the file, for messages.

    Raises:
        IntegrityError: a column's datasets break the layout (the message says which).
    """

    def __init__(
        self,
        h5: h5py.File,
        columns: Sequence[Column],
        *,
        num_samples: int,
        file_size: int,
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
        try:
            for c in self.columns:
                self._check_datasets(h5, c, num_samples)
            cols = Columns(h5, self.columns)
            for c in self.columns:
                self._load(h5, cols, c, num_samples, file_size, image_hw, want_digests)
        except IntegrityError:
            raise
        except H5_DAMAGE as e:
            raise _damaged(where, f"/{GROUP} cannot be read ({type(e).__name__}: {e})") from e

    def _check_datasets(self, h5: h5py.File, c: Column, n: int) -> None:
        at = f"/{GROUP}/{c.name}"
        group = h5.get(f"{GROUP}/{c.name}")
        if not isinstance(group, h5py.Group):
            raise _damaged(self.where, f"the schema names column {c.name!r} but {at} is missing")
        want: dict[str, tuple[str, tuple[int, ...] | None]] = {
            "values": (c.dtype or "", (n,)) if c.kind == "number" else (_VALUES[c.kind], None),
            "digests": ("uint8", (n, 32)),
        }
        if c.kind != "number":
            want["offsets"] = ("uint64", (n + 1,))
        if c.kind == "mask":
            want["shapes"] = ("uint32", (n, 2))
        for name, (dtype, shape) in want.items():
            d = group.get(name)
            if not isinstance(d, h5py.Dataset) or d.dtype != np.dtype(dtype):
                raise _damaged(self.where, f"{at}/{name} is missing or not {dtype}")
            if shape is not None and d.shape != shape:
                raise _damaged(self.where, f"{at}/{name} has shape {d.shape}, expected {shape}")
        values = group["values"]
        rows = (6,) if c.kind == "boxes" else ()
        if values.ndim != 1 + len(rows) or values.shape[1:] != rows:
            raise _damaged(self.where, f"{at}/values has shape {values.shape}")
        layout = values.id.get_create_plist().get_layout()
        if values.size and (layout != h5py.h5d.CONTIGUOUS or values.compression is not None):
            raise _damaged(self.where, f"{at}/values is not stored contiguous and unfiltered")

    def _load(
        self,
        h5: h5py.File,
        cols: Columns,
        c: Column,
        n: int,
        file_size: int,
        image_hw: np.ndarray,
        want_digests: bool,
    ) -> None:
        at = f"/{GROUP}/{c.name}"
        if c.kind != "number":
            off = h5[f"{at}/offsets"][()]
            if n and (off[0] != 0 or (np.diff(off.astype(np.int64)) < 0).any()):
                raise _damaged(self.where, f"{at}/offsets go back or do not start at 0")
            if int(off[-1]) != h5[f"{at}/values"].shape[0]:
                raise _damaged(self.where, f"{at}/offsets end at {int(off[-1])}, not len(values)")
        ranges = cols.ranges(c.name).astype(np.int64)
        if n and int((ranges[:, 0] + ranges[:, 1]).max()) > file_size:
            raise _damaged(self.where, f"{at}/values lie beyond the end of the file")
        counts = ranges[:, 1]
        bound = {"boxes": MAX_BOXES * 24, "text": MAX_TEXT_BYTES}.get(c.kind)
        if c.kind == "multilabel":
            bound = 4 * len(c.classes)
        if bound is not None and n and int(counts.max()) > bound:
            k = int(np.argmax(counts))
            raise _damaged(self.where, f"{at}[{k}] holds {int(counts[k])} bytes, over {bound}")
        if c.kind == "mask":
            shapes = cols.shapes[c.name].astype(np.int64)
            bad = np.flatnonzero((shapes != image_hw).any(axis=1))
            if len(bad):
                k = int(bad[0])
                raise _damaged(
                    self.where,
                    f"{at}/shapes[{k}] is {shapes[k].tolist()}, its image is "
                    f"{image_hw[k].tolist()} (H, W)",
                )
            if c.encoding == "raw" and (counts != shapes[:, 0] * shapes[:, 1]).any():
                raise _damaged(self.where, f"{at}: a raw mask's bytes differ from H x W")
            self.shapes[c.name] = shapes
        self.ranges[c.name] = ranges
        if want_digests:
            self.digests[c.name] = h5[f"{at}/digests"][()]

    def wanted(
        self, rows: Sequence[int]
    ) -> tuple[tuple[list[tuple[int, int]], list[memoryview]], list[memoryview]]:
        """The byte ranges of ``rows`` in every column (column by column) with a buffer each,
        to read in the same call as their images (so remote requests coalesce): ``((ranges,
        buffers), every buffer)``, the first without the empty values (nothing to read)."""
        ranges: list[tuple[int, int]] = []
        for c in self.columns:
            ranges += [(int(a), int(b)) for a, b in self.ranges[c.name][list(rows)]]
        bufs = [memoryview(bytearray(b)) for _, b in ranges]
        read = [k for k, (_, b) in enumerate(ranges) if b]
        return ([ranges[k] for k in read], [bufs[k] for k in read]), bufs

    def values(self, rows: Sequence[int], bufs: Sequence[memoryview]) -> list[dict[str, Any]]:
        """Each row's values (numpy or Python, :func:`h5forge.targets.store.decode_value`),
        from every buffer :meth:`wanted` gave, filled.

        Raises:
            IntegrityError: a value does not decode, breaks its column's rules, or (with
                ``verify_reads``) differs from its digest.
        """
        out: list[dict[str, Any]] = [{} for _ in rows]
        k = 0
        for c in self.columns:
            digests = self.digests.get(c.name)
            for j, r in enumerate(rows):
                buf = bufs[k]
                k += 1
                if digests is not None and hashlib.sha256(buf).digest() != bytes(digests[r]):
                    raise IntegrityError(
                        f"{self.where}: /{GROUP}/{c.name}[{r}] read back with sha256 "
                        f"{hashlib.sha256(buf).hexdigest()}, the file records "
                        f"{bytes(digests[r]).hex()}; the file is corrupt — re-fetch it or run "
                        "`h5forge verify`"
                    )
                out[j][c.name] = self._decode(c, r, buf)
        return out

    def _decode(self, c: Column, r: int, buf: memoryview) -> Any:
        shape = self.shapes[c.name][r] if c.kind == "mask" else None
        try:
            value = decode_value(c, buf, shape)
        except (ValueError, TypeError) as e:  # UnicodeDecodeError and a bad PNG are ValueErrors
            raise _damaged(self.where, f"/{GROUP}/{c.name}[{r}] does not decode ({e})") from e
        if (
            c.kind == "multilabel"
            and len(value)
            and (value.min() < 0 or value.max() >= len(c.classes))
        ):
            raise _damaged(
                self.where,
                f"/{GROUP}/{c.name}[{r}] holds a class index outside 0..{len(c.classes) - 1}",
            )
        if c.kind == "boxes" and len(value):
            cls, crowd = value[:, 4], value[:, 5]
            bad = (
                ~np.isfinite(value[:, :4]).all(axis=1)
                | (value[:, 2] < value[:, 0])
                | (value[:, 3] < value[:, 1])
                | (cls < 0)
                | (cls >= len(c.classes))
                | (cls != np.floor(cls))
                | ((crowd != 0) & (crowd != 1))
            )
            if bad.any():
                raise _damaged(
                    self.where,
                    f"/{GROUP}/{c.name}[{r}] box {int(np.argmax(bad))} "
                    f"is {value[int(np.argmax(bad))].tolist()}, not a valid box",
                )
        return value
