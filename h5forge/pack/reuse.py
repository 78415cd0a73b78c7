"""Incremental pack: take the stored bytes of unchanged samples from the previous version.

:class:`Reuse` names the previous version's local file and the relative paths whose source
file did not change (the caller decides how, e.g. :func:`unchanged_paths` over size+mtime or
ETag tokens). :class:`SampleSource` then yields, in catalog order, what the writer stores: a
sample is taken from the previous file only when its path is unchanged, the previous file's
``config_sha256`` is this pack's, and that file passes the reader's open checks
(:func:`~h5forge.asset.open.open_h5`, :func:`~h5forge.asset.index.load_index`,
:func:`~h5forge.asset.index.check_index`); every other sample is preprocessed as in a full
build. Labels, splits and paths always come from the new catalog, so the file is the one a full
rebuild writes, sample for sample.

The previous file is untrusted. Its unfiltered samples are read by ``/byte_ranges`` (one
``pread`` per run of touching ranges, :class:`~h5forge.asset.ranges.RangeReader`), filtered
chunks through HDF5, which decompresses them (the sink compresses them as a full build would);
each sample's sha256 is compared with the previous ``/digests`` before it is handed on, and a
mismatch is preprocessed from source instead (counted in :attr:`SampleSource.mismatched`). A
previous file that fails its checks is not used at all (:attr:`SampleSource.refused` says why).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import check_index, load_index
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.asset.ranges import RangeReader
from h5forge.discover.catalog import Catalog
from h5forge.errors import H5ForgeError
from h5forge.pack.config import PackConfig
from h5forge.preprocess.images import Processed, Quarantined, process_file
from h5forge.preprocess.pool import iter_processed

__all__ = ["Reuse", "SampleSource", "unchanged_paths"]

log = logging.getLogger(__name__)

_BATCH_BYTES = 32 << 20  # reused stored bytes read (and held) at once
_HASH_THREADS = 2  # hashlib releases the GIL: the next samples hash while one is written
_REFUSED = (H5ForgeError, FileNotFoundError, *H5_DAMAGE)


@dataclass(frozen=True)
class Reuse:
    """What an incremental pack may take from the previous version.

    Attributes:
        path: the previous version's file, local (the caller downloads it).
        unchanged: relative paths (as the catalog records them) whose source file is the same
            as when the previous version was packed.

    Raises:
        TypeError: ``path`` is not a path, or ``unchanged`` is not a collection of strings.
        ValueError: ``path`` is a URL.
    """

    path: str
    unchanged: frozenset[str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", os.fspath(self.path))
        if "://" in self.path:
            raise ValueError(f"path={self.path!r} must be a local file: download it first")
        if isinstance(self.unchanged, (str, bytes)) or not all(
            isinstance(p, str) for p in self.unchanged
        ):
            raise TypeError(f"unchanged={self.unchanged!r:.200} must be a set of relative paths")
        object.__setattr__(self, "unchanged", frozenset(self.unchanged))


def unchanged_paths(previous_files: Mapping[str, str], current_files: Mapping[str, str]) -> set:
    """The relative paths whose token (size+mtime, ETag ...) is the same, and not empty, in
    ``previous_files`` and ``current_files`` (both ``relpath -> token``)."""
    return {p for p, token in current_files.items() if token and previous_files.get(p) == token}


@dataclass(frozen=True)
class _Previous:
    """What was read and checked of the previous file: its identity and per-row index."""

    path: str
    identity: tuple[int, int, int, int]  # st_dev, st_ino, st_size, st_mtime_ns
    filtered: bool
    byte_ranges: np.ndarray
    digests: np.ndarray
    shapes: np.ndarray  # (N, 3)


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


class SampleSource:
    """The samples of ``catalog`` in order, as the pool yields them: reused or preprocessed.

    Iterate it once; the writer stores each result before asking for the next (a preprocessed
    sample may borrow the pool's shared memory until then). :attr:`reused` and
    :attr:`mismatched` count as it goes.

    Args:
        catalog: the new source.
        config: this pack's configuration.
        workers: preprocessing processes (None: CPU count).
        reuse: the previous version, or None for a full build.
    """

    def __init__(
        self, catalog: Catalog, config: PackConfig, *, workers: int | None, reuse: Reuse | None
    ) -> None:
        self.catalog, self.config, self.workers = catalog, config, workers
        self.reused = 0
        self.mismatched = 0
        self.refused = ""
        self._rows: dict[int, int] = {}  # catalog index -> row of the previous file
        self._previous: _Previous | None = None
        if reuse is not None and reuse.unchanged:
            try:
                self._plan(reuse)
            except _REFUSED as e:
                self._refuse(f"{type(e).__name__}: {e}")

    def _refuse(self, why: str) -> None:
        self.refused, self._rows, self._previous = why, {}, None
        log.warning("not reusing the previous version: %s; every sample is preprocessed", why)

    def _plan(self, reuse: Reuse) -> None:
        where, cfg = reuse.path, self.config
        with open_h5(reuse.path) as h5:
            identity = _identity(os.fstat(h5.id.get_vfd_handle()))
            index = load_index(h5, where=where)
            check_index(
                index, h5.id.get_filesize(), where=where, max_pixels=cfg.image.max_image_pixels
            )
            got = h5.attrs.get(fmt.A_CONFIG_SHA256, "")
            got = got.decode("utf-8", "replace") if isinstance(got, bytes) else str(got)
            if got != cfg.sha256():
                self._refuse(f"{where} has config_sha256 {got[:64]!r}, this pack {cfg.sha256()}")
                return
            storage = "array" if cfg.fixed_size else "blob"
            if index.header.storage != storage or index.filtered != bool(cfg.filter_kwargs()):
                self._refuse(f"{where}: its storage does not match its config_json")
                return
            n = index.header.num_samples
            digests = h5[fmt.DIGESTS][()]
            paths = h5[fmt.PATHS].asstr()[()].tolist() if n else []
        if digests.shape != (n, fmt.DIGEST_SIZE) or len(paths) != n:
            self._refuse(f"{where}: /digests or /paths do not have {n} rows")
            return
        if index.shapes is not None:
            shapes = index.shapes
        else:
            assert index.image_shape is not None
            shapes = np.tile(np.asarray(index.image_shape, np.uint32), (n, 1))
        rows: dict[str, int] = {}
        seen_twice = set()
        for row, p in enumerate(paths):
            if p in rows:
                seen_twice.add(p)
            rows[p] = row
        unchanged = reuse.unchanged - seen_twice  # an ambiguous path is preprocessed
        self._rows = {
            i: rows[s.relpath]
            for i, s in enumerate(self.catalog.samples)
            if s.relpath in unchanged and s.relpath in rows
        }
        self._previous = _Previous(
            where, identity, index.filtered, index.byte_ranges, digests, shapes
        )

    def __iter__(self) -> Generator[Processed | Quarantined, None, None]:
        samples, image = self.catalog.samples, self.config.image
        with contextlib.ExitStack() as stack:  # the previous file, the pool
            reused = self._open_reused(stack)
            fresh_idx = [i for i in range(len(samples)) if i not in self._rows]
            fresh = iter_processed(
                [samples[i].path for i in fresh_idx], image, workers=self.workers, borrow=True
            )
            stack.callback(fresh.close)
            for i in range(len(samples)):
                if i in self._rows:
                    r = next(reused)
                    if r is None:  # its bytes do not match the previous /digests
                        self.mismatched += 1
                        yield process_file(i, samples[i].path, image)
                    else:
                        self.reused += 1
                        yield r
                else:
                    yield replace(next(fresh), index=i)

    def _open_reused(self, stack: contextlib.ExitStack) -> Iterator[Processed | None]:
        """The reused samples in catalog order (None: a digest mismatch); opens the previous
        file again and checks it is the one planned with, else reuses nothing."""
        prev = self._previous
        if prev is None or not self._rows:
            return iter(())
        if prev.filtered:
            opened = open_h5(prev.path)
            stack.callback(opened.close)
            fd = opened.h5.id.get_vfd_handle()
        else:
            reader = RangeReader(prev.path)
            stack.callback(reader.close)
            fd = reader.fd
        assert fd is not None
        if _identity(os.fstat(fd)) != prev.identity:
            self._refuse(f"{prev.path} changed after it was checked")
            return iter(())
        order = sorted(self._rows)
        if prev.filtered:
            return self._decoded(opened.h5[fmt.IMAGES], order)
        hashing = stack.enter_context(ThreadPoolExecutor(_HASH_THREADS, "h5forge-reuse-hash"))
        return self._stored(reader, order, hashing)

    def _check(
        self, i: int, row: int, data: bytes, digest: bytes | None = None
    ) -> Processed | None:
        """``data`` as sample ``i``, or None where its sha256 (``digest``, computed here when
        None) is not row ``row``'s of the previous ``/digests``."""
        assert self._previous is not None
        digest = hashlib.sha256(data).digest() if digest is None else digest
        if digest != self._previous.digests[row].tobytes():
            log.warning(
                "%s: sample %s (row %d) does not match its /digests; preprocessing it",
                self._previous.path,
                self.catalog.samples[i].relpath,
                row,
            )
            return None
        shape = tuple(int(x) for x in self._previous.shapes[row])
        return Processed(index=i, data=data, shape=shape, digest=digest)  # type: ignore[arg-type]

    def _decoded(self, images: Any, order: list[int]) -> Iterator[Processed | None]:
        for i in order:
            row = self._rows[i]
            try:
                data = np.ascontiguousarray(images[row]).tobytes()
            except H5_DAMAGE as e:  # a chunk that does not decompress: like a mismatch
                log.warning(
                    "%s row %d does not read (%s); preprocessing it", images.file.filename, row, e
                )
                yield None
                continue
            yield self._check(i, row, data)

    def _stored(
        self, reader: RangeReader, order: list[int], hashing: ThreadPoolExecutor
    ) -> Iterator[Processed | None]:
        """Batches of stored bytes read in one pass of ``preadv``, hashed on ``hashing``; one
        buffer serves every batch (the sink stores each sample before the next is asked for)."""
        assert self._previous is not None
        ranges = self._previous.byte_ranges
        start, buf = 0, bytearray()
        while start < len(order):
            stop, total = start, 0
            while stop < len(order) and (stop == start or total < _BATCH_BYTES):
                total += int(ranges[self._rows[order[stop]], 1])
                stop += 1
            rows = [self._rows[i] for i in order[start:stop]]
            batch = [(int(ranges[r, 0]), int(ranges[r, 1])) for r in rows]
            if len(buf) < total:
                buf = bytearray(total)
            views, pos = [], 0
            for _, size in batch:
                views.append(memoryview(buf)[pos : pos + size])
                pos += size
            reader.read_into(batch, views)
            digests = [hashing.submit(_sha256, v) for v in views]
            for i, view, digest in zip(order[start:stop], views, digests, strict=True):
                yield self._check(i, self._rows[i], view, digest.result())  # type: ignore[arg-type]
            start = stop


def _sha256(data: memoryview) -> bytes:
    return hashlib.sha256(data).digest()
