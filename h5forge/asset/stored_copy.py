"""The stored-copy kernel: samples' stored bytes copied out of a sealed h5forge file, checked.

Whatever copies samples from one h5forge file into the file being written goes through here:
an incremental pack taking unchanged samples from the previous version
(:mod:`h5forge.pack.reuse`, :mod:`h5forge.pack.sink`) and the merge of Dask parts
(:mod:`h5forge.scale.assemble`). The bytes move as stored, never decoded or recompressed.

The unit is rows: chosen rows of a sealed source file (their stored byte ranges, from its
index, and the sha256 digests its ``/digests`` records) go to chosen rows of the file being
written (the offsets its chunks or blob were allocated at). :meth:`StoredCopy.copy_rows` does
it for unfiltered bytes (raw chunks, a blob); :func:`copy_raw`, :func:`copy_blob` and
:func:`copy_filtered` copy every row of one source's ``/images`` of each storage.

How a copy is checked, one of two ways chosen by the caller:

- **Each sample's sha256, from the bytes the new file holds** (``check=True``): unfiltered bytes
  move file to file in the kernel (``os.copy_file_range`` per run of samples back to back in
  both files; ``pread``/``pwrite`` where it cannot, :class:`~h5forge.asset.range_copy.RangeCopy`),
  then a helper thread reads them back from the NEW file (through ``mmap``, on every usable CPU:
  :func:`~h5forge.verify.digests.hash_local_ranges`) and compares each sample's sha256 with the
  digest its source recorded, while the next run is copied; then it starts the writeback of the
  new file's pages, so the fsync before the seal finds little left to do. Filtered chunks are
  copied as stored (``write_direct_chunk``, filter mask carried) and, since a digest covers the
  pixels, decompressed once on helper threads to be checked (gzip with zlib; other pipelines
  decoded by HDF5 from the source). A failure never stops the copy: :meth:`StoredCopy.wait`
  lists every mismatched row and the caller decides (the pack re-packs them from source, the
  merge refuses the output).
- **By the caller** (``check=False``): the whole source file's sha256 covers its bytes (a
  published Dask part, :mod:`h5forge.scale.file_check`), so nothing is read back.

Structural damage (a chunk of the wrong size, no chunk, a blob shorter than its offsets, a source
that ends inside a sample) raises :class:`~h5forge.errors.IntegrityError` at once.

Memory is bounded: at most :data:`_IN_FLIGHT` bytes of filtered chunks wait for their hash; the
kernel copy and the read-back hold none (the read-back works on the page cache).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import h5py
import numpy as np

from h5forge.asset.chunks import chunk_ranges, chunk_table
from h5forge.asset.range_copy import RangeCopy, runs, writeback_starter
from h5forge.cpus import usable_cpus
from h5forge.errors import IntegrityError
from h5forge.verify.digests import hash_local_ranges

__all__ = ["Mismatch", "StoredCopy", "StoredRun", "copy_blob", "copy_filtered", "copy_raw"]

_CHECK_BYTES = 32 << 20  # bytes read back per background check (short runs share one)
_IN_FLIGHT = 48 << 20  # bytes of filtered chunks held for hashing at once


@dataclass(frozen=True)
class StoredRun:
    """Consecutive samples whose stored bytes are copied from a source file, as one request.

    Attributes:
        first: index of the first sample where it goes (the others follow it, one each).
        fd: the source file, open for reading (valid until the next run is asked for).
        src: ``(k,)`` file offsets of the samples' stored bytes in the source.
        sizes: ``(k,)`` their stored sizes.
        digests: ``(k, 32)`` sha256 of each sample, as the source recorded them.
        shapes: ``(k, 3)`` their shapes, as the source recorded them.
    """

    first: int
    fd: int
    src: np.ndarray
    sizes: np.ndarray
    digests: np.ndarray
    shapes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)


@dataclass(frozen=True)
class Mismatch:
    """A row of the new file whose copied bytes do not match its source's digest.

    Attributes:
        row: the row in the file being written.
        reason: what was found, e.g. both digests (the caller names the row and source).
    """

    row: int
    reason: str


class StoredCopy:
    """Copies stored sample bytes into ``path`` (the file being written) and checks them.

    Use as a context manager (or call :meth:`close`); :meth:`wait` returns the rows that do
    not match. Rows are the new file's: the caller maps them back to its sources.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._copy = RangeCopy()
        self._writeback = writeback_starter()
        self._readback: ThreadPoolExecutor | None = None  # one thread; hashing fans out itself
        self._hash: ThreadPoolExecutor | None = None  # filtered chunks checked in hand
        self._pending: list[Future[list[Mismatch]]] = []
        self._in_hand: deque[tuple[Future[list[Mismatch]], int]] = deque()
        self._held = 0
        # rows read back not yet submitted: (row, offset, size, digest)
        self._batch: list[tuple[int, int, int, bytes]] = []
        self._batch_bytes = 0
        self._batch_writeback: int | None = None
        self._failed: list[Mismatch] = []
        self.checked = 0  # rows whose check was asked for

    def __enter__(self) -> StoredCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Cancel the checks not started, wait for the others."""
        for pool in (self._readback, self._hash):
            if pool is not None:
                pool.shutdown(wait=True, cancel_futures=True)

    @property
    def failed(self) -> bool:
        """Whether a mismatch was found so far (checks still running may find more)."""
        self._collect(done_only=True)
        return bool(self._failed)

    def copy(self, src_fd: int, dst_fd: int, src: np.ndarray, dst: np.ndarray, sizes: Any) -> None:
        """Copy ``sizes[j]`` bytes from offset ``src[j]`` of ``src_fd`` to ``dst[j]`` of
        ``dst_fd``, unchecked: one system call per stretch back to back in both files."""
        src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
        for s, d, size in runs(src, dst, np.asarray(sizes, np.int64)):
            self._copy(src_fd, dst_fd, s, d, size)

    def copy_rows(
        self,
        rows: range,
        src_fd: int,
        src: np.ndarray,
        sizes: np.ndarray,
        digests: np.ndarray,
        dst_fd: int,
        dst: np.ndarray,
        *,
        check: bool = True,
        writeback: bool = False,
    ) -> None:
        """Copy rows of a source to ``rows`` of the new file and (``check``) check them.

        Args:
            rows: the rows in the new file, one per sample.
            src_fd: the sealed source, open for reading.
            src, sizes: ``(k,)`` offsets and sizes of the samples' stored bytes in the source.
            digests: ``(k, 32)`` their sha256, as the source's ``/digests`` records them.
            dst_fd: the new file (:attr:`path`), open for writing.
            dst: ``(k,)`` where their bytes go in it (allocated chunks, or blob offsets).
            check: read them back from the new file and compare with ``digests``; false
                where the caller checks the source file as a whole.
            writeback: once checked, start writing ``dst_fd``'s dirty pages to disk.
        """
        self.copy(src_fd, dst_fd, src, dst, sizes)
        if check:
            self.check(rows, dst, sizes, digests, writeback=dst_fd if writeback else None)

    def check(
        self,
        rows: Sequence[int],
        offsets: np.ndarray,
        sizes: np.ndarray,
        digests: np.ndarray,
        *,
        writeback: int | None = None,
    ) -> None:
        """Hash rows ``rows`` (``sizes`` bytes at ``offsets`` of :attr:`path`) in the
        background (gathered until ``_CHECK_BYTES``, or :meth:`wait`) and compare them with
        ``digests`` (``(k, DIGEST_SIZE)``); then start the writeback of descriptor
        ``writeback``, if given."""
        sizes = np.asarray(sizes)
        wants = [bytes(d) for d in digests]
        self._batch += zip(rows, np.asarray(offsets).tolist(), sizes.tolist(), wants, strict=True)
        self._batch_bytes += int(sizes.sum())
        self.checked += len(wants)
        if writeback is not None:
            self._batch_writeback = writeback
        if self._batch_bytes >= _CHECK_BYTES:
            self._submit()

    def _submit(self) -> None:
        if self._batch:
            if self._readback is None:
                self._readback = ThreadPoolExecutor(1, thread_name_prefix="h5forge-readback")
            job = self._readback.submit(self._read_back, self._batch, self._batch_writeback)
            self._pending.append(job)
        self._batch, self._batch_bytes, self._batch_writeback = [], 0, None

    def _read_back(
        self, batch: list[tuple[int, int, int, bytes]], writeback: int | None
    ) -> list[Mismatch]:
        wants = {row: want for row, _, _, want in batch}
        got: dict[int, bytes] = {}

        def on_sample(row: int, digest: bytes, _: bytes | None) -> None:
            got[row] = digest  # one key per thread call: dict assignment is atomic

        ranges = [(row, offset, size) for row, offset, size, _ in batch]
        hash_local_ranges(self.path, ranges, on_sample, _ignore, mapped=True)
        if writeback is not None:
            self._writeback(writeback)
        fails = []
        for row, want in wants.items():
            digest = got.get(row)
            if digest is None:
                fails.append(Mismatch(row, "its bytes were not read back: the file ends first"))
            elif digest != want:
                fails.append(
                    Mismatch(
                        row,
                        f"sha256 of the copied bytes is {digest.hex()}, its source's /digests "
                        f"says {want.hex()}",
                    )
                )
        return fails

    def check_in_hand(
        self,
        row: int,
        data: bytes | np.ndarray,
        want: bytes,
        decode: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Check row ``row`` from bytes in hand (a filtered chunk's pixels); ``decode`` (e.g.
        ``zlib.decompress``) runs first, on a helper thread."""
        nbytes = data.nbytes if isinstance(data, np.ndarray) else len(data)
        while self._in_hand and self._held + nbytes > _IN_FLIGHT:
            self._retire()
        if self._hash is None:
            threads = max(1, min(4, usable_cpus()))
            self._hash = ThreadPoolExecutor(threads, thread_name_prefix="h5forge-hash")
        self._in_hand.append((self._hash.submit(_check_one, row, data, want, decode), nbytes))
        self._held += nbytes
        self.checked += 1

    def fail(self, row: int, reason: str) -> None:
        """Record row ``row`` as not matching, for ``reason`` (e.g. its chunk does not decode)."""
        self._failed.append(Mismatch(row, reason))

    def _retire(self) -> None:
        future, nbytes = self._in_hand.popleft()
        self._failed += future.result()
        self._held -= nbytes

    def _collect(self, *, done_only: bool) -> None:
        while self._in_hand and (not done_only or self._in_hand[0][0].done()):
            self._retire()
        keep = []
        for job in self._pending:
            if done_only and not job.done():
                keep.append(job)
            else:
                self._failed += job.result()
        self._pending = keep

    def wait(self) -> list[Mismatch]:
        """Wait for every check; every mismatch so far, by row."""
        self._submit()
        self._collect(done_only=False)
        return sorted(self._failed, key=lambda m: m.row)


