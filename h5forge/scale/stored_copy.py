"""Copy the stored sample bytes of one shard into the merged file, never decoding them.

Each function copies one storage: unfiltered chunks (:func:`copy_raw`), filtered chunks
(:func:`copy_filtered`) or a blob (:func:`copy_blob`). With a :class:`CheckedCopy` every sample's
digest is checked from the bytes copied (a bare shard); without one (``check=None``: the shard
file's sha256 covers the bytes) they move in the kernel, or chunk by chunk as stored. See
:mod:`h5forge.scale.checked_copy` for the two ways a copy is checked.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable

import h5py
import numpy as np

from h5forge.asset.chunks import chunk_ranges, chunk_table
from h5forge.errors import IntegrityError
from h5forge.scale.checked_copy import CheckedCopy
from h5forge.scale.kernel_copy import RangeCopy, runs

__all__ = ["copy_blob", "copy_filtered", "copy_raw"]


def copy_raw(
    check: CheckedCopy | None,
    src_fd: int,
    src: h5py.Dataset,
    out_fd: int,
    dst: np.ndarray,
    digests: np.ndarray,
    label: Callable[[int], str],
    copy: RangeCopy,
) -> None:
    """Copy unfiltered chunks file to file, into chunks allocated at creation (``dst``).

    With ``check`` each sample's digest is checked from the bytes copied; without it (the
    shard file's hash covers them) runs of chunks move in the kernel.
    """
    n = len(dst)
    ranges = chunk_ranges(src, n)
    want = int(np.prod(src.shape[1:]))
    for j in np.flatnonzero((ranges[:, 1] != want) | (dst[:, 1] != want))[:1]:
        raise IntegrityError(
            f"{label(j)}: its chunk has {ranges[j, 1]} bytes in the shard and "
            f"{dst[j, 1]} in the output, expected {want} (-1: no chunk); the "
            "shard is damaged, re-pack it"
        )
    if check is not None:
        check.copy_ranges(src_fd, out_fd, ranges[:, 0], dst[:, 0], ranges[:, 1], digests, label)
        return
    for s, d, size in runs(ranges[:, 0], dst[:, 0].astype(np.int64), ranges[:, 1]):
        copy(src_fd, out_fd, s, d, size)


def copy_filtered(
    check: CheckedCopy | None,
    src_fd: int,
    src: h5py.Dataset,
    dst: h5py.Dataset,
    base: int,
    digests: np.ndarray,
    label: Callable[[int], str],
    filters: tuple[int, ...],
) -> None:
    """Copy filtered chunks as stored (filter mask carried), never recompressed.

    With ``check``, the digest covers the decompressed pixels, so checking it costs one
    decompression per sample: gzip chunks are inflated with zlib on the hash threads, other
    pipelines (lzf, Blosc, Zstd, fletcher32) are decoded by HDF5 from the shard. Without it
    (the shard file's hash covers them) each chunk is read from ``src_fd`` and written as it
    is.
    """
    if check is None:
        _copy_chunks(src_fd, src, dst, base, len(digests), label)
        return
    zlib_only = filters == (h5py.h5z.FILTER_DEFLATE,)
    for j in range(len(digests)):
        mask, chunk = src.id.read_direct_chunk((j, 0, 0, 0))
        dst.id.write_direct_chunk((base + j, 0, 0, 0), chunk, mask)
        if zlib_only and mask == 0:
            check.check(chunk, bytes(digests[j]), label(j), zlib.decompress)
            continue
        pixels = np.empty((1, *src.shape[1:]), np.uint8)
        try:
            src.read_direct(pixels, np.s_[j : j + 1])
        except OSError as e:  # fletcher32 mismatch, or the codec rejects the chunk
            check.failures.append(f"{label(j)}: HDF5 cannot decode its chunk ({e})")
            continue
        check.check(pixels, bytes(digests[j]), label(j))


def _copy_chunks(
    src_fd: int,
    src: h5py.Dataset,
    dst: h5py.Dataset,
    base: int,
    n: int,
    label: Callable[[int], str],
) -> None:
    table = chunk_table(src, n)
    for j in np.flatnonzero(table[:, 1] < 0)[:1]:
        raise IntegrityError(
            f"{label(j)}: the shard has no chunk for it; the shard is damaged, re-pack it"
        )
    # One pread per chunk, found by one pass over the chunk index (no B-tree search per
    # chunk); h5py takes a bytes chunk faster than a slice of a larger buffer.
    for j, (offset, size, mask) in enumerate(table.tolist()):
        chunk = os.pread(src_fd, size, offset)
        if len(chunk) != size:
            raise IntegrityError(
                f"{label(j)}: the shard ends inside its chunk (bytes {offset}.."
                f"{offset + size - 1}); the shard is truncated, re-pack it"
            )
        dst.id.write_direct_chunk((base + j, 0, 0, 0), chunk, mask)


def copy_blob(
    check: CheckedCopy | None,
    src_fd: int,
    where: str,
    src: h5py.Dataset,
    out_fd: int,
    dst_offset: int,
    offsets: np.ndarray,
    digests: np.ndarray,
    label: Callable[[int], str],
    copy: RangeCopy,
) -> int:
    """Copy ``src``'s samples to ``dst_offset`` of the fd ``out_fd``; return the byte count.

    The output blob is allocated at creation (the writer's head layout), so its file offset is
    known and its bytes go in with plain ``pwrite`` or ``copy_file_range``; HDF5 never caches
    contiguous raw data it did not write, so nothing stale can overwrite them. With ``check``
    each sample's digest is checked from the bytes copied; without it the blob is one range
    copied in the kernel.
    """
    size = int(src.shape[0])
    if size == 0:
        return 0
    base = src.id.get_offset()
    assert base is not None, "a non-empty contiguous dataset has storage"
    starts = offsets.astype(np.int64)
    if int(starts[-1]) != size:
        raise IntegrityError(
            f"{where}: /offsets ends at {int(starts[-1])}, /images holds {size}"
            " bytes; the shard is damaged, re-pack it"
        )
    if check is None:
        copy(src_fd, out_fd, base, dst_offset, size)
    else:
        check.copy_ranges(
            src_fd,
            out_fd,
            base + starts[:-1],
            dst_offset + starts[:-1],
            np.diff(starts),
            digests,
            label,
        )
    return size
