"""A verified local copy of a remote asset, kept in ``cache_dir`` for later epochs and jobs.

``H5ImageDataset(url)`` reads a remote asset through this cache by default (its folder:
:func:`default_cache_dir`; ``cache_dir=`` another, ``cache_dir=False`` none). Nothing is
downloaded before the first batch: the entry fills from the reader's own range requests
(:mod:`h5forge.read.fill`), and once whole and hashed it is a whole-file copy that every later
process (workers, epochs, other jobs on the machine) reads with ``pread`` like a local file.

- **Key**: the asset's identity, never its name alone: canonical URL, the sha256 of its
  sidecar (``NAME.h5.manifest.json``, written by publish) or of its pinned version, its size
  and ETag. A replaced asset has a new key, so a stale copy is never served.
- **A pinned version is keyed by its content**: a version's file or, sharded, its manifest
  (``version=`` the full sha256, or ``latest`` resolved to it) is kept under its sha256 alone,
  so a later open that pins the version (``H5ImageDataset(url, version=ds.version)``) finds it
  without asking the server anything, not even the pointer (:meth:`FileCache.cached_version`);
  every byte served was hashed to that sha256 when it was kept.
- **Shards are keyed by content address**: a shard of a sharded version
  (``BASE/shards/<sha256>.h5``) is keyed by the sha256 and size its version's manifest records,
  nothing else: versions that share a shard, and the same shard reached under another base (a
  second bucket, a copied asset), share one entry, fetched once. An entry found valid is
  served without asking the server anything (not even its size). A shard larger than the limit
  keeps its blocks under its URL's key, as an asset does: a block cannot be checked against the
  whole file's sha256, so blocks from one place never serve another.
- **Validated**: a filled copy is hashed whole and kept only when it matches the sidecar's
  (or pinned version's, or shard's manifest entry's) sha256 and size, else refused with an
  :class:`~h5forge.errors.IntegrityError` and nothing kept (each block on the way carries the
  sha256 of the bytes the server sent); the entry records the copy's inode,
  size, mtime and ctime, and a later change (a flipped byte is a write: it moves mtime and
  ctime) makes the next open hash it again and, on a mismatch, fetch it again. The dataset's
  workers get the main process's check pickled and ask the server nothing
  (:meth:`FileCache.local_copy`). Per-sample checks: ``verify_reads``.
- **Safe to share**: entries are folders carrying h5forge's marker (:mod:`h5forge.files`);
  concurrent workers and jobs fill one entry (each block in its own byte range, its record
  renamed into place after it), the copy is sealed under the entry's lock file
  (:func:`h5forge.locks.lock_file`), and nobody sees half a file as a copy. Nothing is
  followed through a link: a planted symlink is refused.
- **Bounded**: ``limit_bytes`` for all entries, blocks included (default: what the cache holds
  plus half the free disk, at most 50 GiB); the least recently used are removed (under the
  folder's lock) before an entry starts filling. An asset larger than the limit is read
  remotely, its blocks kept (:mod:`h5forge.read.block_cache`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from h5forge.asset.coalesce import DEFAULT_BLOCK_BYTES
from h5forge.errors import IntegrityError
from h5forge.files import (
    is_ours,
    make_marked_dir,
    replace_file,
)
from h5forge.location import MAX_MANIFEST_BYTES, Location
from h5forge.locks import lock_file
from h5forge.publish.sidecar import load_sidecar
from h5forge.read.block_cache import (
    BLOCKS_KIND,
    ENTRY_KIND,
    BlockStore,
    entry_bytes,
    evict_cache,
)
from h5forge.read.fill import FillStore, entry_record, identity, read_entry_file, room_for
from h5forge.store_errors import store_failures

__all__ = ["DEFAULT_CACHE_LIMIT", "FileCache", "Pinned", "default_cache_dir", "default_limit"]

log = logging.getLogger("h5forge.read.cache")

DEFAULT_CACHE_LIMIT = 50 << 30
_KIND = ENTRY_KIND
_ASSET, _RECORD, _MANIFEST_FILE = "asset.h5", "entry.json", "version.json"
_CHUNK = 8 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SIDECAR, _MANIFEST = "its sidecar", "its version's manifest"


def default_cache_dir() -> str:
    """Where the default cache lives: ``$XDG_CACHE_HOME/h5forge/read`` when that variable holds
    an absolute path (the XDG rule), else ``~/.cache/h5forge/read`` (beside the fetch cache,
    which keeps ``h5forge`` itself)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "h5forge", "read")