def _check_one(
    row: int, data: Any, want: bytes, decode: Callable[[bytes], bytes] | None
) -> list[Mismatch]:
    if decode is not None:
        try:
            data = decode(data)
        except (zlib.error, ValueError, OSError) as e:
            return [
                Mismatch(row, f"its stored chunk does not decompress ({type(e).__name__}: {e})")
            ]
    got = hashlib.sha256(data).digest()
    if got != want:
        return [
            Mismatch(
                row,
                f"sha256 of the copied (decompressed) bytes is {got.hex()}, its source's "
                f"/digests says {want.hex()}",
            )
        ]
    return []


_ignore: Callable[[int], None] = lambda _: None  # noqa: E731 (no progress to report)


def copy_raw(
    copy: StoredCopy,
    src_fd: int,
    src: h5py.Dataset,
    out_fd: int,
    dst: np.ndarray,
    digests: np.ndarray,
    *,
    base: int,
    check: bool,
    label: Callable[[int], str],
) -> None:
    """Copy every unfiltered chunk of ``src`` into chunks allocated at creation (``dst``,
    ``(k, 2)`` offset and size), rows ``base..base + k - 1`` of the new file.

    ``label(j)`` names sample ``j`` of the source in an error.

    Raises:
        IntegrityError: a chunk is missing or of the wrong size in the source or the output.
    """
    n = len(dst)
    ranges = chunk_ranges(src, n)
    want = int(np.prod(src.shape[1:]))
    for j in np.flatnonzero((ranges[:, 1] != want) | (dst[:, 1] != want))[:1]:
        raise IntegrityError(
            f"{label(j)}: its chunk has {ranges[j, 1]} bytes in the source and "
            f"{dst[j, 1]} in the output, expected {want} (-1: no chunk); the "
            "source is damaged, re-pack it"
        )
    copy.copy_rows(
        range(base, base + n),
        src_fd,
        ranges[:, 0],
        ranges[:, 1],
        digests,
        out_fd,
        dst[:, 0],
        check=check,
    )


