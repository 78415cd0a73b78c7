"""Reused samples moved file to file in the kernel, then checked once, from the new file's bytes.

An incremental pack of unfiltered storage (:mod:`h5forge.pack.reuse`) never reads a reused
sample into Python: :class:`StoredRun` names a stretch of samples whose stored bytes are taken
from the previous file as they are, and :class:`CopiedCheck` moves each run of them that lies
back to back in both files with one ``os.copy_file_range`` (in the kernel; ``pread``/``pwrite``
where it cannot, :class:`~h5forge.scale.kernel_copy.RangeCopy`): into the chunks ``/images``
allocated at creation (array storage), or into the blob behind the head once it is made (blob
storage: straight from the previous file, never through the spool). Array chunks are checked
while the next run is copied: helper threads read the run just copied back from the NEW file
and compare each sample's sha256 with the digest the previous version recorded
(:func:`~h5forge.verify.digests.hash_local_ranges`, every usable CPU; hashlib releases the GIL),
then start its writeback to disk, so the fsync before the seal finds little left to do. Once the
file is flushed, every sample not yet checked (preprocessed ones, the blob) is checked the same
way, while the file is fsynced: each sample of the file is hashed exactly once, from the
bytes the file holds, and the seal skips its own digest pass.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from h5forge.errors import IntegrityError
from h5forge.scale.kernel_copy import RangeCopy, runs, writeback_starter
from h5forge.verify.digests import hash_local_ranges

__all__ = ["CopiedCheck", "CopiedMismatch", "StoredRun"]

_CHECK_BYTES = 32 << 20  # rows gathered per background check (short runs share one)


class CopiedMismatch(IntegrityError):
    """Copied samples whose bytes in the new file do not match the previous ``/digests``; the
    writer packs again, preprocessing them (:attr:`paths`, their relative paths)."""

    def __init__(self, message: str, paths: frozenset[str]) -> None:
        super().__init__(message, sorted(paths)[:100])
        self.paths = paths


@dataclass(frozen=True)
class StoredRun:
    """Consecutive catalog samples whose stored chunks are copied from the previous file.

    Attributes:
        first: catalog index of the first sample (the others follow it, one each).
        fd: the previous file, open for reading (valid until the next sample is asked for).
        src: ``(k,)`` file offsets of the chunks in the previous file.
        sizes: ``(k,)`` their stored sizes (each the size of one sample's chunk).
        digests: ``(k, 32)`` sha256 of each sample, as the previous version recorded them.
        shapes: ``(k, 3)`` their shapes, as the previous version recorded them.
    """

    first: int
    fd: int
    src: np.ndarray
    sizes: np.ndarray
    digests: np.ndarray
    shapes: np.ndarray

    def __len__(self) -> int:
        return len(self.sizes)


class CopiedCheck:
    """Copies runs of samples file to file and checks rows of ``path`` (the file being packed)
    in the background; :meth:`wait` returns the rows whose bytes do not match their digest.

    :meth:`close` joins the helper thread.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._copy = RangeCopy()
        self._writeback = writeback_starter()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="h5forge-reuse-check")
        self._pending: list[Future[None]] = []
        self._batch: list[tuple[int, int, int]] = []  # (row, offset, size) not yet submitted
        self._batch_bytes = 0
        self._batch_writeback: int | None = None
        self._wants: dict[int, bytes] = {}
        self._seen: set[int] = set()
        self._failed: list[int] = []

    def close(self) -> None:
        """Cancel the checks not started, wait for the others."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def copy(self, run: StoredRun, dst_fd: int, dst: np.ndarray) -> None:
        """Copy ``run`` to offsets ``dst`` (``(k,)``) of ``dst_fd``: one system call per
        stretch back to back in both files."""
        src, dst = np.asarray(run.src, np.int64), np.asarray(dst, np.int64)
        for s, d, size in runs(src, dst, np.asarray(run.sizes, np.int64)):
            self._copy(run.fd, dst_fd, s, d, size)

    def check(
        self,
        rows: range | list[int],
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
        self._batch += zip(rows, np.asarray(offsets).tolist(), sizes.tolist(), strict=True)
        for row, want in zip(rows, digests, strict=True):
            self._wants[row] = bytes(want)
        self._batch_bytes += int(sizes.sum())
        if writeback is not None:
            self._batch_writeback = writeback
        if self._batch_bytes >= _CHECK_BYTES:
            self._submit()

    def _submit(self) -> None:
        if self._batch:
            job = self._pool.submit(self._run, self._batch, self._batch_writeback)
            self._pending.append(job)
        self._batch, self._batch_bytes, self._batch_writeback = [], 0, None

    def _run(self, ranges: list[tuple[int, int, int]], writeback: int | None) -> None:
        hash_local_ranges(self.path, ranges, self._on_sample, _ignore, mapped=True)
        if writeback is not None:
            self._writeback(writeback)

    def _on_sample(self, row: int, digest: bytes, _: bytes | None) -> None:
        self._seen.add(row)  # set.add and list.append are atomic: the hashing threads race
        if digest != self._wants[row]:
            self._failed.append(row)

    def wait(self) -> list[int]:
        """Wait for every check; the rows that do not match (or were never read: the file
        ends before them), sorted."""
        self._submit()
        for pending in self._pending:
            pending.result()
        self._pending.clear()
        return sorted({*self._failed, *(set(self._wants) - self._seen)})


_ignore: Callable[[int], None] = lambda _: None  # noqa: E731 (no progress to report)
