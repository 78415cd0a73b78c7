"""Read sample byte ranges of an asset: ``os.preadv`` locally, fsspec ``cat_ranges`` remotely.

Local files are read with ``os.preadv`` straight into caller buffers. Remote files are read by
:class:`h5forge.asset.coalesce.RemoteRanges`: a batch's ranges coalesced into few concurrent
requests, with aligned read-ahead blocks kept for later batches (see that module). A remote
range the store kept failing after its client's retries raises a
:class:`~h5forge.errors.StoreError` naming the URL, the bytes and the attempts
(:mod:`h5forge.store_errors`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from h5forge.asset.coalesce import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_KEEP_BYTES,
    DEFAULT_MAX_GAP,
    DEFAULT_MAX_REQUEST,
    STORED_KEEP_BYTES,
    BlockSource,
    ReadStats,
    RemoteRanges,
)
from h5forge.errors import IntegrityError
from h5forge.files import open_regular
from h5forge.location import Location
from h5forge.platforms import require_calls
from h5forge.store_errors import explain, store_failures

__all__ = ["RangeReader"]

# Most buffers one preadv call takes (IOV_MAX).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class RangeReader:
    """Reads absolute byte ranges of one file, locally with ``preadv`` or remotely.

    Create it in the process that reads (it holds a file descriptor or a filesystem client).
    ``size`` (the file's, when the caller knows it) saves a remote reader one request; the
    other keywords tune remote reads (:class:`h5forge.asset.coalesce.RemoteRanges`; ``store``:
    its blocks kept on local disk; ``keep_bytes`` defaults to 64 MiB, 24 MiB with a store,
    which serves the older blocks from disk).
    """

    def __init__(
        self,
        where: Location,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        max_request: int = DEFAULT_MAX_REQUEST,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        keep_bytes: int | None = None,
        size: int | None = None,
        store: BlockSource | None = None,
    ) -> None:
        self.url = where.url
        self._where = where
        self._fs, self._path = where.fs, where.path
        self._fd: int | None = None
        self.remote: RemoteRanges | None = None
        self._stats = ReadStats()
        if where.is_local:
            require_calls("batched local reads", "preadv")
            self._fd = open_regular(self._path, "asset file")  # never waits on a FIFO
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        else:
            if size is None:
                size = int(where.ask("the size", "size", self._path))
            self.remote = RemoteRanges(
                self._cat_ranges,
                size,
                self._short,
                max_gap=max_gap,
                max_request=max_request,
                block_bytes=block_bytes,
                keep_bytes=keep_bytes
                if keep_bytes is not None
                else (DEFAULT_KEEP_BYTES if store is None else STORED_KEEP_BYTES),
                store=store,
            )

    def _cat_ranges(self, starts: list[int], ends: list[int]) -> list[Any]:
        """The bytes of each range, or the :class:`~h5forge.errors.StoreError` (or other
        error) that its read ended with, in its place."""
        started = time.monotonic()
        with store_failures(self._where, f"{len(starts)} byte ranges"):
            limit = self._where.read_timeout(sum(ends) - sum(starts))
            out = list(self._fs.cat_ranges([self._path] * len(starts), starts, ends, **limit))
        for i, blob in enumerate(out):
            if isinstance(blob, BaseException):
                what = f"bytes {starts[i]}-{ends[i] - 1}"
                err = explain(blob, self._where, what=what, seconds=time.monotonic() - started)
                if err is not None and err is not blob:
                    err.__cause__ = blob
                    out[i] = err
        return out

    @property
    def stats(self) -> ReadStats:
        """What the remote reads fetched (all zero for a local file)."""
        return self.remote.stats if self.remote is not None else self._stats

    @property
    def fd(self) -> int | None:
        """The open descriptor of a local file (None for remote files, or once closed)."""
        return self._fd

    def close(self) -> None:
        """Release the file descriptor (remote readers hold nothing to release)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read_into(self, ranges: Sequence[tuple[int, int]], buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers[i]`` with the bytes of ``ranges[i] = (offset, nbytes)``.

        Ranges are read in file order; ranges that touch are read with one system call (local);
        remote ones are coalesced into few concurrent requests (see the module docstring).

        Raises:
            IntegrityError: the file ended before a range did (truncated file).
        """
        if not len(ranges):
            return
        # Plain Python, not numpy: a batch holds tens of ranges, and numpy's fixed cost per
        # call (~20 us) was most of the time of a read split over several files.
        runs: list[tuple[int, int, list[int]]] = []  # (start, end, buffer indices in order)
        for offset, size, i in sorted((int(o), int(n), i) for i, (o, n) in enumerate(ranges)):
            if runs and runs[-1][1] == offset and len(runs[-1][2]) < _IOV_MAX:
                runs[-1] = (runs[-1][0], offset + size, runs[-1][2])
                runs[-1][2].append(i)
            else:
                runs.append((offset, offset + size, [i]))
        if self._fd is not None:
            for start, end, members in runs:
                self._preadv([buffers[i] for i in members], start, end - start)
            return
        assert self.remote is not None
        if self._went_local():
            for start, end, members in runs:
                self._preadv([buffers[i] for i in members], start, end - start)
            return
        parts = self.remote.read([r[0] for r in runs], [r[1] for r in runs])
        for (start, _, members), views in zip(runs, parts, strict=True):
            _scatter(views, [(int(ranges[i][0]) - start, buffers[i]) for i in members])

    def prefetch(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Start fetching in the background what a later :meth:`read_into` of ``ranges``
        (``(offset, nbytes)``) will need (:meth:`RemoteRanges.prefetch`); nothing locally."""
        if self.remote is None or not len(ranges) or self._went_local():
            return
        spans = sorted((int(o), int(o) + int(n)) for o, n in ranges)
        self.remote.prefetch([a for a, _ in spans], [b for _, b in spans])

    def _went_local(self) -> bool:
        """Whether the remote file's store now holds it whole, validated (a cache entry that
        filled, :mod:`h5forge.read.fill`): then this reader reads that copy with ``preadv``
        from here on, as a local file (its descriptor is this reader's own)."""
        assert self.remote is not None
        store = self.remote.store
        fd = store.local_fd() if store is not None else None
        if fd is None:
            return False
        self._fd, self._stats, self.remote = os.dup(fd), self.remote.stats, None
        return True

    def _preadv(self, buffers: list[memoryview], offset: int, want: int) -> None:
        """``preadv`` until every buffer is full (Linux caps one call at ~2 GiB)."""
        assert self._fd is not None
        got = os.preadv(self._fd, buffers, offset)
        if got == want:
            return
        done = 0
        while got:
            done += got
            if done == want:
                return
            rest, skip = [], done
            for b in buffers:  # drop what was filled, keep the remainder
                if skip >= len(b):
                    skip -= len(b)
                else:
                    rest.append(b[skip:])
                    skip = 0
            got = os.preadv(self._fd, rest, offset + done)
        self._short(offset, want, done)

    def _short(self, offset: int, want: int, got: int) -> None:
        raise IntegrityError(
            f"{self.url}: read of {want} bytes at offset {offset} returned {got}; the file is "
            "truncated — re-fetch or re-pack it"
        )


def _scatter(views: list[memoryview], pieces: list[tuple[int, memoryview]]) -> None:
    """Copy a run held as consecutive ``views`` into ``pieces``: each ``(at, buffer)`` takes the
    run's bytes from offset ``at``, ``len(buffer)`` of them (``at`` ascending)."""
    if len(views) == 1:
        view = views[0]
        for at, buf in pieces:
            buf[:] = view[at : at + len(buf)]
        return
    k, lo = 0, 0  # the view holding offset ``lo`` of the run, and where it starts
    for at, buf in pieces:
        n, done = len(buf), 0
        while done < n:
            while at + done >= lo + len(views[k]):
                lo += len(views[k])
                k += 1
            view = views[k]
            a = at + done - lo
            take = min(n - done, len(view) - a)
            buf[done : done + take] = view[a : a + take]
            done += take
