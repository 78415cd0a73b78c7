"""Declared shapes and types of an asset's datasets, checked against its counts and size.

A small file can declare datasets of any size: HDF5 returns the fill value for storage that was
never written, so reading a 78 KB file's ``(10**9, 2)`` index allocates 16 GB.
:func:`check_declared` compares every dataset's declared shape, type and chunking with the root
attributes and the file's size before any of them is read; :func:`h5forge.asset.index.load_index`
runs it. docs/FORMAT.md ("What readers refuse") lists the refusals.
"""

from __future__ import annotations

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.structure import FIX
from h5forge.asset.target_layout import check_target_layout
from h5forge.errors import IntegrityError

__all__ = ["check_declared"]

# name -> (numpy kind, itemsize, trailing dims); kind "S" means any string type.
_INDEX = {
    fmt.BYTE_RANGES: ("u", 8, (2,)),
    fmt.LABELS: ("i", 8, ()),
    fmt.SPLITS: ("u", 1, ()),
    fmt.DIGESTS: ("u", 1, (fmt.DIGEST_SIZE,)),
    fmt.PATHS: ("S", 16, ()),
    fmt.OFFSETS: ("u", 8, ()),
    fmt.SHAPES: ("u", 4, (3,)),
    fmt.CLASSES: ("S", 16, ()),
    fmt.SPLIT_NAMES: ("S", 16, ()),
    fmt.QUARANTINE_PATHS: ("S", 16, ()),
    fmt.QUARANTINE_REASONS: ("S", 16, ()),
}
_TYPE_NAMES = {
    ("u", 8): "uint64",
    ("i", 8): "int64",
    ("u", 1): "uint8",
    ("u", 4): "uint32",
    ("S", 16): "UTF-8 string",
}


def check_declared(h5: h5py.File, header: fmt.Header, *, file_size: int, where: str) -> None:
    """Refuse declared shapes and types a reader cannot trust, before reading any of them.

    Every per-sample dataset must have ``num_samples`` rows (``/offsets`` one more), the type
    FORMAT.md gives it, and fit in the file: a dataset whose declared size exceeds the file's
    cannot be stored in it (HDF5 would hand back fill values, allocated in full). ``/classes``
    must have ``num_classes`` names, the quarantine lists ``num_quarantined`` entries, and
    ``/images`` the storage's shape, type, chunking and channel count. No chunk may be larger
    than the file either (HDF5 inflates whole chunks to read any row of one). Then the target
    columns of a version 2 file (:mod:`h5forge.asset.target_layout`).

    Raises:
        IntegrityError: naming the dataset, what it declares and what was expected.
    """
    n, k, q = header.num_samples, header.num_classes, header.num_quarantined
    size = max(int(file_size), 0)
    for attr, value in ((fmt.A_NUM_SAMPLES, n), (fmt.A_NUM_CLASSES, k), (fmt.A_NUM_QUARANTINED, q)):
        if value < 0 or value * 16 > size:
            raise IntegrityError(
                f"{where}: root attribute {attr} = {value}, but a "
                f"{size}-byte file holds at most {size // 16} (16 bytes of "
                f"index each); {FIX}"
            )
    rows = {
        fmt.BYTE_RANGES: n,
        fmt.LABELS: n,
        fmt.SPLITS: n,
        fmt.DIGESTS: n,
        fmt.PATHS: n,
        fmt.CLASSES: k,
        fmt.QUARANTINE_PATHS: q,
        fmt.QUARANTINE_REASONS: q,
    }
    if header.storage == "blob":
        rows.update({fmt.OFFSETS: n + 1, fmt.SHAPES: n})
    for name, want_rows in rows.items():
        _check_index_dataset(h5, name, want_rows, size, where)
    splits = _check_index_dataset(h5, fmt.SPLIT_NAMES, None, size, where)
    if not 1 <= splits <= 256:  # /splits is uint8
        raise IntegrityError(
            f"{where}: /split_names has {splits} names, expected 1..256 (/splits is uint8); {FIX}"
        )
    _check_images(h5, header, size, where)
    check_target_layout(h5, header, file_size=size, where=where)


def _dataset(h5: h5py.File, name: str, where: str) -> h5py.Dataset:
    obj = h5.get(name)
    if not isinstance(obj, h5py.Dataset):
        raise IntegrityError(
            f"{where}: /{name} is {'missing' if obj is None else 'a group'}, "
            f"expected a dataset; {FIX}"
        )
    return obj


