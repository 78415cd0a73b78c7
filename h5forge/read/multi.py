"""``H5MultiDataset``: several h5forge assets read as one map-style Dataset, and their mixing.

Each asset is an :class:`~h5forge.read.dataset.H5ImageDataset` (pinned, checked and pickled
as its URL and :class:`~h5forge.read.options.ReadOptions`, one value for every asset). Index
``i`` is found by bisecting the assets' cumulative lengths (after ``split``, applied to every
asset), through the ``subset`` if any. A batch is grouped by asset and put back in its order:
fixed-size decoded samples straight into one batch buffer, each asset's share with one
``read_into``; others through ``__getitems__``. Mixing: ``read.mixing``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import Dataset, get_worker_info

from h5forge.errors import H5ForgeError, IntegrityError
from h5forge.location import Location
from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.read import batches as _batches
from h5forge.read import collate as _collate
from h5forge.read.asset_list import (
    AssetSource,
    check_same_targets,
    parse_sources,
    read_asset_list,
    union_classes,
)
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.loader import BatchLoading
from h5forge.read.mixing import select_subset
from h5forge.read.options import ReadOptions, pick_options
from h5forge.read.order import shown
from h5forge.read.sharded import ShardedVersion, is_manifest
from h5forge.read.stacked import plain
from h5forge.read.state import ProcessState, open_state
from h5forge.read.targets import CLASS
from h5forge.redact import redact_url

__all__ = ["H5MultiDataset"]


class _Handles:
    """One process's states of the assets it reads in place (file rows, fixed image shape or
    None), and the byte ranges and union labels of their samples, by concatenation index."""

    def __init__(self, total: int) -> None:
        self.pid = os.getpid()
        self.states: dict[int, tuple[ProcessState, np.ndarray, tuple[int, ...] | None]] = {}
        self.ranges = np.zeros((total, 2), dtype=np.int64)
        self.labels = np.zeros(total, dtype=np.int64)


def _open_entry(
    listed: str, k: int, where: Location, version: str | None, options: ReadOptions
) -> H5ImageDataset:
    """The dataset of entry ``k``; what it raises names the asset list (if any) and the entry.

    The error keeps its type (callers and the CLI's exit codes tell them apart); only its
    message gains ``LIST: assets[k] (URL): `` in front.
    """
    try:
        return H5ImageDataset(where, version=version, options=options)
    except (OSError, ValueError, H5ForgeError) as e:
        prefix = f"{listed}: " if listed else ""
        message = f"{prefix}assets[{k}] ({where}): {e}"
        try:
            named = type(e)(message)
        except Exception:  # an error type that takes other arguments: raised as it was
            raise e from None
        raise named from e


class H5MultiDataset(BatchLoading, Dataset[tuple[Any, Any]]):
    """Several h5forge assets as one map-style Dataset: images and labels, one global index.

    Args:
        sources: a list of assets (URLs, ``(url, version)`` pairs, or dicts with ``url`` and
            optionally ``version`` and ``weight``), or the URL (a string or path) of an
            asset list (JSON); see :mod:`h5forge.read.asset_list` for the format and its limits.
        split: only samples of this split, in every asset (each must have it).
        subset: ``None`` for all samples; a list of indices (into the concatenation, after
            ``split``; kept in the given order); or a fraction in (0, 1]: that share of the
            samples, picked at random with ``seed`` and kept in concatenation order.
        seed: the seed of a fractional ``subset``.
        remap: when the assets' class sets differ, build their union (order of first
            appearance) and renumber the labels of the assets that need it, instead of
            refusing. ``classes`` and ``class_to_idx`` always state the mapping used.
        target: as for :class:`~h5forge.read.dataset.H5ImageDataset` (``"class"``, a column,
            a kind or a list; ``multilabel``, ``iscrowd`` too): other than ``"class"``, all
            assets must have the same target columns; batches are read sample by sample.
        transform: applied to each ``uint8`` C x H x W tensor.
        target_transform: applied to each label (after any remap), or target.
        storage_options, verify_reads, max_pixels: as for
            :class:`~h5forge.read.dataset.H5ImageDataset`, for every asset.
        options: the reading keywords above (``split``, ``target``, ``multilabel``,
            ``iscrowd``, ``transform``, ``target_transform``, ``verify_reads``, ``max_pixels``)
            as one :class:`~h5forge.read.options.ReadOptions`, instead of those keywords;
            its ``transforms``, ``cache_dir`` and ``cache_limit`` must be left unset.

    Raises:
        ValueError: a malformed list, asset list file or subset; a missing split; class
            sets that disagree (naming both assets) without ``remap``; target columns that
            differ; ``options`` with other reading keywords, or with what this class does not
            take.
        FileNotFoundError, IntegrityError: as an asset's H5ImageDataset raises them.

    Attributes:
        sources: the :class:`~h5forge.read.asset_list.AssetSource` of each asset.
        datasets: each asset's H5ImageDataset (versions pinned once, here).
        options: the :class:`~h5forge.read.options.ReadOptions` it reads with; each asset's
            dataset reads with the same, less ``target_transform`` (applied here, after any
            remap).
        cumulative_sizes: the running total of the assets' lengths (as ConcatDataset's).
        classes, class_to_idx: the union mapping that every label refers to.
    """

    def __init__(
        self,
        sources: Sequence[object] | str | os.PathLike[str],
        *,
        split: str | None = None,
        subset: Sequence[int] | float | None = None,
        seed: int = 0,
        remap: bool = False,
        target: str | Sequence[str] = CLASS,
        multilabel: str = "multihot",
        iscrowd: bool = False,
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        verify_reads: bool = False,
        max_pixels: int = DEFAULT_MAX_PIXELS,
        options: ReadOptions | None = None,
    ) -> None:
        given = ReadOptions(
            split=split,
            target=target,
            multilabel=multilabel,
            iscrowd=iscrowd,
            transform=transform,
            target_transform=target_transform,
            verify_reads=verify_reads,
            max_pixels=max_pixels,
        )
        self.options = pick_options(options, given)
        if self.options.transforms is not None or self.options.cache_dir is not None:
            raise ValueError(
                f"options has transforms={self.options.transforms!r:.100}, cache_dir="
                f"{self.options.cache_dir!r:.100}: H5MultiDataset takes neither (its "
                "target_transform runs after the labels are remapped); leave both unset"
            )
        if isinstance(subset, float) and not 0.0 < subset <= 1.0:
            raise ValueError(f"subset={subset!r}: give a fraction in (0, 1]")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={shown(seed)} must be an int >= 0")
        list_name = ""  # the asset list's, for messages about its entries
        if isinstance(sources, (str, os.PathLike, Location)):
            listed = Location.of(sources, storage_options)
            storage_options = dict(listed.options)
            self.name = list_name = str(listed)
            found = read_asset_list(listed)
        else:
            found = parse_sources(sources)
            self.name = f"{len(found)} assets ({redact_url(found[0].url)}, ...)"
        self.sources: list[AssetSource] = found
        self._handles: _Handles | None = None
        self._orphans: list[_Handles] = []
        each = dataclasses.replace(self.options, target_transform=None)
        self.datasets = [
            _open_entry(list_name, k, Location(s.url, storage_options), s.version, each)
            for k, s in enumerate(found)
        ]
        self.classes, self._maps = union_classes(
            [(d.url, d.classes) for d in self.datasets], remap=remap
        )
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        if self.options.target != CLASS:
            check_same_targets([(d.url, d.schema) for d in self.datasets])
        self._sizes = np.array([len(d) for d in self.datasets], dtype=np.int64)
        self.cumulative_sizes = np.cumsum(self._sizes)
        self._starts = self.cumulative_sizes - self._sizes
        total = int(self.cumulative_sizes[-1])
        self._picks = None if subset is None else select_subset(subset, total, seed=seed)

    # --- where an index lives ----------------------------------------------------------------
    def __len__(self) -> int:
        return int(self.cumulative_sizes[-1]) if self._picks is None else len(self._picks)

    def locate(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(asset number, index within that asset's dataset)`` of each of ``indices``.

        Raises:
            IndexError: an index is out of range (negative ones count from the end).
        """
        n = len(self)
        asked = np.asarray(indices, dtype=np.int64).reshape(-1)
        where = np.where(asked < 0, asked + n, asked)
        outside = (where < 0) | (where >= n)
        if outside.any():
            raise IndexError(
                f"index {int(asked[np.flatnonzero(outside)[0]])} out of range for {n} samples"
            )
        flat = where if self._picks is None else self._picks[where]
        asset = np.searchsorted(self.cumulative_sizes, flat, side="right")
        return asset, flat - self._starts[asset]

    def indices_of(self, asset: int) -> np.ndarray:
        """This dataset's indices whose samples come from asset number ``asset``."""
        end = int(self.cumulative_sizes[asset])
        start = end - int(self._sizes[asset])
        if self._picks is None:
            return np.arange(start, end, dtype=np.int64)
        return np.flatnonzero((self._picks >= start) & (self._picks < end)).astype(np.int64)

    @property
    def targets(self) -> list[int]:
        """Label of every sample (in the union mapping), like torchvision's ImageFolder."""
        parts = [np.asarray(d.targets, dtype=np.int64) for d in self.datasets]
        parts = [p if m is None else m[p] for p, m in zip(parts, self._maps, strict=True)]
        labels = np.concatenate(parts)
        return (labels if self._picks is None else labels[self._picks]).tolist()

    # --- pickling and per-process handles -----------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_handles", "_orphans")}

    def _before_fork(self) -> None:
        """Each sharded asset's local shards checked here once, before ``loader()``'s
        workers fork, so that they inherit the checks."""
        for d in self.datasets:
            d._before_fork()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handles, self._orphans = None, []

    def _state(self, a: int) -> tuple[ProcessState, np.ndarray, tuple[int, ...] | None]:
        """This process's state of asset ``a``, the file rows of its dataset indices, and its
        image shape when its samples are fixed-size, decoded and unfiltered (else None)."""
        h = self._handles
        if h is None or h.pid != os.getpid():
            if h is not None:  # inherited through fork: never use or close the parent's
                self._orphans.append(h)
            h = self._handles = _Handles(int(self.cumulative_sizes[-1]))
        if a not in h.states:  # opened on first use, in the process that reads
            d, split = self.datasets[a], self.options.split
            st = open_state(Location(d.url, d.storage_options), d.options, d.version)
            idx = st.index
            rows = np.arange(idx.header.num_samples)
            if split is not None:
                code = idx.split_names.index(split) if split in idx.split_names else -1
                rows = np.flatnonzero(idx.split_codes == code)
            if len(rows) != self._sizes[a]:
                st.close()
                raise IntegrityError(
                    f"{d.url} has {len(rows)} samples (split {split!r}) now, "
                    f"{self._sizes[a]} when the dataset was opened: it was replaced; open "
                    "the dataset again, or pin a version"
                )
            fixed = idx.header.storage == "array" and not idx.filtered
            h.states[a] = (st, rows, idx.image_shape if fixed else None)
            at = slice(int(self._starts[a]), int(self.cumulative_sizes[a]))
            h.ranges[at] = idx.byte_ranges[rows]
            lut = self._maps[a]
            h.labels[at] = idx.labels[rows] if lut is None else lut[idx.labels[rows]]
        return h.states[a]

    def _sharded(self, a: int) -> ShardedVersion | None:
        """Asset ``a``'s sharded version (its dataset's, opened in this process), or None."""
        d = self.datasets[a]
        return d._shards() if is_manifest(d.url) else None

    def _read_direct(self, asset: np.ndarray, local: np.ndarray, *, slot: bool) -> Any:
        """The batch read straight into one :class:`~h5forge.read.batches.Batch`; None when
        a transform is set or an asset's samples are not fixed-size, decoded and unfiltered."""
        o = self.options
        if o.transform is not None or o.target_transform is not None or o.target != CLASS:
            return None
        order = np.argsort(asset, kind="stable")  # positions grouped by asset, in batch order
        cuts = np.flatnonzero(np.diff(asset[order])) + 1
        groups = [g.tolist() for g in np.split(order, cuts) if len(g)]
        # A sharded asset reads its own share (its shards' samples and labels); a file, here.
        sharded = [self._sharded(int(asset[g[0]])) for g in groups]
        states = [
            None if v is not None else self._state(int(asset[g[0]]))
            for g, v in zip(groups, sharded, strict=True)
        ]
        shapes: set[tuple[int, ...] | None] = set()
        for g, v, one in zip(groups, sharded, states, strict=True):
            if v is not None:
                shapes |= v.shapes(local[g])
            elif one is not None:
                shapes.add(one[2])
        if not groups:  # an empty batch: asset 0's shape
            v0 = self._sharded(0)
            shapes = v0.shapes(local) if v0 is not None else {self._state(0)[2]}
        hwc = shapes.pop() if len(shapes) == 1 else None
        if hwc is None:
            return None
        in_worker = get_worker_info() is not None
        batch = _batches.Batch(len(asset), hwc, slot=slot and in_worker, shared=in_worker)
        try:
            flat = local + self._starts[asset]
            view = memoryview(batch.flat.numpy()).cast("B")  # type: ignore[arg-type]
            size = int(math.prod(hwc))
            bufs = [view[p * size : (p + 1) * size] for p in range(len(asset))]
            labels = batch.labels.numpy()
            for g, v, state in zip(groups, sharded, states, strict=True):
                mine = [bufs[p] for p in g]
                if v is not None:
                    found = v.fill(local[g], mine)
                    lut = self._maps[int(asset[g[0]])]
                    labels[g] = found if lut is None else lut[found]
                    continue
                assert state is not None
                assert self._handles is not None
                st, file_rows, _ = state
                assert st.reader is not None
                st.reader.read_into(self._handles.ranges[flat[g]].tolist(), mine)
                if st.digests is not None:
                    st.check(mine, file_rows[local[g]].tolist())
                labels[g] = self._handles.labels[flat[g]]
        except BaseException:
            batch.release()
            raise
        return batch.result()

    # --- torch Dataset protocol --------------------------------------------------------------
    def __getitem__(self, i: int) -> tuple[Any, Any]:
        image, target = self.__getitems__([i])[0]
        return plain(image), target

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        asset, local = self.locate(indices)
        out: list[Any] = [None] * len(asset)
        for a in np.unique(asset).tolist():
            at = np.flatnonzero(asset == a)
            lut = self._maps[a]
            items = self.datasets[a].__getitems__(local[at].tolist())
            for p, (image, label) in zip(at.tolist(), items, strict=True):
                if lut is not None and isinstance(label, dict) and CLASS in label:
                    label = {**label, CLASS: int(lut[label[CLASS]])}
                elif lut is not None and self.options.target == CLASS:
                    label = int(lut[label])
                if self.options.target_transform is not None:
                    label = self.options.target_transform(label)
                out[p] = (image, label)
        return out

    def read_batch(self, indices: Sequence[int]) -> tuple[Any, Any]:
        """A whole batch at once, ``(images, labels)``, in the order of ``indices``.

        As :meth:`H5ImageDataset.read_batch <h5forge.read.dataset.H5ImageDataset.read_batch>`:
        fixed-size decoded assets without transforms give one ``B x C x H x W`` uint8 tensor
        in ``torch.channels_last`` memory, read in place (each asset's samples with one
        ``read_into``); anything else is read by each asset's ``__getitems__`` and stacked by
        torch's ``default_collate``. Labels are int64, in :attr:`classes`' numbering.
        """
        return self._read_batch(indices, use_slots=False)

    def _read_batch(self, indices: Sequence[int], *, use_slots: bool) -> Any:
        asset, local = self.locate(indices)
        direct = self._read_direct(asset, local, slot=use_slots)
        if direct is not None:
            return direct
        slot = use_slots and get_worker_info() is not None
        if self.options.target != CLASS:  # batched alike by every asset (the same columns)
            return self.datasets[0].collate(self.__getitems__(indices))
        return _collate.collate(self.__getitems__(indices), slot=slot, url=self.name)
