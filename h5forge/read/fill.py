"""A cache entry filled from the reader's own range requests, then checked whole.

The default cache of a remote asset (:mod:`h5forge.read.cache`) does not download the file before
the first batch: the reader fetches what its batches need (aligned blocks, coalesced,
:class:`h5forge.asset.coalesce.RemoteRanges`), and a :class:`FillStore` keeps every block it
fetched in the asset's cache entry, so that the next batch, worker, epoch or job that needs the
block reads it from local disk. Once every block is there, the file is hashed whole and becomes an
ordinary whole-file entry, read with ``pread`` like a local file.

In the entry folder (made and marked by the cache, one per asset identity or shard content
address):

- ``fill.h5``: a sparse file of the asset's size; block ``k`` is written at ``k * block_bytes``.
- ``NNNNNNNNNN.have``: block ``k``'s CRC-32 (4 bytes, big-endian), written (fresh exclusive temp
  name, then renamed) after its bytes. A block is served from ``fill.h5`` only when its record
  exists and the bytes match it; anything else is fetched again (a torn write, a crash, a
  flipped byte). A checksum, not a digest, is enough here and costs a third of one (4.6 vs
  1.6 GB/s on the benchmark machine, ~0.2 s of CPU in a 301 MB file's first epoch): whoever can
  write the entry can write a matching sha256 as easily, so the record guards against accidents
  only; what guards the content is the whole file's sha256, checked before the entry is sealed
  and served as a local copy. (A record of another length, an earlier h5forge's sha256, is a
  missing one: its block is fetched again.)
- Complete: when at most ``max(8 MiB, 1/32)`` of the file is missing, the process that noticed
  (one that fetched blocks, or one that only read them from the entry, as after a job killed
  before the check: every block kept, none sealed), if it found the entry's lock free (another
  process, finishing it, is not waited for), fetches the rest on a helper thread while it
  hashes the kept blocks before the first missing one, then hashes the rest of ``fill.h5``
  under the entry's lock while a helper thread writes its pages to disk (the seal's ``fsync``
  then waits for little), and only if it matches the sha256 the sidecar, pinned version or
  version manifest records renames it to ``asset.h5`` with the entry's record
  (:mod:`h5forge.read.cache`'s layout): from then on every process reads it as a validated
  local copy (:meth:`FillStore.local_fd`). A mismatch fetches every block again, once (a block
  damaged on disk after its record is no fault of the server); if the server's own bytes do not
  hash right, everything fetched is removed and :class:`~h5forge.errors.IntegrityError` raised:
  the server's bytes are not the asset's. In a DataLoader worker all of this runs on a thread
  of its own, beside the worker's next batches (:meth:`FillStore.complete`).

Blocks are written by any worker of any job on the machine at once: distinct blocks land in
distinct byte ranges of one file, and a block written twice holds the same bytes. A block that
two of them want at the same moment is fetched by one: the first to claim it (``NNNNNNNNNN.want``,
:class:`h5forge.read.block_cache.BlockClaims`); the other reads it from the entry once kept (two
workers' batches share the block at the boundary of their sample blocks). A full disk,
an entry evicted meanwhile, or a cache that cannot be written stops filling with a warning; the
read goes on from the server.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from h5forge.documents import DocumentError, parse_json
from h5forge.errors import BusyError, IntegrityError
from h5forge.files import (
    CLOEXEC,
    NOFOLLOW,
    NONBLOCK,
    create_exclusive,
    hash_fd,
    is_ours,
    make_marked_dir,
    remove_marked,
    replace_file,
    sha256_fd,
)
from h5forge.location import MAX_CACHE_RECORD_BYTES
from h5forge.locks import lock_file
from h5forge.read.block_cache import BlockClaims, evict_cache

__all__ = [
    "BESIDE_BYTES",
    "FILL_BLOCK_BYTES",
    "FillStore",
    "entry_record",
    "identity",
    "read_entry_file",
    "room_for",
]

log = logging.getLogger("h5forge.read.fill")

#: Block size of a filling entry: small enough that a batch of a block-shuffled order fetches
#: little beyond its samples, large enough that a 100 GB asset has ~50,000 records.
FILL_BLOCK_BYTES = 2 << 20
_FILL, _ASSET, _RECORD, _HAVE = "fill.h5", "asset.h5", "entry.json", ".have"
_DIGEST = 4  # a block record: its CRC-32, big-endian
_CHUNK = 8 << 20


def identity(st: os.stat_result) -> list[int]:
    """What a validated copy's record keeps of its ``stat``: a write moves mtime and ctime."""
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def entry_record(entry: str, kind: str) -> dict[str, Any] | None:
    """The record of a whole-file entry (``entry.json``), None when missing, not a regular
    file, too large, not JSON or not of ``kind``."""
    raw = read_entry_file(os.path.join(entry, _RECORD), MAX_CACHE_RECORD_BYTES)
    if raw is None:
        return None
    try:
        data = parse_json(raw, what="cache record", name=entry)
    except DocumentError:
        return None
    return data if isinstance(data, dict) and data.get("format") == kind else None


