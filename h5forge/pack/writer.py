"""Pack a catalog of images into one sealed h5forge file (format v1; v2 with target columns).

Samples stream in order from the process pool or a previous version (:mod:`h5forge.pack.reuse`)
into a :class:`~h5forge.pack.sink.Sink`; :mod:`h5forge.pack.commit` verifies, seals and renames
``OUT.partial``. The metadata goes at the head (:mod:`h5forge.asset.placement`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from h5forge.asset import format as fmt
from h5forge.asset.placement import Head
from h5forge.discover.catalog import Catalog, Sample, discover
from h5forge.discover.columns import ColumnSpec
from h5forge.pack.attrs import pack_attrs
from h5forge.pack.bar import PackProgress
from h5forge.pack.checks import check_pack, check_quarantine
from h5forge.pack.commit import Staged, staged
from h5forge.pack.config import PackConfig
from h5forge.pack.reuse import Reuse, SampleSource
from h5forge.pack.sink import CopiedMismatch, Sink
from h5forge.pack.targets import PackTargets
from h5forge.targets.schema import parse_columns

__all__ = ["PackResult", "pack", "pack_slice"]


@dataclass(frozen=True)
class PackResult:
    """What :func:`pack` wrote.

    Attributes:
        path: the sealed file.
        counts: ``split -> class name -> number of samples`` ('' is the split of unsplit data).
        quarantined: ``(relative path, reason)`` of every input that was not packed.
        seconds: wall time of the whole pack, verification included.
        reused, reuse_mismatched: samples taken from ``reuse``; those failing their digest.
        target_stats: per target column, its counts (:mod:`h5forge.targets.stats`).
    """

    path: str
    num_samples: int
    num_quarantined: int
    num_classes: int
    classes: tuple[str, ...]
    quarantined: tuple[tuple[str, str], ...]
    bytes: int
    seconds: float
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    reused: int = 0
    reuse_mismatched: int = 0
    target_stats: dict[str, dict[str, object]] = field(default_factory=dict)


_HOW = "(CLI: --overwrite) "
log = logging.getLogger(__name__)


def pack(
    src: str | os.PathLike[str] | Catalog,
    out: str | os.PathLike[str],
    *,
    config: PackConfig | None = None,
    workers: int | None = None,
    max_bad_fraction: float = 0.01,
    listing: str | os.PathLike[str] | None = None,
    coco: str | os.PathLike[str] | None = None,
    masks: str | None = None,
    coco_masks: bool = False,
    columns: ColumnSpec | str | None = None,
    source_url: str = "",
    source_sha256: str = "",
    lineage: Mapping[str, str] | None = None,
    progress: bool = False,
    on_progress: Callable[[int, int], None] | None = None,
    overwrite: bool = False,
    reuse: Reuse | None = None,
) -> PackResult:
    """Pack an image folder, sample listing or :class:`Catalog` into a sealed h5forge file.

    Args:
        src: dataset root (ImageFolder layout, or the folder a ``listing`` is relative to), or
            a catalog from :func:`h5forge.discover.catalog.discover`.
        out: path of the ``.h5`` file to write (local).
        config: image policy, codec and checksums; default :class:`PackConfig()`: decoded RGB
            224x224, uncompressed.
        workers: preprocessing processes; default: CPU count.
        max_bad_fraction: fail when more than this fraction of inputs is quarantined.
        listing, coco, masks, columns: the source layout when ``src`` is a folder: a CSV/JSONL
            listing, a COCO instances JSON, or the masks folder beside ``images/``; and a
            listing's target columns (``{name: kind}``, or the ``NAME=KIND,...`` text of
            :func:`h5forge.targets.schema.parse_columns`); see
            :func:`h5forge.discover.catalog.discover`.
        source_url, source_sha256, lineage: root attributes (redact the URL; lineage: optional).
        progress: show a progress bar on the terminal.
        on_progress: called with ``(done, total)`` after each input.
        overwrite: replace an existing ``out``.
        reuse: a previous version to take unchanged samples from (:mod:`h5forge.pack.reuse`).

    Raises:
        OptionError: ``workers`` or ``max_bad_fraction`` out of bounds.
        MissingExtraError: the codec needs ``hdf5plugin``, which is not installed.
        FileExistsError: ``out`` exists and ``overwrite`` is false.
        BusyError: another live run is writing ``out`` (the message names its pid and host).
        UnsafePathError: ``OUT.partial``, its spool or ``OUT.lock`` is taken by something
            h5forge did not make (a planted link); nothing is written through it.
        TooManyBadImagesError, EmptyDatasetError: too many inputs quarantined, or a class lost
            all its images to quarantine (or nothing is usable).
    """
    t0 = time.perf_counter()
    config = PackConfig() if config is None else config
    out_path, filters = check_pack(config, out, workers, max_bad_fraction, overwrite, _HOW)
    spec = parse_columns(columns) if isinstance(columns, str) else columns
    catalog = (
        src
        if isinstance(src, Catalog)
        else discover(
            src, listing=listing, coco=coco, masks=masks, columns=spec, coco_masks=coco_masks
        )
    )
    damaged: frozenset[str] = frozenset()  # copied, then found not to match: packed anew
    while True:
        reuse = reuse and replace(reuse, unchanged=reuse.unchanged - damaged)
        try:
            result = _pack(
                SampleSource(catalog, config, workers=workers, reuse=reuse),
                out_path,
                config,
                filters,
                max_bad_fraction=max_bad_fraction,
                source_url=source_url,
                source_sha256=source_sha256,
                lineage=lineage,
                bar=PackProgress(len(catalog.samples), progress, on_progress),
                overwrite=overwrite,
                every_class=True,
                t0=t0,
            )
        except CopiedMismatch as e:  # nothing was kept of this pass; the next reuses fewer
            if not e.paths - damaged or (reuse is not None and reuse.targets):
                raise  # carried targets are the previous file's: no source to pack them from
            log.warning("%s", e)
            damaged |= e.paths
            continue
        return replace(result, reuse_mismatched=result.reuse_mismatched + len(damaged))


def pack_slice(
    catalog: Catalog,
    out: str | os.PathLike[str],
    *,
    config: PackConfig,
    workers: int | None,
    shard: bool = False,
    reuse: Reuse | None = None,
) -> PackResult:
    """Pack a slice of a catalog (a part, or with ``shard`` a shard) into ``out``, replacing it.

    ``reuse``: a sealed file (an earlier shard) whose samples of these paths are copied as
    stored, checked, instead of decoded (a shard rewritten without some rows).

    Unlike :func:`pack`, a class may have no sample in the slice, and any number of inputs
    may be quarantined: the merge (or the sharded version) applies ``max_bad_fraction`` to the
    whole dataset. A shard leaves out what varies between runs (:func:`~h5forge.pack.attrs.
    root_attrs`), so the same slice and configuration give the same bytes.
    """
    t0 = time.perf_counter()
    out_path, filters = check_pack(config, out, workers, 1.0, True, _HOW)
    return _pack(
        SampleSource(catalog, config, workers=workers, reuse=reuse),
        out_path,
        config,
        filters,
        max_bad_fraction=1.0,
        bar=PackProgress(len(catalog.samples), False, None),
        overwrite=True,
        every_class=False,
        t0=t0,
        shard=shard,
    )


class _Slice:
    """The next ``len(catalog.samples)`` results of a stream shared by consecutive shards,
    re-indexed from 0: what :func:`_pack` asks of a :class:`SampleSource`."""

    copies = False
    reused = 0
    mismatched = 0

    def __init__(self, catalog: Catalog, schema: Any, stream: Iterator[Any], offset: int) -> None:
        self.catalog, self.schema, self._stream, self._offset = catalog, schema, stream, offset

    def __iter__(self) -> Iterator[Any]:
        for _ in range(len(self.catalog.samples)):
            r = next(self._stream)
            yield replace(r, index=r.index - self._offset)


def pack_shards_stream(
    catalog: Catalog,
    groups: Sequence[int],
    out: Callable[[int], str | os.PathLike[str]],
    *,
    config: PackConfig,
    workers: int | None,
    few: bool = False,
) -> Iterator[PackResult]:
    """Pack consecutive runs of ``catalog.samples`` (of ``groups[k]`` samples each) into the
    shards ``out(k)``, one after the other, through ONE worker pool (a pool per shard would
    cost its start-up, ~0.1 s, for every shard), or with ``few`` on threads of this process
    (:class:`~h5forge.pack.reuse.SampleSource`). Each shard is as :func:`pack_slice` with
    ``shard=True`` writes it: sealed, verified, byte-reproducible.
    """
    t0 = time.perf_counter()
    if sum(groups) != len(catalog.samples) or any(g < 1 for g in groups):
        raise ValueError(f"groups {list(groups)[:10]} must be >= 1 each and add up to the samples")
    source = SampleSource(catalog, config, workers=workers, reuse=None, few=few)
    results = iter(source)
    try:
        # The pool starts before the first shard's file exists: its workers live on while
        # every shard is sealed, and must not hold (a forked copy of) any shard's descriptor.
        first = next(results, None)
        stream = itertools.chain([] if first is None else [first], results)
        offset = 0
        for k, n in enumerate(groups):
            part = replace(catalog, samples=catalog.samples[offset : offset + n], rejected=())
            out_path, filters = check_pack(config, out(k), workers, 1.0, True, _HOW)
            yield _pack(
                _Slice(part, source.schema, stream, offset),  # type: ignore[arg-type]
                out_path,
                config,
                filters,
                max_bad_fraction=1.0,
                bar=PackProgress(n, False, None),
                overwrite=True,
                every_class=False,
                t0=t0,
                shard=True,
            )
            offset += n
            t0 = time.perf_counter()
    finally:
        results.close()


def _pack(
    source: SampleSource,
    out_path: Path,
    config: PackConfig,
    filters: dict[str, Any],
    *,
    max_bad_fraction: float,
    source_url: str = "",
    source_sha256: str = "",
    lineage: Mapping[str, str] | None = None,
    bar: PackProgress,
    overwrite: bool,
    every_class: bool,
    t0: float,
    shard: bool = False,
) -> PackResult:
    """Write ``source`` into ``out_path`` and commit it; ``bar`` is closed either way."""
    catalog = source.catalog
    attrs = pack_attrs(
        config,
        num_samples=len(catalog.samples),
        num_classes=len(catalog.classes),
        schema=source.schema,
        source_url=source_url,
        source_sha256=source_sha256,
        lineage=lineage,
        shard=shard,
    )
    copies = source.copies  # then every sample is checked from the file before the seal
    try:
        with staged(
            out_path,
            overwrite=overwrite,
            max_pixels=config.image.max_image_pixels,
            how=_HOW,
            check_digests=not copies,
        ) as stage:
            samples, bad, stats = _write(
                source,
                stage,
                config,
                filters,
                attrs,
                bar=bar,
                max_bad_fraction=max_bad_fraction,
                every_class=every_class,
            )
    finally:
        bar.close()
    counts = replace(catalog, samples=tuple(samples)).counts()
    return PackResult(
        path=str(out_path),
        num_samples=len(samples),
        num_quarantined=len(bad),
        num_classes=len(catalog.classes),
        classes=tuple(catalog.classes),
        quarantined=tuple(bad),
        bytes=out_path.stat().st_size,
        seconds=time.perf_counter() - t0,
        counts=counts,
        reused=source.reused,
        reuse_mismatched=source.mismatched,
        target_stats=stats,
    )


def _write(
    source: SampleSource,
    stage: Staged,
    config: PackConfig,
    filters: dict[str, Any],
    attrs: dict[str, Any],
    *,
    bar: PackProgress,
    max_bad_fraction: float,
    every_class: bool,
) -> tuple[list[Sample], list[tuple[str, str]], dict[str, dict[str, object]]]:
    """Preprocess every input into ``stage.partial`` and flush it; return the packed samples,
    the quarantined ``(path, reason)`` and the target statistics."""
    catalog = source.catalog
    split_names = list(catalog.splits) or [""]
    lock = stage.lock
    with contextlib.ExitStack() as stack:
        sink = Sink(config, filters, stage.partial + ".blob", lock)
        stack.callback(sink.close)
        targets = PackTargets(source.schema, stage.partial, lock) if source.schema else None
        if targets is not None:
            stack.callback(targets.close)

        def head(capacity: int) -> tuple[h5py.File, Head]:
            # Everything but the image bytes goes first (see h5forge.asset.placement).
            h5 = stack.enter_context(stage.create())
            made = Head(
                h5,
                attrs,
                storage=sink.storage,
                capacity=capacity,
                classes=catalog.classes,
                split_names=split_names,
                images=sink.images_kwargs(capacity),
            )
            sink.images = made.images
            return h5, made

        if sink.storage == "array":  # chunks are written as samples arrive
            h5, index = head(len(catalog.samples))
        else:  # the file is written once the sizes are known; mark the pack as under way
            os.close(lock.create(stage.partial, 0o644))
        if source.copies:  # asked before iterating, as _pack did
            sink.copy_into(stage.partial)
        results = iter(source)  # sink.add() writes each before the next
        try:
            kept, bad = sink.drain(results, catalog, bar, targets)
        finally:
            close = getattr(results, "close", None)
            if close is not None:
                close()
        bad = check_quarantine(catalog, kept, bad, max_bad_fraction, every_class)
        if sink.storage == "blob":  # sizes are known only now: the file starts here
            lock.discard_one(stage.partial)  # the placeholder; HDF5 creates the name anew
            h5, index = head(len(kept))
        byte_ranges, offsets = sink.finish()
        samples = [catalog.samples[i] for i in kept]
        index.finish(
            byte_ranges=byte_ranges,
            labels=np.array([s.label for s in samples], np.int64),
            splits=np.array([split_names.index(s.split) for s in samples], np.uint8),
            digests=np.frombuffer(b"".join(sink.digests), np.uint8).reshape(
                len(samples), fmt.DIGEST_SIZE
            ),
            paths=[s.relpath for s in samples],
            quarantine=bad,
            offsets=offsets,
            shapes=np.asarray(sink.shapes, np.uint32).reshape(len(samples), 3),
        )
        if targets is not None:
            targets.sink.write(h5)  # after /images, see h5forge.targets.store
        h5.flush()
        if sink.copying:  # the seal skips its digest pass: every sample is checked here
            # The disk takes the file while its bytes are hashed from the page cache; the
            # seal's own fsync then finds little left.
            with ThreadPoolExecutor(1, thread_name_prefix="h5forge-fsync") as pool:
                synced = pool.submit(os.fsync, h5.id.get_vfd_handle())
                sink.check_written(byte_ranges, [s.relpath for s in samples], stage.partial)
                synced.result()
    return samples, bad, ({} if targets is None else targets.stats.as_dict())
