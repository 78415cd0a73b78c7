"""Consecutive chunks of ``/images`` written to the file in large writes.

A pack stores its samples in order into chunks allocated back to back at creation, so the
chunks of consecutive samples are consecutive bytes of the file. Written one chunk per system
call (HDF5's direct chunk write: one ``pwrite`` of 147 KiB at 224 x 224 x 3), they leave the
file in the page cache as small folios, and reading a sample back from the page cache (the
smoke load, a verify, training on the machine that packed) then costs more than it costs from
a file written in larger writes: 11-15 us per 224 x 224 x 3 sample against 8-10 us after 1 MiB
writes (7.5-8.5 us after 8 MiB writes, whose larger folios cost the pack itself time to
allocate), on the machine of benchmarks/RESULTS.md, Linux 6.18. :class:`ChunkWriter` gathers
the chunks of consecutive samples and writes each stretch of up to 1 MiB with one ``pwrite``.
"""

from __future__ import annotations

from h5forge.asset.range_copy import pwrite_all

__all__ = ["ChunkWriter"]

_LIMIT = 1 << 20  # bytes gathered before a write


class ChunkWriter:
    """Writes bytes at given offsets of ``fd``, gathering those that follow each other.

    :meth:`flush` before anything reads the file or writes it otherwise.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buf = bytearray(_LIMIT)
        self._start = 0  # file offset of the gathered bytes
        self._size = 0  # bytes gathered

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` (now, or with the next bytes that follow it)."""
        n = len(data)
        if self._size and (offset != self._start + self._size or self._size + n > _LIMIT):
            self.flush()
        if n > _LIMIT:
            pwrite_all(self.fd, memoryview(data), offset)
            return
        if not self._size:
            self._start = offset
        self._buf[self._size : self._size + n] = data
        self._size += n

    def flush(self) -> None:
        """Write what was gathered."""
        if self._size:
            pwrite_all(self.fd, memoryview(self._buf)[: self._size], self._start)
            self._size = 0
