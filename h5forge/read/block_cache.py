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
  twice, never a torn one; a block that several want at once is fetched by the first to
  claim it (:class:`BlockClaims`), the others wait for it to be kept.
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
import time
from collections.abc import Iterable, Mapping
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

__all__ = [
    "BLOCKS_KIND",
    "CLAIM_SECONDS",
    "ENTRY_KIND",
    "BlockClaims",
    "BlockStore",
    "entry_bytes",
    "evict_cache",
]

log = logging.getLogger("h5forge.read.block_cache")

BLOCKS_KIND = "read-cache-blocks"
#: The marker kind of a whole-file entry (:mod:`h5forge.read.cache`).
ENTRY_KIND = "read-cache"
_SUFFIX = ".blk"
_DIGEST = 32
_CLAIM = ".want"
#: What a claim file holds: the tag that names it h5forge's, and the claiming process.
_CLAIM_TAG = b"h5forge-block-claim/1 pid="
#: How long a claim on a block holds off other processes. A 2 MiB block takes ~25-300 ms to
#: fetch (20 ms per request, a busy machine); a claim older than this is its maker's that died
#: or stalled: the block is fetched by whoever needs it.
CLAIM_SECONDS = 5.0
_CLAIM_MAX = 64  # bytes: a claim file is its tag and a pid
_POLL = 0.002  # seconds between looks at a block being fetched by another process


def entry_bytes(path: str) -> int:
    """Bytes of the regular files directly in ``path`` (links and folders are not counted)."""
    total = 0
    with os.scandir(path) as it:
        for e in it:
            if e.is_file(follow_symlinks=False):
                total += e.stat(follow_symlinks=False).st_size
    return total


