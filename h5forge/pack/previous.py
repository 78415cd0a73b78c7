"""The previous version's file as an incremental pack reads it (:mod:`h5forge.pack.reuse`).

:class:`Previous` is what was read and checked of it: its identity and per-row index. Its filtered
chunks are read through HDF5 (which decompresses them; the sink compresses them as a full
build would) and checked in hand against its ``/digests``; unfiltered bytes never pass through
Python (:mod:`h5forge.asset.stored_copy`).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from h5forge.asset.open import H5_DAMAGE
from h5forge.preprocess.images import Processed

__all__ = ["Previous", "file_identity"]

log = logging.getLogger(__name__)


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