def default_limit(root: str) -> int:
    """The default ``cache_limit`` of a cache at ``root``: what it holds now plus half the free
    space of its disk, at most :data:`DEFAULT_CACHE_LIMIT` (50 GiB); at least 1 byte."""
    try:
        fs = os.statvfs(root)
    except OSError:
        return 1
    held = 0
    with os.scandir(root) as it:
        for e in it:
            if is_ours(e.path, _KIND) or is_ours(e.path, BLOCKS_KIND):
                held += entry_bytes(e.path)
    return max(1, min(DEFAULT_CACHE_LIMIT, held + fs.f_bavail * fs.f_frsize // 2))


@dataclass(frozen=True)
class Pinned:
    """A validated local copy: ``path``, the ``sha256`` it matched, its ``stat`` then."""

    path: str
    sha256: str
    stat: tuple[int, ...]  # (dev, inode, size, mtime_ns, ctime_ns)


def _content_key(sha256: str, size: int) -> str:
    """The entry key of a shard: its content address alone (no URL, base or version)."""
    return hashlib.sha256(f"h5forge shard\n{sha256}\n{size}".encode()).hexdigest()


def _version_key(sha256: str) -> str:
    """The entry key of a version's own bytes (its file, or its manifest): its sha256 alone."""
    return hashlib.sha256(f"h5forge version\n{sha256}".encode()).hexdigest()


def _why(source: str) -> str:
    """What a copy that does not match ``source`` means, and what to do."""
    if source == _MANIFEST:  # a shard never changes: other bytes under its name are damage
        return (
            "the shard on the server is not the one its version names (damaged or overwritten); "
            "copy it again from a good replica, or publish the version again"
        )
    return "the asset is being replaced or damaged — retry, or run `h5forge verify` on it"


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class FileCache:
    """Whole-file copies of remote assets under ``root`` (see the module docstring).

    Raises:
        ValueError: ``root`` is a symlink, not a folder, or not writable; ``limit_bytes`` < 1.
    """

    root: str
    limit_bytes: int | None = None
    required: bool = True
    # Copies this object validated, by (canonical URL, sha256 asked for), a shard's by ("",
    # "sha256:size"); pickled with it, so DataLoader workers reuse the main process's check.
    pins: dict[tuple[str, str], Pinned | None] = field(
        default_factory=dict, compare=False, repr=False
    )
    # Assets larger than the limit, read remotely with their blocks kept (pickled as well).
    stores: dict[tuple[str, str], BlockStore | FillStore] = field(
        default_factory=dict, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        limit = self.limit_bytes
        if limit is not None and (
            isinstance(limit, bool) or not isinstance(limit, int) or limit < 1
        ):
            raise ValueError(
                f"cache_limit={limit!r} must be an integer >= 1 (bytes), or None for the "
                "default (half the free disk space, at most 50 GiB)"
            )
        object.__setattr__(self, "root", os.path.abspath(os.fspath(self.root)))
        try:
            os.makedirs(self.root, exist_ok=True)
        except OSError as e:
            raise ValueError(
                f"cache_dir={self.root!r} cannot be created ({e.strerror}); pass a folder this "
                "user can write, or cache_dir=False to read remotely"
            ) from e
        st = os.lstat(self.root)
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise ValueError(
                f"cache_dir={self.root!r} is not a real folder (a symlink or a file); pass the "
                "folder itself"
            )
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise ValueError(
                f"cache_dir={self.root!r} is not writable by this user; pass a folder this user "
                "can write, or cache_dir=False to read remotely"
            )
        if limit is None:
            object.__setattr__(self, "limit_bytes", default_limit(self.root))

    def local_copy(
        self, where: Location, sha256: str = "", size: int | None = None
    ) -> Pinned | None:
        """The validated local copy of ``where``; None when the asset is local already, not
        whole in the cache yet (read it remotely: its entry fills from those reads, through
        :meth:`block_store`) or larger than the limit (its blocks kept, :meth:`block_store`).

        Costs three requests on a hit (the object's size and ETag; its sidecar's HEAD and GET)
        the first time; later calls on this object or its pickled copies (DataLoader workers)
        ask nothing: the copy validated is served while its inode, size, mtime and ctime are
        unchanged, hashed again if they changed (a mismatch or a missing copy asks the server).

        A shard (``size`` given) costs no request once its entry is valid, in any process: its
        entry's name is computed from ``sha256`` and ``size``; a miss is read remotely and
        fills its entry.

        Args:
            sha256: the asset's full sha256 when known (a pinned version); else the sidecar's.
            size: with ``sha256``, a shard's content address, both from its version's manifest
                (checked against the manifest's own sha256): the copy is keyed by them alone and
                shared by every URL the same bytes are published under.

        Raises:
            IntegrityError: a filled copy does not match the sidecar, pinned version or shard's
                manifest entry (raised by the read that completes it; nothing is kept).
            ValueError: no sidecar and no ``sha256``: nothing to validate a copy against; a
                shard's ``sha256`` is not 64 lower-case hex digits or ``size`` < 1.
            ValueError: the entry's name in ``cache_dir`` is taken by something not ours.
        """
        store = self.stores.get((where.key, sha256))
        if store is not None:
            if isinstance(store, FillStore):
                # Filled since (by any process), or filled and changed since: hashed again here
                # (a copy still right is served, a wrong one removed and filled again).
                return self._valid(store.entry, store.sha256, store.size)
            return None  # read remotely, its blocks kept (block_store)
        key = (where.key, sha256) if size is None else ("", f"{sha256}:{size}")
        known = self.pins.get(key)
        if known is not None:
            st = _lstat(known.path)
            if st is not None and list(known.stat) == identity(st):
                return known  # no request: this object (or the one pickled here) checked it
            known = self._valid(os.path.dirname(known.path), known.sha256, known.stat[2])
            if known is not None:  # changed, yet it hashes to what was validated
                self.pins[key] = known
                return known
        if where.is_local:
            return None
        if size is None and _SHA256.fullmatch(sha256):  # a pinned version: keyed by content
            found = self._version_file(sha256)
            if found is not None:
                self.pins[key] = found
                return found  # asked nothing: the copy was hashed to the version's sha256
        if size is None:
            found = self._check(where, sha256)
        else:
            found = self._check_shard(where, sha256, size)
        self.pins[key] = found
        return found

    def block_store(self, where: Location, sha256: str = "") -> BlockStore | FillStore | None:
        """Where the blocks of ``where`` are kept when :meth:`local_copy` found it larger than
        the limit (:mod:`h5forge.read.block_cache`); None otherwise."""
        return self.stores.get((where.key, sha256))

    def _check_shard(self, where: Location, sha256: str, size: int) -> Pinned | None:
        """:meth:`local_copy` of a shard: its entry named by its content address, found valid
        without a request, else read remotely, filling it (a shard over the limit:
        :meth:`_check`, blocks)."""
        if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
            raise ValueError(f"shard sha256 {sha256!r:.80} must be 64 lower-case hex digits")
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"shard size {size!r:.40} must be an integer >= 1 (bytes)")
        if size > self.limit:
            return self._check(where, sha256, size)
        entry = os.path.join(self.root, _content_key(sha256, size)[:32])
        found = self._valid(entry, sha256, size)
        if found is not None:
            return found  # asked nothing: the address is the manifest's, the copy was hashed
        return self._fill(where, entry, sha256, size, sha256)

    def _check(self, where: Location, sha256: str, expected: int | None = None) -> Pinned | None:
        """:meth:`local_copy` asking the server: the object's identity, its sidecar (a shard's
        ``expected`` size and ``sha256`` are its manifest entry's: no sidecar asked)."""
        path, shown = where.path, str(where)
        if expected is None:
            with ThreadPoolExecutor(1) as pool:  # the two requests overlap: one latency, not two
                head = pool.submit(where.ask, "the size", "info", path)
                with store_failures(where.sidecar, "its sidecar"):
                    sidecar = load_sidecar(where.sidecar)
                info = head.result()
            source = _SIDECAR
            stale = "the asset is being republished or its sidecar is stale — retry once it is done"
        else:
            info = where.ask("the size", "info", path)
            sidecar, source = {"sha256": sha256, "bytes": expected}, _MANIFEST
            stale = _why(source)
        if info.get("type") == "directory":  # a prefix, as a sharded asset's base is: no file
            raise FileNotFoundError(f"no file at {shown} (a folder or prefix)")
        size = int(info["size"])
        want = sha256 or (sidecar["sha256"] if sidecar else "")
        if not want:
            if not self.required:  # the default cache: such an asset is read uncached
                log.info("%s has no sidecar to check a copy against: it is not cached", shown)
                return None
            raise ValueError(
                f"cache_dir needs {shown}'s sidecar ({shown}.manifest.json, written by "
                "publish) or a pinned version to validate a copy against; publish the asset "
                "with h5forge, or pass cache_dir=False"
            )
        if sidecar is not None and sidecar["bytes"] != size:
            raise IntegrityError(
                f"{shown} has {size} bytes, {source} records {sidecar['bytes']}; {stale}"
            )
        tag = str(info.get("ETag") or info.get("etag") or info.get("mtime") or "")
        key = hashlib.sha256(f"{where.key}\n{want}\n{size}\n{tag}".encode()).hexdigest()
        if size > self.limit:
            log.info(
                "%s (%d bytes) is larger than the cache limit; its blocks are kept", shown, size
            )
            # A small cache keeps smaller blocks, so that a good number of them fit.
            block = min(DEFAULT_BLOCK_BYTES, max(16 << 10, self.limit // 16))
            self.stores[(where.key, sha256)] = BlockStore(self.root, key, self.limit, block)
            return None
        pinned = expected is None and _SHA256.fullmatch(sha256)
        entry = self._version_entry(sha256) if pinned else os.path.join(self.root, key[:32])
        found = self._valid(entry, want, size)
        if found is not None:
            return found
        return self._fill(where, entry, want, size, sha256)

    # --- versions kept by content (their sha256) -----------------------------------------------
    def cached_version(self, sha256: str) -> str | None:
        """``"sharded"`` when this cache keeps the manifest of the version with this full
        sha256 (hashed when it is read, :meth:`version_manifest`: a damaged one is read from
        the server), ``"file"`` when it holds the version's whole file, valid; else None. Asks
        no server: a pinned version is opened from here without its pointer, manifest or size."""
        if not _SHA256.fullmatch(sha256):
            return None
        entry = self._version_entry(sha256)
        if is_ours(entry, _KIND) and os.path.lexists(os.path.join(entry, _MANIFEST_FILE)):
            return "sharded"
        return "file" if self._version_file(sha256) is not None else None

    def version_manifest(self, sha256: str) -> bytes | None:
        """The kept manifest of the sharded version with this full sha256, hashed to it here
        (each open: a manifest is small); None when not kept, or when what is kept is not it."""
        entry = self._version_entry(sha256)
        if not is_ours(entry, _KIND):
            return None
        data = read_entry_file(os.path.join(entry, _MANIFEST_FILE), MAX_MANIFEST_BYTES)
        if data is None:
            return None
        if hashlib.sha256(data).hexdigest() != sha256:
            log.warning("cache entry %s does not hash to its version; reading it again", entry)
            return None
        self._touch(entry)
        return data

    def keep_manifest(self, sha256: str, data: bytes) -> None:
        """Keep a version manifest read from the server under its sha256 (checked here). Best
        effort: a full disk, a name taken by something not ours, or an error only logs (the
        next open reads it from the server again)."""
        if not _SHA256.fullmatch(sha256) or hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"a manifest kept in the cache must hash to {sha256!r:.80}")
        if len(data) > self.limit:
            return
        entry = self._version_entry(sha256)
        try:
            with lock_file(entry + ".lock", target=f"the cache entry of version {sha256[:16]}"):
                if not os.path.lexists(entry):
                    evict_cache(self.root, self.limit, len(data), keep=entry)
                    if not room_for(self.root, len(data)):
                        return
                    make_marked_dir(entry, _KIND)
                if not is_ours(entry, _KIND):
                    log.warning("%s is in cache_dir but is not h5forge's; not kept", entry)
                    return
                replace_file(os.path.join(entry, _MANIFEST_FILE), data, 0o600, fsync=False)
        except OSError as e:
            log.warning("cannot keep version %s's manifest in the cache: %s", sha256[:16], e)

    def _version_entry(self, sha256: str) -> str:
        return os.path.join(self.root, _version_key(sha256)[:32])

    def _version_file(self, sha256: str) -> Pinned | None:
        """The kept whole file of the version with this sha256, valid (see :meth:`_valid`)."""
        entry = self._version_entry(sha256)
        st = _lstat(os.path.join(entry, _ASSET))
        return None if st is None else self._valid(entry, sha256, st.st_size)

    @property
    def limit(self) -> int:
        """``limit_bytes``, resolved when made (the default's value here)."""
        assert self.limit_bytes is not None
        return self.limit_bytes

    def _fill(self, where: Location, entry: str, want: str, size: int, asked: str) -> Pinned | None:
        """No valid copy yet: ``where`` is read from the server, and its entry fills from those
        reads (:mod:`h5forge.read.fill`), complete and hashed against ``want`` once every block is
        there. Kept under ``asked``, the sha256 the caller looks it up by ("" unpinned)."""
        # Under the entry's lock: a folder found made but not marked may be another process's
        # between its mkdir and its marker (refused only if it still is not ours then), and a
        # copy being sealed is waited for and served.
        with lock_file(entry + ".lock", target=f"the cache entry of {where}"):
            found = self._valid(entry, want, size, locked=True)
        if found is not None:
            return found
        self.stores[(where.key, asked)] = FillStore(
            entry, _KIND, want, size, str(where), self.limit
        )
        return None

    # --- entries -------------------------------------------------------------------------------
    def _valid(self, entry: str, want: str, size: int, *, locked: bool = False) -> Pinned | None:
        """The entry's copy if it is ours and unchanged since it was validated (or, if changed,
        hashes to ``want`` again); a changed, mismatching entry is removed. One without its
        record is removed only ``locked`` (a seal renames its copy, then writes the record,
        under the lock). One not ours: refused ``locked`` (under its lock, where folder and
        marker are made), else None (half made?)."""
        if not os.path.lexists(entry):
            return None
        if not is_ours(entry, _KIND):
            if not locked:
                return None
            raise ValueError(
                f"{entry} is in cache_dir but was not made by h5forge's cache (a link, or "
                "someone else's folder); remove it, or use another cache_dir"
            )
        record, asset = self._record(entry), os.path.join(entry, _ASSET)
        if (st := _lstat(asset)) is None:
            return None
        if record is None or record.get("sha256") != want or not stat.S_ISREG(st.st_mode):
            if not locked:  # a seal between renaming its copy and writing its record (a
                return None  # worker fetching the same shard): only its lock may decide
            log.warning("cache entry %s is incomplete or not ours; fetching it again", entry)
            self._drop(entry)
            return None
        if record.get("stat") == identity(st) and st.st_size == size:
            self._touch(entry)
            return Pinned(asset, want, tuple(identity(st)))
        if st.st_size == size and Location.of(asset).sha256() == want:  # touched, yet still right
            st = os.lstat(asset)
            replace_file(
                os.path.join(entry, _RECORD), json.dumps({**record, "stat": identity(st)}).encode()
            )
            return Pinned(asset, want, tuple(identity(st)))
        log.warning("cache entry %s changed since it was validated; fetching it again", entry)
        self._drop(entry)
        return None

    def _record(self, entry: str) -> dict[str, Any] | None:
        return entry_record(entry, _KIND)

    def _touch(self, entry: str) -> None:
        # The entry folder's mtime is its last use (LRU order); the copy's own times stay.
        try:
            os.utime(entry, follow_symlinks=False)
        except OSError as e:  # a read-only shared cache still serves hits
            log.debug("cannot mark %s as used: %s", entry, e)

    def _drop(self, entry: str) -> None:
        for name in (_ASSET, _RECORD):
            if os.path.lexists(os.path.join(entry, name)):
                os.unlink(os.path.join(entry, name))
