"""Physical placement of a new file: everything but the image bytes at the head.

HDF5 allocates file space in creation order. So before the first image byte is written, the
writer creates the root attributes (final values, counts as placeholders fixed up in place at
the end, ``sealed = False``), the link and object header of every dataset, and the storage of
the per-sample index, in the order a reader needs it: ``/byte_ranges``, ``/labels``,
``/splits`` (and ``/shapes``), the class and split names, then ``/digests`` (and ``/offsets``)
and ``/paths``. A remote reader opens the file with one ranged read of its first MiB (see
:mod:`h5forge.asset.open`) instead of chasing metadata to the end of a multi-GB file.

The count of samples is only known once every input has been decoded (some are quarantined),
yet the index must be allocated before. Index datasets are therefore chunked with a single
chunk sized for every input of the catalog, allocated at creation, and shrunk to the packed
count at the end (a dataspace change in place; the chunk stays where it is). Quarantine lists
are resizable and written at the end (no reader needs them to open the file).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import h5py
import numpy as np

from h5forge.asset import format as fmt

__all__ = ["Head", "early_allocation", "utf8"]

_QUARANTINE_CHUNK = 64
_STR = h5py.string_dtype("utf-8")


def utf8(s: str) -> str:
    """File names may hold undecodable bytes (surrogate escapes); store them visibly escaped."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def early_allocation(vlen: bool) -> h5py.h5p.PropDCID:
    """A dataset creation list that allocates the storage at creation (in creation order,
    so at the head), never filled (``vlen``: variable-length types, which HDF5 must fill)."""
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    dcpl.set_alloc_time(h5py.h5d.ALLOC_TIME_EARLY)
    if not vlen:  # HDF5 refuses FILL_TIME_NEVER for variable-length types
        dcpl.set_fill_time(h5py.h5d.FILL_TIME_NEVER)
    return dcpl


class Head:
    """Creates the head of a new file and fills the per-sample index in at the end.

    Args:
        h5: a new, empty file open for writing.
        attrs: every root attribute but ``sealed`` and ``metadata_sha256`` (counts may be
            placeholders: :meth:`finish` writes the real ones in place).
        storage: ``array`` or ``blob``.
        capacity: most samples the file may hold (the catalog's inputs).
        classes, split_names: written at once.
        images: keyword arguments of ``create_dataset`` for ``/images``: created last, so its
            object header lies in the head and its bytes follow it.
    """

    def __init__(
        self,
        h5: h5py.File,
        attrs: dict[str, Any],
        *,
        storage: fmt.Storage,
        capacity: int,
        classes: Sequence[str],
        split_names: Sequence[str],
        images: dict[str, Any],
    ) -> None:
        self.h5, self.storage, self.capacity = h5, storage, capacity
        for name, value in attrs.items():
            h5.attrs[name] = value
        # Created now with values of their final type and size, so rewriting them later reuses
        # their place in the root object header instead of chaining one at the end of the file.
        h5.attrs[fmt.A_METADATA_SHA256] = "0" * 64
        h5.attrs[fmt.A_SEALED] = False
        blob = storage == "blob"
        self.ds: dict[str, h5py.Dataset] = {}
        self._index(fmt.BYTE_RANGES, np.uint64, (2,))
        self._index(fmt.LABELS, np.int64)
        self._index(fmt.SPLITS, np.uint8)
        if blob:
            self._index(fmt.SHAPES, np.uint32, (3,))
        for name, values in ((fmt.SPLIT_NAMES, split_names), (fmt.CLASSES, classes)):
            h5.create_dataset(
                name,
                data=np.array([utf8(v) for v in values], dtype=object),
                dtype=_STR,
                shape=(len(values),),
            )
        self._index(fmt.DIGESTS, np.uint8, (fmt.DIGEST_SIZE,))
        if blob:
            self._index(fmt.OFFSETS, np.uint64, extra=1)
        self._index(fmt.PATHS, _STR)
        for name in (fmt.QUARANTINE_PATHS, fmt.QUARANTINE_REASONS):
            self.ds[name] = h5.create_dataset(
                name, shape=(0,), maxshape=(None,), dtype=_STR, chunks=(_QUARANTINE_CHUNK,)
            )
        if blob:  # contiguous, allocated now: its bytes start right after the head
            images = {**images, "dcpl": early_allocation(False)}
        self.images: h5py.Dataset = h5.create_dataset(fmt.IMAGES, **images)

    def _index(self, name: str, dtype: Any, row: tuple[int, ...] = (), extra: int = 0) -> None:
        rows = self.capacity + extra
        self.ds[name] = self.h5.create_dataset(
            name,
            shape=(rows, *row),
            maxshape=(max(1, rows), *row),
            chunks=(max(1, rows), *row),
            dtype=dtype,
            dcpl=early_allocation(dtype is _STR),
        )

    def finish(
        self,
        *,
        byte_ranges: np.ndarray,
        labels: np.ndarray,
        splits: np.ndarray,
        digests: np.ndarray,
        paths: Sequence[str],
        quarantine: Sequence[tuple[str, str]],
        shapes: np.ndarray | None = None,
        offsets: np.ndarray | None = None,
    ) -> None:
        """Write the index of the ``n`` packed samples and the quarantine list; fix the counts."""
        n = len(labels)
        if n > self.capacity:
            raise AssertionError(f"{n} samples packed, the head was sized for {self.capacity}")
        values: dict[str, Any] = {
            fmt.BYTE_RANGES: byte_ranges,
            fmt.LABELS: labels,
            fmt.SPLITS: splits,
            fmt.DIGESTS: digests,
            fmt.PATHS: np.array([utf8(p) for p in paths], dtype=object),
        }
        if self.storage == "blob":
            assert shapes is not None
            assert offsets is not None
            values[fmt.SHAPES], values[fmt.OFFSETS] = shapes, offsets
        for name, data in values.items():
            ds = self.ds[name]
            rows = len(data)
            if ds.shape[0] != rows:
                ds.resize(rows, axis=0)
            if rows:
                ds[...] = data
        for name, col in ((fmt.QUARANTINE_PATHS, 0), (fmt.QUARANTINE_REASONS, 1)):
            if quarantine:
                self.ds[name].resize(len(quarantine), axis=0)
                self.ds[name][...] = np.array([utf8(q[col]) for q in quarantine], dtype=object)
        self.h5.attrs.modify(fmt.A_NUM_SAMPLES, n)
        self.h5.attrs.modify(fmt.A_NUM_QUARANTINED, len(quarantine))