class BlockClaims:
    """Who fetches a block that several processes want at once.

    Two DataLoader workers whose batches share a block (the block at the boundary of two
    sample blocks of a block shuffle, read by the two workers' batches at about the same
    time), or two jobs reading one asset, would each fetch it from the server. Before it
    fetches a block to keep, a reader claims it (:meth:`claim`): the first process to create
    the block's claim file (``NNNNNNNNNN.want`` in the store's folder, created exclusively, never
    through a link) fetches it, and releases the claim once the block is kept or the fetch
    failed (:meth:`release`). Another reader that needs the block meanwhile gets it from the
    store when it arrives (:meth:`wait`), and fetches it itself only when the claim ends without
    the block or is older than :data:`CLAIM_SECONDS` (its maker died or stalled).

    A store that uses this provides ``has``, ``get``, :meth:`_folder` and :meth:`_claimable`.
    Claims are only a saving: whatever a claim says, a block is served only when the store
    holds it intact.
    """

    def _folder(self) -> str:
        """The store's folder, where its blocks' claims are made."""
        raise NotImplementedError

    def has(self, k: int) -> bool:
        raise NotImplementedError

    def get(self, k: int, size: int) -> bytes | None:
        raise NotImplementedError

    def _claimable(self) -> bool:
        """Whether this store keeps blocks now (its folder made and ours): else every process
        fetches what it needs, unclaimed."""
        raise NotImplementedError

    def _claim_path(self, k: int) -> str:
        return os.path.join(self._folder(), f"{k:010d}{_CLAIM}")

    def _claims(self) -> set[int]:
        """The claims this process made and holds (a forked or spawned worker holds none of
        its parent's)."""
        held: tuple[int, set[int]] | None = getattr(self, "_claims_held", None)
        if held is None or held[0] != os.getpid():
            held = (os.getpid(), set())
            self._claims_held = held
        return held[1]

    def claim(self, k: int) -> bool:
        """Whether this process should fetch block ``k``: True when it claimed it, or when no
        claim can be made (the store keeps nothing now) or the one found is stale; False when
        another process is fetching it now (:meth:`wait` gives it once kept)."""
        mine = self._claims()
        if k in mine:
            return True
        if not self._claimable():
            return True
        try:
            fd = os.open(
                self._claim_path(k),
                os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW | CLOEXEC,
                0o600,
            )
        except FileExistsError:
            return self._claim_deadline(k) is None
        except OSError:
            return True  # no claim can be made here: fetched unclaimed
        try:
            os.write(fd, _CLAIM_TAG + str(os.getpid()).encode())
        except OSError:
            pass  # an empty claim still holds; its age ends it
        finally:
            os.close(fd)
        mine.add(k)
        return True

    def release(self, k: int) -> None:
        """Drop this process's claim on block ``k`` (kept, or its fetch failed); a block not
        claimed here is left alone."""
        mine = self._claims()
        if k in mine:
            mine.discard(k)
            with contextlib.suppress(OSError):
                os.unlink(self._claim_path(k))

    def _claim_deadline(self, k: int) -> float | None:
        """When another process's live claim on block ``k`` goes stale (epoch seconds), or None
        when there is none: no claim file, one older than :data:`CLAIM_SECONDS`, one dated in
        the future, or not a small regular file."""
        try:
            st = os.lstat(self._claim_path(k))
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode) or st.st_size > _CLAIM_MAX:
            return None
        now = time.time()
        return (
            st.st_mtime + CLAIM_SECONDS
            if st.st_mtime - 1 <= now < st.st_mtime + CLAIM_SECONDS
            else None
        )

    def wait(self, sizes: Mapping[int, int]) -> dict[int, bytes]:
        """The blocks of ``sizes`` (block -> its size) that other processes claimed, once the
        store holds them intact. Returns as soon as each block is kept, or its claim ended
        without it (the fetch failed) or went stale, and after :data:`CLAIM_SECONDS` at most
        whatever the claims say: the caller fetches the blocks missing from the result itself.
        Blocks this process claimed are not waited for."""
        out: dict[int, bytes] = {}
        left = {k: n for k, n in sizes.items() if k not in self._claims()}
        stop = time.monotonic() + CLAIM_SECONDS
        while left:
            for k, n in list(left.items()):
                # Kept first, then the claim: its maker keeps the block before it releases it
                # (a claim gone with the block kept is read below, not fetched again).
                if self.has(k) or self._claim_deadline(k) is None:
                    blob = self.get(k, n)
                    if blob is not None:
                        out[k] = blob
                    del left[k]
            if not left or time.monotonic() >= stop:
                break
            time.sleep(_POLL)
        return out

    def settle(self, ks: Iterable[int]) -> None:
        """Wait until no live claim on blocks ``ks`` remains (this process's own among them:
        its fetch ahead), or :data:`CLAIM_SECONDS` passed: the readers fetching them have kept
        what they fetched, and none of them writes a block later."""
        left, stop = list(ks), time.monotonic() + CLAIM_SECONDS
        while True:
            left = [k for k in left if not self.has(k) and self._claim_deadline(k) is not None]
            if not left or time.monotonic() >= stop:
                return
            time.sleep(_POLL)

    def _drop_claims(self) -> None:
        """Remove the claim files left in the store's folder (the store is whole now, or being
        removed): only those that hold h5forge's claim tag."""
        with contextlib.suppress(OSError), os.scandir(self._folder()) as it:
            for e in it:
                if not e.name.endswith(_CLAIM) or not e.is_file(follow_symlinks=False):
                    continue
                try:
                    fd = os.open(e.path, os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC)
                except OSError:
                    continue
                try:
                    tagged = os.read(fd, _CLAIM_MAX).startswith(_CLAIM_TAG)
                finally:
                    os.close(fd)
                if tagged:
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)


@dataclass
class BlockStore(BlockClaims):
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

    def put(self, k: int, blob: bytes | memoryview) -> None:
        """Keep block ``k`` (as fetched from the server); never raises for a full disk or a
        cache that cannot be written: the read goes on uncached."""
        if len(blob) > self.block_bytes:
            raise ValueError(f"block {k} is {len(blob)} bytes, more than {self.block_bytes}")
        if len(blob) + _DIGEST > self.limit_bytes:  # would be evicted at once: not written
            return
        try:
            self._ensure()
            replace_file(self._path(k), b"".join((blob, hashlib.sha256(blob).digest())), 0o600)
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

    def _folder(self) -> str:
        return self.entry

    def _claimable(self) -> bool:
        if self.block_bytes + _DIGEST > self.limit_bytes:
            return False  # no block is kept (put): none is claimed, no folder made
        try:
            self._ensure()
        except (OSError, ValueError):
            return False
        return True

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
