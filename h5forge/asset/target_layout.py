"""The ``/targets`` columns of a format version 2 file, checked at open like the rest of the
file (docs/FORMAT.md, "What readers refuse"): its schema, the datasets each column holds, their
types and declared sizes, then their small index (offsets, mask shapes).

``targets_json`` comes from someone else: it is parsed with bounds
(:func:`h5forge.targets.schema.parse_schema`), and a file whose ``/targets`` holds anything it
does not name, or names something ``/targets`` lacks, is refused. ``values`` must be
contiguous, unfiltered, little-endian (readers take each sample's bytes as one range of the
file, :meth:`h5forge.targets.columns.Columns.ranges`) and lie inside the file; ``offsets`` run
from 0 to ``len(values)`` without going back; a mask's ``(H, W)`` is its image's (masks move
with their image), and a raw mask holds exactly ``H*W`` bytes. Per-sample bounds of the schema
hold too (boxes, text bytes, multilabel indices). Contents (digests, values) are
:mod:`h5forge.verify.targets`'s.
"""

from __future__ import annotations

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.structure import FIX
from h5forge.errors import IntegrityError
from h5forge.targets.schema import MAX_BOXES, MAX_TEXT_BYTES, Column, Schema, parse_schema

__all__ = ["check_target_layout", "file_schema", "image_sizes"]

_VALUES: dict[str, tuple[str, tuple[int, ...]]] = {  # kind -> values dtype, row shape
    "multilabel": ("<i4", ()),
    "boxes": ("<f4", (6,)),
    "mask": ("|u1", ()),
    "text": ("|u1", ()),
}
_INDEX = {"offsets": ("u", 8, ()), "shapes": ("u", 4, (2,)), "digests": ("u", 1, (32,))}


def file_schema(header: fmt.Header, *, where: str) -> Schema:
    """The file's target columns (``()`` for version 1).

    Raises:
        IntegrityError: ``targets_json`` is not a valid schema (the parse error named).
    """
    if header.format_version != fmt.TARGETS_VERSION:
        return ()
    try:
        schema = parse_schema(header.targets_json, where=where)
    except ValueError as e:
        raise IntegrityError(f"{e}; {FIX}") from None
    if not schema:
        raise IntegrityError(f"{where}: targets_json lists no column in a version 2 file; {FIX}")
    return schema


def image_sizes(h5: h5py.File, header: fmt.Header) -> np.ndarray:
    """``(N, 2)`` ``(H, W)`` of every sample's stored image (after the declared checks)."""
    n = header.num_samples
    if header.storage == "array":
        return np.tile(np.asarray(h5[fmt.IMAGES].shape[1:3], np.int64), (n, 1))
    return h5[fmt.SHAPES][()][:, :2].astype(np.int64)


def check_target_layout(h5: h5py.File, header: fmt.Header, *, file_size: int, where: str) -> None:
    """Refuse target columns a reader cannot trust, their small index read last.

    Raises:
        IntegrityError: naming the column, the dataset, what it holds and what is allowed.
    """
    schema = file_schema(header, where=where)
    group = h5.get(fmt.TARGETS)
    if not schema:
        if group is not None:
            raise IntegrityError(f"{where}: /{fmt.TARGETS} in a version 1 file; {FIX}")
        return
    if not isinstance(group, h5py.Group):
        what = "missing" if group is None else "not a group"
        raise IntegrityError(
            f"{where}: /{fmt.TARGETS} is {what}, targets_json lists columns; {FIX}"
        )
    names = {c.name for c in schema}
    found = set(group.keys())
    if found != names:
        raise IntegrityError(
            f"{where}: /{fmt.TARGETS} holds {sorted(found)}, targets_json names "
            f"{sorted(names)}; extra: {sorted(found - names)}, missing: {sorted(names - found)}; "
            f"{FIX}"
        )
    sizes = None
    for c in schema:
        col = _column(group, c, header.num_samples, file_size, where)
        if c.kind == "number":
            continue
        offsets = col["offsets"][()].astype(np.uint64)
        counts = _check_offsets(offsets, col["values"].shape[0], c, where)
        if c.kind == "mask":
            sizes = image_sizes(h5, header) if sizes is None else sizes
            _check_shapes(col["shapes"][()].astype(np.int64), counts, sizes, c, where)


