"""Incremental pack: take the stored bytes of unchanged samples from the previous version.

:class:`Reuse` names the previous version's local file and the relative paths whose source
file did not change (e.g. :func:`unchanged_paths` over size+mtime or ETag tokens).
:class:`SampleSource` yields, in catalog order, what the writer stores: a sample is taken from
the previous file only when its path is unchanged, the previous file's ``config_sha256`` is
this pack's, and that file passes the reader's open checks (:func:`~h5forge.asset.open.open_h5`,
:func:`~h5forge.asset.index.load_index`, :func:`~h5forge.asset.index.check_index`); every
other sample is preprocessed as in a full build. Labels, splits and paths always come from the
new catalog, so the file is the one a full rebuild writes, sample for sample.

The previous file is untrusted; each reused sample's sha256 is compared once with the previous
``/digests``. Unfiltered bytes (array chunks, blob) go file to file in runs
(:class:`~h5forge.asset.stored_copy.StoredRun`), checked from the new file; a mismatch makes the
writer pack again, preprocessing it. Filtered chunks are read through HDF5 and checked in hand
(:class:`~h5forge.pack.previous.Previous`); a mismatch is preprocessed from source. Both are
counted in ``PackResult.reuse_mismatched``. A previous file that fails its checks is not used
at all (:attr:`SampleSource.refused` says why).

Target columns: a catalog's target values may differ from the previous file's for an unchanged
image (a listing's caption edited), so a pack with target columns reuses nothing, unless
:attr:`Reuse.targets` says the previous file's values are the ones to keep (a rewrite of that
file, whose catalog was read from it): reused samples then carry their stored target bytes from
it, each checked against its column's digests (:mod:`h5forge.pack.carried`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace

import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.index import check_index, load_index
from h5forge.asset.open import H5_DAMAGE, open_h5
from h5forge.asset.stored_copy import StoredRun
from h5forge.asset.target_layout import file_schema
from h5forge.discover.catalog import Catalog
from h5forge.errors import H5ForgeError, IntegrityError
from h5forge.files import CLOEXEC, NONBLOCK
from h5forge.location import Location
from h5forge.pack.carried import CarriedRun, CarriedTargets
from h5forge.pack.chunk_writes import HOLD
from h5forge.pack.config import PackConfig
from h5forge.pack.previous import Previous, file_identity
from h5forge.pack.targets import stored_schema
from h5forge.preprocess.images import Processed, Quarantined, process_file
from h5forge.preprocess.pool import iter_processed

__all__ = ["Reuse", "SampleSource", "unchanged_paths"]

log = logging.getLogger(__name__)

_RUN_BYTES = 64 << 20  # reused chunks copied per StoredRun (then checked while the next copies)
# Fewer samples to preprocess than this, beside reused ones, are preprocessed on threads of this
# process: starting the worker processes (forkserver, imports) costs about as much as 200 samples.
POOL_MIN = 200
_REFUSED = (H5ForgeError, FileNotFoundError, *H5_DAMAGE)


@dataclass(frozen=True)
class Reuse:
    """What an incremental pack may take from the previous version.

    Attributes:
        path: the previous version's file, local (the caller downloads it).
        unchanged: relative paths (as the catalog records them) whose source file is the same
            as when the previous version was packed.
        targets: reused samples keep the target values the previous file stores (its target
            columns must be this pack's), not the catalog's: for a rewrite of that file. A
            reused sample whose bytes do not match is then an error, never packed from its
            source (the values are the previous file's). False: a pack with target columns
            reuses nothing.

    Raises:
        TypeError: ``path`` is not a path, or ``unchanged`` is not a collection of strings.
        ValueError: ``path`` is a URL.
    """

    path: str
    unchanged: frozenset[str]
    targets: bool = False

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


class SampleSource:
    """The samples of ``catalog`` in order, as the pool yields them: reused or preprocessed.

    Iterate it once; the writer stores each result before asking for the next (a preprocessed
    sample may borrow the pool's shared memory, for up to
    :data:`~h5forge.pack.chunk_writes.HOLD` more results, until its chunk is written).
    :attr:`reused` and :attr:`mismatched` count as it goes.

    Args:
        catalog: the new source.
        config: this pack's configuration.
        workers: preprocessing processes (None: CPU count).
        reuse: the previous version, or None for a full build.
        few: the samples to preprocess are few (fewer than ``POOL_MIN``) beside work that
            is not theirs (reused rows, or other shards' samples referenced, not packed):
            preprocess them on threads of this process instead of starting a pool of
            processes (in a fresh process its start costs more than they do). None: decide
            from ``reuse``.
    """

    def __init__(
        self,
        catalog: Catalog,
        config: PackConfig,
        *,
        workers: int | None,
        reuse: Reuse | None,
        few: bool | None = None,
    ) -> None:
        self.catalog, self.config, self.workers, self._few = catalog, config, workers, few
        self.schema = stored_schema(catalog.schema, config.image.layout)
        self.reused = 0
        self.mismatched = 0
        self.refused = ""
        self._rows: dict[int, int] = {}  # catalog index -> row of the previous file
        self._previous: Previous | None = None
        self._carry = bool(self.schema) and reuse is not None and reuse.targets
        if reuse is not None and reuse.unchanged and self.schema and not reuse.targets:
            # The catalog's values may not be the previous file's (see the module's doc).
            self._refuse(f"the catalog has target columns {[c.name for c in self.schema]}")
        elif reuse is not None and reuse.unchanged:
            try:
                self._plan(reuse)
            except _REFUSED as e:
                self._refuse(f"{type(e).__name__}: {e}")

    def _refuse(self, why: str) -> None:
        self.refused, self._rows, self._previous = why, {}, None
        log.warning("not reusing the previous version: %s; every sample is preprocessed", why)

    def _plan(self, reuse: Reuse) -> None:
        where, cfg = reuse.path, self.config
        with open_h5(Location(reuse.path)) as h5:
            identity = file_identity(os.fstat(h5.id.get_vfd_handle()))
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
            held = file_schema(index.header, where=where)
            if self._carry and held != self.schema:
                self._refuse(f"{where} has target columns {held!r:.300}, not this pack's")
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
        self._previous = Previous(
            where, identity, index.filtered, index.byte_ranges, digests, shapes
        )

    @property
    def copies(self) -> bool:
        """Whether reused samples come as :class:`StoredRun` (unfiltered storage): the
        writer then checks every sample from the new file itself."""
        prev = self._previous
        return bool(prev is not None and self._rows and not prev.filtered)

    def __iter__(self) -> Generator[Processed | Quarantined | StoredRun, None, None]:
        samples, image = self.catalog.samples, self.config.image
        with contextlib.ExitStack() as stack:  # the previous file, the pool
            reused = self._open_reused(stack)
            carried = self._open_carried(stack)
            fresh_idx = [i for i in range(len(samples)) if i not in self._rows]
            # A few samples beside reused ones cost less on threads than starting the pool
            few = bool(self._rows) and len(fresh_idx) < POOL_MIN if self._few is None else self._few
            fresh = iter_processed(
                [samples[i].path for i in fresh_idx],
                image,
                workers=self.workers,
                borrow=HOLD + 1,  # the sink keeps up to HOLD of them as it asks for the next
                threads=few,
                schema=self.schema,
                targets=[samples[i].targets for i in fresh_idx] if self.schema else None,
            )
            stack.callback(fresh.close)
            i = 0
            while i < len(samples):
                if i not in self._rows:
                    yield replace(next(fresh), index=i)
                    i += 1
                    continue
                r = next(reused)
                if r is None:  # its bytes do not match the previous /digests
                    self.mismatched += 1
                    if self._carry:  # its targets are the previous file's: none to pack with
                        where = self._previous.path if self._previous else "previous file"
                        raise IntegrityError(
                            f"{where}: sample {samples[i].relpath!r} does not match its "
                            "/digests; its targets are carried from that file, so it cannot be "
                            "packed from source: verify it (`h5forge verify`)"
                        )
                    yield process_file(i, samples[i].path, image, self.schema, samples[i].targets)
                    i += 1
                    continue
                n = len(r) if isinstance(r, StoredRun) else 1
                self.reused += n
                yield self._with_targets(r, carried)
                i += n

    def _open_carried(self, stack: contextlib.ExitStack) -> CarriedTargets | None:
        """The previous file's target columns, when reused samples carry theirs (its identity
        checked again: a file swapped in since it was planned with is an error)."""
        prev = self._previous
        if not self._carry or prev is None or not self._rows:
            return None
        opened = open_h5(Location(prev.path))
        stack.callback(opened.close)
        if file_identity(os.fstat(opened.h5.id.get_vfd_handle())) != prev.identity:
            raise IntegrityError(f"{prev.path} changed after it was checked: nothing was reused")
        return CarriedTargets(opened.h5, self.schema, where=prev.path)

    def _with_targets(
        self, r: Processed | StoredRun, carried: CarriedTargets | None
    ) -> Processed | StoredRun:
        """A reused sample (or run) with its stored targets, read from the previous file."""
        if carried is None:
            return r
        if isinstance(r, StoredRun):
            rows = [self._rows[i] for i in range(r.first, r.first + len(r))]
            run = {f.name: getattr(r, f.name) for f in dataclasses.fields(StoredRun)}
            return CarriedRun(**run, targets=tuple(carried.row(row) for row in rows))
        return replace(r, targets=carried.row(self._rows[r.index]))

    def _open_reused(self, stack: contextlib.ExitStack) -> Iterator[Processed | StoredRun | None]:
        """The reused samples in catalog order (None: a digest mismatch); opens the previous
        file again and checks it is the one planned with, else reuses nothing."""
        prev = self._previous
        if prev is None or not self._rows:
            return iter(())
        if prev.filtered:
            opened = open_h5(Location(prev.path))
            stack.callback(opened.close)
            fd = opened.h5.id.get_vfd_handle()
        else:
            # Non-blocking: a FIFO swapped in is refused by the identity check, never waited on.
            fd = os.open(prev.path, os.O_RDONLY | NONBLOCK | CLOEXEC)
            stack.callback(os.close, fd)
        if file_identity(os.fstat(fd)) != prev.identity:
            self._refuse(f"{prev.path} changed after it was checked")
            return iter(())
        order = sorted(self._rows)
        if prev.filtered:
            names = [s.relpath for s in self.catalog.samples]
            return prev.decoded(opened.h5[fmt.IMAGES], [(i, self._rows[i]) for i in order], names)
        return self._runs(fd, order)

    def _runs(self, fd: int, order: list[int]) -> Iterator[StoredRun]:
        """Stretches of consecutive catalog samples, up to ``_RUN_BYTES`` each."""
        assert self._previous is not None
        ranges, digests = self._previous.byte_ranges, self._previous.digests
        k = 0
        while k < len(order):
            stop, total = k + 1, int(ranges[self._rows[order[k]], 1])
            while stop < len(order) and order[stop] == order[stop - 1] + 1 and total < _RUN_BYTES:
                total += int(ranges[self._rows[order[stop]], 1])
                stop += 1
            rows = np.array([self._rows[i] for i in order[k:stop]], np.int64)
            src, sizes = ranges[rows, 0].astype(np.int64), ranges[rows, 1].astype(np.int64)
            yield StoredRun(order[k], fd, src, sizes, digests[rows], self._previous.shapes[rows])
            k = stop
