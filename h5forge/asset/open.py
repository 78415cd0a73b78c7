"""Open an asset at a :class:`~h5forge.location.Location`: HDF5's view of local and remote files.

Local files (:attr:`Location.is_local <h5forge.location.Location.is_local>`) are opened by HDF5
itself; remote files through a ranged file object for HDF5's ``fileobj`` driver.

Opening a remote file costs two requests for files this version writes: one ``info`` (the size,
which HDF5 checks against the end address in the superblock) and one ranged read of the head of
the file, where the writer puts the superblock, every object header, the root attributes and
the per-sample index (see docs/FORMAT.md, "Physical placement"). Reads HDF5 makes beyond what
is cached cost one request each: small ones fetch a block around them, large ones exactly what
is asked. Files laid out otherwise (older writers, ``h5repack``) open too, with a few more
requests. A store that keeps failing those requests (after its client's retries) raises a
:class:`~h5forge.errors.StoreError` (:mod:`h5forge.store_errors`), never an
:class:`~h5forge.errors.IntegrityError`: HDF5 sees a read error it cannot tell from a damaged
file, so the file object keeps the store's error and the open raises it instead.

A remote read waits on fsspec's IO thread while h5py holds its global lock (h5py calls the file
object with it held), and freeing any h5py object takes that lock. Were the cyclic garbage
collector to run on the IO thread then and free an h5py object left in a reference cycle (a
refused file's traceback holds one), both threads would wait on each other forever (h5py
issue 2019). So automatic collection is paused while a remote read waits
(:func:`_collection_paused`); what was left to collect is collected after, on whatever thread
allocates next.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import stat
import threading
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import h5py

from h5forge.asset import structure
from h5forge.errors import H5ForgeError, IntegrityError, StoreError
from h5forge.location import Location
from h5forge.store_errors import store_failures

__all__ = ["H5_DAMAGE", "Opened", "open_h5"]

# The first read of a remote file fetches this much from offset 0: the writer keeps everything
# an open needs there (about 25 bytes per sample of index), so one request serves the open of
# files up to ~30,000 samples and a handful of requests serve millions.
_HEAD_BYTES = 1 << 20
# Later small misses (HDF5 metadata: B-tree nodes, heaps) fetch a block this large around them;
# reads at least this large (chunks, index datasets) are fetched exactly, never read ahead.
_MISS_BLOCK = 64 << 10
# Bytes of fetched ranges a remote file object keeps (oldest dropped first).
_CACHE_BYTES = 64 << 20


# What h5py, HDF5 and numpy raise when a file's structure is damaged (bad object header,
# undecodable name or string, corrupt dataspace, impossible sizes ...).
H5_DAMAGE = (
    OSError,
    KeyError,
    RuntimeError,
    TypeError,
    IndexError,
    UnicodeError,
    OverflowError,
    ValueError,
    MemoryError,
)


# Readers of several threads may wait at once: collection resumes when the last one is done.
_pause_lock = threading.Lock()
_pauses = [0, False]  # [readers waiting, whether collection was enabled before the first]


@contextlib.contextmanager
def _collection_paused() -> Iterator[None]:
    """Automatic garbage collection off while a remote read made under h5py's lock waits (see
    the module docstring); it resumes, if it was on, when the last waiting reader is done."""
    with _pause_lock:
        if _pauses[0] == 0:
            _pauses[1] = gc.isenabled()
            gc.disable()
        _pauses[0] += 1
    try:
        yield
    finally:
        with _pause_lock:
            _pauses[0] -= 1
            if _pauses[0] == 0 and _pauses[1]:
                gc.enable()


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over fsspec ranged reads, for HDF5's file-object driver.

    fsspec's own file objects either read ahead a large block on every miss (``readahead``,
    ``bytes``: 35-200x the bytes a random sample read needs) or cache fixed blocks (the
    ``blockcache``, which still rounds every chunk read up to whole blocks). This one knows what
    HDF5 asks for: the head of the file in one request, small metadata misses as one small
    block, and large reads exactly.
    """

    def __init__(self, where: Location, size: int) -> None:
        super().__init__()
        self._where = where
        self._fs, self._path, self._size = where.fs, where.path, size
        self._pos = 0
        self.failure: StoreError | None = None  # the store's error HDF5 saw as a read error
        self._spans: OrderedDict[int, bytes] = OrderedDict()  # start -> bytes, oldest first
        self._held = 0
        self.requests = 0  # ranged reads issued (for tests and benchmarks)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        want = min(len(view), max(0, self._size - self._pos))
        done = 0
        while done < want:
            pos = self._pos + done
            start, data = self._span(pos, want - done)
            n = min(want - done, start + len(data) - pos)
            view[done : done + n] = data[pos - start : pos - start + n]
            done += n
        self._pos += done
        return done

    def _span(self, pos: int, need: int) -> tuple[int, bytes]:
        for start, data in reversed(self._spans.items()):
            if start <= pos < start + len(data):
                return start, data
        if not self._spans and pos == 0:
            end = _HEAD_BYTES
            if self._size > _HEAD_BYTES + _MISS_BLOCK:
                return self._head_and_tail(need)
        elif need >= _MISS_BLOCK:
            end = pos + need
        else:
            end = pos + _MISS_BLOCK
        end = min(max(end, pos + need), self._size)
        try:
            with _collection_paused(), store_failures(self._where, f"bytes {pos}-{end - 1}"):
                limit = self._where.read_timeout(end - pos)
                data = self._fs.cat_file(self._path, start=pos, end=end, **limit)
        except StoreError as e:
            self.failure = e  # HDF5 reports a failed read as its own error: keep the cause
            raise
        except OSError as e:
            if e.errno == errno.EINVAL:  # 416: the object ends before the size it was given
                raise self._shorter(e) from e
            raise
        self.failure = None  # only the last read's failure is the cause of HDF5's error
        self.requests += 1
        if len(data) < min(need, end - pos):
            raise OSError(
                f"short read: {len(data)} bytes at offset {pos}, expected "
                f"{end - pos}; the file is truncated"
            )
        self._spans[pos] = data
        self._held += len(data)
        while self._held > _CACHE_BYTES and len(self._spans) > 1:
            _, old = self._spans.popitem(last=False)
            self._held -= len(old)
        return pos, data

    def _shorter(self, e: OSError) -> OSError:
        """A range past the object's end (416): it is shorter than the size this file was
        opened with (a shard's, from its manifest)."""
        return OSError(
            f"the object is shorter than the {self._size} bytes expected ({e}); the file is "
            "truncated"
        )

    def _head_and_tail(self, need: int) -> tuple[int, bytes]:
        """The first read: the head and the last ``_MISS_BLOCK`` bytes in one concurrent call
        (HDF5 reads the end of the file next; one latency instead of two)."""
        tail = self._size - _MISS_BLOCK
        end = min(max(_HEAD_BYTES, need), self._size)
        try:
            with _collection_paused(), store_failures(self._where, f"bytes 0-{end - 1}"):
                head, last = self._fs.cat_ranges(
                    [self._path, self._path],
                    [0, tail],
                    [end, self._size],
                    on_error="return",
                    **self._where.read_timeout(end + self._size - tail),
                )
                for got in (head, last):
                    if isinstance(got, FileNotFoundError | StoreError):
                        raise got
                    if isinstance(got, OSError) and got.errno == errno.EINVAL:  # 416
                        raise self._shorter(got) from got
                    if isinstance(got, BaseException):
                        raise got
        except StoreError as e:
            self.failure = e  # as in _span
            raise
        self.failure = None
        self.requests += 2
        if len(head) < min(need, end) or len(last) != _MISS_BLOCK:
            raise OSError(
                f"short read: {len(head)} bytes at offset 0, expected {end}; the file is truncated"
            )
        self._spans[tail] = last
        self._spans[0] = head
        self._held += len(head) + len(last)
        return 0, head


