"""Baseline Datasets of the read benchmarks (module level, so every worker start method works)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

SIDE = 224


def resize_crop(im: Image.Image, side: int = SIDE) -> Image.Image:
    """torchvision's ``Resize(side)`` + ``CenterCrop(side)`` on a PIL image (bilinear)."""
    w, h = im.size
    nw, nh = (side, int(side * h / w)) if w <= h else (int(side * w / h), side)
    im = im.resize((nw, nh), Image.Resampling.BILINEAR)
    left, top = int(round((nw - side) / 2.0)), int(round((nh - side) / 2.0))
    return im.crop((left, top, left + side, top + side))


def _chw(arr: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(arr).permute(2, 0, 1)


class JpegFolder(Dataset[tuple[torch.Tensor, int]]):
    """The usual recipe: open each JPEG, decode, resize and crop to 224 in ``__getitem__``."""

    def __init__(self, files: Sequence[Path], labels: Sequence[int]) -> None:
        self.files, self.labels = [str(f) for f in files], list(labels)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as im:
            arr = np.array(resize_crop(im.convert("RGB")))
        return _chw(arr), self.labels[i]


class Memmap(Dataset[tuple[torch.Tensor, int]]):
    """An ``(N, H, W, C)`` uint8 ``.npy`` file, memory-mapped per process, read a batch at once."""

    def __init__(self, path: Path, labels: np.ndarray) -> None:
        self.path, self.labels = str(path), labels
        self._array: np.ndarray | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path, "labels": self.labels, "_array": None}

    def __len__(self) -> int:
        return len(self.labels)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r")
        idx = np.asarray(indices)
        order = np.argsort(idx)
        batch = self._array[idx[order]]  # one sorted fancy read: a copy out of the page cache
        out: list[tuple[torch.Tensor, int]] = [None] * len(idx)  # type: ignore[list-item]
        for k, o in enumerate(order):
            out[o] = (_chw(batch[k]), int(self.labels[idx[o]]))
        return out

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([i])[0]


class MemmapBatches(Memmap):
    """:class:`Memmap` read a whole batch per call, the way ``H5ImageDataset.loader`` reads:
    indexed by a list of indices (automatic batching off), the batch gathered with one sorted
    ``np.take`` straight into a shared-memory tensor, handed over as N x C x H x W
    channels-last with an int64 label tensor. The same DataLoader mode as h5forge's fast path,
    so the two compare storage and reader, not collation."""

    def __getitem__(self, indices: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        from torch.utils.data import get_worker_info

        if self._array is None:
            self._array = np.load(self.path, mmap_mode="r")
        idx = np.sort(np.asarray(indices))
        shape = (len(idx), *self._array.shape[1:])
        nbytes = int(np.prod(shape))
        if get_worker_info() is not None:
            out = torch.empty(0, dtype=torch.uint8).set_(torch.UntypedStorage._new_shared(nbytes))  # type: ignore[attr-defined]
        else:
            out = torch.empty(nbytes, dtype=torch.uint8)
        pixels = out.view(shape)
        np.take(self._array, idx, axis=0, out=pixels.numpy())
        return pixels.permute(0, 3, 1, 2), torch.from_numpy(self.labels[idx].astype(np.int64))


class ResizeCrop:
    """A transform for :class:`h5forge.H5ImageDataset` over encoded images: uint8 C x H x W in,
    the same Pillow resize + centre crop as :class:`JpegFolder` out."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        im = Image.fromarray(image.permute(1, 2, 0).numpy())
        return _chw(np.array(resize_crop(im)))


class H5pyOverFsspec(Dataset[tuple[torch.Tensor, int]]):
    """The common remote recipe: ``h5py.File(fs.open(url))`` with fsspec's default cache,
    opened lazily per worker, one ``images[i]`` per item."""

    def __init__(self, url: str, storage_options: dict[str, Any], n: int) -> None:
        self.url, self.storage_options, self.n = url, storage_options, n
        self._h5: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"url": self.url, "storage_options": self.storage_options, "n": self.n, "_h5": None}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        if self._h5 is None:
            import fsspec
            import h5py

            fs, path = fsspec.core.url_to_fs(self.url, **self.storage_options)
            self._h5 = h5py.File(fs.open(path, "rb"), "r")
        return _chw(self._h5["images"][i]), int(self._h5["labels"][i])


class Constant(Dataset[tuple[torch.Tensor, int]]):
    """A control: batches of the right shape from nowhere (what a worker costs by itself)."""

    def __init__(self, n: int, shape: tuple[int, int, int]) -> None:
        self.n, self.shape = n, shape
        self._zeros: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.n

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        if self._zeros is None:  # one sample, allocated once per process
            self._zeros = torch.zeros(self.shape, dtype=torch.uint8)
        return [(self._zeros, 0) for _ in indices]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return self.__getitems__([i])[0]


def resize_crop_tensor(image: torch.Tensor, side: int = SIDE) -> torch.Tensor:
    """``Resize(side)`` + ``CenterCrop(side)`` on a uint8 C x H x W tensor, as torchvision's
    v2 transforms do it: antialiased bilinear on uint8 (same pixels as Pillow's, +-1)."""
    h, w = image.shape[1:]
    nw, nh = (side, int(side * h / w)) if w <= h else (int(side * w / h), side)
    x = image.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    x = torch.nn.functional.interpolate(
        x, size=(nh, nw), mode="bilinear", antialias=True, align_corners=False
    )
    left, top = int(round((nw - side) / 2.0)), int(round((nh - side) / 2.0))
    return x[0, :, top : top + side, left : left + side]


class TensorResizeCrop:
    """:func:`resize_crop_tensor` as a transform object (picklable)."""

    def __call__(self, image: torch.Tensor) -> torch.Tensor:
        return resize_crop_tensor(image)


class JpegFolderTensor(JpegFolder):
    """The folder recipe yielding tensors: decode, then the same tensor transform as h5forge's
    Dataset gets (only the storage differs)."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        with Image.open(self.files[i]) as im:
            arr = np.array(im.convert("RGB"))
        return resize_crop_tensor(_chw(arr)), self.labels[i]


class PlainImages(Dataset[tuple[torch.Tensor, Any]]):
    """An ``H5ImageDataset`` whose ``__getitems__`` hands out plain tensors: what
    ``default_collate`` makes of its batches with torch's own stack, into new shared memory
    (h5forge's images otherwise go into a worker's reused slot, :mod:`h5forge.read.stacked`)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, Any]]:
        return [
            (image.as_subclass(torch.Tensor), y) for image, y in self.dataset.__getitems__(indices)
        ]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, Any]:
        return self.__getitems__([i])[0]