def copy_filtered(
    copy: StoredCopy,
    src_fd: int,
    src: h5py.Dataset,
    dst: h5py.Dataset,
    digests: np.ndarray,
    *,
    base: int,
    check: bool,
    label: Callable[[int], str],
    filters: tuple[int, ...],
) -> None:
    """Copy every filtered chunk of ``src`` as stored (filter mask carried, never
    recompressed) to rows ``base..`` of ``dst``.

    With ``check``, the digest covers the decompressed pixels, so checking it costs one
    decompression per sample: gzip chunks are inflated with zlib on the hash threads, other
    pipelines (lzf, Blosc, Zstd, fletcher32) are decoded by HDF5 from the source. Without it
    each chunk is read from ``src_fd`` (its offset and mask from one pass over the chunk
    index) and written as it is.

    Raises:
        IntegrityError: the source has no chunk for a sample, or ends inside one.
    """
    if not check:
        _copy_chunks(src_fd, src, dst, base, len(digests), label)
        return
    zlib_only = filters == (h5py.h5z.FILTER_DEFLATE,)
    for j in range(len(digests)):
        mask, chunk = src.id.read_direct_chunk((j, 0, 0, 0))
        dst.id.write_direct_chunk((base + j, 0, 0, 0), chunk, mask)
        if zlib_only and mask == 0:
            copy.check_in_hand(base + j, chunk, bytes(digests[j]), zlib.decompress)
            continue
        pixels = np.empty((1, *src.shape[1:]), np.uint8)
        try:
            src.read_direct(pixels, np.s_[j : j + 1])
        except OSError as e:  # fletcher32 mismatch, or the codec rejects the chunk
            copy.fail(base + j, f"HDF5 cannot decode its chunk ({e})")
            continue
        copy.check_in_hand(base + j, pixels, bytes(digests[j]))


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
            f"{label(j)}: the source has no chunk for it; the source is damaged, re-pack it"
        )
    # One pread per chunk, found by one pass over the chunk index (no B-tree search per
    # chunk); h5py takes a bytes chunk faster than a slice of a larger buffer.
    for j, (offset, size, mask) in enumerate(table.tolist()):
        chunk = os.pread(src_fd, size, offset)
        if len(chunk) != size:
            raise IntegrityError(
                f"{label(j)}: the source ends inside its chunk (bytes {offset}.."
                f"{offset + size - 1}); the source is truncated, re-pack it"
            )
        dst.id.write_direct_chunk((base + j, 0, 0, 0), chunk, mask)


