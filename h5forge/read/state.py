"""What one process holds to read an asset: its index, a byte-range reader, the digests.

:class:`H5ImageDataset <h5forge.read.dataset.H5ImageDataset>` makes one :class:`ProcessState`
per process, lazily, on first use (a handle inherited through ``fork`` is never used). Opening
checks the whole file before any sample is read; the HDF5 handle is then closed unless the
images are filtered (compressed), and samples are read by byte range.
"""

from __future__ import annotations

import copy
import hashlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.coalesce import BlockSource
from h5forge.asset.index import check_index, load_index
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.asset.ranges import RangeReader
from h5forge.asset.target_layout import file_schema, image_sizes
from h5forge.errors import IntegrityError
from h5forge.location import Location
from h5forge.read.fill import FillStore
from h5forge.read.options import ReadOptions
from h5forge.read.targets import TargetReads, select

__all__ = ["ProcessState", "open_state"]


def _digests(h5: Any, url: str) -> np.ndarray:
    try:
        digests = h5[fmt.DIGESTS][()]
    except H5_DAMAGE as e:
        raise IntegrityError(
            f"{url}: /digests cannot be read ({type(e).__name__}: {e}); the "
            "file is damaged — run `h5forge verify`"
        ) from e
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
    fd = reader.fd
    if fd is None or h5.driver != "sec2":
        return True
    a, b = os.fstat(fd), os.fstat(h5.id.get_vfd_handle())
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class ProcessState:
    """Per-process handles: index, range reader and (for filtered files) an HDF5 handle;
    ``selection`` (what ``options.target`` resolved to, :func:`h5forge.read.targets.select`)
    and ``targets``, the columns it reads (None for ``"class"`` alone). Of ``options`` it uses
    what opening needs: ``verify_reads`` (digests loaded), ``max_pixels``, ``target``,
    ``multilabel`` and ``iscrowd``. ``size``: the remote object's size when known (a shard's,
    from its version's manifest): opening then asks the server no ``info``.

    Raises:
        _Replaced: the file changed identity while it was opened (:func:`open_state` opens
            it again).
    """

    def __init__(
        self,
        where: Location,
        options: ReadOptions,
        store: BlockSource | None = None,
        check: Callable[[Any], None] | None = None,
        size: int | None = None,
    ):
        self.pid = os.getpid()
        self.url = url = where.url
        self.opened = open_h5(where, size)
        self.targets: TargetReads | None = None
        want_digests = options.verify_reads
        try:
            h5 = self.opened.h5
            if check is not None:
                check(h5)
            self.index = load_index(h5, where=url)
            check_index(self.index, h5.id.get_filesize(), where=url, max_pixels=options.max_pixels)
            self.digests = _digests(h5, url) if want_digests else None
            schema = file_schema(self.index.header, where=url)
            self.selection = select(
                options.target,
                schema,
                where=url,
                multilabel=options.multilabel,
                iscrowd=options.iscrowd,
            )
            if self.selection.columns:
                self.targets = TargetReads(
                    h5,
                    self.selection.columns,
                    image_hw=image_sizes(h5, self.index.header),
                    want_digests=want_digests,
                    where=url,
                )
        except BaseException:
            self.opened.close()
            raise
        self.reader: RangeReader | None = None
        if self.index.filtered:
            self.images = self.opened.h5[fmt.IMAGES]  # compressed: reads go through HDF5
            if self.targets is not None:  # target values are never filtered: by byte range
                self.reader = RangeReader(where, size=h5.id.get_filesize(), store=store)
                if not _same_file(h5, self.reader):
                    self.reader.close()
                    self.opened.close()
                    raise _Replaced(url)
        else:
            try:
                size = self.opened.h5.id.get_filesize()  # checked against the object's size
                self.reader = RangeReader(where, size=size, store=store)
                if not _same_file(self.opened.h5, self.reader):
                    self.reader.close()
                    raise _Replaced(url)
            finally:
                self.opened.close()  # the rest is read by byte range; no HDF5 handle kept

    def reattached(self, reader: RangeReader) -> ProcessState:
        """This state (checked here or in the process that forked this one) reading through
        ``reader``, a new descriptor of the same file, in this process: nothing is read or
        checked again (:func:`h5forge.read.shard_check.reattach` says when that is right)."""
        assert not self.index.filtered, "filtered images are read through an HDF5 handle"
        st = copy.copy(self)
        st.pid, st.reader = os.getpid(), reader
        return st

    def forked(self, where: Location) -> ProcessState | None:
        """This state of a remote file, opened and checked in the process that forked this one,
        reading through a byte reader of this process's own (the parent's client and threads
        are not this process's): its index, selection and digests are kept, so a DataLoader
        worker reads its first batch without opening the file again (~4 round trips and the
        structure checks, ~160 ms on a 20 ms link). Its blocks are kept in the same store
        (cache entry) as the parent's. One dataset object so reads one version of the object
        in every worker. None when the file is local (its descriptor is opened again here) or
        its images are filtered (read through an HDF5 handle)."""
        remote = self.reader.remote if self.reader is not None else None
        if remote is None or self.index.filtered:
            return None
        return self.reattached(RangeReader(where, size=remote.size, store=remote.store))

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        if self.index.filtered or self.reader is None:
            self.opened.close()

    def check(self, bufs: Sequence[Any], rows: list[int]) -> None:
        """With ``verify_reads`` (digests loaded), each sample's sha256 against ``/digests``.

        Raises:
            IntegrityError: naming the first sample whose bytes differ.
        """
        if self.digests is None:
            return
        for buf, r in zip(bufs, rows, strict=True):
            got = hashlib.sha256(buf).hexdigest()
            want = bytes(self.digests[r]).hex()
            if got != want:
                raise IntegrityError(
                    f"{self.url}: sample {r} ({'/paths'}[{r}]) read back with sha256 {got}, "
                    f"the file records {want}; the file is corrupt — re-fetch it or run "
                    "`h5forge verify`"
                )


