"""``target=`` of :class:`~h5forge.read.dataset.H5ImageDataset`: what a sample comes with, as
torch values (torchvision ``tv_tensors`` where they apply), and how a batch of them is collated.

``target`` is ``"class"`` (the default: the integer label, as in format version 1), a column's
name, a kind word (``"multilabel"``, ``"boxes"``, ``"mask"``, ``"text"``, ``"number"``: the one
column of that kind; a name wins over a kind word), or a list of those, which gives a dict
``{key: value}`` keyed by ``"class"`` and the column names. What each gives:

==============  ===============================================================================
``class``       ``int``, the label
``multilabel``  ``(len(classes),) float32`` multi-hot (``multilabel="multihot"``, the default;
                what ``BCEWithLogitsLoss`` takes) or ``(k,) int64`` sorted class indices
                (``multilabel="indices"``)
``boxes``       ``{"boxes": (M, 4) float32 XYXY, absolute pixels of the stored image,
                "labels": (M,) int64}`` (the dict torchvision's detection models train on),
                with ``"iscrowd": (M,) uint8`` too when ``iscrowd=True`` (COCO evaluation;
                like the keys of torchvision's ``wrap_dataset_for_transforms_v2``, whose
                default gives boxes and labels and the other keys on request)
``mask``        ``(H, W) uint8`` class ids, the image's size
``text``        ``str``
``number``      ``int`` or ``float`` (the column's dtype)
==============  ===============================================================================

With torchvision importable, ``boxes`` is a ``tv_tensors.BoundingBoxes(format="XYXY",
canvas_size=(H, W))``, a mask a ``tv_tensors.Mask``, and, when a boxes or mask target is asked
for, the image a ``tv_tensors.Image`` (C x H x W), so ``torchvision.transforms.v2`` transforms
``(image, target)`` as is (flips, crops, ``SanitizeBoundingBoxes``). Without torchvision they
are plain tensors of the same shapes.

Batches (``loader()``, ``read_batch``): fixed-size values stack — ``class`` and ``number`` as a
``(B,)`` tensor (int64, or float64 for a float column), multi-hot ``(B, C)``, masks of one size
``(B, H, W)`` (a plain tensor, like the batch's images); variable-length ones are lists of B —
boxes dicts (each a ``BoundingBoxes`` with torchvision), index lists, text, masks of differing
sizes. With a list ``target``, a batch's second item is a dict of these.

Reading them (:class:`TargetReads`): each process keeps the small index of the columns it
reads, checked at open, and reads each sample's value by byte range beside its image.

A file someone else wrote is untrusted: its layout is checked at open, with its index
(:mod:`h5forge.asset.target_layout`), and each value read is checked as it is decoded (class
indices, finite boxes, UTF-8), and with ``verify_reads`` against its column's ``digests``: a
damaged file is an :class:`~h5forge.errors.IntegrityError` naming the column and the sample,
never a wrong target.

Small columns stay in memory: a boxes, multilabel, text or number column whose ``values`` hold
at most :data:`RESIDENT_BYTES` is read whole at open (one read), and its samples are then
sliced from memory, costing no read at all (a box list is ~100 bytes: a read each would cost
more than its bytes). Masks, and larger columns, are read by range with their images.

Values keep their rules as they are read (:func:`bad_row`), one sample or a whole batch at
once: class indices in range, boxes finite and not inverted.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np
import torch

from h5forge.asset.open import H5_DAMAGE
from h5forge.errors import IntegrityError
from h5forge.read.collate import check_one_size
from h5forge.read.ragged import Ragged, unpack
from h5forge.read.tv import tv_tensors
from h5forge.targets.columns import Columns
from h5forge.targets.rules import bad_boxes, bad_labels
from h5forge.targets.schema import KINDS, MAX_COLUMNS, Column
from h5forge.targets.store import GROUP, decode_value

__all__ = [
    "CLASS",
    "MULTILABEL_FORMS",
    "RESIDENT_BYTES",
    "VALUES",
    "Selection",
    "TargetReads",
    "bad_row",
    "damaged",
    "select",
]

CLASS = "class"
MULTILABEL_FORMS = ("multihot", "indices")


@dataclass(frozen=True)
class Selection:
    """What ``target=`` resolved to in one file.

    Attributes:
        keys: ``"class"`` or column names, in the order asked.
        columns: the columns to read (every key but ``"class"``), schema objects.
        as_dict: a list was asked for: each target is a dict keyed by ``keys``.
        multilabel: ``"multihot"`` or ``"indices"``.
        iscrowd: boxes dicts hold ``"iscrowd"`` too.
    """

    keys: tuple[str, ...]
    columns: tuple[Column, ...]
    as_dict: bool
    multilabel: str = "multihot"
    iscrowd: bool = False

    @property
    def spatial(self) -> bool:
        """A boxes or mask column is asked for (the image comes as ``tv_tensors.Image``)."""
        return any(c.kind in ("boxes", "mask") for c in self.columns)

    def _kind(self, key: str) -> str:
        if key == CLASS:
            return CLASS
        kind: str = next(c.kind for c in self.columns if c.name == key)
        return f"multilabel:{self.multilabel}" if kind == "multilabel" else kind

    @property
    def _boxes(self) -> str:
        """The :class:`~h5forge.read.ragged.Ragged` kind of this selection's boxes."""
        return "boxes+iscrowd" if self.iscrowd else "boxes"

    def image(self, image: torch.Tensor) -> Any:
        """The image as this selection hands it out."""
        tv = tv_tensors() if self.spatial else None
        return image if tv is None else tv.Image(image)

    def target(self, label: int, values: dict[str, Any], canvas: tuple[int, int]) -> Any:
        """One sample's target from its label and its columns' decoded values
        (:meth:`h5forge.read.targets.TargetReads.values`); ``canvas`` its image's (H, W)."""
        out = {k: label if k == CLASS else self._value(k, values[k], canvas) for k in self.keys}
        return out if self.as_dict else out[self.keys[0]]

    def _value(self, key: str, value: Any, canvas: tuple[int, int]) -> Any:
        kind = self._kind(key)
        tv = tv_tensors()
        if kind == "multilabel:multihot":
            size = len(next(c for c in self.columns if c.name == key).classes)
            hot = torch.zeros(size, dtype=torch.float32)
            hot[torch.from_numpy(value)] = 1.0
            return hot
        if kind == "multilabel:indices":
            return torch.from_numpy(value)
        if kind == "boxes":  # a batch of one
            return unpack(self._boxes, torch.from_numpy(value), [len(value)], [canvas])[0]
        if kind == "mask":
            mask = torch.from_numpy(value)
            return mask if tv is None else tv.Mask(mask)
        return value  # text: str; number: int or float

    def batch(self, items: Sequence[tuple[Any, Any]], *, url: str) -> tuple[Any, Any]:
        """``(images, targets)`` of samples ``(image, target)``: the images stacked (plain
        tensors; of one size, else a ValueError saying what to do), the targets collated.
        """
        from torch.utils.data import default_collate

        images = [image for image, _ in items]
        check_one_size(images, url=url)
        if all(isinstance(image, torch.Tensor) for image in images):
            images = [image.as_subclass(torch.Tensor) for image in images]
        return default_collate(images), self.collate([t for _, t in items])

    def from_columns(
        self,
        labels: np.ndarray,
        cols: dict[str, Any],
        canvas: list[tuple[int, int]],
        *,
        in_worker: bool,
    ) -> Any:
        """A batch of targets, as :meth:`collate` would make it, from the columns in one
        piece each (:meth:`h5forge.read.targets.TargetReads.batch`): the batch's values
        are converted with a few whole-batch operations instead of one per sample. Inside a
        worker, boxes and index lists are :class:`~h5forge.read.ragged.Ragged` (one tensor
        to send; a list again on arrival)."""
        out: dict[str, Any] = {}
        for key in self.keys:
            kind = self._kind(key)
            value: Any = cols.get(key)
            if kind == CLASS:
                out[key] = torch.from_numpy(np.asarray(labels, np.int64))
            elif kind == "number":
                out[key] = torch.from_numpy(value)
            elif kind == "multilabel:multihot":
                flat, counts = value
                size = len(next(c for c in self.columns if c.name == key).classes)
                hot = torch.zeros(len(counts), size, dtype=torch.float32)
                which = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
                hot[which, flat.to(torch.int64)] = 1.0
                out[key] = hot
            elif kind in ("multilabel:indices", "boxes"):
                rows, counts = value  # a region of the batch's memory
                name = self._boxes if kind == "boxes" else "indices"
                out[key] = (
                    Ragged(name, rows, counts, canvas)
                    if in_worker
                    else unpack(name, rows, counts, canvas)
                )
            elif kind == "mask" and isinstance(value, torch.Tensor):
                out[key] = value  # read straight into the batch's (B, H, W) tensor
            elif kind == "mask":
                out[key] = _batch(kind, [torch.from_numpy(v) for v in value])
            else:
                out[key] = value  # text: a list of str
        return out if self.as_dict else out[self.keys[0]]

    def collate(self, targets: Sequence[Any]) -> Any:
        """A batch of targets (see the module docstring)."""
        if not self.as_dict:
            return _batch(self._kind(self.keys[0]), list(targets))
        return {k: _batch(self._kind(k), [t[k] for t in targets]) for k in self.keys}