def copy_blob(
    copy: StoredCopy,
    src_fd: int,
    where: str,
    src: h5py.Dataset,
    out_fd: int,
    dst_offset: int,
    offsets: np.ndarray,
    digests: np.ndarray,
    *,
    base: int,
    check: bool,
) -> int:
    """Copy the blob ``src`` (samples at ``offsets``, ``(k + 1,)``) to ``dst_offset`` of
    ``out_fd``, rows ``base..`` of the new file; return the byte count.

    The output blob is allocated at creation (the writer's head layout), so its file offset is
    known and its bytes go in with ``copy_file_range`` or plain ``pwrite``; HDF5 never caches
    contiguous raw data it did not write, so nothing stale can overwrite them. Without
    ``check`` the blob is one range copied in the kernel.

    Raises:
        IntegrityError: ``/offsets`` does not end where ``/images`` does (``where`` names it).
    """
    size = int(src.shape[0])
    if size == 0:
        return 0
    start = src.id.get_offset()
    assert start is not None, "a non-empty contiguous dataset has storage"
    starts = offsets.astype(np.int64)
    if int(starts[-1]) != size:
        raise IntegrityError(
            f"{where}: /offsets ends at {int(starts[-1])}, /images holds {size}"
            " bytes; the source is damaged, re-pack it"
        )
    if not check:
        copy.copy(src_fd, out_fd, np.array([start]), np.array([dst_offset]), np.array([size]))
        return size
    copy.copy_rows(
        range(base, base + len(starts) - 1),
        src_fd,
        start + starts[:-1],
        np.diff(starts),
        digests,
        out_fd,
        dst_offset + starts[:-1],
    )
    return size
