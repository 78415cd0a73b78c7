"""``H5ImageDataset``: a map-style PyTorch Dataset over an h5forge file, local or remote.

Safe in DataLoader workers by construction: the object pickles as its URL and options only, and
every process opens its own handles lazily on first use (the pid is checked on each access, so a
handle inherited through ``fork`` is never used). Sample bytes are read with one ``pread`` (local)
or one range request (remote) per sample at offsets recorded in the file; ``__getitems__`` reads
a whole batch sorted by offset, coalescing neighbours.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import Dataset

from h5forge import format as fmt
from h5forge.access import H5_DAMAGE, AssetIndex, RangeReader, check_index, load_index, open_h5
from h5forge.errors import IntegrityError

__all__ = ["H5ImageDataset"]


def _digests(h5: Any, url: str) -> np.ndarray:
    try:
        digests = h5[fmt.DIGESTS][()]
    except H5_DAMAGE as e:
        raise IntegrityError(f"{url}: /digests cannot be read ({type(e).__name__}: {e}); the "
                             "file is damaged — run `h5forge verify`") from e
    if digests.ndim != 2 or digests.shape[1] != fmt.DIGEST_SIZE:
        raise IntegrityError(f"{url}: /digests has shape {digests.shape}; the file is damaged")
    return digests


class _Replaced(Exception):
    """The file was replaced (e.g. republished) between reading its index and opening it."""


def _same_file(h5: Any, reader: RangeReader) -> bool:
    """Whether the byte reader and the HDF5 handle the index came from see one file (local).

    A local reader keeps its descriptor, so once they agree every later read is of the same
    version even if the path is republished meanwhile. Remote readers cannot pin an object
    version; see H5ImageDataset's docstring.
    """
    fd = getattr(reader, "_fd", None)
    if fd is None or h5.driver != "sec2":
        return True
    a, b = os.fstat(fd), os.fstat(h5.id.get_vfd_handle())
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class _State:
    """Per-process handles: index, range reader and (for filtered files) an HDF5 handle."""

    def __init__(self, url: str, storage_options: dict[str, Any] | None, want_digests: bool):
        self.pid = os.getpid()
        self.opened = open_h5(url, storage_options)
        try:
            self.index = load_index(self.opened.h5, where=url)
            check_index(self.index, self.opened.h5.id.get_filesize(), where=url)
            self.digests = (_digests(self.opened.h5, url) if want_digests else None)
        except BaseException:
            self.opened.close()
            raise
        self.reader: RangeReader | None = None
        if self.index.filtered:
            self.images = self.opened.h5[fmt.IMAGES]  # compressed: reads go through HDF5
        else:
            try:
                self.reader = RangeReader(url, storage_options)
                if not _same_file(self.opened.h5, self.reader):
                    self.reader.close()
                    raise _Replaced(url)
            finally:
                self.opened.close()  # the rest is read by byte range; no HDF5 handle kept

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        else:
            self.opened.close()


class H5ImageDataset(Dataset[tuple[Any, Any]]):
    """Images and labels from an h5forge file.

    Args:
        url: local path or fsspec URL (``s3://bucket/x.h5``, ``memory://...``) of a sealed file.
        split: only samples of this split (e.g. ``"train"``); ``None`` for all.
        transform: applied to the ``uint8`` C x H x W tensor.
        target_transform: applied to the integer label.
        storage_options: passed to fsspec for remote URLs (credentials, endpoint).
        verify_reads: check each sample's sha256 as it is read; an ``IntegrityError`` names the
            sample. Without it a flipped byte in an uncompressed sample is returned as is (run
            :func:`h5forge.verify` on the file, or enable ``fletcher32`` when packing).

    Raises:
        UnsealedFileError: the file is a ``.partial``, unsealed, or of an unknown version.
        ValueError: ``split`` is not in the file.
    """

    def __init__(self, url: str | os.PathLike[str], *, split: str | None = None,
                 transform: Callable[[Any], Any] | None = None,
                 target_transform: Callable[[Any], Any] | None = None,
                 storage_options: dict[str, Any] | None = None,
                 verify_reads: bool = False) -> None:
        self.url = os.fspath(url)
        self.split = split
        self.transform = transform
        self.target_transform = target_transform
        self.storage_options = dict(storage_options or {})
        self.verify_reads = verify_reads
        fmt.refuse_partial(self.url)
        self._state: _State | None = None
        self._orphans: list[_State] = []
        self._indices: np.ndarray | None = None
        self._open()

    # --- pickling: URL and options only ------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        keep = ("url", "split", "transform", "target_transform", "storage_options",
                "verify_reads")
        return {k: self.__dict__[k] for k in keep}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._state = None
        self._orphans = []
        self._indices = None  # selected on first access, in the process that reads

    # --- per-process state -------------------------------------------------------------------
    def _open(self) -> _State:
        st = self._state
        if st is not None and st.pid == os.getpid():
            return st
        if st is not None:
            # Inherited through fork: never use or close the parent's handles here.
            self._orphans.append(st)
        for _ in range(3):  # a publish may replace the file while it is opened: open again
            try:
                st = self._state = _State(self.url, self.storage_options, self.verify_reads)
                break
            except _Replaced:
                continue
        else:
            raise IntegrityError(f"{self.url} was replaced 3 times while being opened; open it "
                                 "again once it is no longer being published")
        if self._indices is None:
            self._select(st.index)
        return st

    def _select(self, index: AssetIndex) -> None:
        if self.split is None:
            self._indices = np.arange(index.header.num_samples)
        else:
            if self.split not in index.split_names:
                raise ValueError(f"split {self.split!r} is not in {self.url}; it has "
                                 f"{[s for s in index.split_names if s] or 'no splits'}")
            code = index.split_names.index(self.split)
            self._indices = np.flatnonzero(index.split_codes == code)
        self.classes = list(index.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._labels = index.labels[self._indices]

    def close(self) -> None:
        """Release this process's handles (they reopen on the next access)."""
        if self._state is not None and self._state.pid == os.getpid():
            self._state.close()
        self._state = None

    # --- torch Dataset protocol --------------------------------------------------------------
    def __len__(self) -> int:
        self._open()
        assert self._indices is not None
        return len(self._indices)

    @property
    def targets(self) -> list[int]:
        """Label of every sample, like torchvision's ImageFolder."""
        self._open()
        return self._labels.tolist()

    def __getattr__(self, name: str) -> Any:
        # classes / class_to_idx after unpickling: load them on first use.
        if name in ("classes", "class_to_idx", "_labels"):
            self._open()
            return self.__dict__[name]
        raise AttributeError(name)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        st = self._open()
        assert self._indices is not None
        n = len(self._indices)
        asked = np.asarray(indices, dtype=np.int64).reshape(-1)
        where = np.where(asked < 0, asked + n, asked)
        outside = (where < 0) | (where >= n)
        if outside.any():
            raise IndexError(f"index {int(asked[np.flatnonzero(outside)[0]])} out of range for "
                             f"{n} samples")
        rows = self._indices[where].tolist()
        images = self._read(st, rows)
        labels = st.index.labels[rows].tolist()
        if self.transform is None and self.target_transform is None:
            return list(zip(images, labels, strict=True))
        out = []
        for image, label in zip(images, labels, strict=True):
            if self.transform is not None:
                image = self.transform(image)
            if self.target_transform is not None:
                label = self.target_transform(label)
            out.append((image, label))
        return out

    def _read(self, st: _State, rows: list[int]) -> Iterable[Any]:
        """The images of ``rows`` as uint8 C x H x W tensors (views of H x W x C pixels).

        Encoded images are decoded lazily, as the caller iterates: each is transformed (and
        usually shrunk) before the next is decoded, instead of a batch of full-size images
        living at once (64 x 560 KB at 500x375, well past the CPU caches).
        """
        if st.index.header.storage == "array" and not st.index.filtered:
            return self._read_array(st, rows)
        return (torch.from_numpy(a).permute(2, 0, 1) for a in self._read_arrays(st, rows))

    def _read_array(self, st: _State, rows: list[int]) -> list[Any]:
        # The whole batch lands in one array, one pread per sample (touching ones coalesced).
        idx = st.index
        assert st.reader is not None
        assert idx.image_shape is not None
        size = int(np.prod(idx.image_shape))
        batch = np.empty((len(rows), *idx.image_shape), np.uint8)
        view = batch.data.cast("B")
        bufs = [view[k * size:(k + 1) * size] for k in range(len(rows))]
        st.reader.read_into(idx.byte_ranges[rows].tolist(), bufs)
        self._check(bufs, rows, st)
        chw = torch.from_numpy(batch).permute(0, 3, 1, 2)
        return list(chw.unbind(0))

    def _read_arrays(self, st: _State, rows: list[int]) -> Iterable[np.ndarray]:
        idx = st.index
        if idx.filtered:
            arrays = []
            for r in rows:
                try:
                    arrays.append(np.ascontiguousarray(st.images[r]))
                except OSError as e:  # fletcher32 mismatch, or the codec rejects the chunk
                    raise IntegrityError(
                        f"{self.url}: sample {r} cannot be read ({e}): its chunk fails its "
                        "checksum (fletcher32) or does not decompress; the file is corrupt — "
                        "re-fetch it or run `h5forge verify`") from e
            self._check([a.data for a in arrays], rows, st)
            return arrays
        assert st.reader is not None
        ranges = idx.byte_ranges[rows].tolist()
        raw = [bytearray(n) for _, n in ranges]
        bufs = [memoryview(b) for b in raw]
        st.reader.read_into(ranges, bufs)
        self._check(bufs, rows, st)
        assert idx.shapes is not None
        if idx.header.layout == "decoded":
            return [np.frombuffer(b, np.uint8).reshape(tuple(idx.shapes[r]))
                    for b, r in zip(raw, rows, strict=True)]
        from h5forge.images import Encoding, decode_stored

        return (decode_stored(memoryview(b), tuple(int(x) for x in idx.shapes[r]),
                              layout="encoded",
                              encoding=cast(Encoding, idx.header.encoding), mode=idx.header.mode)
                for b, r in zip(raw, rows, strict=True))

    def _check(self, bufs: Sequence[Any], rows: list[int], st: _State) -> None:
        if not self.verify_reads or st.digests is None:
            return
        for buf, r in zip(bufs, rows, strict=True):
            got = hashlib.sha256(buf).hexdigest()
            want = bytes(st.digests[r]).hex()
            if got != want:
                raise IntegrityError(
                    f"{self.url}: sample {r} ({'/paths'}[{r}]) read back with sha256 {got}, "
                    f"the file records {want}; the file is corrupt — re-fetch it or run "
                    "`h5forge verify`")