def _check_index_dataset(
    h5: h5py.File, name: str, want_rows: int | None, size: int, where: str
) -> int:
    ds = _dataset(h5, name, where)
    kind, itemsize, tail = _INDEX[name]
    shape = ds.shape
    if shape is None or len(shape) != 1 + len(tail) or tuple(shape[1:]) != tail:
        expected = (
            "("
            + ", ".join(["N" if want_rows is None else str(want_rows), *map(str, tail)])
            + ("," if not tail else "")
            + ")"
        )
        raise IntegrityError(f"{where}: /{name} has shape {shape}, expected {expected}; {FIX}")
    if want_rows is not None and shape[0] != want_rows:
        what = {
            fmt.CLASSES: "num_classes",
            fmt.QUARANTINE_PATHS: "num_quarantined",
            fmt.QUARANTINE_REASONS: "num_quarantined",
        }.get(name, "num_samples")
        raise IntegrityError(
            f"{where}: /{name} has {shape[0]} rows, root attribute {what} "
            f"says {want_rows - (name == fmt.OFFSETS)}"
            f"{' (plus one)' if name == fmt.OFFSETS else ''}; {FIX}"
        )
    dt = ds.dtype
    is_str = h5py.check_string_dtype(dt) is not None
    ok = is_str if kind == "S" else (dt.kind == kind and dt.itemsize == itemsize)
    if not ok:
        raise IntegrityError(
            f"{where}: /{name} has type {dt}, expected {_TYPE_NAMES[(kind, itemsize)]}; {FIX}"
        )
    item = itemsize if not is_str else 16
    stored = int(np.prod(shape, dtype=object)) * item
    if stored > size:
        raise IntegrityError(
            f"{where}: /{name} declares {shape} = {stored} bytes, more than "
            f"the whole {size}-byte file; {FIX}"
        )
    # HDF5 reads (and inflates) whole chunks: a compressed chunk far larger than the dataset
    # would be allocated in full to read a few rows of it.
    chunk = int(np.prod(ds.chunks, dtype=object)) * item if ds.chunks else 0
    if chunk > max(size, stored):
        raise IntegrityError(
            f"{where}: /{name} has chunks of {ds.chunks} = {chunk} bytes, more "
            f"than the whole {size}-byte file; {FIX}"
        )
    return int(shape[0])


def _check_images(h5: h5py.File, header: fmt.Header, size: int, where: str) -> None:
    images = _dataset(h5, fmt.IMAGES, where)
    shape, n, c = images.shape, header.num_samples, header.channels
    if images.dtype != np.uint8:
        raise IntegrityError(f"{where}: /images has type {images.dtype}, expected uint8; {FIX}")
    filtered = images.id.get_create_plist().get_nfilters() > 0
    if header.storage == "blob":
        if shape is None or len(shape) != 1:
            raise IntegrityError(
                f"{where}: /images has shape {shape}, blob storage needs (B,); {FIX}"
            )
        if filtered or images.chunks is not None:
            raise IntegrityError(
                f"{where}: /images is chunked or filtered, blob storage "
                f"keeps it contiguous and unfiltered; {FIX}"
            )
        if shape[0] > size:
            raise IntegrityError(
                f"{where}: /images declares {shape[0]} bytes, more than the "
                f"whole {size}-byte file; {FIX}"
            )
        return
    if shape is None or len(shape) != 4 or shape[0] != n or shape[3] != c or 0 in shape[1:]:
        raise IntegrityError(
            f"{where}: /images has shape {shape}, expected ({n}, H, W, {c}) "
            f"(num_samples {n}, mode {header.mode}); {FIX}"
        )
    if images.chunks != (1, *shape[1:]):
        raise IntegrityError(
            f"{where}: /images has chunks {images.chunks}, expected one "
            f"sample per chunk {(1, *shape[1:])}; {FIX}"
        )
    sample = shape[1] * shape[2] * shape[3]
    if sample > 0xFFFFFFFF:  # HDF5's own limit on one chunk
        raise IntegrityError(
            f"{where}: /images declares samples of {sample} bytes, more "
            f"than one HDF5 chunk can hold (4 GiB); {FIX}"
        )
    if not filtered and n * sample > size:
        raise IntegrityError(
            f"{where}: /images declares {n} x {sample} bytes, more than the "
            f"whole {size}-byte file; {FIX}"
        )
