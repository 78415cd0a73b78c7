"""The read seam: open an asset by URL, load its index, and read sample byte ranges.

This is the one place that tells local files from remote ones. Local files are read with
``os.preadv`` straight into caller buffers; remote files through fsspec's ``cat_ranges``, one
range request per sample, issued concurrently by the filesystem implementation.

Opening a remote file costs two requests for files this version writes: one ``info`` (the size,
which HDF5 checks against the end address in the superblock) and one ranged read of the head of
the file, where the writer puts the superblock, every object header, the root attributes and
the per-sample index (see docs/FORMAT.md, "Physical placement"). Reads HDF5 makes beyond what
is cached cost one request each: small ones fetch a block around them, large ones exactly what
is asked. Files laid out otherwise (older writers, ``h5repack``) open too, with a few more
requests.
"""

from __future__ import annotations

import io
import os
import stat
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import h5py
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from h5forge.asset import format as fmt
from h5forge.asset import structure
from h5forge.errors import H5ForgeError, IntegrityError

__all__ = [
    "AssetIndex",
    "RangeReader",
    "check_index",
    "check_labels",
    "load_index",
    "open_h5",
    "open_ranges",
]

# The first read of a remote file fetches this much from offset 0: the writer keeps everything
# an open needs there (about 25 bytes per sample of index), so one request serves the open of
# files up to ~30,000 samples and a handful of requests serve millions.
_HEAD_BYTES = 1 << 20
# Later small misses (HDF5 metadata: B-tree nodes, heaps) fetch a block this large around them;
# reads at least this large (chunks, index datasets) are fetched exactly, never read ahead.
_MISS_BLOCK = 64 << 10
# Bytes of fetched ranges a remote file object keeps (oldest dropped first).
_CACHE_BYTES = 64 << 20
# Most buffers one preadv call takes (IOV_MAX).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


def url_to_fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """Resolve ``url`` to ``(filesystem, path)``; plain paths are local files."""
    return fsspec.core.url_to_fs(str(url), **(storage_options or {}))


def is_local(fs: Any) -> bool:
    """True when ``fs`` is the local filesystem (the reader can use ``pread``)."""
    return isinstance(fs, LocalFileSystem)


class _RangeFile(io.RawIOBase):
    """A read-only, seekable file over fsspec ranged reads, for HDF5's file-object driver.

    fsspec's own file objects either read ahead a large block on every miss (``readahead``,
    ``bytes``: 35-200x the bytes a random sample read needs) or cache fixed blocks (the
    ``blockcache``, which still rounds every chunk read up to whole blocks). This one knows what
    HDF5 asks for: the head of the file in one request, small metadata misses as one small
    block, and large reads exactly.
    """

    def __init__(self, fs: Any, path: str, size: int) -> None:
        super().__init__()
        self._fs, self._path, self._size = fs, path, size
        self._pos = 0
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
        elif need >= _MISS_BLOCK:
            end = pos + need
        else:
            end = pos + _MISS_BLOCK
        end = min(max(end, pos + need), self._size)
        data = self._fs.cat_file(self._path, start=pos, end=end)
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


class _Opened:
    """An open ``h5py.File`` plus whatever file object it reads through."""

    def __init__(self, h5: h5py.File, fileobj: Any | None) -> None:
        self.h5 = h5
        self._fileobj = fileobj

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


def open_h5(url: str, storage_options: dict[str, Any] | None = None) -> _Opened:
    """Open an HDF5 file read-only from a local path or any fsspec URL.

    Remote files cost one ``info`` request and one ranged read of the file's head for files this
    version writes (see the module docstring). Every link and dataset of the file is checked
    before it is returned (:func:`h5forge.asset.structure.check_links`): soft, external and
    user-defined links, virtual datasets and external storage are refused, and the filters the
    file uses are resolved (``hdf5plugin`` is imported when one needs it).

    Raises:
        FileNotFoundError: nothing at ``url``.
        IntegrityError: the file exists but HDF5 cannot open it (truncated or not HDF5), or it
            holds a link, virtual dataset or external storage, or an unknown filter.
        MissingExtraError: the file uses a plugin filter and ``hdf5plugin`` is not installed.
    """
    opened = _open(url, storage_options)
    try:
        structure.check_links(opened.h5, where=url)
    except BaseException as e:
        opened.close()
        if isinstance(e, H5ForgeError) or not isinstance(e, H5_DAMAGE):
            raise
        raise IntegrityError(
            f"{url}: its HDF5 structure cannot be read ({type(e).__name__}: "
            f"{e}); it is damaged — re-fetch or re-pack it"
        ) from e
    return opened


