"""Consecutive chunks of ``/images`` written to the file in large writes.

A pack stores its samples in order into chunks allocated back to back at creation, so the
chunks of consecutive samples are consecutive bytes of the file. Written one chunk per system
call (HDF5's direct chunk write: one ``pwrite`` of 147 KiB at 224 x 224 x 3), they leave the
file in the page cache as small folios, and reading a sample back from the page cache (the
smoke load, a verify, training on the machine that packed) then costs more than it costs from
a file written in larger writes: 11-15 us per 224 x 224 x 3 sample against 8-10 us after 1 MiB
writes (7.5-8.5 us after 8 MiB writes, whose larger folios cost the pack itself time to
allocate), on the machine of benchmarks/RESULTS.md, Linux 6.18. :class:`ChunkWriter` gathers
the chunks of consecutive samples and writes each stretch of up to 1 MiB with one system call.

The chunks are gathered as they are, not copied: one ``pwritev`` takes them all (where
``pwritev`` exists; elsewhere they are copied into one buffer). A chunk may be a view of the
decode pool's shared-memory ring, so at most :data:`HOLD` are held at once: the writer asks
the pool to keep that many of its latest slots (``iter_processed(borrow=HOLD)``).
"""

from __future__ import annotations

import os

from h5forge.asset.range_copy import pwrite_all

__all__ = ["HOLD", "ChunkWriter"]

_LIMIT = 1 << 20  # bytes gathered before a write
HOLD = 8  # chunks gathered before a write: 1 MiB is 7 chunks of 224 x 224 x 3
_IOV_MAX = 1024


class ChunkWriter:
    """Writes bytes at given offsets of ``fd``, gathering up to :data:`HOLD` pieces that follow
    each other (up to 1 MiB) into one write.

    A piece is kept, not copied, until its write: it must stay unchanged until :meth:`flush`
    or :data:`HOLD` later pieces. :meth:`flush` before anything reads the file or writes it
    otherwise.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._pieces: list[memoryview] = []
        self._start = 0  # file offset of the gathered bytes
        self._size = 0  # bytes gathered
        self._vectored = hasattr(os, "pwritev")

    def write(self, offset: int, data: bytes | memoryview) -> None:
        """Write ``data`` at ``offset`` (now, or with the next bytes that follow it)."""
        view = memoryview(data).cast("B")
        n = len(view)
        if self._pieces and (
            offset != self._start + self._size
            or self._size + n > _LIMIT
            or len(self._pieces) >= HOLD
        ):
            self.flush()
        if n > _LIMIT:
            pwrite_all(self.fd, view, offset)
            return
        if not self._pieces:
            self._start = offset
        self._pieces.append(view)
        self._size += n

    def flush(self) -> None:
        """Write what was gathered."""
        if not self._pieces:
            return
        pieces, self._pieces = self._pieces, []
        size, self._size = self._size, 0
        if not self._vectored or len(pieces) == 1:
            data = pieces[0] if len(pieces) == 1 else memoryview(b"".join(pieces))
            pwrite_all(self.fd, data, self._start)
            return
        done = 0
        while done < size:  # pwritev may write less: go on from where it stopped
            skip, k = done, 0
            while skip >= len(pieces[k]):
                skip -= len(pieces[k])
                k += 1
            batch = [pieces[k][skip:], *pieces[k + 1 : k + _IOV_MAX]]
            done += os.pwritev(self.fd, batch, self._start + done)
