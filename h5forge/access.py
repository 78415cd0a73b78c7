"""The read seam: open an asset by URL, load its index, and read sample byte ranges.

This is the one place that tells local files from remote ones. Local files are read with
``os.preadv`` straight into caller buffers; remote files through fsspec's ``cat_ranges``, one
range request per sample, issued concurrently by the filesystem implementation.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import h5py
import numpy as np
from fsspec.implementations.local import LocalFileSystem

from h5forge import format as fmt
from h5forge.errors import IntegrityError

__all__ = ["AssetIndex", "RangeReader", "load_index", "open_h5", "open_ranges"]

# HDF5 metadata is read in small scattered pieces at open; a block cache with blocks this large
# serves them in a handful of requests without fsspec's default readahead pulling whole images.
_REMOTE_BLOCK_SIZE = 1 << 20


def url_to_fs(url: str, storage_options: dict[str, Any] | None) -> tuple[Any, str]:
    """Resolve ``url`` to ``(filesystem, path)``; plain paths are local files."""
    return fsspec.core.url_to_fs(str(url), **(storage_options or {}))


def is_local(fs: Any) -> bool:
    """True when ``fs`` is the local filesystem (the reader can use ``pread``)."""
    return isinstance(fs, LocalFileSystem)


class _Opened:
    """An open ``h5py.File`` plus whatever file object it reads through."""

    def __init__(self, h5: h5py.File, fileobj: Any | None) -> None:
        self.h5 = h5
        self._fileobj = fileobj

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

    Raises:
        FileNotFoundError: nothing at ``url``.
        IntegrityError: the file exists but HDF5 cannot open it (truncated or not HDF5).
    """
    fs, path = url_to_fs(url, storage_options)
    try:
        if is_local(fs):
            if not os.path.exists(path):
                raise FileNotFoundError(f"no file at {url}")
            return _Opened(h5py.File(path, "r"), None)
        if not fs.exists(path):
            raise FileNotFoundError(f"no file at {url}")
        fileobj = fs.open(path, "rb", cache_type="blockcache", block_size=_REMOTE_BLOCK_SIZE)
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


def load_index(h5: h5py.File, *, where: str, require_sealed: bool = True) -> AssetIndex:
    """Read the header and the per-sample index arrays from an open file.

    Raises:
        UnsealedFileError: unknown format, unknown version, or not sealed.
        IntegrityError: a required dataset is missing.
    """
    header = fmt.read_header(h5.attrs, where=where)
    if require_sealed:
        fmt.require_sealed(header, where=where)
    missing = [n for n in fmt.REQUIRED_DATASETS[header.storage] if n not in h5]
    if missing:
        raise IntegrityError(f"{where} lacks required datasets {missing}; the file is damaged")
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
        order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
        groups: list[list[int]] = []
        for i in order:
            if groups and ranges[groups[-1][-1]][0] + ranges[groups[-1][-1]][1] == ranges[i][0]:
                groups[-1].append(i)
            else:
                groups.append([i])
        if self._fd is not None:
            for g in groups:
                want = sum(ranges[i][1] for i in g)
                got = os.preadv(self._fd, [buffers[i] for i in g], ranges[g[0]][0])
                if got != want:
                    self._short(ranges[g[0]][0], want, got)
            return
        starts = [ranges[g[0]][0] for g in groups]
        ends = [ranges[g[-1]][0] + ranges[g[-1]][1] for g in groups]
        blobs = self._fs.cat_ranges([self._path] * len(groups), starts, ends)
        for g, blob, start, end in zip(groups, blobs, starts, ends, strict=True):
            if isinstance(blob, BaseException):
                raise blob
            if len(blob) != end - start:
                self._short(start, end - start, len(blob))
            pos = 0
            for i in g:
                n = ranges[i][1]
                buffers[i][:] = blob[pos:pos + n]
                pos += n

    def _short(self, offset: int, want: int, got: int) -> None:
        raise IntegrityError(
            f"{self.url}: read of {want} bytes at offset {offset} returned {got}; the file is "
            "truncated — re-fetch or re-pack it"
        )


def open_ranges(url: str, storage_options: dict[str, Any] | None = None) -> RangeReader:
    """Return a :class:`RangeReader` for ``url``."""
    return RangeReader(url, storage_options)
