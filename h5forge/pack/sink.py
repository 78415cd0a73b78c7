"""Where a pack's processed samples go, in order: chunk by chunk, or spooled for the blob.

Array storage (decoded pixels of one size) writes each sample as one chunk of ``/images`` as
it arrives; unfiltered chunks are allocated when ``/images`` is created, so the chunks of
consecutive samples are written together, in large writes (:mod:`h5forge.pack.chunk_writes`),
and the runs of chunks an incremental pack reuses are copied into them file to file
(:mod:`h5forge.asset.stored_copy`).
Blob storage (encoded bytes, or ``resize='none'``) spools the bytes of the samples it
preprocesses, since ``/images`` can only be created once the packed count and sizes are known,
and copies them behind the head at the end, in the kernel (``copy_file_range``). The runs an
incremental pack reuses never go through the spool: they are recorded where they will lie, and
copied at the end straight from the previous file, so a reused byte is written once.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.chunks import chunk_ranges
from h5forge.asset.placement import early_allocation
from h5forge.asset.range_copy import RangeCopy
from h5forge.asset.stored_copy import StoredCopy, StoredRun
from h5forge.discover.catalog import Catalog
from h5forge.errors import IntegrityError
from h5forge.output_lock import OutputLock
from h5forge.pack.bar import PackProgress
from h5forge.pack.carried import CarriedRun
from h5forge.pack.chunk_writes import ChunkWriter
from h5forge.pack.config import PackConfig
from h5forge.pack.targets import PackTargets
from h5forge.preprocess.images import Processed, Quarantined

__all__ = ["CopiedMismatch", "Sink"]


class CopiedMismatch(IntegrityError):
    """Copied samples whose bytes in the new file do not match the previous ``/digests``; the
    writer packs again, preprocessing them (:attr:`paths`, their relative paths)."""

    def __init__(self, message: str, paths: frozenset[str]) -> None:
        super().__init__(message, sorted(paths)[:100])
        self.paths = paths


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
        self._copies: StoredCopy | None = None
        self._dst: np.ndarray | None = None  # file offset of every chunk, allocated at creation
        self._writer: ChunkWriter | None = None  # consecutive chunks, written together
        self._copied: list[bool] = []  # per row: taken from the previous version
        self._checked: list[bool] = []  # per row: its check from the new file is under way
        # Blob: what finish() copies behind the head, in order: ("spool", spool offset, blob
        # offset, bytes) or ("run", StoredRun on a descriptor of its own, blob offset).
        self._plan: list[tuple[Any, ...]] = []
        self._spooled = 0  # bytes written to the spool
        self._stored = 0  # bytes of every sample so far: the next one's blob offset
        self._held: dict[int, int] = {}  # a previous file's descriptor -> our duplicate of it
        if self.storage == "array":
            assert image.size is not None
            self._shape = (*image.size, 1 if image.mode == "L" else 3)
        else:
            # PackConfig refuses filters on blob storage: each sample stays one byte range.
            assert not self.filters, "blob storage is never filtered"
            # Read back in finish() through this same handle, never reopened by name.
            self._spool = os.fdopen(lock.create(spool_path, 0o600, flags=os.O_RDWR), "w+b")

    def close(self) -> None:
        """Close the spool (its file is removed with the lock's other partial files) and join
        the checks of copied chunks."""
        if self._spool is not None:
            self._spool.close()
        if self._copies is not None:
            self._copies.close()
        for fd in self._held.values():
            os.close(fd)
        self._held.clear()

    @property
    def copying(self) -> bool:
        """Whether :meth:`copy_into` was called (then :meth:`check_written` must be)."""
        return self._copies is not None

    def copy_into(self, path: str) -> None:
        """Take :class:`StoredRun` samples from now on (unfiltered storage; array: once
        ``/images`` exists): they are copied file to file, and every sample is checked from
        ``path``, the file being packed, by :meth:`check_written`."""
        assert self._direct, "unfiltered storage"
        if self.storage == "array":
            self._chunks()
        self._copies = StoredCopy(path)

    def images_kwargs(self, total: int) -> dict[str, Any]:
        """``create_dataset`` arguments of ``/images`` (blob: after every sample was added)."""
        if self.storage == "array":
            return {
                "shape": (total, *self._shape),
                "maxshape": (None, *self._shape),
                "dtype": np.uint8,
                "chunks": (1, *self._shape),
                **self.filters,
                # Unfiltered chunks lie where they will stay from the start (in order, after
                # the head): reused ones are copied into them file to file.
                **({} if self.filters else {"dcpl": early_allocation(False)}),
            }
        return {"shape": (sum(self.lengths),), "dtype": np.uint8}

    def drain(
        self,
        results: Iterator[Processed | Quarantined | StoredRun],
        catalog: Catalog,
        bar: PackProgress,
        targets: PackTargets | None = None,
    ) -> tuple[list[int], list[tuple[str, str]]]:
        """Store every processed sample of ``results`` (in catalog order), advancing ``bar``;
        with ``targets``, each sample's target values into it (a run's are carried with it).

        Returns:
            The catalog indices of the stored samples, and ``(relative path, reason)`` of each
            quarantined input.
        """
        kept: list[int] = []
        bad: list[tuple[str, str]] = []
        done = 0
        for r in results:
            if isinstance(r, StoredRun):
                if targets is not None:  # carried from the file the run is copied from
                    assert isinstance(r, CarriedRun), "a run of a pack with targets carries them"
                    assert len(r.targets) == len(r), "a stored value per sample of the run"
                    for t in r.targets:
                        targets.add((), t)
                self.add_run(r)
                kept.extend(range(r.first, r.first + len(r)))
                done += len(r)
            elif isinstance(r, Quarantined):
                bad.append((catalog.samples[r.index].relpath, r.reason))
                done += 1
            else:
                self.add(r)
                if targets is not None:
                    targets.add(catalog.samples[r.index].targets, r.targets)
                kept.append(r.index)
                done += 1
            bar.advance(done)
        if self._writer is not None:  # before the pool and its ring close
            self._writer.flush()
        return kept, bad

    def add_run(self, run: StoredRun) -> None:
        """Copy the stored bytes of ``run`` (the next samples in order): into their chunks in
        this file (checked at once, in the background), or onto the spool."""
        j, k = len(self.digests), len(run)
        assert self._copies is not None, "copy_into() first"
        sizes = np.asarray(run.sizes, np.int64)
        if self.storage == "array":
            assert self.images is not None
            assert self._dst is not None
            if (sizes != int(np.prod(self._shape))).any():  # check_index refuses such a file
                raise AssertionError(f"reused rows {j}..{j + k - 1}: a chunk of another size")
            dst, fd = self._dst[j : j + k], self.images.file.id.get_vfd_handle()
            self._copies.copy_rows(
                range(j, j + k), run.fd, run.src, sizes, run.digests, fd, dst, writeback=True
            )
        else:  # copied in finish(): the previous file's descriptor closes before that
            if run.fd not in self._held:
                self._held[run.fd] = os.dup(run.fd)
            self._plan.append(("run", replace(run, fd=self._held[run.fd]), self._stored))
        self.digests += [bytes(d) for d in run.digests]
        self.shapes += [tuple(int(x) for x in shape) for shape in run.shapes]  # type: ignore[misc]
        self.lengths += sizes.tolist()
        self._stored += int(sizes.sum())
        self._copied += [True] * k
        self._checked += [self.storage == "array"] * k

    def check_written(self, byte_ranges: np.ndarray, paths: list[str], where: str) -> None:
        """Once the file is flushed: check every row that was not copied from the bytes the
        file holds, and wait for the checks of the copied ones.

        Raises:
            CopiedMismatch: copied rows do not match (the writer packs them from source).
            IntegrityError: rows written from preprocessed bytes do not match (``where``).
        """
        assert self._copies is not None, "copy_into() first"
        rest = [j for j, checked in enumerate(self._checked) if not checked]
        ranges = byte_ranges[rest].astype(np.int64)
        wants = np.frombuffer(b"".join(self.digests[j] for j in rest), np.uint8)
        self._copies.check(rest, ranges[:, 0], ranges[:, 1], wants.reshape(-1, fmt.DIGEST_SIZE))
        failed = [m.row for m in self._copies.wait()]
        fresh = [f"sample {j} ({paths[j]})" for j in failed if not self._copied[j]]
        if fresh:
            raise IntegrityError(
                f"{where}: {len(fresh)} sample(s) written do not match their sha256 when read "
                "back; the disk or filesystem lost writes, pack again",
                fresh[:100],
            )
        if failed:
            raise CopiedMismatch(
                f"{where}: {len(failed)} reused sample(s) do not match the previous version's "
                "/digests; packing them from source",
                frozenset(paths[j] for j in failed),
            )

    def add(self, r: Processed) -> None:
        """Store one processed sample (the next in order)."""
        j = len(self.digests)
        if self.storage == "array":
            assert self.images is not None
            if tuple(r.shape) != self._shape:
                raise AssertionError(f"sample {r.index}: shape {r.shape} != {self._shape}")
            if self._direct:
                self._chunk_writer().write(int(self._chunks()[j]), r.data)
            else:
                self.images[j] = np.frombuffer(r.data, np.uint8).reshape(self._shape)
        else:
            assert self._spool is not None
            self._spool.write(r.data)
            at, n = self._stored, len(r.data)
            last = self._plan[-1] if self._plan else None
            if last is not None and last[0] == "spool" and last[2] + last[3] == at:
                self._plan[-1] = ("spool", last[1], last[2], last[3] + n)
            else:
                self._plan.append(("spool", self._spooled, at, n))
            self._spooled += n
        self.digests.append(r.digest)
        self.shapes.append(tuple(r.shape))  # type: ignore[arg-type]
        self.lengths.append(len(r.data))
        self._stored += len(r.data)
        self._copied.append(False)
        self._checked.append(False)

    def _chunks(self) -> np.ndarray:
        """The file offset of every chunk of ``/images`` (unfiltered: allocated at creation)."""
        if self._dst is None:
            assert self.images is not None, "the head first"
            self._dst = chunk_ranges(self.images, self.images.shape[0])[:, 0]
            assert (self._dst >= 0).all(), "/images is allocated at creation"
        return self._dst

    def _chunk_writer(self) -> ChunkWriter:
        if self._writer is None:
            assert self.images is not None
            self._writer = ChunkWriter(self.images.file.id.get_vfd_handle())
        return self._writer

    def finish(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Lay out the image bytes for good; return ``byte_ranges`` and (blob) ``offsets``."""
        n = len(self.digests)
        images = self.images
        assert images is not None
        if self._writer is not None:
            self._writer.flush()
        if self.storage == "array":
            images.resize(n, axis=0)
            ranges = chunk_ranges(images, n)
            assert (ranges >= 0).all(), "every sample was written as one chunk"
            if self._dst is not None:  # copied chunks were checked where they were copied to
                copied = np.flatnonzero(self._copied)
                assert (ranges[copied, 0] == self._dst[copied]).all(), "a copied chunk moved"
            return ranges.astype(np.uint64), None
        assert self._spool is not None
        offsets = np.zeros(n + 1, np.uint64)
        np.cumsum(np.asarray(self.lengths, np.uint64), out=offsets[1:])
        total, base = int(offsets[-1]), images.id.get_offset() or 0
        with self._spool as f:
            f.flush()
            out = images.file.id.get_vfd_handle()
            copy = RangeCopy()
            # /images is allocated at creation: HDF5 caches no raw data of it, none goes stale
            for step in self._plan if total else ():
                if step[0] == "spool":
                    copy(f.fileno(), out, step[1], base + step[2], step[3])
                else:
                    run, at = step[1], base + step[2]
                    assert self._copies is not None, "runs come with copy_into()"
                    dst = at + np.cumsum(run.sizes) - run.sizes
                    self._copies.copy(run.fd, out, run.src, dst, run.sizes)
        return np.stack([offsets[:-1] + np.uint64(base), np.diff(offsets)], axis=1), offsets
