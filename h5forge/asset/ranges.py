"""Read sample byte ranges of an asset: ``os.preadv`` locally, fsspec ``cat_ranges`` remotely.

Local files are read with ``os.preadv`` straight into caller buffers. Remote files are read by
:class:`h5forge.asset.coalesce.RemoteRanges`: a batch's ranges coalesced into few concurrent
requests, with aligned read-ahead blocks kept for later batches (see that module).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from h5forge.asset.coalesce import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_KEEP_BYTES,
    DEFAULT_MAX_GAP,
    DEFAULT_MAX_REQUEST,
    BlockSource,
    ReadStats,
    RemoteRanges,
)
from h5forge.asset.open import is_local, url_to_fs
from h5forge.errors import IntegrityError

__all__ = ["RangeReader", "open_ranges"]

# Most buffers one preadv call takes (IOV_MAX).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class RangeReader:
    """Reads absolute byte ranges of one file, locally with ``preadv`` or remotely.

    Create it in the process that reads (it holds a file descriptor or a filesystem client).
    ``size`` (the file's, when the caller knows it) saves a remote reader one request; the
    other keywords tune remote reads (:class:`h5forge.asset.coalesce.RemoteRanges`; ``store``:
    its blocks kept on local disk).
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        max_gap: int = DEFAULT_MAX_GAP,
        max_request: int = DEFAULT_MAX_REQUEST,
        block_bytes: int = DEFAULT_BLOCK_BYTES,
        keep_bytes: int = DEFAULT_KEEP_BYTES,
        size: int | None = None,
        store: BlockSource | None = None,
    ) -> None:
        self.url = url
        self._fs, self._path = url_to_fs(url, storage_options)
        self._fd: int | None = None
        self.remote: RemoteRanges | None = None
        if is_local(self._fs):
            self._fd = os.open(self._path, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)
        else:
            self.remote = RemoteRanges(
                self._cat_ranges,
                int(self._fs.size(self._path)) if size is None else size,
                self._short,
                max_gap=max_gap,
                max_request=max_request,
                block_bytes=block_bytes,
                keep_bytes=keep_bytes,
                store=store,
            )

    def _cat_ranges(self, starts: list[int], ends: list[int]) -> list[Any]:
        return list(self._fs.cat_ranges([self._path] * len(starts), starts, ends))

    @property
    def stats(self) -> ReadStats:
        """What the remote reads fetched (all zero for a local file)."""
        return self.remote.stats if self.remote is not None else ReadStats()

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
        arr = np.asarray(ranges, dtype=np.int64).reshape(-1, 2)
        order = np.argsort(arr[:, 0], kind="stable")
        starts, sizes = arr[order, 0], arr[order, 1]
        # Runs of ranges that touch are read with one call; at most _IOV_MAX buffers each.
        cut = np.flatnonzero(starts[1:] != starts[:-1] + sizes[:-1]) + 1
        bounds = [0, *cut.tolist(), len(order)]
        order_l, starts_l, sizes_l = order.tolist(), starts.tolist(), sizes.tolist()
        runs = [
            (lo, min(lo + _IOV_MAX, hi))
            for a, hi in zip(bounds[:-1], bounds[1:], strict=True)
            for lo in range(a, hi, _IOV_MAX)
        ]
        if self._fd is not None:
            for lo, hi in runs:
                self._preadv(
                    [buffers[i] for i in order_l[lo:hi]], starts_l[lo], sum(sizes_l[lo:hi])
                )
            return
        assert self.remote is not None
        run_starts = [starts_l[lo] for lo, _ in runs]
        run_ends = [starts_l[hi - 1] + sizes_l[hi - 1] for _, hi in runs]
        for (lo, hi), view in zip(runs, self.remote.read(run_starts, run_ends), strict=True):
            pos = 0
            for k in range(lo, hi):
                n = sizes_l[k]
                buffers[order_l[k]][:] = view[pos : pos + n]
                pos += n

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


def open_ranges(url: str, storage_options: dict[str, Any] | None = None) -> RangeReader:
    """Return a :class:`RangeReader` for ``url`` (default coalescing and read-ahead)."""
    return RangeReader(url, storage_options)
