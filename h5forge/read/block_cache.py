"""Blocks of a remote asset kept on local disk, for an asset too large for a whole-file copy.

:class:`h5forge.read.cache.FileCache` keeps whole files; an asset larger than its limit is
read remotely, and with a :class:`BlockStore` the aligned read-ahead blocks of
:class:`h5forge.asset.coalesce.RemoteRanges` are kept in ``cache_dir`` too, so a later epoch (or
job) reads the blocks it fetched before from disk:

- **Key**: the asset's identity (the same key as a whole-file entry: canonical URL, sha256 of
  the sidecar or pinned version, size, ETag), so a replaced asset never gets another's blocks.
  Blocks live in one folder per key carrying h5forge's marker (:mod:`h5forge.files`).
- **Validated**: each block file is its bytes followed by their sha256, written when they came
  from the server; a block is used only when its length is the block's and its sha256 matches
  (else it is removed and fetched again). ``verify_reads=True`` checks every sample read (from
  the cache or not) against ``/digests`` besides.
- **Safe to share**: every block is written under a fresh exclusive temp name and renamed into
  place, opened without following links; concurrent workers and jobs may write one block
  twice, never a torn one.
- **Bounded**: blocks count against the cache's ``limit_bytes`` with every other entry; when a
  process has added a tenth of the limit since it last looked, the least recently used blocks
  (file mtime, refreshed on every hit) are removed until the cache fits the limit again.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import stat
from dataclasses import dataclass, field

from h5forge.files import (
    CLOEXEC,
    NOFOLLOW,
    NONBLOCK,
    is_ours,
    make_marked_dir,
    remove_tree,
    replace_file,
)
from h5forge.locks import folder_lock, lock_file

__all__ = ["BLOCKS_KIND", "ENTRY_KIND", "BlockStore", "entry_bytes", "evict_cache"]

log = logging.getLogger("h5forge.read.block_cache")

BLOCKS_KIND = "read-cache-blocks"
#: The marker kind of a whole-file entry (:mod:`h5forge.read.cache`).
ENTRY_KIND = "read-cache"
_SUFFIX = ".blk"
_DIGEST = 32


def entry_bytes(path: str) -> int:
    """Bytes of the regular files directly in ``path`` (links and folders are not counted)."""
    total = 0
    with os.scandir(path) as it:
        for e in it:
            if e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


@dataclass
class BlockStore:
    """The blocks of one remote asset under ``root`` (see the module docstring).

    Args:
        root: the cache folder (``cache_dir``), checked by the caller.
        key: the asset's identity, hex.
        limit_bytes: what the whole cache may hold.
        block_bytes: the reader's block size; a block file holds at most this many bytes.
    """

    root: str
    key: str
    limit_bytes: int
    block_bytes: int
    hits: int = 0
    misses: int = 0
    _added: int = field(default=0, repr=False)
    _ready: bool = field(default=False, repr=False)

    @property
    def entry(self) -> str:
        """This asset's folder of blocks."""
        return os.path.join(self.root, "blocks-" + self.key[:32])

    def _path(self, k: int) -> str:
        return os.path.join(self.entry, f"{k:010d}{_SUFFIX}")

    def get(self, k: int, size: int) -> bytes | None:
        """Block ``k``'s ``size`` bytes if they are kept and intact, else None (a damaged block
        is removed)."""
        path = self._path(k)
        try:
            # Non-blocking: a FIFO planted under a block's name would block the open forever;
            # it is refused below (not a regular file), as a link is by NOFOLLOW.
            fd = os.open(path, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
        except OSError:
            self.misses += 1
            return None
        try:
            st = os.fstat(fd)
            data = b""
            if stat.S_ISREG(st.st_mode) and st.st_size == size + _DIGEST:
                with os.fdopen(os.dup(fd), "rb") as f:
                    data = f.read(size + _DIGEST)
        finally:
            os.close(fd)
        blob, digest = data[:size], data[size:]
        if len(data) != size + _DIGEST or hashlib.sha256(blob).digest() != digest:
            log.warning("cached block %s is damaged or of another size; fetching it again", path)
            self._remove(path)
            self.misses += 1
            return None
        with contextlib.suppress(OSError):  # a read-only shared cache still serves hits
            os.utime(path, follow_symlinks=False)  # its last use, for the LRU order
        self.hits += 1
        return blob

    def put(self, k: int, blob: bytes) -> None:
        """Keep block ``k`` (as fetched from the server); never raises for a full disk or a
        cache that cannot be written: the read goes on uncached."""
        if len(blob) > self.block_bytes:
            raise ValueError(f"block {k} is {len(blob)} bytes, more than {self.block_bytes}")
        if len(blob) + _DIGEST > self.limit_bytes:  # would be evicted at once: not written
            return
        try:
            self._ensure()
            replace_file(self._path(k), blob + hashlib.sha256(blob).digest(), 0o600)
        except (OSError, ValueError) as e:
            log.warning("cannot keep block %d of %s in the cache: %s", k, self.entry, e)
            return
        self._added += len(blob) + _DIGEST
        if self._added * 10 >= self.limit_bytes:
            self._added = 0
            self.evict()

    def complete(self, fetch: object) -> None:
        """Blocks of a file larger than the cache stay blocks: nothing to finish."""

    def local_fd(self) -> int | None:
        """Never whole (see :meth:`complete`)."""
        return None

    def has(self, k: int) -> bool:
        """Whether block ``k``'s file exists (:meth:`get` checks it)."""
        return os.path.lexists(self._path(k))

    def _ensure(self) -> None:
        if self._ready:
            return
        if not is_ours(self.entry, BLOCKS_KIND):
            # Made, folder then marker, under the entry's lock: another worker may be between
            # the two, so only what is found under the lock is refused.
            with lock_file(self.entry + ".lock", target=f"the cache entry {self.entry}"):
                if not os.path.lexists(self.entry):
                    make_marked_dir(self.entry, BLOCKS_KIND)
                if not is_ours(self.entry, BLOCKS_KIND):
                    raise ValueError(
                        f"{self.entry} is in cache_dir but was not made by h5forge's cache; "
                        "remove it, or use another cache_dir"
                    )
        self._ready = True

    def evict(self) -> None:
        """Fit the whole cache in ``limit_bytes`` (:func:`evict_cache`)."""
        evict_cache(self.root, self.limit_bytes)

    @staticmethod
    def _remove(path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def evict_cache(root: str, limit_bytes: int, incoming: int = 0, keep: str = "") -> None:
    """Remove the least recently used whole-file entries and blocks of the cache at ``root``
    until ``incoming`` more bytes fit ``limit_bytes``; ``keep`` (an entry) stays.

    An entry's last use is its folder's mtime, a block's its file's. Folders that are not
    h5forge's are never counted or removed. Runs under the cache folder's lock; an entry is
    removed under its own lock (a reader holding the copy open keeps reading it, POSIX).
    """
    with folder_lock(root):
        items: list[tuple[int, int, str, bool]] = []  # (last use, bytes, path, is a block)
        with os.scandir(root) as it:
            for e in it:
                if e.is_symlink() or not e.is_dir(follow_symlinks=False) or e.path == keep:
                    continue
                if is_ours(e.path, BLOCKS_KIND):
                    with os.scandir(e.path) as files:
                        for f in files:
                            if f.name.endswith(_SUFFIX) and f.is_file(follow_symlinks=False):
                                st = f.stat(follow_symlinks=False)
                                items.append((st.st_mtime_ns, st.st_size, f.path, True))
                elif is_ours(e.path, ENTRY_KIND):
                    used = e.stat(follow_symlinks=False).st_mtime_ns
                    items.append((used, entry_bytes(e.path), e.path, False))
        total = sum(n for _, n, _, _ in items)
        for _, n, path, block in sorted(items):
            if total + incoming <= limit_bytes:
                break
            if block:
                BlockStore._remove(path)
            else:
                with lock_file(path + ".lock", target=f"the cache entry {path}"):
                    remove_tree(path)
                log.info("evicted %s (%d bytes) from the cache", path, n)
            total -= n