def _column(group: h5py.Group, c: Column, n: int, size: int, where: str) -> h5py.Group:
    at = f"/{fmt.TARGETS}/{c.name}"
    col = group.get(c.name)
    want = set(fmt.TARGET_DATASETS[c.kind])
    if not isinstance(col, h5py.Group) or set(col.keys()) != want:
        held = sorted(col.keys()) if isinstance(col, h5py.Group) else "not a group"
        raise IntegrityError(
            f"{where}: {at} holds {held}, a {c.kind} column holds exactly {sorted(want)}; {FIX}"
        )
    for name in sorted(want):
        ds = col.get(name)
        if not isinstance(ds, h5py.Dataset):
            raise IntegrityError(f"{where}: {at}/{name} is not a dataset; {FIX}")
        if name == "values":
            _check_values(ds, c, n, size, f"{at}/values", where)
            continue
        kind, itemsize, tail = _INDEX[name]
        rows = n + 1 if name == "offsets" else n
        if ds.shape != (rows, *tail) or ds.dtype.kind != kind or ds.dtype.itemsize != itemsize:
            raise IntegrityError(
                f"{where}: {at}/{name} is {ds.shape} {ds.dtype}, expected {(rows, *tail)} "
                f"uint{8 * itemsize} (num_samples {n}); {FIX}"
            )
    return col


def _check_values(ds: h5py.Dataset, c: Column, n: int, size: int, at: str, where: str) -> None:
    name, row = (
        ("<i8" if c.dtype == "int64" else "<f8", ()) if c.kind == "number" else _VALUES[c.kind]
    )
    dtype = np.dtype(name)
    shape = ds.shape
    if shape is None or len(shape) != 1 + len(row) or tuple(shape[1:]) != row:
        raise IntegrityError(f"{where}: {at} has shape {shape}, expected (M, {row}); {FIX}")
    if ds.dtype != dtype:
        raise IntegrityError(f"{where}: {at} has type {ds.dtype.str}, expected {dtype.str}; {FIX}")
    if c.kind == "number" and shape[0] != n:
        raise IntegrityError(f"{where}: {at} has {shape[0]} rows, num_samples says {n}; {FIX}")
    dcpl = ds.id.get_create_plist()
    if dcpl.get_layout() != h5py.h5d.CONTIGUOUS or dcpl.get_nfilters():
        raise IntegrityError(
            f"{where}: {at} is chunked or filtered; target values are contiguous and "
            f"unfiltered (one byte range per sample); {FIX}"
        )
    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    start = ds.id.get_offset()
    if nbytes and (start is None or int(start) + nbytes > size):
        where_at = "no storage" if start is None else f"offset {int(start)}"
        raise IntegrityError(
            f"{where}: {at} declares {nbytes} bytes at {where_at}, outside the whole "
            f"{size}-byte file; {FIX}"
        )


def _check_offsets(offsets: np.ndarray, rows: int, c: Column, where: str) -> np.ndarray:
    at = f"/{fmt.TARGETS}/{c.name}/offsets"
    if len(offsets) and int(offsets[0]) != 0:
        raise IntegrityError(f"{where}: {at}[0] = {int(offsets[0])}, expected 0; {FIX}")
    back = np.flatnonzero(offsets[1:] < offsets[:-1])
    if len(back):
        i = int(back[0])
        raise IntegrityError(
            f"{where}: {at} goes backwards at sample {i}: {int(offsets[i])} then "
            f"{int(offsets[i + 1])}; {FIX}"
        )
    if int(offsets[-1]) != rows:
        raise IntegrityError(
            f"{where}: {at} ends at {int(offsets[-1])}, values has {rows} rows; {FIX}"
        )
    counts = np.diff(offsets).astype(np.int64)
    limit = {"boxes": MAX_BOXES, "text": MAX_TEXT_BYTES, "multilabel": len(c.classes)}
    if c.kind in limit and len(counts) and int(counts.max()) > limit[c.kind]:
        i = int(np.argmax(counts))
        raise IntegrityError(
            f"{where}: {at}: sample {i} has {int(counts[i])} rows, a {c.kind} value has at "
            f"most {limit[c.kind]}; {FIX}"
        )
    return counts


def _check_shapes(
    shapes: np.ndarray, counts: np.ndarray, sizes: np.ndarray, c: Column, where: str
) -> None:
    at = f"/{fmt.TARGETS}/{c.name}/shapes"
    bad = np.flatnonzero((shapes != sizes).any(axis=1) | (shapes < 1).any(axis=1))
    if len(bad):
        i = int(bad[0])
        raise IntegrityError(
            f"{where}: {at}[{i}] = {tuple(shapes[i].tolist())}, its image is "
            f"{tuple(sizes[i].tolist())} (H, W); a mask has its image's size; {FIX}"
        )
    if c.encoding == "raw":
        bad = np.flatnonzero(shapes[:, 0] * shapes[:, 1] != counts)
        if len(bad):
            i = int(bad[0])
            raise IntegrityError(
                f"{where}: {at}[{i}] = {tuple(shapes[i].tolist())} needs "
                f"{int(shapes[i].prod())} bytes, the raw mask holds {int(counts[i])}; {FIX}"
            )