def _open(url: str, storage_options: dict[str, Any] | None) -> _Opened:
    fs, path = url_to_fs(url, storage_options)
    try:
        if is_local(fs):
            if not os.path.exists(path):
                raise FileNotFoundError(f"no file at {url}")
            if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
                raise IntegrityError(f"{url} is not a regular file; an asset is one .h5 file")
            return _Opened(h5py.File(path, "r"), None)
        try:
            info = fs.info(path)
        except FileNotFoundError:
            raise FileNotFoundError(f"no file at {url}") from None
        if info.get("type", "file") != "file":
            raise FileNotFoundError(f"no file at {url}: it is a {info.get('type')}")
        fileobj: Any
        if info.get("size") is None:  # e.g. an HTTP server that sends no Content-Length
            fileobj = fs.open(path, "rb", cache_type="blockcache", block_size=_HEAD_BYTES)
        else:
            fileobj = _RangeFile(fs, path, int(info["size"]))
        try:
            return _Opened(h5py.File(fileobj, "r"), fileobj)
        except BaseException:
            fileobj.close()
            raise
    except OSError as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise IntegrityError(
            f"{url} cannot be opened as HDF5 ({e}); it is truncated, corrupt or not an HDF5 "
            "file — re-fetch or re-pack it"
        ) from e


@dataclass(frozen=True)
class AssetIndex:
    """Everything a reader needs about an asset, loaded once per process.

    Attributes:
        header: parsed root attributes.
        byte_ranges: ``(N, 2) uint64`` absolute (offset, nbytes) of each sample's stored bytes.
        labels: ``(N,) int64``.
        split_codes: ``(N,) uint8`` index into ``split_names``.
        split_names: split names (``('',)`` when the source had none).
        classes: class names.
        image_shape: ``(H, W, C)`` for array storage, else ``None``.
        shapes: ``(N, 3)`` for blob storage, else ``None``.
        filtered: True when ``/images`` has HDF5 filters (compression, fletcher32), so stored
            bytes are not the sample bytes and reads must go through HDF5.
    """

    header: fmt.Header
    byte_ranges: np.ndarray
    labels: np.ndarray
    split_codes: np.ndarray
    split_names: tuple[str, ...]
    classes: tuple[str, ...]
    image_shape: tuple[int, int, int] | None
    shapes: np.ndarray | None
    filtered: bool


def _strings(ds: h5py.Dataset) -> tuple[str, ...]:
    return tuple(ds.asstr()[()].tolist()) if ds.shape and ds.shape[0] else ()


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


def load_index(h5: h5py.File, *, where: str, require_sealed: bool = True) -> AssetIndex:
    """Read the header and the per-sample index arrays from an open file.

    Raises:
        UnsealedFileError: unknown format, unknown version, or not sealed.
        IntegrityError: a required dataset is missing, or HDF5 cannot read the index.
    """
    try:
        return _load_index(h5, where=where, require_sealed=require_sealed)
    except (IntegrityError, FileNotFoundError):
        raise
    except H5_DAMAGE as e:
        raise IntegrityError(
            f"{where} cannot be read: its HDF5 structure is damaged ({type(e).__name__}: {e}); "
            "re-fetch or re-pack it"
        ) from e


def check_labels(index: AssetIndex, *, where: str) -> None:
    """Refuse labels outside ``0..K-1`` (``K`` the number of class names) and split codes
    outside the split names: what a reader hands out, and what counts are indexed by.

    Raises:
        IntegrityError: naming the first bad value and its row.
    """
    k, labels = len(index.classes), index.labels
    if index.header.num_classes != k:
        raise IntegrityError(
            f"{where}: /classes has {k} names, root attribute num_classes "
            f"says {index.header.num_classes}; the file is damaged — run "
            "`h5forge verify`"
        )
    bad = np.flatnonzero((labels < 0) | (labels >= k))
    if len(bad):
        i = int(bad[0])
        raise IntegrityError(
            f"{where}: label {int(labels[i])} out of range: file declares {k} "
            f"classes (0..{k - 1}) in /labels[{i}] ({len(bad)} bad label(s)); "
            "the file is damaged — run `h5forge verify`"
        )
    s = len(index.split_names)
    bad = np.flatnonzero(index.split_codes >= s)
    if len(bad):
        i = int(bad[0])
        raise IntegrityError(
            f"{where}: split code {int(index.split_codes[i])} out of range "
            f"0..{s - 1} in /splits[{i}]; the file is damaged — run "
            "`h5forge verify`"
        )