def _batch(kind: str, values: list[Any]) -> Any:
    from torch.utils.data import default_collate

    if kind in (CLASS, "number", "multilabel:multihot"):
        try:
            return default_collate(values)
        except (TypeError, RuntimeError):  # a target_transform made them of differing shapes
            return values
    tensors = all(isinstance(v, torch.Tensor) for v in values)
    if kind == "mask" and tensors and len({tuple(v.shape) for v in values}) == 1:
        # in shared memory inside a worker; a plain tensor, as the batch's images
        return default_collate([v.as_subclass(torch.Tensor) for v in values])
    return values


def _describe(schema: Sequence[Column]) -> str:
    return ", ".join(f"{c.name!r} ({c.kind})" for c in schema)


def select(
    target: object,
    schema: Sequence[Column],
    *,
    where: str,
    multilabel: str = "multihot",
    iscrowd: bool = False,
) -> Selection:
    """Resolve ``target`` (see the module docstring) against a file's schema.

    Raises:
        ValueError: ``target`` is not a word, a name or a list of them, names no column of
            the file (the message lists the file's columns), names a kind with no or several
            columns, or repeats one; a target other than ``"class"`` asked of a file without
            target columns; ``multilabel`` or ``iscrowd`` of another value or type.
    """
    if multilabel not in MULTILABEL_FORMS:
        raise ValueError(f"multilabel={multilabel!r} must be one of {MULTILABEL_FORMS}")
    if not isinstance(iscrowd, bool):
        raise ValueError(f"iscrowd={iscrowd!r:.100} must be True or False")
    as_dict = isinstance(target, (list, tuple))
    asked = list(target) if isinstance(target, (list, tuple)) else [target]
    if not asked or len(asked) > MAX_COLUMNS + 1 or any(not isinstance(a, str) for a in asked):
        raise ValueError(
            f"target={target!r:.200} must be 'class', a column name, a kind "
            f"({', '.join(KINDS)}) or a non-empty list of those"
        )
    by_name = {c.name: c for c in schema}
    keys: list[str] = []
    for a in asked:
        if a == CLASS:
            keys.append(CLASS)
            continue
        if not schema:
            raise ValueError(
                f"{where}: this asset has no target columns (format version 1), so "
                f"target={a!r} cannot be read; only target='class' can. Pack it from a source "
                "with target columns (a sample listing with extra columns, COCO instances, or "
                "images/ + masks/ folders) to read boxes, masks, labels lists, text or numbers"
            )
        if a in by_name:
            keys.append(a)
            continue
        of_kind = [c for c in schema if c.kind == a]
        if len(of_kind) != 1:
            why = (
                f"it has {len(of_kind)} {a} columns, name one"
                if of_kind
                else f"{a!r} is no column name or kind there"
            )
            raise ValueError(
                f"{where}: target={a!r}: {why}; its columns are {_describe(schema)}; give "
                "'class', a column name or a kind with one column"
            )
        keys.append(of_kind[0].name)
    if len(set(keys)) != len(keys):
        raise ValueError(f"target={target!r}: asks for a column twice (as {keys})")
    columns = tuple(by_name[k] for k in keys if k != CLASS)
    return Selection(tuple(keys), columns, as_dict, multilabel, iscrowd)


# Reading a file's target columns, one process

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


# The rules a value read from an untrusted file keeps

#: dtype of each kind's ``values`` (number columns: their own dtype).
VALUES = {"multilabel": "int32", "boxes": "float32", "mask": "uint8", "text": "uint8"}


def damaged(where: str, what: str) -> IntegrityError:
    """An IntegrityError saying what is wrong with the file and what to do."""
    return IntegrityError(
        f"{where}: {what}; the file is damaged or not written by h5forge — re-fetch or re-pack it"
    )


def bad_row(c: Column, value: Any) -> int | None:
    """The first row of ``value`` (multilabel indices, boxes) its column's rules refuse."""
    if c.kind not in ("multilabel", "boxes") or not len(value):
        return None
    if c.kind == "multilabel":
        bad = bad_labels(value, len(c.classes))
    else:
        bad = bad_boxes(value, len(c.classes))
    return int(np.argmax(bad)) if bad.any() else None
