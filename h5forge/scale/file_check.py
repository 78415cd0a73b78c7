"""Check whole part files against their sidecars: one sha256 per file, on helper threads.

A published part has a sidecar, written last by :func:`h5forge.publish.storage.publish`, that
records
the whole file's sha256 and size. The file's sha256 covers every byte the merge copies (image
bytes as stored, compressed or not, the index, the digests), so when it matches, what the merge
copied is what was packed and verified: the per-sample digests need not be recomputed and
compressed chunks need not be inflated.

The file is hashed with no copy into user space: it is mapped (``mmap``) and fed to hashlib in
memoryview slices; hashlib releases the GIL, so hashing runs on a small pool of threads (two
files at once with two or more CPUs) beside the copy, which the kernel does. A job reads nothing
into memory that it holds: the mapped pages are the page cache's.

The hash and the copy read the file through different descriptors (HDF5 opens it by path too),
possibly at different times, so the file's identity (device, inode, size, modification time in
ns) is taken when the merge first opens it (the survey), when the hash begins and ends, and when
the copy ends (through the copy's descriptor and through the path); the merge accepts a part
only when they are all one and the same: what was hashed is then what was copied (short of an
in-place rewrite within one tick of the filesystem's clock that keeps the size). A file
truncated in place while it is mapped would stop the process with SIGBUS; h5forge never rewrites
a published part in place (publish renames a new file over it, which leaves the mapped one
intact).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from h5forge.cpus import usable_cpus
from h5forge.errors import IntegrityError
from h5forge.files import open_regular

__all__ = ["Expected", "FileChecks", "FileIdentity"]

# Bytes per hashlib call (~25 ms here). The GIL is released during a call and taken back
# between calls, which waits up to one switch interval (5 ms) while the merge's thread runs
# Python: long slices keep that wait small.
_SLICE = 32 << 20


@dataclass(frozen=True)
class FileIdentity:
    """What tells one version of a file from another without reading it."""

    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, fd_or_path: int | str) -> FileIdentity:
        st = os.fstat(fd_or_path) if isinstance(fd_or_path, int) else os.stat(fd_or_path)
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)

    def __str__(self) -> str:
        return f"device {self.dev}, inode {self.ino}, {self.size} bytes, mtime {self.mtime_ns} ns"


@dataclass(frozen=True)
class Expected:
    """A part's sidecar, as far as the check needs it."""

    url: str  # the part, for messages
    sidecar_url: str  # its sidecar, for messages
    sha256: str
    size: int


class _Cancelled(Exception):
    """The merge stopped before this hash finished."""


def _changed(url: str, first: str, a: FileIdentity, then: str, b: FileIdentity) -> IntegrityError:
    return IntegrityError(
        f"{url} changed during the merge: {first} it was ({a}), {then} ({b}); what was hashed "
        "may not be what was copied. Run the merge again once nothing writes to the part; if "
        "it was re-packed, run the build again (find_done_parts checks it against its sidecar)"
    )


def _sha256_mapped(path: str, url: str, stop: threading.Event) -> tuple[str, FileIdentity]:
    """The sha256 of the file at ``path``, read through a read-only mapping."""
    fd = open_regular(path, "part")  # never waits on a FIFO planted in the staging folder
    try:
        before = FileIdentity.of(fd)
        digest = hashlib.sha256()
        if before.size:
            with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mapped:
                if len(mapped) != before.size:
                    raise _changed(
                        url, "when opened", before, "when mapped it had", FileIdentity.of(fd)
                    )
                if hasattr(mmap, "MADV_SEQUENTIAL"):  # read ahead: it is read once, in order
                    mapped.madvise(mmap.MADV_SEQUENTIAL)
                with memoryview(mapped) as view:
                    for start in range(0, before.size, _SLICE):
                        if stop.is_set():
                            raise _Cancelled
                        digest.update(view[start : start + _SLICE])
        after = FileIdentity.of(fd)
        if after != before:
            raise _changed(url, "when the hash began", before, "when it ended it was", after)
        return digest.hexdigest(), before
    finally:
        os.close(fd)


def _hash_threads() -> int:
    return 2 if usable_cpus() >= 2 else 1


