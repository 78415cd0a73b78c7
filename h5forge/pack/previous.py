"""The previous version's file as an incremental pack reads it (:mod:`h5forge.pack.reuse`).

:class:`Previous` is what was read and checked of it: its identity and per-row index. Samples
it hands over in memory are checked there against its ``/digests``: filtered chunks read
through HDF5 (which decompresses them; the sink compresses them as a full build would), blob
bytes read by ``/byte_ranges`` in batches (:class:`~h5forge.asset.ranges.RangeReader`, one
``pread`` per run of touching ranges) and hashed on helper threads.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge.asset.open import H5_DAMAGE
from h5forge.asset.ranges import RangeReader
from h5forge.preprocess.images import Processed

__all__ = ["HASH_THREADS", "Previous", "file_identity"]

log = logging.getLogger(__name__)

_BATCH_BYTES = 32 << 20  # reused stored bytes read (and held) at once
HASH_THREADS = 2  # hashlib releases the GIL: the next samples hash while one is written


def file_identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """``(st_dev, st_ino, st_size, st_mtime_ns)``: the same file, unchanged."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


@dataclass(frozen=True)
class Previous:
    """What was read and checked of the previous file: its identity and per-row index."""

    path: str
    identity: tuple[int, int, int, int]  # file_identity() when it was checked
    filtered: bool
    byte_ranges: np.ndarray
    digests: np.ndarray
    shapes: np.ndarray  # (N, 3)

    def checked(
        self, i: int, row: int, data: bytes, name: str, digest: bytes | None = None
    ) -> Processed | None:
        """``data`` as sample ``i`` (``name``), or None where its sha256 (``digest``, computed
        here when None) is not row ``row``'s of ``/digests``."""
        digest = hashlib.sha256(data).digest() if digest is None else digest
        if digest != self.digests[row].tobytes():
            log.warning(
                "%s: sample %s (row %d) does not match its /digests; preprocessing it",
                self.path,
                name,
                row,
            )
            return None
        shape = tuple(int(x) for x in self.shapes[row])
        return Processed(index=i, data=data, shape=shape, digest=digest)  # type: ignore[arg-type]

    def decoded(
        self, images: Any, pairs: list[tuple[int, int]], names: Sequence[str]
    ) -> Iterator[Processed | None]:
        """Samples ``i`` from rows ``row`` of ``pairs`` through HDF5 (filtered chunks), checked
        (None: a mismatch, or a chunk that does not read); ``names[i]`` names them."""
        for i, row in pairs:
            try:
                data = np.ascontiguousarray(images[row]).tobytes()
            except H5_DAMAGE as e:  # a chunk that does not decompress: like a mismatch
                log.warning(
                    "%s row %d does not read (%s); preprocessing it", images.file.filename, row, e
                )
                yield None
                continue
            yield self.checked(i, row, data, names[i])

    def stored(
        self,
        reader: RangeReader,
        pairs: list[tuple[int, int]],
        hashing: ThreadPoolExecutor,
        names: Sequence[str],
    ) -> Iterator[Processed | None]:
        """Like :meth:`decoded` for unfiltered bytes: batches read in one pass of ``preadv``,
        hashed on ``hashing``; one buffer serves every batch (the sink stores each sample
        before the next is asked for)."""
        ranges = self.byte_ranges
        start, buf = 0, bytearray()
        while start < len(pairs):
            stop, total = start, 0
            while stop < len(pairs) and (stop == start or total < _BATCH_BYTES):
                total += int(ranges[pairs[stop][1], 1])
                stop += 1
            rows = [row for _, row in pairs[start:stop]]
            batch = [(int(ranges[r, 0]), int(ranges[r, 1])) for r in rows]
            if len(buf) < total:
                buf = bytearray(total)
            views, pos = [], 0
            for _, size in batch:
                views.append(memoryview(buf)[pos : pos + size])
                pos += size
            reader.read_into(batch, views)
            digests = [hashing.submit(_sha256, v) for v in views]
            for (i, row), view, digest in zip(pairs[start:stop], views, digests, strict=True):
                yield self.checked(i, row, view, names[i], digest.result())  # type: ignore[arg-type]
            start = stop


def _sha256(data: memoryview) -> bytes:
    return hashlib.sha256(data).digest()