class _PausedFile(io.RawIOBase):
    """An fsspec file object whose reads wait with collection paused (`_collection_paused`)."""

    def __init__(self, f: Any) -> None:
        super().__init__()
        self._f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return int(self._f.tell())

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return int(self._f.seek(offset, whence))

    def readinto(self, buffer: Any) -> int:
        with _collection_paused():
            return int(self._f.readinto(buffer))

    def close(self) -> None:
        self._f.close()
        super().close()


class Opened:
    """An open ``h5py.File`` plus whatever file object it reads through."""

    def __init__(self, h5: h5py.File, fileobj: Any | None) -> None:
        self.h5 = h5
        self._fileobj = fileobj

    @property
    def failure(self) -> StoreError | None:
        """The store's error behind HDF5's failed read, when the last read of the file object
        failed so (HDF5 raises its own ``OSError`` for it: raise this instead)."""
        return getattr(self._fileobj, "failure", None)

    @property
    def requests(self) -> int:
        """Ranged reads made so far through the file object (0 for local files)."""
        return int(getattr(self._fileobj, "requests", 0))

    def close(self) -> None:
        self.h5.close()
        if self._fileobj is not None:
            self._fileobj.close()

    def __enter__(self) -> h5py.File:
        return self.h5

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_h5(where: Location, size: int | None = None) -> Opened:
    """Open the HDF5 file at ``where`` read-only (a local path or any fsspec URL).

    Remote files cost one ``info`` request (none when ``size``, the object's size, is known:
    a shard's, from its version's manifest) and one concurrent read of the file's head and
    tail for files this version writes (see the module docstring). Every link and dataset of
    the file is checked before it is returned (:func:`h5forge.asset.structure.check_links`):
    soft, external and user-defined links, virtual datasets and external storage are refused,
    and the filters the file uses are resolved (``hdf5plugin`` is imported when one needs it).

    Raises:
        FileNotFoundError: nothing at ``where``.
        IntegrityError: the file exists but HDF5 cannot open it (truncated or not HDF5), or it
            holds a link, virtual dataset or external storage, or an unknown filter.
        MissingExtraError: the file uses a plugin filter and ``hdf5plugin`` is not installed.
    """
    opened = _open(where, size)
    url = where.url
    try:
        structure.check_links(opened.h5, where=url)
    except BaseException as e:
        opened.close()
        if opened.failure is not None:
            raise opened.failure from e
        if isinstance(e, H5ForgeError) or not isinstance(e, H5_DAMAGE):
            raise
        raise IntegrityError(
            f"{url}: its HDF5 structure cannot be read ({type(e).__name__}: "
            f"{e}); it is damaged — re-fetch or re-pack it"
        ) from e
    return opened