class FileChecks:
    """Hashes whole files on a bounded pool of threads and checks them against their sidecars.

    :meth:`start` queues a file's hash (one file per thread); :meth:`copied` records the identity
    the copy saw; :meth:`settle` waits for a file's hash and raises :class:`IntegrityError` on
    any mismatch. Use as a context manager: leaving it stops the hashes still running.

    Hashing runs at most ``2 x threads`` files ahead of the copy, so that on a driver whose
    parts do not fit in memory a file hashed is still in the page cache when it is copied.
    """

    def __init__(self, threads: int | None = None) -> None:
        threads = threads or _hash_threads()
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="h5forge-filehash")
        self._ahead = 2 * threads
        self._stop = threading.Event()
        self._expected: dict[int, Expected] = {}
        self._waiting: deque[tuple[int, str]] = deque()
        self._hashes: dict[int, Future[tuple[str, FileIdentity]]] = {}
        self._copied: dict[int, FileIdentity] = {}

    def __enter__(self) -> FileChecks:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def __contains__(self, key: int) -> bool:
        return key in self._expected

    def start(self, key: int, path: str, expected: Expected) -> None:
        """Queue the hash of the local file ``path`` (part ``key``); a wrong size fails now."""
        size = os.stat(path).st_size
        if size != expected.size:
            raise IntegrityError(
                f"{expected.url} has {size} bytes, its sidecar {expected.sidecar_url} records "
                f"{expected.size}: the part changed after it was published. Run the build again "
                "(find_done_parts sees the mismatch and re-packs it) or re-pack it with "
                "h5forge.scale.parts.pack_part"
            )
        self._expected[key] = expected
        self._waiting.append((key, path))
        self._pump()

    def _pump(self) -> None:
        """Start queued hashes while fewer than ``_ahead`` hashed files wait for their copy."""
        while self._waiting and len(self._hashes) - len(self._copied) < self._ahead:
            self._submit(*self._waiting.popleft())

    def _submit(self, key: int, path: str) -> None:
        self._hashes[key] = self._pool.submit(
            _sha256_mapped, path, self._expected[key].url, self._stop
        )

    def copied(self, key: int, path: str, fd: int, opened: FileIdentity) -> None:
        """Record that part ``key`` was copied through ``fd`` from the file at ``path``.

        ``opened`` is the file's identity when the merge first opened it (its survey, for a
        local part), before any byte of it was read.

        Raises:
            IntegrityError: the file changed, or ``path`` names another file, since ``opened``.
        """
        url = self._expected[key].url
        for now, then in (
            (FileIdentity.of(fd), "when the copy ended it was"),
            (FileIdentity.of(path), "when the copy ended its path named"),
        ):
            if now != opened:
                raise _changed(url, "when first opened", opened, then, now)
        if key not in self._hashes:  # copied before its turn to be hashed came
            entry = next(e for e in self._waiting if e[0] == key)
            self._waiting.remove(entry)
            self._submit(*entry)
        self._copied[key] = opened
        self._pump()

    def settle(self, key: int) -> None:
        """Wait for part ``key``'s hash; check it and the identities against the copy's.

        Raises:
            IntegrityError: the sha256 differs from the sidecar's, or the file the hash read
                is not the one the copy read.
        """
        expected = self._expected.pop(key)
        actual, hashed = self._hashes.pop(key).result()
        if actual != expected.sha256:
            raise IntegrityError(
                f"{expected.url}: sha256 of the part file is {actual}, its sidecar "
                f"{expected.sidecar_url} records {expected.sha256}: the part changed after it "
                "was published. Run the build again (find_done_parts sees the mismatch and "
                "re-packs it) or re-pack it with h5forge.scale.parts.pack_part"
            )
        copied = self._copied.pop(key)
        if copied != hashed:
            raise _changed(expected.url, "when hashed", hashed, "when copied it was", copied)

    def settle_finished(self) -> None:
        """Settle every copied part whose hash is already done (fail early, never wait)."""
        for key in [k for k in self._copied if self._hashes[k].done()]:
            self.settle(key)

    def settle_all(self) -> None:
        """Settle every copied part, waiting for the hashes still running."""
        for key in list(self._copied):
            self.settle(key)
