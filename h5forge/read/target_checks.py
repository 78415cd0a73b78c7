"""The rules a target column of an untrusted file must keep, for the reader: its datasets'
dtypes, shapes and storage (checked at open), and its decoded rows (class indices in range,
boxes finite and not inverted, checked as they are read)."""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

from h5forge.errors import IntegrityError
from h5forge.targets.schema import Column
from h5forge.targets.store import GROUP

__all__ = ["VALUES", "bad_row", "check_column", "damaged"]

#: dtype of each kind's ``values`` (number columns: their own dtype).
VALUES = {"multilabel": "int32", "boxes": "float32", "mask": "uint8", "text": "uint8"}


def damaged(where: str, what: str) -> IntegrityError:
    """An IntegrityError saying what is wrong with the file and what to do."""
    return IntegrityError(
        f"{where}: {what}; the file is damaged or not written by h5forge — re-fetch or re-pack it"
    )


def check_column(h5: h5py.File, c: Column, n: int, *, where: str) -> None:
    """Refuse a column whose datasets are missing or not of its kind's dtypes and shapes, or
    whose ``values`` are not one contiguous, unfiltered run of bytes.

    Raises:
        IntegrityError: naming the dataset.
    """
    at = f"/{GROUP}/{c.name}"
    group = h5.get(f"{GROUP}/{c.name}")
    if not isinstance(group, h5py.Group):
        raise damaged(where, f"the schema names column {c.name!r} but {at} is missing")
    want: dict[str, tuple[str, tuple[int, ...] | None]] = {
        "values": (c.dtype or "", (n,)) if c.kind == "number" else (VALUES[c.kind], None),
        "digests": ("uint8", (n, 32)),
    }
    if c.kind != "number":
        want["offsets"] = ("uint64", (n + 1,))
    if c.kind == "mask":
        want["shapes"] = ("uint32", (n, 2))
    for name, (dtype, shape) in want.items():
        d = group.get(name)
        if not isinstance(d, h5py.Dataset) or d.dtype != np.dtype(dtype):
            raise damaged(where, f"{at}/{name} is missing or not {dtype}")
        if shape is not None and d.shape != shape:
            raise damaged(where, f"{at}/{name} has shape {d.shape}, expected {shape}")
    values = group["values"]
    rows = (6,) if c.kind == "boxes" else ()
    if values.ndim != 1 + len(rows) or values.shape[1:] != rows:
        raise damaged(where, f"{at}/values has shape {values.shape}")
    layout = values.id.get_create_plist().get_layout()
    if values.size and (layout != h5py.h5d.CONTIGUOUS or values.compression is not None):
        raise damaged(where, f"{at}/values is not stored contiguous and unfiltered")


def bad_row(c: Column, value: Any) -> int | None:
    """The first row of ``value`` (multilabel indices, boxes) its column's rules refuse."""
    if c.kind not in ("multilabel", "boxes") or not len(value):
        return None
    if c.kind == "multilabel":
        bad = (value < 0) | (value >= len(c.classes))
    else:
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
    return int(np.argmax(bad)) if bad.any() else None
