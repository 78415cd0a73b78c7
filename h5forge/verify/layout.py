"""Verify where an asset says its samples are against where HDF5 keeps them.

``/byte_ranges`` is what readers trust to fetch a sample with one ``pread`` or range request;
here it is compared with the chunk index (one walk, :func:`h5forge.asset.chunks.chunk_ranges`)
or with ``/offsets`` and the blob's file offset, and, for local unfiltered files, every chunk is
looked up once more the way h5py and other HDF5 readers find it.
"""

from __future__ import annotations

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.chunks import chunk_ranges
from h5forge.asset.index import AssetIndex

__all__ = ["check_layout"]


def check_layout(
    h5: h5py.File, idx: AssetIndex, file_size: int, fails: list[str], *, lookup: bool = True
) -> None:
    """Append to ``fails`` each sample whose ``/byte_ranges`` row differs from where HDF5 keeps
    its bytes (chunk index for ``array``, ``/offsets`` for ``blob``) or ends past the file; with
    ``lookup``, also each chunk HDF5's own chunk search does not find (local, unfiltered)."""
    n = idx.header.num_samples
    images = h5[fmt.IMAGES]
    actual = np.zeros((max(n, 0), 2), np.uint64)
    if idx.header.storage == "array":
        found = chunk_ranges(images, n)
        actual[found[:, 0] >= 0] = found[found[:, 0] >= 0]
        if lookup and not idx.filtered and h5.driver != "fileobj":
            _lookup(images, n, actual, fails)
    else:
        offsets = h5[fmt.OFFSETS][()].astype(np.uint64)
        steps = np.diff(offsets.astype(np.int64))
        if len(offsets) != n + 1 or offsets[0] != 0 or np.any(steps < 0):
            fails.append("/offsets must start at 0 and never decrease")
            return
        if int(offsets[-1]) != images.shape[0]:
            fails.append(f"/offsets ends at {int(offsets[-1])}, /images holds {images.shape[0]}")
        base = np.uint64(images.id.get_offset() or 0)
        actual = np.stack([offsets[:-1] + base, np.diff(offsets)], axis=1)
        if idx.header.layout == "decoded" and idx.shapes is not None:
            want = np.prod(idx.shapes.astype(np.uint64), axis=1)
            for i in np.flatnonzero(want != actual[:, 1])[:100]:
                fails.append(
                    f"sample {i}: /shapes says {tuple(idx.shapes[i])} = {want[i]} bytes,"
                    f" /offsets gives {actual[i, 1]}"
                )
    if idx.byte_ranges.shape != actual.shape:
        return
    for i in np.flatnonzero(np.any(idx.byte_ranges != actual, axis=1))[:100]:
        fails.append(
            f"sample {i}: /byte_ranges says {tuple(int(x) for x in idx.byte_ranges[i])},"
            f" the HDF5 layout says {tuple(int(x) for x in actual[i])}"
        )
    ends = idx.byte_ranges[:, 0] + idx.byte_ranges[:, 1] if n else np.zeros(0, np.uint64)
    for i in np.flatnonzero(ends > np.uint64(file_size))[:100]:
        fails.append(
            f"sample {i}: byte range ends at {int(ends[i])}, past the end of the "
            f"{file_size}-byte file (truncated?)"
        )


def _lookup(images: h5py.Dataset, n: int, actual: np.ndarray, fails: list[str]) -> None:
    """Every chunk must be found by HDF5's own lookup too, not only by iterating the index.

    h5py and other HDF5 readers find a chunk by searching the chunk index's keys; iterating it
    (``chunk_iter``, what the byte ranges are checked against) does not read every key field. A
    damaged key hides the chunk from the search, and those readers silently get the fill value
    (zeros) for the sample. Local files only: reading every chunk again costs a second pass
    over the images, cheap from the page cache, a second download remotely.
    """
    rank = len(images.shape)
    # Not get_chunk_info_by_coord: HDF5 implements it by iterating the whole index (O(N) per
    # call, O(N^2) here), and iterating is not the search whose keys this check is about.
    for i in range(min(n, images.shape[0])):
        try:
            _, data = images.id.read_direct_chunk((i,) + (0,) * (rank - 1))
        except (OSError, RuntimeError, ValueError) as e:
            fails.append(
                f"sample {i}: HDF5's chunk lookup does not find it ({e}); h5py and "
                "other HDF5 readers would read zeros: the chunk index is damaged"
            )
        else:
            if len(data) != int(actual[i, 1]):
                fails.append(
                    f"sample {i}: HDF5's chunk lookup finds {len(data)} bytes, the "
                    f"chunk index lists {int(actual[i, 1])}"
                )
        if len(fails) >= 100:
            return
