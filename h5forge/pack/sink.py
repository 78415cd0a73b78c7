"""Where a pack's processed samples go, in order: chunk by chunk, or spooled for the blob.

Array storage (decoded pixels of one size) writes each sample as one chunk of ``/images`` as
it arrives. Blob storage (encoded bytes, or ``resize='none'``) spools the bytes, since
``/images`` can only be created once the packed count and sizes are known, and copies them
behind the head at the end.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.chunks import chunk_ranges
from h5forge.discover.catalog import Catalog
from h5forge.output_lock import OutputLock
from h5forge.pack.bar import PackProgress
from h5forge.pack.config import PackConfig
from h5forge.preprocess.images import Processed, Quarantined

__all__ = ["Sink"]

_COPY_BLOCK = 16 << 20


class Sink:
    """Receives processed samples in order: array storage writes each as one chunk at once,
    blob storage spools the bytes and copies them behind the head when the count is known.

    Args:
        config: the pack's configuration (its storage).
        filters: ``config.filter_kwargs()``, asked for before any work (a missing plugin
            fails the pack up front).
        spool_path: the blob spool, created exclusively through ``lock`` (blob storage only).
        lock: the held output lock, which records the spool as this run's.
    """

    def __init__(
        self, config: PackConfig, filters: dict[str, Any], spool_path: str, lock: OutputLock
    ) -> None:
        image = config.image
        self.storage: fmt.Storage = "array" if config.fixed_size else "blob"
        self.filters = filters
        self.digests: list[bytes] = []
        self.shapes: list[tuple[int, int, int]] = []
        self.lengths: list[int] = []
        self.images: h5py.Dataset | None = None
        self._spool = None
        self._direct = not self.filters
        if self.storage == "array":
            assert image.size is not None
            self._shape = (*image.size, 1 if image.mode == "L" else 3)
        else:
            # PackConfig refuses filters on blob storage: each sample stays one byte range.
            assert not self.filters, "blob storage is never filtered"
            # Read back in finish() through this same handle, never reopened by name.
            self._spool = os.fdopen(lock.create(spool_path, 0o600, flags=os.O_RDWR), "w+b")

    def close(self) -> None:
        """Close the spool (its file is removed with the lock's other partial files)."""
        if self._spool is not None:
            self._spool.close()

    def images_kwargs(self, total: int) -> dict[str, Any]:
        """``create_dataset`` arguments of ``/images`` (blob: after every sample was added)."""
        if self.storage == "array":
            return {
                "shape": (total, *self._shape),
                "maxshape": (None, *self._shape),
                "dtype": np.uint8,
                "chunks": (1, *self._shape),
                **self.filters,
            }
        return {"shape": (sum(self.lengths),), "dtype": np.uint8}

    def drain(
        self, results: Iterator[Processed | Quarantined], catalog: Catalog, bar: PackProgress
    ) -> tuple[list[int], list[tuple[str, str]]]:
        """Store every processed sample of ``results`` (in catalog order), advancing ``bar``.

        Returns:
            The catalog indices of the stored samples, and ``(relative path, reason)`` of each
            quarantined input.
        """
        kept: list[int] = []
        bad: list[tuple[str, str]] = []
        for done, r in enumerate(results, start=1):
            if isinstance(r, Quarantined):
                bad.append((catalog.samples[r.index].relpath, r.reason))
            else:
                self.add(r)
                kept.append(r.index)
            bar.advance(done)
        return kept, bad

    def add(self, r: Processed) -> None:
        """Store one processed sample (the next in order)."""
        j = len(self.digests)
        if self.storage == "array":
            assert self.images is not None
            if tuple(r.shape) != self._shape:
                raise AssertionError(f"sample {r.index}: shape {r.shape} != {self._shape}")
            if self._direct:
                self.images.id.write_direct_chunk((j, 0, 0, 0), r.data)
            else:
                self.images[j] = np.frombuffer(r.data, np.uint8).reshape(self._shape)
        else:
            assert self._spool is not None
            self._spool.write(r.data)
        self.digests.append(r.digest)
        self.shapes.append(tuple(r.shape))  # type: ignore[arg-type]
        self.lengths.append(len(r.data))

    def finish(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Lay out the image bytes for good; return ``byte_ranges`` and (blob) ``offsets``."""
        n = len(self.digests)
        images = self.images
        assert images is not None
        if self.storage == "array":
            images.resize(n, axis=0)
            ranges = chunk_ranges(images, n)
            assert (ranges >= 0).all(), "every sample was written as one chunk"
            return ranges.astype(np.uint64), None
        assert self._spool is not None
        offsets = np.zeros(n + 1, np.uint64)
        np.cumsum(np.asarray(self.lengths, np.uint64), out=offsets[1:])
        with self._spool as f:
            f.flush()
            f.seek(0)
            pos = 0
            while block := f.read(_COPY_BLOCK):
                images[pos : pos + len(block)] = np.frombuffer(block, np.uint8)
                pos += len(block)
        base = images.id.get_offset() or 0
        return np.stack([offsets[:-1] + np.uint64(base), np.diff(offsets)], axis=1), offsets
