"""Check the sample bytes a merge copies: :class:`CheckedCopy`, each sample's sha256 in hand.

Two ways to know a copy (:mod:`h5forge.scale.stored_copy`) is right, chosen per shard by the
merge:

- **By the shard file's sha256** (``check=None`` there): the shard has a manifest and the merge
  hashes the whole file against it (:mod:`h5forge.scale.file_check`), so the bytes need not pass
  through Python at all. Unfiltered chunks and blobs move with ``os.copy_file_range`` (in the
  kernel, no user-space copy) in runs that lie back to back in both files (``RangeCopy``,
  which falls back to ``pread``/``pwrite`` where the kernel or filesystem cannot). Filtered
  chunks are read from the shard with ``pread`` (their offsets and filter masks from one pass
  over the chunk index) and written with ``write_direct_chunk``, mask carried, never inflated.
- **By each sample's sha256** (a :class:`CheckedCopy`): bare sealed files without a manifest.
  The merge holds every byte it copies in memory at some point and checks it there: each
  sample's sha256 is computed from the bytes in hand and compared with the digest its shard
  recorded. Hashing runs on helper threads (hashlib and zlib release the GIL) while the calling
  thread reads and writes the next block. Unfiltered chunks and blobs move in blocks of up to
  16 MiB (one ``pread`` and one ``pwrite`` each), hashed from the same buffer; filtered chunks
  are copied as stored and, since the digest covers the pixels, decompressed once to be
  checked: gzip with zlib on the helper threads, other pipelines (lzf, Blosc, Zstd,
  fletcher32) by HDF5 from the shard.

Memory is bounded: at most :data:`_IN_FLIGHT` bytes wait for their hash at any time, and the
kernel copy holds none.
"""

from __future__ import annotations

import hashlib
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from h5forge.cpus import usable_cpus
from h5forge.scale.kernel_copy import BLOCK as _BLOCK
from h5forge.scale.kernel_copy import pread_into, pwrite_all

__all__ = ["CheckedCopy"]

_IN_FLIGHT = 48 << 20  # bytes held for hashing at once


def _hash_threads() -> int:
    return max(1, min(4, usable_cpus()))


class CheckedCopy:
    """Copies sample bytes and checks each sample's sha256 against its expected digest.

    Use as a context manager; :attr:`failures` lists every mismatch (one line each) once
    :meth:`wait` returned. A failure never stops the copy: the caller decides what to raise.
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(_hash_threads(), thread_name_prefix="h5forge-hash")
        self._pending: deque[tuple[Future[list[str]], int, bytearray | None]] = deque()
        self._held = 0
        self._free: list[bytearray] = []
        self.failures: list[str] = []
        self.checked = 0

    def __enter__(self) -> CheckedCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _make_room(self, nbytes: int) -> None:
        while self._pending and self._held + nbytes > _IN_FLIGHT:
            self._retire()

    def _submit(
        self, nbytes: int, buffer: bytearray | None, fn: Callable[..., list[str]], *args: Any
    ) -> None:
        self._pending.append((self._pool.submit(fn, *args), nbytes, buffer))
        self._held += nbytes

    def _retire(self) -> None:
        future, nbytes, buffer = self._pending.popleft()
        self.failures += future.result()
        self._held -= nbytes
        if buffer is not None:
            self._free.append(buffer)

    def wait(self) -> list[str]:
        """Wait for every submitted check; return all failures so far (one line each)."""
        while self._pending:
            self._retire()
        return self.failures

    def _buffer(self, size: int) -> bytearray:
        for k, buf in enumerate(self._free):
            if len(buf) >= size:
                return self._free.pop(k)
        return bytearray(max(size, _BLOCK))

    def copy_ranges(
        self,
        src_fd: int,
        dst_fd: int,
        src: np.ndarray,
        dst: np.ndarray,
        sizes: np.ndarray,
        digests: np.ndarray,
        label: Callable[[int], str],
    ) -> None:
        """Copy samples ``j`` (``sizes[j]`` bytes from ``src[j]`` to ``dst[j]``) and check them.

        Samples that lie back to back in both files are moved in blocks of up to 16 MiB (one
        ``pread`` and one ``pwrite`` each); their digests are checked from the same buffer.
        ``label(j)`` names sample ``j`` in a failure message.
        """
        src, dst, sizes = (np.asarray(a, np.int64) for a in (src, dst, sizes))
        ends = src + sizes
        # follows[j]: sample j + 1 follows sample j directly in both files
        follows = ((src[1:] == ends[:-1]) & (dst[1:] == dst[:-1] + sizes[:-1])).tolist()
        size = sizes.tolist()
        m, j = len(size), 0
        while j < m:
            k, total = j + 1, size[j]
            while k < m and follows[k - 1] and total + size[k] <= _BLOCK:
                total += size[k]
                k += 1
            self._make_room(max(total, _BLOCK))
            buf = self._buffer(total)
            view = memoryview(buf)[:total]
            pread_into(src_fd, view, int(src[j]))
            pwrite_all(dst_fd, view, int(dst[j]))
            self._submit(
                len(buf),
                buf,
                _check_block,
                view,
                size[j:k],
                [bytes(d) for d in digests[j:k]],
                label,
                j,
            )
            self.checked += k - j
            j = k

    def check(
        self,
        data: bytes | np.ndarray,
        want: bytes,
        name: str,
        decode: Callable[[bytes], bytes] | None = None,
    ) -> None:
        """Check one sample's bytes in hand; ``decode`` (e.g. ``zlib.decompress``) runs first,
        on the helper thread."""
        nbytes = data.nbytes if isinstance(data, np.ndarray) else len(data)
        self._make_room(nbytes)
        self._submit(nbytes, None, _check_one, data, want, name, decode)
        self.checked += 1


def _check_block(
    view: memoryview, sizes: list[int], wants: list[bytes], label: Callable[[int], str], first: int
) -> list[str]:
    fails, pos = [], 0
    for k, (size, want) in enumerate(zip(sizes, wants, strict=True)):
        got = hashlib.sha256(view[pos : pos + size]).digest()
        if got != want:
            fails.append(
                f"{label(first + k)}: sha256 of the copied bytes is {got.hex()}, the "
                f"shard's /digests says {want.hex()}"
            )
        pos += size
    return fails


def _check_one(
    data: Any, want: bytes, name: str, decode: Callable[[bytes], bytes] | None
) -> list[str]:
    if decode is not None:
        try:
            data = decode(data)
        except (zlib.error, ValueError, OSError) as e:
            return [f"{name}: its stored chunk does not decompress ({type(e).__name__}: {e})"]
    got = hashlib.sha256(data).digest()
    if got != want:
        return [
            f"{name}: sha256 of the copied (decompressed) bytes is {got.hex()}, the "
            f"shard's /digests says {want.hex()}"
        ]
    return []