def check_index(
    index: AssetIndex, file_size: int, *, where: str, max_pixels: int | None = None
) -> None:
    """Refuse an index a reader cannot use safely, before any sample is read.

    Refused: rows missing; a label or split code out of range (:func:`check_labels`); a byte
    range past the end of the file, overlapping another, or (unfiltered storage of decoded
    pixels) not one sample's size; a ``/shapes`` row of the wrong channel count; and, with
    ``max_pixels``, a sample whose decoded size is more than ``max_pixels`` pixels where that
    size is not bounded by the file's (encoded samples, and compressed ``array`` chunks).

    Cheap (vectorised, at open); it keeps a damaged or hostile index from turning into a huge
    allocation or a read at a nonsense offset. It does not prove the data right: that is
    ``verify``.

    Raises:
        IntegrityError: naming the first bad sample.
    """
    hdr = index.header
    n, r = hdr.num_samples, index.byte_ranges
    wanted = {
        "byte_ranges": (r, (n, 2)),
        "labels": (index.labels, (n,)),
        "splits": (index.split_codes, (n,)),
    }
    if index.shapes is not None:
        wanted["shapes"] = (index.shapes, (n, 3))
    for name, (arr, shape) in wanted.items():
        if arr.shape != shape:
            raise IntegrityError(
                f"{where}: /{name} has shape {arr.shape}, num_samples is {n}; "
                "the file is damaged — run `h5forge verify`"
            )
    check_labels(index, where=where)
    size = np.uint64(max(file_size, 0))
    bad = (r[:, 1] > size) | (r[:, 0] > size - np.minimum(r[:, 1], size))
    if index.image_shape is not None and not index.filtered:
        bad |= r[:, 1] != np.uint64(np.prod(index.image_shape))
    if index.shapes is not None:
        _check_shapes(index, int(size), where, max_pixels)
        if hdr.layout == "decoded":
            # No overflow: H*W <= file size (checked above) and C <= 3.
            bad |= r[:, 1] != np.prod(index.shapes.astype(np.uint64), axis=1)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise IntegrityError(
            f"{where}: /byte_ranges[{i}] = {tuple(int(x) for x in r[i])} does "
            f"not fit a sample of this {file_size}-byte file; the file is "
            "damaged — run `h5forge verify`"
        )
    _check_overlap(r, where)
    if (
        max_pixels is not None
        and index.image_shape is not None
        and index.filtered
        and index.image_shape[0] * index.image_shape[1] > max_pixels
    ):
        h, w, _ = index.image_shape
        raise IntegrityError(
            f"{where}: /images holds compressed samples of {h} x {w} = "
            f"{h * w} pixels, more than max_pixels={max_pixels}; pass a larger "
            "max_pixels if you trust this file"
        )


