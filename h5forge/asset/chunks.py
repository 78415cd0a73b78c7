"""The one walk over a chunked dataset's index: where each chunk of ``/images`` lies in the file.

One ``chunk_iter`` pass (a B-tree walk inside HDF5) gives every chunk's file offset, stored size
and filter mask; the writer records them as ``/byte_ranges``, verify compares them with it and
the merge copies chunks by them. Not ``get_chunk_info_by_coord``: HDF5 implements it by
iterating the whole index, O(N) per call.
"""

from __future__ import annotations

from typing import Any

import h5py
import numpy as np

__all__ = ["chunk_ranges", "chunk_table"]


def chunk_table(images: h5py.Dataset, n: int) -> np.ndarray:
    """``(file offset, size, filter mask)`` of chunk ``i`` of ``images``, ``-1`` where none.

    Chunks at or past ``n`` along the first axis are left out (a file may hold more than its
    index declares; the caller decides what that means).
    """
    table = np.full((max(n, 0), 3), -1, np.int64)

    def record(info: Any) -> None:
        if 0 <= info.chunk_offset[0] < n:
            table[info.chunk_offset[0]] = (info.byte_offset, info.size, info.filter_mask)

    if n > 0 and images.shape[0]:
        images.id.chunk_iter(record)
    return table


def chunk_ranges(images: h5py.Dataset, n: int) -> np.ndarray:
    """``(file offset, size)`` of chunk ``i`` of ``images``, ``-1`` where none, in one pass."""
    return chunk_table(images, n)[:, :2].copy()