def open_state(
    where: Location,
    options: ReadOptions,
    sha256: str = "",
    check: Callable[[Any], None] | None = None,
    size: int | None = None,
) -> ProcessState:
    """This process's :class:`ProcessState` for ``where``, read with ``options``, opened again
    if a publish replaced the file while it was being opened.

    With ``options.cache``, a remote ``where`` is read from its validated local copy
    (:meth:`h5forge.read.cache.FileCache.local_copy`, ``sha256`` the pinned version's; one
    larger than the cache's limit is read remotely with its blocks kept there), and the
    copy opened must be the inode that was validated (an eviction or refetch in between opens
    it again). With ``size`` (a shard: ``sha256`` and ``size`` from its version's manifest),
    the copy is keyed by that content address alone, shared by every version and base that
    names the shard, and a valid one is opened without asking the server anything. ``where`` is
    still the one messages name. ``check(h5)``, when given, is called
    with the open HDF5 handle before anything is read from it (a sharded version's shard is
    checked against its manifest entry on the handle it is read through).

    Raises:
        IntegrityError: the file was replaced 3 times in a row, or is damaged.
    """
    cache = options.cache
    for _ in range(3):
        pinned = cache.local_copy(where, sha256, size) if cache is not None else None
        try:
            if pinned is None:
                store = cache.block_store(where, sha256) if cache is not None else None
                if size is None and isinstance(store, FillStore):
                    size = store.size  # the server's, as the cache's check just asked it
                return ProcessState(where, options, store, check, size)
            st = ProcessState(Location(pinned.path), options, check=check)
        except _Replaced:
            continue
        except FileNotFoundError:
            if pinned is None:
                raise
            continue  # evicted between its check and this open
        fd = st.reader.fd if st.reader is not None else st.opened.h5.id.get_vfd_handle()
        seen = os.fstat(int(fd)) if fd is not None else None
        if seen is None or (seen.st_dev, seen.st_ino) != pinned.stat[:2]:
            st.close()
            continue
        st.url = where.url
        return st
    raise IntegrityError(
        f"{where.url} was replaced 3 times while being opened; open it "
        "again once it is no longer being published"
    )