def _open(where: Location, size: int | None = None) -> Opened:
    url, fs, path = where.url, where.fs, where.path
    try:
        if where.is_local:
            if not os.path.exists(path):
                raise FileNotFoundError(f"no file at {url}")
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
                raise IntegrityError(f"{url} is not a regular file; an asset is one .h5 file")
            return Opened(h5py.File(path, "r"), None)
        try:
            info: dict[str, Any] = {"size": size}
            if size is None:
                info = where.ask("the size", "info", path)
        except FileNotFoundError:
            raise FileNotFoundError(f"no file at {url}") from None
        if info.get("type", "file") != "file":
            raise FileNotFoundError(f"no file at {url}: it is a {info.get('type')}")
        fileobj: Any
        if info.get("size") is None:  # e.g. an HTTP server that sends no Content-Length
            fileobj = _PausedFile(
                fs.open(path, "rb", cache_type="blockcache", block_size=_HEAD_BYTES)
            )
        else:
            fileobj = _RangeFile(where, int(info["size"]))
            try:  # the head (and tail) before HDF5 asks: a missing object is named as one
                fileobj.read(1)
                fileobj.seek(0)
            except FileNotFoundError:
                raise FileNotFoundError(f"no file at {url}") from None
        try:
            return Opened(h5py.File(fileobj, "r"), fileobj)
        except BaseException as e:
            fileobj.close()
            failure = getattr(fileobj, "failure", None)
            if failure is not None:
                raise failure from e
            raise
    except OSError as e:
        if isinstance(e, FileNotFoundError | StoreError):
            raise
        raise IntegrityError(
            f"{url} cannot be opened as HDF5 ({e}); it is truncated, corrupt or not an HDF5 "
            "file — re-fetch or re-pack it"
        ) from e