def _check_shapes(index: AssetIndex, size: int, where: str, max_pixels: int | None) -> None:
    """``/shapes`` rows: the file's channel count, at least 1 x 1, and a bounded pixel count
    (computed so that no product can overflow: each factor is below 2**32)."""
    assert index.shapes is not None
    shapes = index.shapes.astype(np.uint64)
    hw = shapes[:, 0] * shapes[:, 1]  # < 2**64: both factors are uint32
    channels = index.header.channels
    decoded = index.header.layout == "decoded"
    limit = size if decoded else (max_pixels if max_pixels is not None else None)
    bad = (shapes[:, 2] != channels) | (hw == 0)
    if limit is not None:
        bad |= hw > np.uint64(limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        h, w, c = (int(x) for x in index.shapes[i])
        if c != channels or h * w == 0:
            why = f"expected (H >= 1, W >= 1, {channels}) for mode {index.header.mode}"
        elif decoded:
            why = f"more pixels than the whole {size}-byte file holds"
        else:
            why = (
                f"{h * w} pixels, more than max_pixels={max_pixels}; pass a larger "
                "max_pixels if you trust this file"
            )
        raise IntegrityError(f"{where}: /shapes[{i}] = ({h}, {w}, {c}): {why}")


def _check_overlap(r: np.ndarray, where: str) -> None:
    """No two samples may share stored bytes (the writer's are in order: one O(N) pass)."""
    if len(r) < 2:
        return
    starts, ends = r[:, 0], r[:, 0] + r[:, 1]  # no overflow: each range lies in the file
    if not np.all(starts[1:] >= starts[:-1]):
        order = np.argsort(starts, kind="stable")
        starts, ends = starts[order], ends[order]
    else:
        order = None
    clash = np.flatnonzero(starts[1:] < ends[:-1])
    if len(clash):
        a, b = int(clash[0]), int(clash[0]) + 1
        if order is not None:
            a, b = int(order[a]), int(order[b])
        raise IntegrityError(
            f"{where}: /byte_ranges[{b}] = {tuple(int(x) for x in r[b])} "
            f"overlaps /byte_ranges[{a}] = {tuple(int(x) for x in r[a])}; "
            "the file is damaged — run `h5forge verify`"
        )


def _load_index(h5: h5py.File, *, where: str, require_sealed: bool) -> AssetIndex:
    header = fmt.read_header(h5.attrs, where=where)
    if require_sealed:
        fmt.require_sealed(header, where=where)
    missing = [n for n in fmt.REQUIRED_DATASETS[header.storage] if n not in h5]
    if missing:
        raise IntegrityError(f"{where} lacks required datasets {missing}; the file is damaged")
    # Declared shapes and types against the counts and the file size, before reading any.
    structure.check_declared(h5, header, file_size=h5.id.get_filesize(), where=where)
    images = h5[fmt.IMAGES]
    filtered = images.id.get_create_plist().get_nfilters() > 0
    return AssetIndex(
        header=header,
        byte_ranges=h5[fmt.BYTE_RANGES][()],
        labels=h5[fmt.LABELS][()],
        split_codes=h5[fmt.SPLITS][()],
        split_names=_strings(h5[fmt.SPLIT_NAMES]),
        classes=_strings(h5[fmt.CLASSES]),
        image_shape=tuple(int(x) for x in images.shape[1:]) if header.storage == "array" else None,  # type: ignore[arg-type]
        shapes=h5[fmt.SHAPES][()] if header.storage == "blob" else None,
        filtered=filtered,
    )


class RangeReader:
    """Reads absolute byte ranges of one file, locally with ``preadv`` or remotely.

    Create it in the process that reads (it holds a file descriptor or a filesystem client).
    """

    def __init__(self, url: str, storage_options: dict[str, Any] | None = None) -> None:
        self.url = url
        self._fs, self._path = url_to_fs(url, storage_options)
        self._fd: int | None = None
        if is_local(self._fs):
            self._fd = os.open(self._path, os.O_RDONLY)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(self._fd, 0, 0, os.POSIX_FADV_RANDOM)

    def close(self) -> None:
        """Release the file descriptor (remote readers hold nothing to release)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def read_into(self, ranges: Sequence[tuple[int, int]], buffers: Sequence[memoryview]) -> None:
        """Fill ``buffers[i]`` with the bytes of ``ranges[i] = (offset, nbytes)``.

        Ranges are read in file order; ranges that touch are read with one system call (local)
        or one request (remote).

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
        run_starts = [starts_l[lo] for lo, _ in runs]
        run_ends = [starts_l[hi - 1] + sizes_l[hi - 1] for _, hi in runs]
        blobs = self._fs.cat_ranges([self._path] * len(runs), run_starts, run_ends)
        for (lo, hi), blob, start, end in zip(runs, blobs, run_starts, run_ends, strict=True):
            if isinstance(blob, BaseException):
                raise blob
            if len(blob) != end - start:
                self._short(start, end - start, len(blob))
            view, pos = memoryview(blob), 0
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
    """Return a :class:`RangeReader` for ``url``."""
    return RangeReader(url, storage_options)
