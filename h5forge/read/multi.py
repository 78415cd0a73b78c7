"""``H5MultiDataset``: several h5forge assets read as one map-style Dataset, and their mixing.

Each asset is an :class:`~h5forge.read.dataset.H5ImageDataset` (opened lazily per process,
pickled as its arguments), so DataLoader workers under fork and spawn read them as they read one.
Index ``i`` of the whole is found by bisecting the assets' cumulative lengths (after ``split``,
applied to every asset), then through the ``subset`` when one is given. A batch is read by
grouping its indices by asset, one ``__getitems__`` per asset, and putting the samples back in
the batch's order.

:class:`h5forge.read.mixing.MixingSampler` draws the assets in fixed proportions instead.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from h5forge.preprocess.config import DEFAULT_MAX_PIXELS
from h5forge.read import batches as _batches
from h5forge.read.asset_list import AssetSource, parse_sources, read_asset_manifest
from h5forge.read.dataset import H5ImageDataset
from h5forge.read.loader import batch_loader
from h5forge.redact import redact_url

__all__ = ["H5MultiDataset", "union_classes"]


def union_classes(
    assets: Sequence[tuple[str, Sequence[str]]], *, remap: bool
) -> tuple[list[str], list[np.ndarray | None]]:
    """One class list for several assets, and each asset's label map (None: unchanged).

    Without ``remap`` the assets must agree: a class name has one index in every asset that has
    it, and an index one name; the union is the longest list (the others are its prefixes).
    With ``remap`` the union lists the classes in order of first appearance (asset by asset), so
    the first asset keeps its labels, and every asset whose labels change gets a map.

    Raises:
        ValueError: (without ``remap``) two assets disagree on a class index; names both.
    """
    name_at: dict[int, tuple[str, str]] = {}  # index -> (name, first asset with it)
    index_of: dict[str, tuple[int, str]] = {}  # name -> (index, first asset with it)
    order: list[str] = []
    for url, classes in assets:
        for i, name in enumerate(classes):
            if name not in index_of:
                index_of[name] = (i, url)
                order.append(name)
            if remap:
                continue
            j, first = index_of[name]
            if j != i:
                _disagree(f"class {name!r} is {j} in {first} but {i} in {url}")
            other, first = name_at.setdefault(i, (name, url))
            if other != name:
                _disagree(f"class index {i} is {other!r} in {first} but {name!r} in {url}")
    if not remap:
        return [name_at[i][0] for i in range(len(name_at))], [None] * len(assets)
    pos = {name: k for k, name in enumerate(order)}
    maps: list[np.ndarray | None] = []
    for _, classes in assets:
        lut = np.array([pos[c] for c in classes], dtype=np.int64)
        maps.append(None if np.array_equal(lut, np.arange(len(lut))) else lut)
    return order, maps


def _disagree(what: str) -> None:
    raise ValueError(
        f"{what}: the assets disagree on their class sets; pack them with the same classes, "
        "or pass remap=True to build the union (labels renumbered, see .classes)"
    )


class H5MultiDataset(Dataset[tuple[Any, Any]]):
    """Several h5forge assets as one map-style Dataset: images and labels, one global index.

    Args:
        sources: a list of assets (URLs, ``(url, version)`` pairs, or dicts with ``url`` and
            optionally ``version`` and ``weight``), or the URL (a string or path) of a shard
            manifest; see :mod:`h5forge.read.asset_list` for the format and its limits.
        split: only samples of this split, in every asset (each must have it).
        subset: ``None`` for all samples; a list of indices (into the concatenation, after
            ``split``; kept in the given order); or a fraction in (0, 1]: that share of the
            samples, picked at random with ``seed`` and kept in concatenation order.
        seed: the seed of a fractional ``subset``.
        remap: when the assets' class sets differ, build their union (order of first
            appearance) and renumber the labels of the assets that need it, instead of
            refusing. ``classes`` and ``class_to_idx`` always state the mapping used.
        transform: applied to each ``uint8`` C x H x W tensor.
        target_transform: applied to each label (after any remap).
        storage_options, verify_reads, max_pixels: as for
            :class:`~h5forge.read.dataset.H5ImageDataset`, for every asset.

    Raises:
        ValueError: a malformed list, manifest or subset; a missing split; class sets that
            disagree (the message names both assets) without ``remap``.
        FileNotFoundError, IntegrityError: as an asset's H5ImageDataset raises them.

    Attributes:
        sources: the :class:`~h5forge.read.asset_list.AssetSource` of each asset.
        datasets: each asset's H5ImageDataset (versions pinned once, here).
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
        transform: Callable[[Any], Any] | None = None,
        target_transform: Callable[[Any], Any] | None = None,
        storage_options: dict[str, Any] | None = None,
        verify_reads: bool = False,
        max_pixels: int = DEFAULT_MAX_PIXELS,
    ) -> None:
        if isinstance(subset, float) and not 0.0 < subset <= 1.0:
            raise ValueError(f"subset={subset!r}: a fraction must be in (0, 1]")
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed={seed!r} must be an int >= 0")
        if isinstance(sources, (str, os.PathLike)):
            self.name = redact_url(os.fspath(sources))
            found = read_asset_manifest(os.fspath(sources), storage_options=storage_options)
        else:
            found = parse_sources(sources)
            self.name = f"{len(found)} assets ({redact_url(found[0].url)}, ...)"
        self.sources: list[AssetSource] = found
        self.target_transform = target_transform
        self.datasets = [
            H5ImageDataset(
                s.url,
                version=s.version,
                split=split,
                transform=transform,
                storage_options=storage_options,
                verify_reads=verify_reads,
                max_pixels=max_pixels,
            )
            for s in found
        ]
        self.classes, self._maps = union_classes(
            [(d.url, d.classes) for d in self.datasets], remap=remap
        )
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.cumulative_sizes = np.cumsum([len(d) for d in self.datasets], dtype=np.int64)
        self._picks = None if subset is None else self._subset(subset, seed)

    def _subset(self, subset: Sequence[int] | float, seed: int) -> np.ndarray:
        total = int(self.cumulative_sizes[-1])
        if isinstance(subset, float):
            k = round(subset * total)
            if k == 0:
                raise ValueError(f"subset={subset!r} of {total} samples selects none")
            rng = np.random.default_rng(seed)
            return np.sort(rng.choice(total, size=k, replace=False)).astype(np.int64)
        if isinstance(subset, (str, bytes)) or not isinstance(subset, Sequence | np.ndarray):
            raise ValueError(
                f"subset must be None, a fraction or a list of indices, not {subset!r:.80}"
            )
        picks = np.asarray(subset)
        if picks.ndim != 1 or (picks.size and picks.dtype.kind not in "iu"):
            raise ValueError(f"subset must be a flat list of integer indices, not {subset!r:.80}")
        picks = picks.astype(np.int64)
        outside = (picks < 0) | (picks >= total)
        if outside.any():
            bad = int(picks[np.flatnonzero(outside)[0]])
            raise ValueError(
                f"subset index {bad} out of range for {total} samples (0..{total - 1})"
            )
        return picks

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
        starts = self.cumulative_sizes - [len(d) for d in self.datasets]
        return asset, flat - starts[asset]

    def indices_of(self, asset: int) -> np.ndarray:
        """This dataset's indices whose samples come from asset number ``asset``."""
        end = int(self.cumulative_sizes[asset])
        start = end - len(self.datasets[asset])
        if self._picks is None:
            return np.arange(start, end, dtype=np.int64)
        return np.flatnonzero((self._picks >= start) & (self._picks < end)).astype(np.int64)

    @property
    def targets(self) -> list[int]:
        """Label of every sample (in the union mapping), like torchvision's ImageFolder."""
        parts = []
        for d, lut in zip(self.datasets, self._maps, strict=True):
            labels = np.asarray(d.targets, dtype=np.int64)
            parts.append(labels if lut is None else lut[labels])
        labels = np.concatenate(parts)
        return (labels if self._picks is None else labels[self._picks]).tolist()

    # --- torch Dataset protocol --------------------------------------------------------------
    def __getitem__(self, i: int) -> tuple[Any, Any]:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[Any, Any]]:
        asset, local = self.locate(indices)
        out: list[Any] = [None] * len(asset)
        for a in np.unique(asset).tolist():
            at = np.flatnonzero(asset == a)
            lut = self._maps[a]
            items = self.datasets[a].__getitems__(local[at].tolist())
            for p, (image, label) in zip(at.tolist(), items, strict=True):
                if lut is not None:
                    label = int(lut[label])
                if self.target_transform is not None:
                    label = self.target_transform(label)
                out[p] = (image, label)
        return out

    def read_batch(self, indices: Sequence[int]) -> tuple[Any, Any]:
        """A whole batch at once, ``(images, labels)``, in the order of ``indices``.

        Each asset's samples are read with one ``__getitems__`` (its coalesced reads) and
        stacked as torch's ``default_collate`` would (an ``N x C x H x W`` uint8 tensor and
        int64 labels). See :meth:`loader`, whose workers stack into reusable shared memory.
        """
        return self._read_batch(indices, use_slots=False)

    def _read_batch(self, indices: Sequence[int], *, use_slots: bool) -> Any:
        from torch.utils.data import get_worker_info

        slot = use_slots and get_worker_info() is not None
        return _batches.collate(self.__getitems__(indices), slot=slot, url=self.name)

    def loader(
        self,
        batch_size: int = 64,
        *,
        shuffle: bool = False,
        sampler: Iterable[int] | None = None,
        drop_last: bool = False,
        generator: torch.Generator | None = None,
        **dataloader_kwargs: Any,
    ) -> DataLoader[Any]:
        """A DataLoader that reads each batch with one :meth:`read_batch` call, as
        :meth:`H5ImageDataset.loader <h5forge.read.dataset.H5ImageDataset.loader>` does (same
        arguments). For mixing pass
        ``sampler=MixingSampler(ds, ...)`` (:mod:`h5forge.read.mixing`)."""
        return batch_loader(
            self,
            functools.partial(self._read_batch, use_slots=True),
            batch_size,
            shuffle=shuffle,
            sampler=sampler,
            drop_last=drop_last,
            generator=generator,
            **dataloader_kwargs,
        )
