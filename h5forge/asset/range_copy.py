"""In-kernel file-to-file copies with a user-space fallback, and early writeback of the output.

``os.copy_file_range`` moves bytes between two files inside the kernel (no copy through user
space; a reflink where the filesystem can). :class:`RangeCopy` uses it and falls back to
``pread``/``pwrite`` through one reused buffer where the kernel or the filesystem cannot.
:func:`writeback_starter` returns how to start writing a file's dirty pages to disk without
waiting, so the fsync that must precede a seal finds little left to do.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable

import numpy as np

from h5forge.platforms import require_calls

__all__ = ["BLOCK", "RangeCopy", "pread_into", "pwrite_all", "runs", "writeback_starter"]

BLOCK = 16 << 20  # bytes read and written per system call when copying through user space
# copy_file_range cannot serve this pair of files (other filesystems on old kernels, no
# support in the filesystem or the OS): copy through user space instead.
_NO_KERNEL_COPY = frozenset(
    {
        errno.EXDEV,
        errno.ENOSYS,
        errno.EOPNOTSUPP,
        errno.EINVAL,
        getattr(errno, "ENOTSUP", errno.EOPNOTSUPP),
    }
)
_SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>: start writeback of the dirty pages, do not wait


def pread_into(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n == 0:
            raise EOFError(
                f"the file ends at byte {offset + done}, inside a sample's stored "
                f"bytes ({offset}..{offset + len(view) - 1}): truncated?"
            )
        done += n


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], offset + done)


class RangeCopy:
    """Copies byte ranges file to file in the kernel (``os.copy_file_range``), else in blocks.

    Falls back to ``pread``/``pwrite`` through one reused 16 MiB buffer, for the rest of its
    copies, when ``copy_file_range`` is missing, raises ``EXDEV``, ``ENOSYS``, ``EOPNOTSUPP`` or
    ``EINVAL``, or returns 0 before the range is done (the fallback then reports a source that
    really ends early).
    """

    def __init__(self) -> None:
        require_calls("copying stored samples", "preadv")
        self.kernel = hasattr(os, "copy_file_range")
        self._buf: bytearray | None = None

    def __call__(self, src_fd: int, dst_fd: int, src: int, dst: int, size: int) -> None:
        """Copy ``size`` bytes from offset ``src`` of ``src_fd`` to offset ``dst`` of ``dst_fd``."""
        done = 0
        while self.kernel and done < size:
            try:
                n = os.copy_file_range(src_fd, dst_fd, size - done, src + done, dst + done)
            except OSError as e:
                if e.errno not in _NO_KERNEL_COPY:
                    raise
                n = 0
            if n == 0:
                self.kernel = False
            done += n
        if done < size:
            self._by_blocks(src_fd, dst_fd, src + done, dst + done, size - done)

    def _by_blocks(self, src_fd: int, dst_fd: int, src: int, dst: int, size: int) -> None:
        if self._buf is None:
            self._buf = bytearray(BLOCK)
        buf = memoryview(self._buf)
        for pos in range(0, size, BLOCK):
            view = buf[: min(BLOCK, size - pos)]
            pread_into(src_fd, view, src + pos)
            pwrite_all(dst_fd, view, dst + pos)


def runs(src: np.ndarray, dst: np.ndarray, sizes: np.ndarray) -> list[tuple[int, int, int]]:
    """``(src, dst, size)`` of the longest runs of items back to back in both files."""
    if not len(sizes):
        return []
    follows = (src[1:] == src[:-1] + sizes[:-1]) & (dst[1:] == dst[:-1] + sizes[:-1])
    starts = np.concatenate([[0], np.flatnonzero(~follows) + 1])
    stops = np.concatenate([starts[1:], [len(sizes)]])
    ends = src[stops - 1] + sizes[stops - 1]
    return list(
        zip(src[starts].tolist(), dst[starts].tolist(), (ends - src[starts]).tolist(), strict=True)
    )


def writeback_starter() -> Callable[[int], None]:
    """``start(fd)``: start writing the file's dirty pages to disk.

    On Linux, ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` queues the writes and returns: the
    disk works while the caller goes on, and the fsync before the seal waits for them (and
    reports their errors, which this call does not consume). Elsewhere ``fdatasync``, which
    waits: call it on a helper thread and check its result before sealing.
    """
    sync = getattr(os, "fdatasync", os.fsync)
    try:
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError, TypeError):  # not Linux / not glibc or musl
        return sync
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int

    def start(fd: int) -> None:
        if call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE) != 0:
            err = ctypes.get_errno()
            if err not in (errno.ENOSYS, errno.EINVAL, errno.ESPIPE):
                raise OSError(err, f"sync_file_range: {os.strerror(err)}")
            sync(fd)

    return start
