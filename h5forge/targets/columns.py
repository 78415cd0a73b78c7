"""The ``/targets`` columns of an open file: the small per-column index in memory, each
sample's value and its byte range (for a remote reader). Layout: :mod:`h5forge.targets.store`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np

from h5forge.targets.schema import Column
from h5forge.targets.store import GROUP, decode_value

__all__ = ["Columns"]


class Columns:
    """The ``/targets`` columns of an open file, with their (small) index in memory.

    Args:
        h5: the open file; its ``targets_json`` gives the schema (``schema``).
        schema: the parsed schema.
    """

    def __init__(self, h5: h5py.File, schema: Sequence[Column]) -> None:
        self.schema = {c.name: c for c in schema}
        self._values: dict[str, h5py.Dataset] = {}
        self._offsets: dict[str, np.ndarray] = {}
        self.shapes: dict[str, np.ndarray] = {}
        for c in schema:
            g = h5[f"{GROUP}/{c.name}"]
            self._values[c.name] = g["values"]
            if c.kind != "number":
                self._offsets[c.name] = g["offsets"][()].astype(np.int64)
            if c.kind == "mask":
                self.shapes[c.name] = g["shapes"][()]

    def _row_bytes(self, name: str) -> int:
        d = self._values[name]
        return d.dtype.itemsize * int(np.prod(d.shape[1:], dtype=np.int64))

    def rows(self, name: str, i: int) -> tuple[int, int]:
        """First row and end row of sample ``i`` in ``values``."""
        if self.schema[name].kind == "number":
            return i, i + 1
        off = self._offsets[name]
        return int(off[i]), int(off[i + 1])

    def raw(self, name: str, i: int) -> bytes:
        """Sample ``i``'s stored bytes in column ``name`` (through HDF5)."""
        a, b = self.rows(name, i)
        return self._values[name][a:b].tobytes()

    def get(self, name: str, i: int) -> Any:
        """Sample ``i``'s value in column ``name`` (see :func:`decode_value`)."""
        shape = self.shapes[name][i] if name in self.shapes else None
        return decode_value(self.schema[name], self.raw(name, i), shape)

    def ranges(self, name: str) -> np.ndarray:
        """``(N, 2) int64`` ``(file offset, byte count)`` of each sample in column ``name``:
        ``values`` is contiguous, so a sample is one range (``(0, 0)`` for an empty value)."""
        d = self._values[name]
        base = d.id.get_offset()
        size = self._row_bytes(name)
        if self.schema[name].kind == "number":
            starts = np.arange(d.shape[0], dtype=np.int64)
            counts = np.ones_like(starts)
        else:
            off = self._offsets[name]
            starts, counts = off[:-1], np.diff(off)
        out = np.stack([starts * size, counts * size], axis=1)
        if base is None:  # nothing stored (every value empty)
            return np.zeros_like(out)
        out[:, 0] += base
        out[counts == 0, 0] = 0
        return out