def read_entry_file(path: str, limit: int) -> bytes | None:
    """The bytes of a file in a cache entry; None when it is missing, a link, not a regular
    file or over ``limit`` bytes. Non-blocking: a FIFO planted under its name (a shared
    cache_dir) would block the open forever; it is refused unread, as a link is by NOFOLLOW."""
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        raw = f.read(limit + 1)
    return None if len(raw) > limit else raw


def room_for(folder: str, nbytes: int) -> bool:
    """Whether ``folder``'s file system has ``nbytes`` free beside a reserve of 5% of the disk
    (at most 1 GiB), for other programs."""
    try:
        fs = os.statvfs(folder)
    except OSError:
        return False
    free, total = fs.f_bavail * fs.f_frsize, fs.f_blocks * fs.f_frsize
    return free - nbytes >= min(1 << 30, total // 20)


def _checksum(data: bytes | memoryview) -> bytes:
    """A block record's content: ``data``'s CRC-32, 4 bytes big-endian."""
    return zlib.crc32(data).to_bytes(_DIGEST, "big")


#: Orders the adoption of a sealed copy by a reader and by its finishing thread (one
#: descriptor each store, none leaked).
_ADOPTING = threading.Lock()
#: ... and the opening of a fill file, by a reader and the threads that fetch ahead and finish.
_OPENING = threading.Lock()


#: Files up to this size are finished beside the worker's batches. A larger one's hash could
#: outlast the 5 s torch gives a worker to exit at the end of an epoch without persistent
#: workers (then it is killed, and the entry would never be sealed): it is finished in the
#: batch that noticed, as in the main process (its stall is then a small part of its epoch).
BESIDE_BYTES = 1 << 30
_FINISHER: tuple[int, ThreadPoolExecutor] | None = None  # (pid, its finishing thread)


def _finisher() -> ThreadPoolExecutor:
    """This process's one thread finishing cache entries (a forked child makes its own)."""
    global _FINISHER
    if _FINISHER is None or _FINISHER[0] != os.getpid():
        pool = ThreadPoolExecutor(1, thread_name_prefix="h5forge-cache-finish")
        _FINISHER = (os.getpid(), pool)
    return _FINISHER[1]


def _in_worker() -> bool:
    """Whether this process is a DataLoader worker (torch says so once it is imported)."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def _write_small(path: str, data: bytes) -> None:
    """``data`` under ``path`` through a fresh exclusive temp name, no fsync: a record lost in a
    crash only costs its block a fetch; a wrong one fails its hash."""
    replace_file(path, data, 0o600, fsync=False)


@contextlib.contextmanager
def _flushing(fd: int) -> Iterator[None]:
    """``fd``'s dirty pages written to disk on a helper thread while the body runs (the fetch of
    the last blocks and the whole-file hash, which only read them): the seal's own ``fsync``
    then has little left to wait for (a 300 MB entry: 0.15 s, here). The seal still makes the
    file durable itself; a failure here is left to it."""
    flush = threading.Thread(target=_fsync_quietly, args=(fd,), name="h5forge-cache-flush")
    flush.start()
    try:
        yield
    finally:
        flush.join()


def _fsync_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.fsync(fd)


@dataclass
class FillStore(BlockClaims):
    """The blocks of one remote file kept in its cache entry (see the module docstring).

    Args:
        entry: the entry folder (``cache_dir/<key>``), made here under its lock when missing.
        kind: the marker kind of a cache entry.
        sha256, size: what the whole file must be (sidecar, pinned version or manifest entry).
        url: the file's URL, for the entry's record and messages.
        limit_bytes: what the whole cache (``entry``'s folder) may hold: before the first block
            is written, the least recently used entries are evicted to make room for ``size``
            bytes, and nothing is kept when the disk has less than that free (beside a reserve
            of 5% of the disk, at most 1 GiB).
    """

    entry: str
    kind: str
    sha256: str
    size: int
    url: str
    limit_bytes: int
    block_bytes: int = FILL_BLOCK_BYTES
    hits: int = 0
    misses: int = 0
    _fd: int | None = field(default=None, repr=False)
    _local: int | None = field(default=None, repr=False)
    _off: bool = field(default=False, repr=False)
    _calls: int = field(default=0, repr=False)
    _seen: int = field(default=0, repr=False)  # blocks kept or read from the entry here
    _counted: int = field(default=-1, repr=False)  # ... when the missing ones were last counted
    _finishing: Future[None] | None = field(default=None, repr=False)
    _failure: BaseException | None = field(default=None, repr=False)  # the finishing's

    def __getstate__(self) -> dict[str, Any]:
        # Descriptors and threads stay in the process that made them; a worker has its own.
        state = {**self.__dict__, "_fd": None, "_local": None, "_pid": os.getpid()}
        return {**state, "_finishing": None, "_failure": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.pop("_pid", None)
        self.__dict__.update(state)

    @property
    def blocks(self) -> int:
        return -(-self.size // self.block_bytes)

    def _have(self, k: int) -> str:
        return os.path.join(self.entry, f"{k:010d}{_HAVE}")

    # --- the validated whole file, once complete ----------------------------------------------
    def local_fd(self) -> int | None:
        """A descriptor of the completed, validated ``asset.h5`` (this process's own), or None
        while the entry is still filling."""
        if self._local is None:
            fd = self._adopt()
            with _ADOPTING:  # the finishing thread adopts the copy it sealed as well
                if self._local is None:
                    self._local, fd = fd, None
            if fd is not None:
                os.close(fd)
        return self._local

    def _adopt(self) -> int | None:
        asset = os.path.join(self.entry, _ASSET)
        try:
            st = os.lstat(asset)
        except OSError:
            return None
        record = entry_record(self.entry, self.kind)
        if (
            record is None
            or record.get("sha256") != self.sha256
            or record.get("stat") != identity(st)
            or st.st_size != self.size
        ):
            return None  # being written, changed since, or another's: the cache decides at open
        try:
            fd = os.open(asset, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
        except OSError:
            return None
        if identity(os.fstat(fd)) != record["stat"]:
            os.close(fd)
            return None
        return fd

    # --- BlockSource ------------------------------------------------------------------------
    def get(self, k: int, size: int) -> bytes | None:
        """Block ``k``'s ``size`` bytes if kept and intact (else None: fetch it)."""
        local = self.local_fd()
        if local is not None:
            data = os.pread(local, size, k * self.block_bytes)
            if len(data) == size:
                self.hits += 1
                self._seen += 1
                return data
            return None
        try:
            fd = os.open(self._have(k), os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
        except OSError:
            self.misses += 1
            return None
        with os.fdopen(fd, "rb") as f:
            digest = f.read(_DIGEST + 1) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        data = b""
        if len(digest) == _DIGEST and self._open_fill(create=False):
            assert self._fd is not None
            data = os.pread(self._fd, size, k * self.block_bytes)
        if len(data) != size or _checksum(data) != digest:
            self.misses += 1
            return None
        self.hits += 1
        self._seen += 1
        return data

    def has(self, k: int) -> bool:
        """Whether block ``k`` is kept (its record exists, or the file is whole)."""
        return self._local is not None or os.path.lexists(self._have(k))

    def _folder(self) -> str:
        return self.entry

    def _claimable(self) -> bool:
        """Blocks are claimed while the entry fills (made here when missing, as by a put)."""
        return not self._off and self.local_fd() is None and self._open_fill(create=True)

    def put(self, k: int, blob: bytes | memoryview) -> None:
        """Keep block ``k`` as fetched; never raises for the disk: filling just stops."""
        if self._off or self.local_fd() is not None:
            return
        try:
            if not self._open_fill(create=True):
                return
            assert self._fd is not None
            view, at = memoryview(blob), k * self.block_bytes
            while view:
                n = os.pwrite(self._fd, view, at)
                view, at = view[n:], at + n
            _write_small(self._have(k), _checksum(blob))
            self._seen += 1
        except OSError as e:
            self._stop(f"cannot keep block {k}: {e}")

    def complete(self, fetch: Callable[[list[int], list[int]], list[Any]]) -> None:
        """Called after each remote read of a batch: finish the entry when little is missing
        (fetch the rest with ``fetch``, as the reader's own requests, hash the whole file and
        make it a whole-file entry). Counts the missing blocks only when a block was kept or
        read from the entry here since it last did.

        In a DataLoader worker, for a file of at most :data:`BESIDE_BYTES`, the finishing runs
        on the process's finishing thread (one entry at a time: each holds a hash buffer and
        the blocks it fetches), so that the batch that noticed is handed out at once (it held
        back the end of a first epoch by the whole file's hash, ~0.25 s for 300 MB here); the
        worker's reads go on from the server and the entry meanwhile. A worker never forks,
        and exits only once the thread is done (a child's threads, and their queued work, are
        finished before it exits). What the thread raised is raised by the next call, after
        the next batch's read (an IntegrityError is also logged at once: an epoch's last batch
        may have been read).

        Raises:
            IntegrityError: the server's bytes do not hash to the expected sha256 (all kept
                are removed).
        """
        failure, self._failure = self._failure, None
        if failure is not None:
            if self._fd is not None and self._off:
                os.close(self._fd)  # the entry is gone: closed here, never under a read
                self._fd = None
            raise failure
        if self._off or self._local is not None or self._fd is None:
            return
        if self._finishing is not None and not self._finishing.done():
            return
        if self._seen == self._counted:
            return  # nothing kept or read from the entry here since the last count
        self._counted = self._seen
        self._calls += 1
        if self.blocks > 2048 and self._calls % 32:
            return  # a large file: count its records now and then, not after every batch
        missing = self._missing()
        last = self.size - (self.blocks - 1) * self.block_bytes
        gap = len(missing) * self.block_bytes - (self.block_bytes - last if missing else 0)
        if gap > max(8 << 20, self.size // 32):
            return
        if self.size > BESIDE_BYTES or not _in_worker():
            self._finish(fetch, beside=False)
            return
        self._finishing = _finisher().submit(self._finish_beside, fetch)

    def _finish_beside(self, fetch: Callable[[list[int], list[int]], list[Any]]) -> None:
        try:
            self._finish(fetch, beside=True)
        except BaseException as e:  # raised by the reader's next complete()
            if isinstance(e, IntegrityError):
                log.error("%s", e)
            self._failure = e

    def _finish(self, fetch: Callable[[list[int], list[int]], list[Any]], *, beside: bool) -> None:
        """:meth:`complete`'s work under the entry's lock (``beside``: on its own thread, while
        the reader goes on)."""
        assert self._fd is not None
        try:
            with lock_file(
                self.entry + ".lock", wait=False, target=f"the cache entry of {self.url}"
            ):
                if self.local_fd() is not None:
                    return  # another process finished it
                missing = self._missing()
                digest = hashlib.sha256()
                first = self._span(missing[0])[0] if missing else self.size
                # The kept blocks before the first missing one are hashed while the missing
                # ones are fetched and kept on a helper thread; the rest once they are in.
                with ThreadPoolExecutor(1, thread_name_prefix="h5forge-cache-fill") as pool:
                    filling = pool.submit(self._fill_missing, fetch, missing) if missing else None
                    hashed = hash_fd(self._fd, digest, 0, first)
                    if filling is not None and not filling.result():
                        return  # a fetch failed, or filling stopped: the next batch tries again
                # The disk takes the file while the rest is hashed (not while the missing
                # blocks are written: their writes waited behind it), so the seal's fsync
                # finds little left.
                with _flushing(self._fd):
                    if hashed == first:
                        hashed += hash_fd(self._fd, digest, first, self.size)
                    if (hashed != self.size or digest.hexdigest() != self.sha256) and (
                        not self._fetch_all(fetch, close=not beside) or self._hash() != self.sha256
                    ):
                        return  # a fetch failed, or another process wrote meanwhile: again
                    self._seal()
        except BusyError:
            return  # another process is finishing it (or making it): its batches go on here
        except OSError as e:
            self._stop(f"cannot finish the entry: {e}")

    # --- internals ----------------------------------------------------------------------------
    def _fill(
        self,
        fetch: Callable[[list[int], list[int]], list[Any]],
        ks: Sequence[int],
        digest: Any = None,
    ) -> bool:
        """Fetch blocks ``ks`` with ``fetch`` and keep them (fed to ``digest`` too, in order,
        when given); False when a fetch failed or filling stopped."""
        spans = [self._span(k) for k in ks]
        blobs = fetch([a for a, _ in spans], [b for _, b in spans])
        for k, (a, b), blob in zip(ks, spans, blobs, strict=True):
            if isinstance(blob, BaseException) or len(blob) != b - a:
                return False
            if digest is not None:
                digest.update(blob)
            self.put(k, blob)
        return not self._off

    def _fill_missing(
        self, fetch: Callable[[list[int], list[int]], list[Any]], missing: list[int]
    ) -> bool:
        """The completion's fetch of the blocks no batch kept. Those a reader is fetching now
        (another process, or this one's fetch ahead) are waited for, not fetched again: so no
        reader's write of a block lands after the seal (it would change the sealed copy's
        times, and every process would then find the copy changed since it was checked). The
        rest are claimed, fetched and kept; False as :meth:`_fill`."""
        self.settle(missing)
        left = [k for k in missing if not os.path.lexists(self._have(k))]
        mine = [k for k in left if self.claim(k)]
        if len(mine) < len(left):  # claimed by another reader just now
            self.settle(set(left) - set(mine))
            mine = [k for k in left if not os.path.lexists(self._have(k))]
        try:
            return self._fill(fetch, mine) if mine else not self._off
        finally:
            for k in mine:
                self.release(k)

    def _span(self, k: int) -> tuple[int, int]:
        return k * self.block_bytes, min((k + 1) * self.block_bytes, self.size)

    def _missing(self) -> list[int]:
        have: set[int] = set()
        with os.scandir(self.entry) as it:
            for e in it:
                if e.name.endswith(_HAVE) and e.name[: -len(_HAVE)].isdigit():
                    have.add(int(e.name[: -len(_HAVE)]))
        return [k for k in range(self.blocks) if k not in have]

    def _hash(self) -> str:
        """The sha256 of ``fill.h5`` (of its first ``size`` bytes; "" if it is shorter)."""
        assert self._fd is not None
        digest, n = sha256_fd(self._fd, self.size, _CHUNK)
        return digest if n == self.size else ""

    def _fetch_all(
        self, fetch: Callable[[list[int], list[int]], list[Any]], *, close: bool = True
    ) -> bool:
        """``fill.h5`` did not hash right: a kept block may be damaged on disk (a byte flipped
        after its record, a record planted), which is no fault of the server. Every block is
        fetched again, once, hashed as it arrives and written; True when the server's bytes are
        the file (then ``fill.h5`` holds them), False when a fetch failed (the next batch tries
        again).

        Raises:
            IntegrityError: the server's own bytes do not hash to ``sha256`` (nothing is kept).
        """
        log.warning("%s: the blocks kept do not hash to its sha256; fetching them again", self.url)
        h, step = hashlib.sha256(), max(1, _CHUNK // self.block_bytes)
        for first in range(0, self.blocks, step):
            if not self._fill(fetch, range(first, min(first + step, self.blocks)), h):
                return False
        if h.hexdigest() != self.sha256:
            self._discard(close=close)
            raise IntegrityError(
                f"{self.url}: the {self.size} bytes the server sent hash to sha256 "
                f"{h.hexdigest()}, expected {self.sha256}; the object on the server is not the "
                "one its sidecar or manifest names (being replaced, or damaged): nothing was "
                "kept — retry once it is published again, or run `h5forge verify` on it"
            )
        return True

    def _seal(self) -> None:
        """Rename ``fill.h5`` (hashed right) to ``asset.h5`` with its record."""
        assert self._fd is not None
        os.fsync(self._fd)
        os.replace(os.path.join(self.entry, _FILL), os.path.join(self.entry, _ASSET))
        st = os.fstat(self._fd)
        record: dict[str, Any] = {"format": self.kind, "url": self.url, "sha256": self.sha256}
        record["stat"] = identity(st)
        _write_small(os.path.join(self.entry, _RECORD), json.dumps(record).encode())
        for k in range(self.blocks):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._have(k))
        self._drop_claims()
        log.info("%s is complete in the cache (%d bytes, sha256 checked)", self.url, self.size)
        self.local_fd()

    def _discard(self, *, close: bool = True) -> None:
        """Nothing of the entry is kept: its fill file, records and folder go (under its lock,
        held by :meth:`complete`; a folder not ours is left alone). ``close``: the fill file's
        descriptor too (not on a finishing thread: the reader may be using it; its next
        :meth:`complete` closes it)."""
        self._off = True
        if close and self._fd is not None:
            os.close(self._fd)
            self._fd = None
        try:
            remove_marked(self.entry, self.kind)
        except OSError as e:
            log.warning("cannot remove the cache entry %s: %s", self.entry, e)

    def _stop(self, why: str) -> None:
        log.warning("%s: %s; reading it from the server from now on", self.url, why)
        self._off = True

    def _open_fill(self, *, create: bool) -> bool:
        """``fill.h5`` open in this process (made, entry and room first, when ``create``)."""
        if self._fd is not None:
            return True
        with _OPENING:  # the reader, its fetch ahead and its finishing thread: one descriptor
            return self._fd is not None or self._open_fill_now(create=create)

    def _open_fill_now(self, *, create: bool) -> bool:
        path = os.path.join(self.entry, _FILL)
        flags = os.O_RDWR | NOFOLLOW | NONBLOCK | CLOEXEC
        try:
            try:
                fd = os.open(path, flags)
            except FileNotFoundError:
                if not create or not self._make(path):
                    return False
                fd = os.open(path, flags)
        except OSError as e:  # a link planted at its name (ELOOP), a folder, no permission
            self._stop(f"cannot open {path}: {e}")
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != self.size:
            os.close(fd)
            self._stop(f"{path} is not the entry's fill file")
            return False
        self._fd = fd
        return True

    def _make(self, path: str) -> bool:
        with lock_file(self.entry + ".lock", target=f"the cache entry of {self.url}"):
            if not os.path.lexists(self.entry):
                make_marked_dir(self.entry, self.kind)
            if not is_ours(self.entry, self.kind):
                self._stop(f"{self.entry} was not made by h5forge's cache")
                return False
            if os.path.lexists(path):
                return True
            root = os.path.dirname(self.entry)
            evict_cache(root, self.limit_bytes, self.size, keep=self.entry)
            if not room_for(root, self.size):
                self._stop("the disk has no room for it")
                return False
            fd = create_exclusive(path, 0o600)
            try:
                os.ftruncate(fd, self.size)  # sparse: blocks take room as they are written
            finally:
                os.close(fd)
        return True
