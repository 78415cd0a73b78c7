"""``H5ImageDataset``: a map-style PyTorch Dataset over an h5forge file, local or remote.

Safe in DataLoader workers by construction: the object pickles as its URL, storage options,
version and :class:`~h5forge.read.options.ReadOptions` only, and
every process opens its own handles lazily on first use (the pid is checked on each access, so a
handle inherited through ``fork`` is never used). A batch is read at the offsets the file
records: ``preadv`` locally, a few coalesced range requests remotely (``asset.coalesce``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any, cast

import numpy as np
from torch.utils.data import Dataset

from h5forge.asset import format as fmt
from h5forge.asset.index import AssetIndex
from h5forge.asset.target_layout import file_schema
from h5forge.location import Location
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.read import collate as _collate
from h5forge.read.loader import BatchLoading
from h5forge.read.options import ReadOptions, pick_options, with_default_cache
from h5forge.read.provenance import SampleSources
from h5forge.read.samples import read_batch, read_images, read_with_targets
from h5forge.read.sharded import ShardedVersion, is_manifest
from h5forge.read.stacked import plain
from h5forge.read.state import ProcessState, open_state
from h5forge.read.targets import CLASS
from h5forge.read.version import cached_version, check_version_file, open_named
from h5forge.targets.schema import Column

__all__ = ["H5ImageDataset"]

log = logging.getLogger("h5forge.read.dataset")


class H5ImageDataset(BatchLoading, SampleSources, Dataset[tuple[Any, Any]]):
    """Images and their targets (by default the class label) from an h5forge file.

    Args:
        url: local path or fsspec URL (``s3://bucket/x.h5``, ``memory://...``) of a sealed file,
            or the name an asset was published to: ``DEST.h5`` or its base ``DEST``. When no
            file is there, the asset's latest version is read (as ``version="latest"``).
        version: ``"latest"`` or a sha256 prefix (16-64 hex) of a published version: resolved
            once, here (:mod:`h5forge.read.version`); ``url`` becomes that version's file, never
            written over, so workers and later epochs read it even after a new publish. The
            command line's ``--version`` means the same.
        split: only samples of this split (e.g. ``"train"``); ``None`` for all.
        target: what each sample comes with: ``"class"`` (the integer label), a target
            column's name, a kind (``"multilabel"``, ``"boxes"``, ``"mask"``, ``"text"``,
            ``"number"``: the file's one column of that kind) or a list of those (a dict per
            sample). Values, ``tv_tensors`` and batching: :mod:`h5forge.read.targets`.
        multilabel: a multilabel column as a ``"multihot"`` float32 vector or as
            ``"indices"``, its class indices.
        iscrowd: a boxes target's dicts hold ``"iscrowd"`` (``(M,) uint8``) besides
            ``"boxes"`` and ``"labels"`` (COCO evaluation needs it; training does not, and
            each key is one more tensor per sample).
        transform: applied to the ``uint8`` C x H x W tensor.
        target_transform: applied to the target (the integer label by default).
        transforms: applied to ``(image, target)`` after those two, returning the pair: e.g. a
            ``torchvision.transforms.v2`` pipeline, which moves boxes and masks with the image.
        storage_options: passed to fsspec for remote URLs (credentials, endpoint).
        verify_reads: check each sample's sha256 as it is read; an ``IntegrityError`` names the
            sample. Without it a flipped byte in an uncompressed sample is returned as is (run
            :func:`h5forge.verify` on the file, or enable ``fletcher32`` when packing).
        max_pixels: most pixels one sample may decode to where the file's size does not bound
            it (encoded images, compressed chunks); default Pillow's limit (89.5 M). The
            file's ``/shapes`` are checked against it at open and never raise it.
        cache_dir: where a remote asset's verified local copy is kept, shared by workers,
            epochs and jobs (:mod:`h5forge.read.cache`). Default (None): the user's cache
            folder, ``$XDG_CACHE_HOME/h5forge/read`` or ``~/.cache/h5forge/read``; ``False``:
            no cache.
            The copy fills from the reader's own range requests (nothing is downloaded before
            the first batch) and, once whole, is hashed against the sidecar's or manifest's
            sha256 and read like a local file (:mod:`h5forge.read.fill`).
        cache_limit: bytes the cache may hold; default (None): half the free disk space,
            at most 50 GiB, besides what it holds. Least recently used entries are evicted.
        options: all of the above but ``url``, ``version`` and ``storage_options`` as one
            :class:`~h5forge.read.options.ReadOptions`, instead of those keywords (giving both
            is refused).

    A sharded version (docs/FORMAT.md, "Sharded versions") reads as one dataset: ``url`` is
    its manifest, ``version`` the manifest's sha256, and opening reads the manifest alone
    (length, ``split=`` counts, classes, order: shards in manifest order, each shard's live
    rows in file order); each shard is opened, and checked against its manifest entry, on first
    use in the process that reads it (:mod:`h5forge.read.sharded`). ``targets`` and
    ``sources`` open every shard.

    Opening checks the whole file before reading any sample (docs/FORMAT.md, "What readers
    refuse"): links, virtual datasets, external storage, declared sizes, labels, byte ranges.

    Raises:
        UnsealedFileError: the file is a ``.partial``, unsealed, or of an unknown version.
        IntegrityError: the file is damaged or refers outside itself (the message says how).
        MissingExtraError: the file is compressed with a codec that needs ``hdf5plugin``.
        FileNotFoundError: no such file, pointer (``latest``) or version.
        ValueError: ``split`` is not in the file, ``target`` names no column of it (the message
            lists its columns) or the file has none, ``max_pixels`` or ``version`` is
            invalid, or ``options`` comes with other reading keywords. All raised here, in the
            constructing process, before any worker starts.

    Attributes:
        url: the file read; version: its full sha256 ("" when opened by ``url`` alone).
        options: the :class:`~h5forge.read.options.ReadOptions` it reads with.
        transform, target_transform, transforms: its options' (as torchvision's datasets
            have them); setting one replaces ``options`` with a value holding it.

    Where each sample came from: ``ds.source_path(i)`` (its path in the source, e.g.
    ``train/cat/001.jpg``), ``ds.sources`` (all of them), and ``ds.provenance`` (source URL
    and sha256, build time, configuration, parent version, Prefect run: see
    :mod:`h5forge.read.provenance`), read from the file when first asked for.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | Location,
        *,
        version: str | None = None,
        split: str | None = None,
        target: str | Sequence[str] = CLASS,
        multilabel: str = "multihot",
        iscrowd: bool = False,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        transforms: Callable[[Any, Any], tuple[Any, Any]] | None = None,
        storage_options: dict[str, Any] | None = None,
        verify_reads: bool = False,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        cache_dir: str | os.PathLike[str] | bool | None = None,
        cache_limit: int | None = None,
        options: ReadOptions | None = None,
    ) -> None:
        given = ReadOptions(
            split=split,
            target=target,
            multilabel=multilabel,
            iscrowd=iscrowd,
            transform=transform,
            target_transform=target_transform,
            transforms=transforms,
            verify_reads=verify_reads,
            max_pixels=max_pixels,
            cache_dir=cache_dir,
            cache_limit=cache_limit,
        )
        where = Location.of(url, storage_options)
        self.options = with_default_cache(pick_options(options, given), not where.is_local)
        self.storage_options = dict(where.options)
        self._state: ProcessState | None = None
        self._orphans: list[ProcessState] = []
        self._indices: np.ndarray | None = None
        self._sharded: ShardedVersion | None = None
        found = cached_version(where, version, self.options.cache)
        if found is not None:
            self._open_file(*found)  # a pinned version held by the cache: no request at all
        else:
            open_named(where, version, self._open_file)

    # torchvision's convention: a dataset's transforms may be set after it is made (a split's
    # own augmentation, say). Each is a view of ``options``; setting one makes a new value.
    @property
    def transform(self) -> Callable[[Any], Any] | None:
        return self.options.transform

    @transform.setter
    def transform(self, fn: Callable[[Any], Any] | None) -> None:
        self.options = with_default_cache(
            dataclasses.replace(self.options, transform=fn), self._reads_remotely()
        )

    @property
    def target_transform(self) -> Callable[[Any], Any] | None:
        return self.options.target_transform

    @target_transform.setter
    def target_transform(self, fn: Callable[[Any], Any] | None) -> None:
        self.options = with_default_cache(
            dataclasses.replace(self.options, target_transform=fn), self._reads_remotely()
        )

    @property
    def transforms(self) -> Callable[[Any, Any], tuple[Any, Any]] | None:
        return self.options.transforms

    @transforms.setter
    def transforms(self, fn: Callable[[Any, Any], tuple[Any, Any]] | None) -> None:
        self.options = with_default_cache(
            dataclasses.replace(self.options, transforms=fn), self._reads_remotely()
        )

    def _open_file(self, url: str, version: str) -> None:
        self.url, self.version = url, version
        if is_manifest(url):
            self._shards()  # the manifest alone: shards open on first use
            return
        fmt.refuse_partial(url)
        file = Location(url, self.storage_options)
        if version and file.is_local:
            check_version_file(file, version)  # once, in the process that pins the version
        self._open()

    # --- pickling: where the file is and how to read it, never a handle -----------------------
    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "version": self.version,
            "storage_options": self.storage_options,
            "options": self.options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._state = None
        self._orphans = []
        self._indices = None  # selected on first access, in the process that reads
        self._sharded = None

    def _shards(self) -> ShardedVersion:
        """The sharded version's index (read from its manifest once per process)."""
        if self._sharded is None:
            where = Location(self.url, self.storage_options)
            self._sharded = ShardedVersion(where, self.version, self.options)
            self.classes = list(self._sharded.classes)
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        return self._sharded

    def _before_fork(self) -> None:
        """A sharded version's local shards checked here once, before ``loader()``'s workers
        fork, so that they inherit the checks (:meth:`ShardedVersion.prepare`)."""
        if is_manifest(self.url):
            self._shards().prepare()

    def _prefetch(self, indices: Sequence[int]) -> None:
        """A remote asset's bytes of ``indices`` fetched in the background (the loader calls
        this in each worker with the batch it reads next, before reading the current one). A
        failure is only logged: the read itself fetches what it needs and raises what it must."""
        try:
            if is_manifest(self.url):
                self._shards().prefetch(self._positions(indices))
                return
            st = self._open()
            if st.reader is None or st.reader.remote is None or st.index.filtered:
                return
            st.reader.prefetch(st.index.byte_ranges[self._rows(indices)].tolist())
        except Exception as e:
            log.debug("prefetch of %d samples of %s failed: %s", len(indices), self.url, e)

    def _reads_remotely(self) -> bool:
        """The URL is remote (``loader(shuffle=True)`` reads blocks), cached locally or not."""
        return not Location(self.url, self.storage_options).is_local

    # --- per-process state -------------------------------------------------------------------
    def _open(self) -> ProcessState:
        st = self._state
        if st is not None and st.pid == os.getpid():
            return st
        if st is not None:
            # Inherited through fork: never use or close the parent's handles here; a remote
            # one's index and checks are reused, with a byte reader of this process's own.
            self._orphans.append(st)
            forked = st.forked(Location(self.url, self.storage_options))
            if forked is not None:
                self._state = forked
                return forked
        st = self._state = open_state(
            Location(self.url, self.storage_options), self.options, self.version
        )
        if self._indices is None:
            self._select(st.index)
        return st

    def _select(self, index: AssetIndex) -> None:
        split = self.options.split
        if split is None:
            self._indices = np.arange(index.header.num_samples)
        else:
            if split not in index.split_names:
                raise ValueError(
                    f"split {split!r} is not in {self.url}; it has "
                    f"{[s for s in index.split_names if s] or 'no splits'}"
                )
            code = index.split_names.index(split)
            self._indices = np.flatnonzero(index.split_codes == code)
        self.classes = list(index.classes)
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self._labels = index.labels[self._indices]

    def close(self) -> None:
        """Release this process's handles (they reopen on the next access)."""
        if self._sharded is not None:
            self._sharded.close()
        if self._state is not None and self._state.pid == os.getpid():
            self._state.close()
        self._state = None

    # --- torch Dataset protocol --------------------------------------------------------------
    def __len__(self) -> int:
        if is_manifest(self.url):
            return len(self._shards())
        self._open()
        assert self._indices is not None
        return len(self._indices)

    @property
    def schema(self) -> tuple[Column, ...]:
        """The file's target columns (:mod:`h5forge.targets.schema`); ``()`` for version 1.
        Of a sharded version: its first shard's (every shard read with ``target=`` has them)."""
        if is_manifest(self.url):
            return self._shards().schema()
        return file_schema(self._open().index.header, where=self.url)

    def collate(self, items: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
        """Samples ``(image, target)`` (of this file's ``target=``) batched as
        :meth:`read_batch` batches them: :meth:`h5forge.read.targets.Selection.batch`."""
        if is_manifest(self.url):
            return self._shards().collate(items, slot=False)
        return self._open().selection.batch(items, url=self.url)

    @property
    def targets(self) -> list[int]:
        """Label of every sample, like torchvision's ImageFolder (of a sharded version: in
        its numbering, opening every shard)."""
        if is_manifest(self.url):
            return cast(list[int], self._shards().labels().tolist())
        self._open()
        return self._labels.tolist()

    def __getattr__(self, name: str) -> Any:
        # classes / class_to_idx after unpickling: load them on first use.
        if name in ("classes", "class_to_idx") and is_manifest(self.__dict__.get("url", "")):
            self._shards()
            return self.__dict__[name]
        if name in ("classes", "class_to_idx", "_labels"):
            self._open()
            return self.__dict__[name]
        raise AttributeError(name)

    # --- where samples came from (one file's: SampleSources; a sharded version's here) --------
    def source_path(self, i: int) -> str:
        if is_manifest(self.url):
            return self._shards().source_paths(self._positions([i]))[0]
        return super().source_path(i)

    source_path.__doc__ = SampleSources.source_path.__doc__

    @property
    def sources(self) -> list[str]:
        """The source path of every sample of this dataset, in index order."""
        if is_manifest(self.url):
            return self._shards().source_paths(np.arange(len(self)))
        return SampleSources.sources.fget(self)  # type: ignore[attr-defined]

    @property
    def provenance(self) -> dict[str, Any]:
        """How and from what the asset was made (:attr:`SampleSources.provenance`); of a
        sharded version, from its manifest, with ``lineage`` and ``shards`` besides."""
        if is_manifest(self.url):
            return {"url": self.url, "sha256": self.version, **self._shards().provenance()}
        return SampleSources.provenance.fget(self)  # type: ignore[attr-defined]

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        image, target = self.__getitems__([i])[0]
        return plain(image), target

    def _positions(self, indices: Sequence[int]) -> np.ndarray:
        """Dataset indices checked, negative ones counted from the end."""
        n = len(self)
        asked = np.asarray(indices, dtype=np.int64).reshape(-1)
        where = np.where(asked < 0, asked + n, asked)
        outside = (where < 0) | (where >= n)
        if outside.any():
            raise IndexError(
                f"index {int(asked[np.flatnonzero(outside)[0]])} out of range for {n} samples"
            )
        return where

    def _rows(self, indices: Sequence[int]) -> list[int]:
        """File rows of dataset indices (negative ones count from the end)."""
        where = self._positions(indices)
        assert self._indices is not None
        return cast(list[int], self._indices[where].tolist())

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        o = self.options
        images: Iterable[Any]
        targets: Iterable[Any]
        if is_manifest(self.url):
            pairs: Any = self._shards().items(self._positions(indices))
            if not o.transformed:
                return cast(list[tuple[Any, Any]], pairs)
            images, targets = (p[0] for p in pairs), (p[1] for p in pairs)
        else:
            st = self._open()
            rows = self._rows(indices)
            if st.selection.columns or st.selection.as_dict:
                images, targets = read_with_targets(st, rows, max_pixels=o.max_pixels)
            else:
                images = read_images(st, rows, max_pixels=o.max_pixels)
                targets = st.index.labels[rows].tolist()
            if not o.transformed:
                return list(zip(images, targets, strict=True))
        out = []
        for image, target in zip(images, targets, strict=True):
            if o.transform is not None:
                image = o.transform(image)
            if o.target_transform is not None:
                target = o.target_transform(target)
            if o.transforms is not None:
                image, target = o.transforms(image, target)
            out.append((image, target))
        return out

    def read_batch(self, indices: Sequence[int]) -> tuple[Any, Any]:
        """A whole batch at once: ``(images, labels)`` as the DataLoader would collate them
        (with ``target=``, ``(images, targets)``: :meth:`h5forge.read.targets.Selection.batch`).

        For a decoded fixed-size file without transforms, the batch is read straight into one
        ``B x C x H x W`` uint8 tensor whose memory is ``B x H x W x C``
        (``torch.channels_last``): no per-sample tensors, no collate copy, and inside a
        DataLoader worker the tensor is allocated in shared memory, so handing it to the main
        process copies nothing either. ``labels`` is an int64 tensor. Call
        ``.contiguous()`` on the images if a consumer needs the plain NCHW layout. Any other
        file or transform is read sample by sample and collated with torch's
        ``default_collate``.

        See :meth:`loader`, which makes a DataLoader call this once per batch.
        """
        return self._read_batch(indices, use_slots=False)

    def _read_batch(self, indices: Sequence[int], *, use_slots: bool) -> Any:
        """:meth:`read_batch`; ``use_slots`` (the loader's workers) reads into a reusable slot
        and returns a :class:`h5forge.read.batches.SlotBatch` (see that module)."""
        from torch.utils.data import get_worker_info

        if is_manifest(self.url):
            in_worker = get_worker_info() is not None
            sharded, at = self._shards(), self._positions(indices)
            direct = sharded.read_batch(at, slot=use_slots and in_worker, shared=in_worker)
            if direct is not None:
                return direct
            return sharded.collate(self.__getitems__(indices), slot=use_slots and in_worker)
        st = self._open()
        idx = st.index
        in_worker = get_worker_info() is not None
        if idx.header.storage != "array" or idx.filtered or self.options.transformed:
            items = self.__getitems__(indices)
            if st.selection.columns or st.selection.as_dict:
                return st.selection.batch(items, url=self.url)
            return _collate.collate(items, slot=use_slots and in_worker, url=self.url)
        return read_batch(st, self._rows(indices), slot=use_slots and in_worker, shared=in_worker)
